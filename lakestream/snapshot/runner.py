"""`run_snapshot`: the initial load of the captured tables at Spark speed, with an exact handover
to Debezium's stream.

1. The publication covers the tables; a logical slot is created with an exported snapshot (`slot`).
2. Each table is created as the pipeline would create it from Debezium's schema (same types,
   layout, identifier fields) and its key range is split into chunks (`source`).
3. Chunks are read in parallel Spark jobs under the exported snapshot and written as Parquet data
   files (`reader`); the driver commits each table's finished chunks as an Iceberg append whose
   summary carries the snapshot's state (``lakestream.snapshot``: slot, handover LSN, chunk plan,
   chunks done).
4. When every chunk is in, the handover point is left for ``lakestream capture``, which starts
   Debezium on the slot at that point (`lakestream.capture.handover`).

Guarantee. Within one run every chunk is read at the slot's consistent point and the stream starts
at that point: each committed transaction lands exactly once, either in the snapshot or in the
stream. A crash mid-snapshot loses the exported snapshot (it dies with its connection) but not the
slot, which keeps the WAL from the handover point. The resumed run keeps the chunks already
committed and reads the remaining ones under a new snapshot, taken later; the stream still starts
at the original handover point, so the changes made in between are applied again on top of rows
that may already contain them. Every change event carries the whole row and the mirror applies
the latest change per key, so once the stream has passed the resumed snapshot's point each row
equals its source row: nothing is lost, and nothing stays applied twice.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import psycopg2

from lakestream.config import PipelineConfig
from lakestream.errors import ConfigError, LakestreamError
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.reader import ChunkResult, ChunkTarget, read_chunk
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.slot import (
    ExportedSlot, ExportedSnapshot, ensure_publication, handover_path, int_to_lsn, lsn_to_int, read_handover,
    slot_state,
    write_handover,
)
from lakestream.snapshot.source import Chunk, ChunkPlan, SourceTable, describe_table, plan_chunks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

STATE_PROPERTY = "lakestream.snapshot"
# Test hook: SIGKILL this process right after that many chunk commits (a crash mid-snapshot).
KILL_AFTER_CHUNKS_ENV = "LAKESTREAM_SNAPSHOT_KILL_AFTER_CHUNKS"
# Finished chunks are committed together at most this often (a crash redoes at most this much work).
COMMIT_EVERY_S = 5.0


class SnapshotError(LakestreamError):
    """The parallel snapshot cannot start or go on safely; the message says why and what to do."""


@dataclass
class _Table:
    source: SourceTable
    lake: str  # namespace.table
    ident: str  # quoted catalog.namespace.table
    target: ChunkTarget
    plan: ChunkPlan
    done: set[int]
    snapshot_id: int | None  # the table's current Iceberg snapshot (commits expect it)
    progress: TableProgress


def source_dsn(config: PipelineConfig) -> str:
    db = config.capture.database
    return psycopg2.extensions.make_dsn(host=db.host, port=db.port, dbname=db.dbname, user=db.user,
                                        password=db.password.get_secret_value() if db.password else None)


def _read_state(spark: SparkSession, ident: str) -> dict[str, Any] | None:
    from lakestream.spark import jvm_helper

    raw = jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, STATE_PROPERTY)
    return orjson.loads(raw) if raw else None


def _plan_under(dsn: str, snapshot_name: str, source: SourceTable, chunk_rows: int) -> ChunkPlan:
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


def _ranges(ids: set[int]) -> list[list[int]]:
    """Chunk ids as [first, last] runs, to keep the summary property small."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _unranges(runs: list[list[int]]) -> set[int]:
    return {i for a, b in runs for i in range(a, b + 1)}


def run_snapshot(
    config: PipelineConfig,
    tables: list[str] | None = None,
    spark: SparkSession | None = None,
    *,
    chunk_rows: int | None = None,
    parallelism: int | None = None,
    progress_interval_s: float = 5.0,
    on_progress: Callable[[list[TableProgress]], Any] | None = None,
    again: bool = False,
    wait_timeout_s: float = 600.0,
) -> SnapshotReport:
    """Snapshot ``tables`` (default: every captured table) into their Iceberg mirrors and leave the
    handover point for ``lakestream capture``; resumes a snapshot a crash interrupted.

    Tables named after the handover (or with ``again``) are re-snapshotted while streaming continues
    (`lakestream.snapshot.resnapshot`)."""
    from lakestream.engine.pipeline import Pipeline
    from lakestream.sink.files import table_info
    from lakestream.sink.report import NewShape
    from lakestream.spark import session_for

    capture = config.capture
    if capture is None:
        raise ConfigError("the pipeline config has no `capture:` section — fix: add capture.database and capture.tables")
    if not capture.schemas_enabled:
        raise ConfigError("capture.schemas_enabled: the parallel snapshot needs Debezium's schemas — fix: set it to true")
    names = [str(SourceTableName.parse(t)) for t in (tables or capture.tables)]
    unknown = [t for t in names if t not in capture.tables]
    if unknown:
        raise ConfigError(f"{unknown} not in capture.tables {capture.tables} — fix: capture them first, or name a "
                          "captured table")
    chunk_rows = chunk_rows or capture.snapshot_chunk_rows
    started = time.monotonic()
    handover = read_handover(config.state_dir, capture)
    if tables and (again or (handover is not None and set(names) <= set(handover["tables"]))):
        from lakestream.snapshot.resnapshot import resnapshot_tables

        return resnapshot_tables(config, names, spark, chunk_rows=chunk_rows, parallelism=parallelism,
                                 progress_interval_s=progress_interval_s, on_progress=on_progress,
                                 wait_timeout_s=wait_timeout_s)
    dsn = source_dsn(config)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    pipeline = None
    try:
        if handover is not None and not slot_state(conn, capture.slot_name).exists:
            raise SnapshotError(f"a snapshot finished for slot {capture.slot_name}, but the slot is gone — fix: to load "
                                f"again, drop the lake tables and delete {handover_path(config.state_dir, capture)}")
        if handover is not None and set(names) <= set(handover["tables"]):
            log.info("snapshot: already complete (handover at %s); nothing to do", handover["lsn_text"])
            return SnapshotReport(capture.slot_name, handover["lsn_text"], already_complete=True)
        if handover is not None:
            raise SnapshotError(f"the snapshot of slot {capture.slot_name} finished without {sorted(set(names) - set(handover['tables']))}; "
                                "a table added after the handover has no mirror to re-snapshot yet — fix: capture it "
                                "with Debezium's incremental snapshot, or start over with a new capture.slot_name")
        spark = spark or session_for(config)
        pipeline = Pipeline(config, spark)
        sources = {name: describe_table(conn, *_parts(name)) for name in names}
        routed = {}
        for name in names:
            topic = capture.topic(name)
            stream, lake = pipeline.router.route(topic)
            if stream.mode != "upsert":
                raise ConfigError(f"topic {topic} is routed to an append stream; the snapshot fills upsert mirrors — fix: "
                                  "route Debezium topics to a stream with mode: upsert")
            routed[name] = (topic, stream, str(lake), pipeline.tables.ident(lake.namespace, lake.table))
        states = {}
        for name, (_topic, _stream, lake, ident) in routed.items():
            ns, tbl = lake.split(".", 1)
            info = table_info(spark, config.catalog.name, ns, tbl)
            state = _read_state(spark, ident) if info["exists"] and info.get("snapshot_id") is not None else None
            if state is None and info["exists"] and info.get("snapshot_id") is not None:
                raise SnapshotError(f"the lake table {lake} already has data that no snapshot of slot {capture.slot_name} "
                                    "wrote — fix: drop it (lakestream sql ... DROP TABLE) to load it again, or use "
                                    "snapshot: debezium")
            if state is not None:
                states[name] = state
        slot = slot_state(conn, capture.slot_name)
        resumed = bool(states)
        if resumed:
            lsns = {(s["slot"], s["lsn"]) for s in states.values()}
            if len(lsns) != 1 or next(iter(lsns))[0] != capture.slot_name:
                raise SnapshotError(f"the tables were snapshotted by different runs {sorted(lsns)}; cannot resume — fix: "
                                    "drop the lake tables and the slot, then snapshot again")
            handover_lsn = next(iter(lsns))[1]
            if not slot.exists:
                raise SnapshotError(f"slot {capture.slot_name} of the interrupted snapshot is gone, and with it the "
                                    "changes since its start — fix: drop the lake tables and snapshot again")
            if slot.confirmed_flush_lsn is not None and slot.confirmed_flush_lsn > handover_lsn:
                raise SnapshotError(f"slot {capture.slot_name} was streamed past the snapshot's handover point before "
                                    "the snapshot finished — fix: drop the lake tables and the slot, snapshot again")
        elif slot.exists:
            raise SnapshotError(f"replication slot {capture.slot_name} exists already (Debezium or an earlier run made "
                                f"it); the snapshot must create its own — fix: SELECT pg_drop_replication_slot("
                                f"'{capture.slot_name}') if nothing uses it, or set capture.slot_name")
        else:
            ensure_publication(conn, capture, names)
        exported: ExportedSlot | ExportedSnapshot = (ExportedSnapshot(dsn) if resumed
                                                     else ExportedSlot(dsn, capture.slot_name))
        with exported:
            if not resumed:
                handover_lsn = exported.lsn
            handover_started = time.time()
            work: dict[str, _Table] = {}
            for name in names:
                topic, stream, lake, ident = routed[name]
                source = sources[name]
                shape = NewShape(lake, topic, f"snapshot:{name}", [(c.name, c.ddl) for c in source.columns],
                                 list(source.key), False)
                pipeline.prepare_table(lake, [shape], stream)
                spec = pipeline.specs[lake]
                state = states.get(name)
                if state is not None:
                    plan = ChunkPlan.from_json(name, state["chunks"])
                    done = _unranges(state["done"])
                else:
                    plan = _plan_under(dsn, exported.snapshot_name, source, chunk_rows)
                    done = set()
                ns, tbl = lake.split(".", 1)
                current = table_info(spark, config.catalog.name, ns, tbl).get("snapshot_id")
                progress = TableProgress(name, lake, len(plan.chunks), len(done), resumed_chunks=len(done))
                work[name] = _Table(source, lake, ident, ChunkTarget(lake, spec.schema, spec.partition_spec,
                                                                     spec.data_location), plan, done, current, progress)
            _load_chunks(spark, config, dsn, exported.snapshot_name, work, handover_lsn,
                         parallelism or capture.snapshot_parallelism, progress_interval_s, on_progress)
        write_handover(config.state_dir, capture, handover_lsn, names)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            lag_bytes = max(0, lsn_to_int(cur.fetchone()[0]) - handover_lsn)
        report = SnapshotReport(capture.slot_name, int_to_lsn(handover_lsn), [w.progress for w in work.values()],
                                time.monotonic() - started, resumed, False, lag_bytes, time.time() - handover_started)
        return report
    finally:
        if pipeline is not None:
            pipeline.close()
        conn.close()


def _parts(name: str) -> tuple[str, str]:
    """(schema, table) of a ``capture.tables`` entry, as PostgreSQL has them."""
    parsed = SourceTableName.parse(name)
    return parsed.schema, parsed.table


def _load_chunks(spark: SparkSession, config: PipelineConfig, dsn: str, snapshot_name: str, work: dict[str, _Table],
                 handover_lsn: int, parallelism: int | None, progress_interval_s: float,
                 on_progress: Callable[[list[TableProgress]], Any] | None,
                 commit: Callable[[_Table, list[ChunkResult]], None] | None = None) -> None:
    """Read every chunk not yet committed in parallel Spark jobs; hand each table's finished chunks to
    ``commit`` (default: commit them as an append carrying the snapshot's state)."""
    if commit is None:
        def commit(w: _Table, results: list[ChunkResult]) -> None:
            _commit_chunks(spark, config, w, results, handover_lsn)

    todo: list[tuple[_Table, Chunk]] = []
    for w in work.values():
        todo.extend((w, c) for c in w.plan.chunks if c.chunk_id not in w.done)
        if not w.plan.chunks or len(w.done) == len(w.plan.chunks):
            w.progress.started = w.progress.finished = time.monotonic()
    # Largest tables first, their chunks interleaved with nothing: the tail is made of small chunks.
    todo.sort(key=lambda item: (-len(item[0].plan.chunks), item[0].source.name, item[1].chunk_id))
    workers = max(1, parallelism or spark.sparkContext.defaultParallelism)
    kill_after = int(os.environ.get(KILL_AFTER_CHUNKS_ENV, "0") or 0)
    committed = 0
    sc = spark.sparkContext

    def run_chunk(w: _Table, chunk: Chunk) -> ChunkResult:
        payload = (dsn, snapshot_name, w.source, chunk, w.target)
        sc.setJobDescription(f"lakestream snapshot {w.source.name} chunk {chunk.chunk_id}")
        try:
            return sc.parallelize([payload], 1).map(lambda p: read_chunk(*p)).collect()[0]
        except Exception as exc:  # noqa: BLE001 — py4j wraps the task's Python error; surface its message
            message = str(exc)
            marker = "lakestream.errors.LakestreamError: "
            if marker in message:
                raise SnapshotError(message.split(marker, 1)[1].splitlines()[0]) from None
            raise

    last_report = last_commit = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapshot-chunk") as pool:
        pending = set()
        queue = list(todo)
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
                            log.warning("snapshot: %s=%d reached, killing this process", KILL_AFTER_CHUNKS_ENV,
                                        kill_after)
                            sys.stderr.flush()
                            os.kill(os.getpid(), signal.SIGKILL)
                now = time.monotonic()
                if now - last_report >= progress_interval_s or not (queue or pending):
                    last_report = now
                    for w in work.values():
                        log.info(w.progress.line())
                    if on_progress is not None:
                        on_progress([w.progress for w in work.values()])
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _commit_chunks(spark: SparkSession, config: PipelineConfig, w: _Table, results: list[ChunkResult],
                   handover_lsn: int) -> None:
    """One append of the chunks' files, its summary recording every chunk of the table done so far."""
    from lakestream.sink.files import commit_files

    done = w.done | {r.chunk_id for r in results}
    state = {"slot": config.capture.slot_name, "lsn": handover_lsn, "chunks": w.plan.to_json(),
             "done": _ranges(done), "complete": len(done) == len(w.plan.chunks)}
    ns, tbl = w.lake.split(".", 1)
    request = {
        "base_snapshot_id": w.snapshot_id,
        "expect_snapshot_id": w.snapshot_id,
        "data_files": [{"path": f["path"], "file_size": f["file_size"], "record_count": f["record_count"],
                        "partition": f["partition"]} for r in results for f in r.files],
        "deletes": [],
        "properties": {STATE_PROPERTY: orjson.dumps(state, default=str).decode()},
    }
    result = commit_files(spark, config.catalog.name, ns, tbl, request)
    if result.get("stale"):
        raise SnapshotError(f"{w.lake} changed while the snapshot loaded it (another writer committed snapshot "
                            f"{result.get('snapshot_id')}) — fix: stop other writers of the table and run the snapshot again")
    w.snapshot_id = result["snapshot_id"]
    w.done = done
    w.progress.chunks_done = len(done)
    w.progress.rows += sum(r.rows for r in results)
    if state["complete"]:
        w.progress.finished = time.monotonic()
