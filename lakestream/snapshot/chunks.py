"""Reading a source table's chunks under an exported snapshot, in parallel Spark tasks, and committing
them: what the initial loads (`postgresql`, `mariadb`) and the re-snapshot (`resnapshot`) share."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import psycopg2

from lakestream.config import CaptureSettings, PipelineConfig
from lakestream.errors import ConfigError, LakestreamError
from lakestream.snapshot.progress import TableProgress
from lakestream.snapshot.reader import ChunkResult, ChunkTarget, read_chunk
from lakestream.snapshot.source import Chunk, ChunkPlan, SourceTable, plan_chunks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.engine.registry import TableRegistry
    from lakestream.sink.catalog.sink import CommitRequest

log = logging.getLogger(__name__)

STATE_PROPERTY = "lakestream.snapshot"
# Test hook: SIGKILL this process right after that many chunk commits (a crash mid-snapshot).
KILL_AFTER_CHUNKS_ENV = "LAKESTREAM_SNAPSHOT_KILL_AFTER_CHUNKS"
# Finished chunks are committed together at most this often (a crash redoes at most this much work).
COMMIT_EVERY_S = 5.0


def read_snapshot_state(spark: SparkSession, ident: str) -> dict[str, Any] | None:
    """The snapshot state (chunks done, the handover) the table's latest commit carries, if any."""
    from lakestream.runtime.spark import jvm_helper

    raw = jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, STATE_PROPERTY)
    return orjson.loads(raw) if raw else None


class SnapshotError(LakestreamError):
    """The parallel snapshot cannot start or go on safely; the message says why and what to do."""


def captured(config: PipelineConfig) -> CaptureSettings:
    """The config's ``capture:`` section; ConfigError naming the fix when it has none."""
    if config.capture is None:
        raise ConfigError(
            "the pipeline config has no `capture:` section — fix: add capture.database and capture.tables"
        )
    return config.capture


@dataclass
class SnapshotTable:
    """One table being loaded: its source, its mirror, its chunk plan and what is done."""

    source: SourceTable
    lake: str  # namespace.table
    ident: str  # quoted catalog.namespace.table
    target: ChunkTarget
    plan: ChunkPlan
    done: set[int]
    snapshot_id: int | None  # the table's current Iceberg snapshot (commits expect it)
    progress: TableProgress


def table_work(
    spark: SparkSession,
    config: PipelineConfig,
    registry: TableRegistry,
    name: str,
    routed: tuple[str, Any, str, str],
    source: SourceTable,
    state: dict[str, Any] | None,
    new_plan: Callable[[], ChunkPlan],
) -> SnapshotTable:
    """``name``'s mirror prepared for the source's columns and key, and its entry for `load_chunks`: the plan and the
    chunks done of the interrupted run ``state`` describes, or ``new_plan()``. ``routed``: (topic, stream, lake,
    ident) as the router places the table."""
    from lakestream.sink.catalog.sink import table_info
    from lakestream.sink.report import NewShape

    topic, stream, lake, ident = routed
    columns = [(c.name, c.ddl) for c in source.columns]
    registry.prepare_table(lake, [NewShape(lake, topic, f"snapshot:{name}", columns, list(source.key), False)], stream)
    spec = registry.specs[lake]
    if state is not None:
        plan = ChunkPlan.from_json(name, state["chunks"])
        done = {i for a, b in state["done"] for i in range(a, b + 1)}
    else:
        plan, done = new_plan(), set()
    ns, tbl = lake.split(".", 1)
    current = table_info(spark, config.catalog.name, ns, tbl).get("snapshot_id")
    progress = TableProgress(name, lake, len(plan.chunks), len(done), resumed_chunks=len(done))
    target = ChunkTarget(lake, spec.schema, spec.partition_spec, spec.data_location)
    return SnapshotTable(source, lake, ident, target, plan, done, current, progress)


def source_dsn(config: PipelineConfig) -> str:
    """The libpq connection string of the PostgreSQL source."""
    db = captured(config).database
    return psycopg2.extensions.make_dsn(
        host=db.host,
        port=db.port,
        dbname=db.dbname,
        user=db.user,
        password=db.password.get_secret_value() if db.password else None,
    )


def plan_under(dsn: str, snapshot_name: str, source: SourceTable, chunk_rows: int) -> ChunkPlan:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        plan = plan_chunks(conn, source, chunk_rows)
        conn.rollback()
        return plan
    finally:
        conn.close()


def chunk_runs(ids: set[int]) -> list[list[int]]:
    """Chunk ids as [first, last] runs, to keep the summary property small."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


# What a chunk's Spark task runs: a function (importable on the executors) and its arguments.
ChunkTask = tuple[Callable[..., ChunkResult], tuple[Any, ...]]


def load_chunks(
    spark: SparkSession,
    config: PipelineConfig,
    dsn: str,
    snapshot_name: str,
    work: dict[str, SnapshotTable],
    handover_lsn: int | dict[str, Any],
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None,
    commit: Callable[[SnapshotTable, list[ChunkResult]], None] | None = None,
    task: Callable[[SnapshotTable, Chunk], ChunkTask] | None = None,
) -> None:
    """Read every chunk not yet committed in parallel Spark jobs; hand each table's finished chunks to
    ``commit`` (default: commit them as an append carrying the snapshot's state).

    ``task`` gives the Spark task of a chunk, called on a driver thread (default: the task reads the chunk from
    PostgreSQL under ``snapshot_name`` itself, `read_chunk`; MariaDB's snapshot reads it on the driver and the
    task converts and writes it, `lakestream.snapshot.mariadb`)."""
    if task is None:
        task = partial(_postgresql_task, dsn, snapshot_name)
    if commit is None:
        commit = _appends(spark, config, handover_lsn)
    queue = _chunks_to_read(work)
    workers = max(1, parallelism or spark.sparkContext.defaultParallelism)
    kill_after = int(os.environ.get(KILL_AFTER_CHUNKS_ENV, "0") or 0)
    committed = 0
    run_chunk = partial(_run_chunk, spark, task)
    last_report = last_commit = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapshot-chunk") as pool:
        pending: set[Future[ChunkResult]] = set()
        finished: dict[str, list[ChunkResult]] = defaultdict(list)
        try:

            def top_up() -> None:
                while queue and len(pending) < workers:
                    w, chunk = queue.pop(0)
                    if w.progress.started is None:
                        w.progress.started = time.monotonic()
                    pending.add(pool.submit(run_chunk, w, chunk))

            while queue or pending:
                top_up()
                done, pending = wait(pending, timeout=progress_interval_s, return_when=FIRST_COMPLETED)
                for future in done:
                    result = future.result()
                    finished[result.table].append(result)
                top_up()  # the freed task slots read the next chunks while the driver commits these
                # Finished chunks commit together at most every COMMIT_EVERY_S (each commit costs the driver
                # about half a second of CPU the tasks would rather have), and at the end.
                due = time.monotonic() - last_commit >= COMMIT_EVERY_S or not (queue or pending) or kill_after
                for table, results in list(finished.items()) if due else ():
                    if results:
                        last_commit = time.monotonic()
                        commit(work[table], results)
                        committed += len(results)
                        finished[table] = []
                        if kill_after and committed >= kill_after:
                            _crash(kill_after)
                now = time.monotonic()
                if now - last_report >= progress_interval_s or not (queue or pending):
                    last_report = now
                    _report(work, on_progress)
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _crash(kill_after: int) -> None:
    """The test hook's crash: SIGKILL this process, as a crash mid-snapshot would end it."""
    log.warning("snapshot: %s=%d reached, killing this process", KILL_AFTER_CHUNKS_ENV, kill_after)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _report(work: dict[str, SnapshotTable], on_progress: Callable[[list[TableProgress]], Any] | None) -> None:
    """Log each table's progress and hand it to ``on_progress``."""
    for w in work.values():
        log.info(w.progress.line())
    if on_progress is not None:
        on_progress([w.progress for w in work.values()])


def _postgresql_task(dsn: str, snapshot_name: str, w: SnapshotTable, chunk: Chunk) -> ChunkTask:
    """The Spark task that reads ``chunk`` from PostgreSQL under the exported snapshot itself."""
    return read_chunk, (dsn, snapshot_name, w.source, chunk, w.target)


def _appends(
    spark: SparkSession, config: PipelineConfig, handover_lsn: int | dict[str, Any]
) -> Callable[[SnapshotTable, list[ChunkResult]], None]:
    """The default commit of finished chunks: an append per table, carrying the snapshot's state."""
    held: dict[str, list[ChunkResult]] = defaultdict(list)

    def commit(w: SnapshotTable, results: list[ChunkResult]) -> None:
        if w.source.keyless:
            # A table without a key commits all its chunks at once: a resumed snapshot could only read its
            # missing chunks later than the handover point, and the stream from that point would then add
            # the rows inserted in between a second time (nothing tells a row from its equal copy).
            held[w.source.name].extend(results)
            w.progress.chunks_done = len(w.done) + len(held[w.source.name])
            if len(w.done) + len(held[w.source.name]) < len(w.plan.chunks):
                return
            results = held.pop(w.source.name)
        commit_chunks(spark, config, w, results, handover_lsn)

    return commit


def _chunks_to_read(work: dict[str, SnapshotTable]) -> list[tuple[SnapshotTable, Chunk]]:
    """Every chunk not yet committed, in reading order; a table with nothing left is marked finished."""
    todo: list[tuple[SnapshotTable, Chunk]] = []
    for w in work.values():
        todo.extend((w, c) for c in w.plan.chunks if c.chunk_id not in w.done)
        if not w.plan.chunks or len(w.done) == len(w.plan.chunks):
            w.progress.started = w.progress.finished = time.monotonic()
    # Largest tables first, their chunks interleaved with nothing: the tail is made of small chunks.
    todo.sort(key=lambda item: (-len(item[0].plan.chunks), item[0].source.name, item[1].chunk_id))
    return todo


def _run_chunk(
    spark: SparkSession, task: Callable[[SnapshotTable, Chunk], ChunkTask], w: SnapshotTable, chunk: Chunk
) -> ChunkResult:
    """One chunk's Spark job (on a driver thread): its task, run on an executor."""
    sc = spark.sparkContext
    function, payload = task(w, chunk)
    sc.setJobDescription(f"lakestream snapshot {w.source.name} chunk {chunk.chunk_id}")
    try:
        result: ChunkResult = sc.parallelize([payload], 1).map(lambda p: function(*p)).collect()[0]
        return result
    except Exception as exc:  # noqa: BLE001 — py4j wraps the task's Python error; surface its message
        message = str(exc)
        marker = "lakestream.errors.LakestreamError: "
        if marker in message:
            raise SnapshotError(message.split(marker, 1)[1].splitlines()[0]) from None
        raise


def commit_chunks(
    spark: SparkSession,
    config: PipelineConfig,
    w: SnapshotTable,
    results: list[ChunkResult],
    handover_lsn: int | dict[str, Any],
) -> None:
    """One append of the chunks' files, its summary recording every chunk of the table done so far."""
    from lakestream.sink.catalog.sink import commit_files

    done = w.done | {r.chunk_id for r in results}
    state = {
        "slot": captured(config).slot_name,
        "lsn": handover_lsn,
        "chunks": w.plan.to_json(),
        "done": chunk_runs(done),
        "complete": len(done) == len(w.plan.chunks),
    }
    ns, tbl = w.lake.split(".", 1)
    request: CommitRequest = {
        "base_snapshot_id": w.snapshot_id,
        "expect_snapshot_id": w.snapshot_id,
        "data_files": [
            {
                "path": f["path"],
                "file_size": f["file_size"],
                "record_count": f["record_count"],
                "partition": f["partition"],
            }
            for r in results
            for f in r.files
        ],
        "deletes": [],
        "properties": {STATE_PROPERTY: orjson.dumps(state, default=str).decode()},
    }
    result = commit_files(spark, config.catalog.name, ns, tbl, request)
    if result.get("stale"):
        raise SnapshotError(
            f"{w.lake} changed while the snapshot loaded it (another writer committed snapshot "
            f"{result.get('snapshot_id')}) — fix: stop other writers of the table and run the snapshot again"
        )
    w.snapshot_id = result["snapshot_id"]
    w.done = done
    w.progress.chunks_done = len(done)
    w.progress.rows += sum(r.rows for r in results)
    if state["complete"]:
        w.progress.finished = time.monotonic()
