"""`resnapshot_tables`: read a captured table again at Spark speed while Debezium and the pipeline
keep streaming it, and replace its mirror with it in one commit — exactly (docs/design/snapshot.md,
"Re-snapshot while streaming").

The stream and the pipeline are not paused. What makes it exact is a window of the table's topic
opened before the snapshot is taken and closed after the pipeline applied everything the snapshot
shows:

1. **Low mark.** The pipeline's committed Kafka offsets of the table's topic (the table's
   ``lakestream.offsets``). Every event below them was in Kafka before the snapshot is taken. We
   wait until every transaction running at that instant has ended, so each of those events
   belongs to a transaction the snapshot sees.
2. **Snapshot.** An exported REPEATABLE READ snapshot S; the chunks are read under it in parallel
   Spark tasks and written as data files (not committed). Right after S, a heartbeat message in the
   WAL marks the **high mark** H: every transaction S sees committed before it.
3. **High mark in Kafka.** Once the slot's confirmed flush LSN passes H, Debezium has put every
   event S sees into Kafka; the topic's end offsets then bound them.
4. **Commit.** When the table's committed offsets have passed every row event below that end, one
   Iceberg commit based on the snapshot those offsets belong to makes the mirror S, *except* the keys
   with an event in the window [low mark, committed offsets) — the pipeline already applied a change of
   those keys that S may not show; their mirror rows are the stream's and stay. Every other key gets S's
   row: a mirror row equal to it (same content digest) is left as it is, lineage included; one that
   differs is replaced by S's row keeping its ``_row_id`` (an update); a key only in S is added, one only
   in the mirror deleted (`lakestream.snapshot.compare`). Leaving an equal row in place writes the same
   content as replacing it, so the argument is unchanged. Events after the committed offsets are
   applied by the pipeline after this commit, in order. Another commit landing first makes this one
   stale; the window is extended and it is planned again.

A MariaDB table (`_read_mariadb_table`): no wait in step 1 (the binlog holds committed transactions only, and a
later consistent snapshot holds every one before its binlog position); in step 2 the snapshot's binlog position is
the high mark H; in step 3 the wait is for capture's stored binlog offset to pass H (`_wait_binlog_published`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import psycopg2

from lakestream.config import PipelineConfig
from lakestream.errors import ConfigError, conflict_cause
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.chunks import captured
from lakestream.snapshot.mirrors import require_upsert
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.reader import ChunkResult, ChunkTarget
from lakestream.snapshot.slot import ExportedSnapshot, int_to_lsn, lsn_to_int, one_row, slot_state

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyspark.sql import SparkSession

    from lakestream.engine.registry import TableRegistry
    from lakestream.routing import Router
    from lakestream.sink.catalog.sink import CommitRequest
    from lakestream.sink.spec import TableSpec
    from lakestream.snapshot.chunks import SnapshotTable
    from lakestream.snapshot.source import ChunkPlan, SourceTable

log = logging.getLogger(__name__)

RESNAPSHOT_PROPERTY = "lakestream.resnapshot"
# The table property by which the re-snapshot's commit holds back the pipeline's commits of the table
# for a few seconds (read by LakestreamSink.commitFiles); it expires by itself.
COMMIT_HOLD_PROPERTY = "lakestream.commit-hold"
HOLD_TTL_S = 120.0


def _position(message: Message) -> tuple[int, int]:
    """A consumed record's (partition, offset); a record without an error has both."""
    partition, offset = message.partition(), message.offset()
    if partition is None or offset is None:
        raise RuntimeError(f"a record of {message.topic()} came without its partition or offset")
    return partition, offset


@dataclass
class TopicWindow:
    """The table topic's change events from the low mark on, read incrementally: the keys each
    partition's row events touched, in offset order, and where the row events are."""

    kafka_conf: dict[str, Any]
    topic: str
    start: dict[int, int]  # partition → low mark (next offset the pipeline had to apply)
    key_columns: list[str]
    key_types: dict[str, Any]  # key column → Arrow type in the lake table
    decoder: Any  # lakestream.decode.records.RecordDecoder
    # A table without a key: the lake table's Arrow schema; each event's keys are then the contents of the rows
    # it removes and adds (`index.row_keys`), as the multiset index identifies rows.
    content_schema: Any = None
    next: dict[int, int] = field(default_factory=dict)
    offsets: dict[int, list[np.ndarray]] = field(default_factory=dict)  # row events' offsets
    keys: dict[int, list[np.ndarray]] = field(default_factory=dict)  # their index keys
    deletes: dict[int, list[np.ndarray]] = field(default_factory=dict)  # whether each is a delete
    truncates: dict[int, list[int]] = field(default_factory=dict)

    def read_to_end(self, partitions: list[int]) -> dict[int, int]:
        """Read every partition up to its current end; returns the ends (next offsets)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        for p in partitions:
            self.next.setdefault(p, self.start.get(p, 0))
        consumer = Consumer(
            {
                **self.kafka_conf,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "allow.auto.create.topics": False,
            }
        )
        try:
            # A partition (or the whole topic) that does not exist yet holds no event: nothing to read.
            meta = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            existing = set(meta.partitions) if meta is not None and meta.error is None else set()
            # The ends as of now: under a live producer a consumer may never see end-of-partition (each fetch
            # finds a few new records), so the read stops at these offsets, or at end-of-partition.
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in partitions
                if p in existing
            }
            open_parts = {p for p, end in ends.items() if self.next[p] < end}
            consumer.assign([TopicPartition(self.topic, p, self.next[p]) for p in sorted(open_parts)])
            deadline = time.monotonic() + 60
            while open_parts:
                messages = consumer.consume(5000, timeout=1.0)
                if not messages and time.monotonic() > deadline:
                    raise TimeoutError(f"reading {self.topic} partitions {sorted(open_parts)} stalled")
                rows: dict[int, list[Any]] = {}
                for m in messages:
                    error = m.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            open_parts.discard(m.partition())
                            continue
                        raise RuntimeError(f"reading {self.topic}: {error}")
                    deadline = time.monotonic() + 60
                    partition, offset = _position(m)
                    self.next[partition] = offset + 1
                    rows.setdefault(partition, []).append(m)
                for p, msgs in rows.items():
                    self._add(p, msgs)
                open_parts = {p for p in open_parts if self.next[p] < ends[p]}
        finally:
            consumer.close()
        return {p: self.next[p] for p in partitions}

    def _add(self, partition: int, messages: list[Any]) -> None:
        import pyarrow as pa

        from lakestream.decode.envelope import TRUNCATE
        from lakestream.sink.index.keys import index_keys
        from lakestream.source.reader import RawRecord

        if self.content_schema is not None:
            self._add_contents(partition, messages)
            return
        offsets, deletes = [], []
        values: dict[str, list[Any]] = {k: [] for k in self.key_columns}
        for m in messages:
            rec = RawRecord(m.topic(), partition, m.offset(), 0, m.key(), m.value(), m.headers())
            decoded = self.decoder.decode(rec)
            if decoded is None or decoded.op == "m":
                continue  # tombstones and messages change no row
            if decoded.op == TRUNCATE:
                self.truncates.setdefault(partition, []).append(m.offset())
                continue
            offsets.append(m.offset())
            deletes.append(decoded.op == "d")
            for k in self.key_columns:
                values[k].append(decoded.row[k])
        if offsets:
            table = pa.table({k: pa.array(v, self.key_types[k]) for k, v in values.items()})
            self.offsets.setdefault(partition, []).append(np.array(offsets, np.int64))
            self.keys.setdefault(partition, []).append(index_keys(table, self.key_columns))
            self.deletes.setdefault(partition, []).append(np.array(deletes, bool))

    def _add_contents(self, partition: int, messages: list[Any]) -> None:
        """A table without a key: an insert touches its new row's content, a delete its old row's, an update
        both. None counts as a delete: the contents' copies the stream left are kept as they are."""
        from lakestream.decode.envelope import TRUNCATE
        from lakestream.sink.index.keys import row_keys
        from lakestream.sink.write.convert import convert_rows
        from lakestream.source.reader import RawRecord

        offsets, rows = [], []
        for m in messages:
            decoded = self.decoder.decode(
                RawRecord(m.topic(), partition, m.offset(), 0, m.key(), m.value(), m.headers())
            )
            if decoded is None or decoded.op == "m":
                continue
            if decoded.op == TRUNCATE:
                self.truncates.setdefault(partition, []).append(m.offset())
                continue
            touched = [decoded.row] if decoded.op != "u" or decoded.old_row is None else [decoded.old_row, decoded.row]
            offsets.extend([m.offset()] * len(touched))
            rows.extend(touched)
        if offsets:
            typed, _bad = convert_rows(rows, self.content_schema)
            if _bad:  # a value the lake cannot hold was a dead letter: it touched no row of the mirror
                keep = [i for i in range(len(rows)) if i not in _bad]
                offsets = [offsets[i] for i in keep]
            self.offsets.setdefault(partition, []).append(np.array(offsets, np.int64))
            self.keys.setdefault(partition, []).append(row_keys(typed, self.content_schema))
            self.deletes.setdefault(partition, []).append(np.zeros(len(offsets), bool))

    def _concat(self, partition: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        offs = self.offsets.get(partition)
        if not offs:
            return np.empty(0, np.int64), None, None
        return np.concatenate(offs), np.concatenate(self.keys[partition]), np.concatenate(self.deletes[partition])

    def rows_pending(self, committed: dict[int, int], ends: dict[int, int]) -> bool:
        """Whether a row event below ``ends`` is not yet applied (at or past ``committed``)."""
        for p, end in ends.items():
            offs, _, _ = self._concat(p)
            if np.any((offs >= committed.get(p, 0)) & (offs < end)):
                return True
            if any(committed.get(p, 0) <= o < end for o in self.truncates.get(p, [])):
                return True
        return False

    def truncated_before(self, committed: dict[int, int]) -> bool:
        return any(o < committed.get(p, 0) for p, offs in self.truncates.items() for o in offs)

    def changed_keys(self, committed: dict[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys with a row event in [low mark, committed) — the keys the pipeline changed after
        the low mark — and, for each, whether its last such event deleted it."""
        keys_parts, offs_parts, del_parts = [], [], []
        for p in self.next:
            offs, keys, deletes = self._concat(p)
            if keys is not None and deletes is not None:
                applied = offs < committed.get(p, 0)
                keys_parts.append(keys[applied])
                offs_parts.append(offs[applied])
                del_parts.append(deletes[applied])
        if not keys_parts or not sum(len(k) for k in keys_parts):
            return None
        keys, offs, deletes = np.concatenate(keys_parts), np.concatenate(offs_parts), np.concatenate(del_parts)
        # A key's events are all in one partition (Debezium keys by primary key): the last by offset wins.
        _, group = np.unique(keys, return_inverse=True)
        order = np.lexsort((offs, group))
        last = order[np.r_[group[order][1:] != group[order][:-1], True]]
        return keys[last], deletes[last]


def _committed_offsets(spark: SparkSession, ident: str, topic: str) -> dict[int, int]:
    from lakestream.runtime.spark import jvm_helper
    from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, decode_offsets

    raw = jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, OFFSETS_PROPERTY)
    return {tp.partition: off for tp, off in decode_offsets(raw).items() if tp.topic == topic}


def _hold_commits(spark: SparkSession, ident: str, owner: str, ttl_s: float) -> None:
    """Make other writers' commits of the table wait (``LakestreamSink.heldByOther``) for at most
    ``ttl_s``: a holder that dies is waited out, not forever."""
    from lakestream.identifiers import sql_string

    hold = orjson.dumps({"owner": owner, "until_ms": int((time.time() + ttl_s) * 1000)}).decode()
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({sql_string(COMMIT_HOLD_PROPERTY)} = {sql_string(hold)})")


def _release_commits(spark: SparkSession, ident: str, owner: str) -> None:
    from lakestream.identifiers import sql_string
    from lakestream.sink.catalog.sink import table_info

    ns, tbl = ident.split(".")[-2:]
    catalog = ident.split(".")[0]
    props = table_info(spark, catalog.strip("`"), ns.strip("`"), tbl.strip("`")).get("properties") or {}
    hold = props.get(COMMIT_HOLD_PROPERTY)
    if hold and orjson.loads(hold).get("owner") == owner:
        spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES IF EXISTS ({sql_string(COMMIT_HOLD_PROPERTY)})")


def _committed_run(spark: SparkSession, ident: str) -> str | None:
    from lakestream.runtime.spark import jvm_helper

    raw = jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, RESNAPSHOT_PROPERTY)
    return orjson.loads(raw).get("run") if raw else None


def registry_client(config: PipelineConfig) -> dict[str, Any] | None:
    """The Schema Registry client settings (secrets from the environment), or None without a registry."""
    registry = config.kafka.schema_registry
    return registry.client_config() if registry is not None else None


def _wait_for_running_transactions(conn: Any, timeout_s: float) -> None:
    """Wait until every transaction running now has ended.

    A transaction's commit record reaches the WAL (and so Debezium and Kafka) a moment before it
    becomes visible to new snapshots. Once every transaction running after the low mark was read has
    ended, every event below the low mark belongs to a transaction the next snapshot sees."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8")
        xmax = cur.fetchone()[0]
        deadline = time.monotonic() + timeout_s
        while True:
            cur.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8")
            if cur.fetchone()[0] >= xmax:
                return
            if time.monotonic() > deadline:
                from lakestream.snapshot.chunks import SnapshotError

                raise SnapshotError(
                    f"transactions older than the re-snapshot's start are still running after "
                    f"{timeout_s:.0f}s (see pg_stat_activity WHERE backend_xid IS NOT NULL) — fix: "
                    "end them, or run the re-snapshot again later"
                )
            time.sleep(0.05)


def _wait_confirmed(conn: Any, slot: str, lsn: int, timeout_s: float) -> None:
    """Wait until Debezium confirmed ``lsn`` on the slot: everything before it is in Kafka."""
    from lakestream.snapshot.chunks import SnapshotError

    deadline = time.monotonic() + timeout_s
    while True:
        state = slot_state(conn, slot)
        if not state.exists:
            raise SnapshotError(
                f"replication slot {slot} is gone — fix: start `lakestream capture` (it streams the "
                "table while it is re-snapshotted)"
            )
        if state.confirmed_flush_lsn is not None and state.confirmed_flush_lsn >= lsn:
            return
        if time.monotonic() > deadline:
            confirmed = "nothing" if state.confirmed_flush_lsn is None else int_to_lsn(state.confirmed_flush_lsn)
            raise SnapshotError(
                f"the capture did not stream slot {slot} past the re-snapshot's high mark "
                f"{int_to_lsn(lsn)} within {timeout_s:.0f}s (confirmed: {confirmed}) — fix: keep "
                "`lakestream capture` running during a re-snapshot"
            )
        time.sleep(0.2)


def _mark_text(mark: int | dict[str, Any]) -> str:
    """A high mark for logs and the commit's summary: an LSN, or ``binlog-file:position``."""
    return f"{mark['file']}:{mark['pos']}" if isinstance(mark, dict) else int_to_lsn(mark)


def _binlog_number(file: str) -> int:
    return int(file.rsplit(".", 1)[-1])


def published_binlog_position(config: PipelineConfig) -> dict[str, Any] | None:
    """The binlog position capture has published up to: the MariaDB connector's stored offset (the embedded
    engine stores it only after Kafka acknowledged the events before it; heartbeats move it on while the
    captured tables are idle). None before capture stored one."""
    import re

    from lakestream.capture.connector import offsets_file

    assert config.capture is not None
    path = offsets_file(Path(config.state_dir), config.capture)
    if not path.exists():
        return None
    # A Java-serialized map of byte arrays: the offset is the JSON object holding "file" and "pos".
    found = None
    for match in re.finditer(rb'\{[^{}]*"file"[^{}]*\}', path.read_bytes()):
        try:
            offset = orjson.loads(match.group(0))
        except orjson.JSONDecodeError:
            continue
        if "pos" in offset:
            found = offset
    return found


def _wait_binlog_published(config: PipelineConfig, mark: dict[str, Any], timeout_s: float) -> None:
    """Wait until capture published the binlog up to ``mark`` (the snapshot's position): every event the snapshot
    shows is in Kafka."""
    from lakestream.snapshot.chunks import SnapshotError

    want = (_binlog_number(mark["file"]), int(mark["pos"]))
    deadline = time.monotonic() + timeout_s
    while True:
        offset = published_binlog_position(config)
        if offset is not None and (_binlog_number(offset["file"]), int(offset["pos"])) >= want:
            return
        if time.monotonic() > deadline:
            seen = "nothing" if offset is None else f"{offset['file']}:{offset['pos']}"
            raise SnapshotError(
                f"the capture did not publish the binlog past the re-snapshot's position "
                f"{_mark_text(mark)} within {timeout_s:.0f}s (stored: {seen}) — fix: keep `lakestream "
                "capture` running during a re-snapshot (its heartbeats move the stored position on "
                "while the tables are idle)"
            )
        time.sleep(0.2)


def _read_mariadb_table(
    spark: SparkSession,
    config: PipelineConfig,
    name: str,
    source: Any,
    lake: str,
    ident: str,
    topic: str,
    spec: Any,
    window: TopicWindow,
    chunk_rows: int | None,
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None,
) -> _Planned:
    """Step 2 for MariaDB: consistent-snapshot sessions at one binlog position read the chunks; that position is
    the high mark (every transaction before it is in the snapshot, every one after it in the stream)."""
    from lakestream.sink.types import arrow_schema
    from lakestream.snapshot.chunks import load_chunks
    from lakestream.snapshot.mariadb import ConsistentSnapshot

    capture = captured(config)
    sessions = parallelism or capture.snapshot_parallelism or spark.sparkContext.defaultParallelism
    parsed = SourceTableName.parse(name)
    with ConsistentSnapshot(config, [parsed], sessions) as snapshot:
        source, _ = snapshot.describe(parsed)  # as the snapshot sees it
        plan = snapshot.plan(source, chunk_rows or capture.snapshot_chunk_rows)
        work, results, collect = _chunk_work(name, lake, ident, source, spec, plan)
        progress = work[name].progress
        load_chunks(
            spark,
            config,
            "",
            "",
            work,
            snapshot.position,
            sessions,
            progress_interval_s,
            on_progress,
            commit=collect,
            task=snapshot.task,
        )
        mark = snapshot.position
    return _Planned(
        name,
        lake,
        ident,
        topic,
        list(source.key),
        source.integer_key,
        results,
        mark,
        window,
        progress,
        arrow_schema(spec.schema),
    )


@dataclass
class _Planned:
    """One table's re-snapshot, read and waiting to be committed."""

    name: str
    lake: str
    ident: str
    topic: str
    key_columns: list[str]  # empty: a table without a key (the mirror is a row multiset)
    integer_key: bool
    results: list[ChunkResult]
    high_lsn: int | dict[str, Any]  # PostgreSQL: the LSN; MariaDB: the snapshot's binlog position {file, pos, gtids}
    window: TopicWindow
    progress: TableProgress
    schema: Any  # the chunks' Arrow schema: the columns a row's content digest covers
    rewritten: set[str] = field(default_factory=set)  # new files rewritten with lineage columns (`keep_row_ids`)


def resnapshot_tables(
    config: PipelineConfig,
    tables: list[str],
    spark: SparkSession | None = None,
    *,
    chunk_rows: int | None = None,
    parallelism: int | None = None,
    progress_interval_s: float = 5.0,
    on_progress: Callable[[list[TableProgress]], Any] | None = None,
    wait_timeout_s: float = 600.0,
) -> SnapshotReport:
    """Read ``tables`` again from the source (PostgreSQL or MariaDB) in parallel and make their mirrors equal to
    the result (rows already equal left alone), while `lakestream capture` and `lakestream run` keep streaming
    them (see the module doc).

    Needs both running: the commit waits until the pipeline has applied every change the snapshot
    shows. Nothing is committed before the end: a run that stops midway leaves the mirror as it was
    (and unreferenced data files for `remove_orphan_files`); run it again."""
    from lakestream.engine.registry import TableRegistry
    from lakestream.runtime.spark import session_for
    from lakestream.snapshot.chunks import SnapshotError, source_dsn
    from lakestream.source.kafka import KafkaCluster

    capture = captured(config)
    if not capture.schemas_enabled:
        raise ConfigError("capture.schemas_enabled: the re-snapshot needs Debezium's schemas — fix: set it to true")
    if not tables:
        raise ConfigError("name the tables to re-snapshot (SCHEMA.TABLE ...)")
    tables = [str(SourceTableName.parse(t)) for t in tables]
    unknown = [t for t in tables if t not in capture.tables]
    if unknown:
        raise ConfigError(
            f"{unknown} not in capture.tables {capture.tables} — fix: name a captured table (a table "
            "must be captured, and its mirror exist, before it can be re-snapshotted)"
        )
    started = time.monotonic()
    mariadb = capture.database.kind == "mariadb"
    dsn = "" if mariadb else source_dsn(config)
    conn = None if mariadb else psycopg2.connect(dsn)
    kafka = None
    try:
        if mariadb:
            from lakestream.capture.connector import offsets_file

            stored = offsets_file(Path(config.state_dir), capture)
            if not stored.exists():
                raise SnapshotError(
                    f"capture has no stored binlog position ({stored}): nothing streams the tables — "
                    "fix: run `lakestream capture` first (a re-snapshot repairs a mirror that "
                    "streams)"
                )
        elif conn is not None:
            conn.autocommit = True
            if not slot_state(conn, capture.slot_name).exists:
                raise SnapshotError(
                    f"replication slot {capture.slot_name} does not exist: nothing streams the tables "
                    "— fix: run `lakestream capture` first (a re-snapshot repairs a mirror that "
                    "streams)"
                )
        spark = spark or session_for(config)
        registry = TableRegistry.for_config(config, spark)
        kafka = KafkaCluster(config.kafka)
        progresses = []
        progress_marks: list[int | dict[str, Any]] = []
        for name in tables:
            planned = _read_table(
                spark,
                config,
                registry,
                kafka,
                conn,
                dsn,
                name,
                chunk_rows,
                parallelism,
                progress_interval_s,
                on_progress,
                wait_timeout_s,
            )
            _commit(spark, config, conn, kafka, planned, wait_timeout_s)
            progresses.append(planned.progress)
            progress_marks.append(planned.high_lsn)
        if conn is None:
            lsn = _mark_text(progress_marks[-1]) if progress_marks else ""
        else:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn()::text")
                lsn = one_row(cur)[0]
        return SnapshotReport(capture.slot_name, lsn, progresses, time.monotonic() - started, resnapshot=True)
    finally:
        if kafka is not None:
            kafka.close()
        if conn is not None:
            conn.close()


def _read_table(
    spark: SparkSession,
    config: PipelineConfig,
    registry: TableRegistry,
    kafka: Any,
    conn: Any,
    dsn: str,
    name: str,
    chunk_rows: int | None,
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None,
    wait_timeout_s: float,
) -> _Planned:
    """Steps 1-2: the low mark, the snapshot, the chunks read and written (not committed), the high mark.
    ``conn``: the PostgreSQL source's connection; None for a MariaDB source."""
    source = _describe_source(config, conn, name)
    mirror = _prepare_mirror(spark, config, registry, name, source)
    window = _open_window(spark, config, kafka, conn, mirror, source, wait_timeout_s)
    if conn is None:
        return _read_mariadb_table(
            spark,
            config,
            name,
            source,
            mirror.lake,
            mirror.ident,
            mirror.topic,
            mirror.spec,
            window,
            chunk_rows,
            parallelism,
            progress_interval_s,
            on_progress,
        )
    return _read_postgresql_table(
        spark,
        config,
        conn,
        dsn,
        name,
        source,
        mirror,
        window,
        chunk_rows,
        parallelism,
        progress_interval_s,
        on_progress,
    )


@dataclass
class _Mirror:
    """The mirror a table's re-snapshot replaces rows of, prepared for the source's columns."""

    topic: str
    lake: str
    ident: str
    spec: TableSpec
    schema: Any  # the mirror's Arrow schema
    router: Router


def _describe_source(config: PipelineConfig, conn: Any, name: str) -> SourceTable:
    """The source table's columns and key as they are now (``conn`` None: a MariaDB source)."""
    from lakestream.snapshot.source import describe_table

    parsed = SourceTableName.parse(name)
    if conn is not None:
        return describe_table(conn, parsed.schema, parsed.table)
    from lakestream.capture.mariadb_connection import source_connection
    from lakestream.snapshot.mariadb import describe_table as describe_mariadb_table

    probe = source_connection(captured(config))
    try:
        with probe.cursor() as cur:
            return describe_mariadb_table(cur, parsed.schema, parsed.table)
    finally:
        probe.close()


def _prepare_mirror(
    spark: SparkSession, config: PipelineConfig, registry: TableRegistry, name: str, source: SourceTable
) -> _Mirror:
    """The table's mirror, prepared for the source's columns; SnapshotError when it does not exist yet (nothing to
    repair) or is keyed otherwise than the source."""
    from lakestream.routing import Router
    from lakestream.sink.catalog.sink import table_info
    from lakestream.sink.report import NewShape
    from lakestream.sink.types import arrow_schema
    from lakestream.snapshot.chunks import SnapshotError

    topic = captured(config).topic(SourceTableName.parse(name))
    router = Router.from_config(config)
    stream, lake_name = router.route(topic)
    require_upsert(topic, stream, "a re-snapshot replaces upsert mirrors")
    lake = str(lake_name)
    ident = registry.catalog.ident(lake_name.namespace, lake_name.table)
    info = table_info(spark, config.catalog.name, lake_name.namespace, lake_name.table)
    if not info["exists"] or info.get("snapshot_id") is None:
        raise SnapshotError(
            f"{name} has no mirror yet ({lake} is missing or empty) — fix: load it first: "
            "`lakestream snapshot` before `lakestream capture` (capture.snapshot: parallel), or let "
            "`lakestream run` apply Debezium's snapshot"
        )
    shape = NewShape(
        lake, topic, f"snapshot:{name}", [(c.name, c.ddl) for c in source.columns], list(source.key), False
    )
    registry.prepare_table(lake, [shape], stream)
    spec = registry.specs[lake]
    if list(spec.key_columns) != list(source.key):
        raise SnapshotError(
            f"{lake} is keyed by {spec.key_columns}, the source {name} by {source.key} — fix: "
            "re-create the mirror with the source's primary key"
        )
    return _Mirror(topic, lake, ident, spec, arrow_schema(spec.schema), router)


def _open_window(
    spark: SparkSession,
    config: PipelineConfig,
    kafka: Any,
    conn: Any,
    mirror: _Mirror,
    source: SourceTable,
    wait_timeout_s: float,
) -> TopicWindow:
    """Step 1: the low mark (the offsets the mirror's last commit applied), then every transaction running at
    that instant must end; the topic's events from the low mark on."""
    from lakestream.decode.records import RecordDecoder

    partitions = [tp.partition for tp in kafka.partitions_of(lambda t: t == mirror.topic)] or [0]
    low = _committed_offsets(spark, mirror.ident, mirror.topic)
    if conn is not None:
        # (MariaDB: an event in Kafka was in the binlog, and a consistent snapshot started later holds every
        # transaction before its binlog position.)
        _wait_for_running_transactions(conn, wait_timeout_s)
    return TopicWindow(
        config.kafka.consumer_config(),
        mirror.topic,
        {p: low.get(p, 0) for p in partitions},
        list(source.key),
        {k: mirror.schema.field(k).type for k in source.key},
        RecordDecoder(mirror.router, registry_client(config)),
        mirror.schema if source.keyless else None,
    )


def _read_postgresql_table(
    spark: SparkSession,
    config: PipelineConfig,
    conn: Any,
    dsn: str,
    name: str,
    source: SourceTable,
    mirror: _Mirror,
    window: TopicWindow,
    chunk_rows: int | None,
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None,
) -> _Planned:
    """Step 2 for PostgreSQL: the snapshot S exported, and the high mark written to the WAL right after it; the
    chunks read under S."""
    from lakestream.capture.connector import HEARTBEAT_MESSAGE_PREFIX
    from lakestream.snapshot.chunks import load_chunks, plan_under

    capture = captured(config)
    with ExportedSnapshot(dsn) as snapshot:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_logical_emit_message(false, %s, %s)::text",
                (HEARTBEAT_MESSAGE_PREFIX, f"lakestream re-snapshot of {name}"),
            )
            high_lsn = lsn_to_int(one_row(cur)[0])
        plan = plan_under(dsn, snapshot.snapshot_name, source, chunk_rows or capture.snapshot_chunk_rows)
        work, results, collect = _chunk_work(name, mirror.lake, mirror.ident, source, mirror.spec, plan)
        progress = work[name].progress
        load_chunks(
            spark,
            config,
            dsn,
            snapshot.snapshot_name,
            work,
            0,
            parallelism or capture.snapshot_parallelism,
            progress_interval_s,
            on_progress,
            commit=collect,
        )
    return _Planned(
        name,
        mirror.lake,
        mirror.ident,
        mirror.topic,
        list(source.key),
        source.integer_key,
        results,
        high_lsn,
        window,
        progress,
        mirror.schema,
    )


def _chunk_work(
    name: str, lake: str, ident: str, source: SourceTable, spec: TableSpec, plan: ChunkPlan
) -> tuple[dict[str, SnapshotTable], list[ChunkResult], Callable[[SnapshotTable, list[ChunkResult]], None]]:
    """The one table a re-snapshot reads, for `load_chunks`: its work entry (nothing committed, the chunks' keys
    reported), the list every chunk's result goes into (uncommitted: the repair commits them in one), and the
    ``commit`` callback that fills it and advances the table's progress."""
    from lakestream.snapshot.chunks import SnapshotTable

    progress = TableProgress(name, lake, len(plan.chunks))
    target = ChunkTarget(lake, spec.schema, spec.partition_spec, spec.data_location, report_keys=True)
    work = {name: SnapshotTable(source, lake, ident, target, plan, set(), None, progress)}
    results: list[ChunkResult] = []

    def collect(w: SnapshotTable, done: list[ChunkResult]) -> None:
        results.extend(done)
        w.done |= {r.chunk_id for r in done}
        w.progress.chunks_done = len(w.done)
        w.progress.rows += sum(r.rows for r in done)
        if len(w.done) == len(w.plan.chunks):
            w.progress.finished = time.monotonic()

    return work, results, collect


def _commit(
    spark: SparkSession, config: PipelineConfig, conn: Any, kafka: Any, planned: _Planned, wait_timeout_s: float
) -> None:
    """Steps 3-4: wait for the pipeline to pass the high mark, then repair the mirror in one commit."""
    from lakestream.snapshot.chunks import SnapshotError

    partitions, high = _wait_for_high_mark(config, conn, kafka, planned, wait_timeout_s)
    deadline = time.monotonic() + wait_timeout_s
    _wait_until_applied(spark, planned, partitions, high, deadline, wait_timeout_s)
    chunks = _ChunkOutput.of(planned)
    mirror = _mirror_rows(spark, config, planned)
    committing = time.monotonic()
    ns, tbl = planned.lake.split(".", 1)
    mirror.rebuild(spark, planned.ident, _current_snapshot(spark, config, ns, tbl))
    attempts = 0
    run_id = uuid.uuid4().hex
    try:
        while True:
            # The pipeline's next commits of this table wait while we plan and commit (see the
            # module doc); one already past that check may still land, and then we plan again.
            _hold_commits(spark, planned.ident, run_id, HOLD_TTL_S)
            base = _current_snapshot(spark, config, ns, tbl)
            committed = _committed_offsets(spark, planned.ident, planned.topic)  # read after `base`: at or past it
            planned.window.read_to_end(sorted(set(partitions) | set(committed)))
            if planned.window.truncated_before(committed):
                raise SnapshotError(
                    f"{planned.name} was truncated while it was re-snapshotted; nothing was committed "
                    "— fix: run the re-snapshot again"
                )
            changed = planned.window.changed_keys(committed)
            if mirror.snapshot_id != base:
                mirror.rebuild(spark, planned.ident, base)
            result = _commit_once(spark, config, planned, mirror, changed, base, committed, high, chunks, run_id)
            attempts += 1
            if result is not None:
                log.info(
                    "re-snapshot of %s committed as snapshot %s after %d attempt(s), %.2fs from the mirror's scan: %s",
                    planned.name,
                    result["snapshot_id"],
                    attempts,
                    time.monotonic() - committing,
                    result["state"],
                )
                planned.progress.rows = result["state"]["rows"]
                return
            if time.monotonic() > deadline:
                raise SnapshotError(
                    f"{planned.lake} kept moving under the re-snapshot's commit ({attempts} attempts "
                    f"in {wait_timeout_s:.0f}s) — fix: run it again"
                )
    finally:
        _release_commits(spark, planned.ident, run_id)


def _current_snapshot(spark: SparkSession, config: PipelineConfig, ns: str, tbl: str) -> int | None:
    """The table's current Iceberg snapshot id (None: no snapshot yet)."""
    from lakestream.sink.catalog.sink import table_info

    return table_info(spark, config.catalog.name, ns, tbl).get("snapshot_id")


def _wait_for_high_mark(
    config: PipelineConfig, conn: Any, kafka: Any, planned: _Planned, wait_timeout_s: float
) -> tuple[list[int], dict[int, int]]:
    """Step 3: wait until capture has published the high mark; the topic's partitions and their ends then (every
    event the snapshot shows is in Kafka below these ends)."""
    waited = time.monotonic()
    if isinstance(planned.high_lsn, dict):
        _wait_binlog_published(config, planned.high_lsn, wait_timeout_s)
    else:
        _wait_confirmed(conn, captured(config).slot_name, planned.high_lsn, wait_timeout_s)
    partitions = [tp.partition for tp in kafka.partitions_of(lambda t: t == planned.topic)] or [0]
    high = planned.window.read_to_end(partitions)
    log.info(
        "re-snapshot of %s: high mark %s in Kafka at %s after %.1fs",
        planned.name,
        _mark_text(planned.high_lsn),
        high,
        time.monotonic() - waited,
    )
    return partitions, high


def _wait_until_applied(
    spark: SparkSession,
    planned: _Planned,
    partitions: list[int],
    high: dict[int, int],
    deadline: float,
    wait_timeout_s: float,
) -> None:
    """Without holding anything: wait until the pipeline applied every row event below the high mark."""
    from lakestream.snapshot.chunks import SnapshotError

    while True:
        committed = _committed_offsets(spark, planned.ident, planned.topic)
        planned.window.read_to_end(sorted(set(partitions) | set(committed)))
        if not planned.window.rows_pending(committed, high):
            return
        if time.monotonic() > deadline:
            raise SnapshotError(
                f"the pipeline did not apply {planned.topic} up to the re-snapshot's high mark "
                f"{high} within {wait_timeout_s:.0f}s (committed: {committed}) — fix: keep "
                "`lakestream run` running during a re-snapshot, then run it again"
            )
        time.sleep(0.5)


def _mirror_rows(spark: SparkSession, config: PipelineConfig, planned: _Planned) -> Any:
    """What the commit compares the snapshot with (not scanned yet). A table without a key: its rows by content,
    as the pipeline's multiset index holds them. A keyed one: its rows' keys and content digests, to leave the
    rows equal to the snapshot's alone (`compare`)."""
    from lakestream.sink.catalog.sink import table_info
    from lakestream.sink.index.keyless import KeylessIndex
    from lakestream.sink.types import arrow_schema
    from lakestream.snapshot.compare import MirrorRows

    if planned.key_columns:
        return MirrorRows(planned.key_columns, not planned.integer_key, planned.schema)
    ns, tbl = planned.lake.split(".", 1)
    return KeylessIndex(arrow_schema(table_info(spark, config.catalog.name, ns, tbl)["schema"]))


@dataclass
class _ChunkOutput:
    """What the snapshot's chunks wrote: their files, and each file's row keys and content digests."""

    files: list[dict[str, Any]]
    keys: list[np.ndarray]
    digests: list[np.ndarray]
    all_keys: np.ndarray  # every row's key, in one array

    @classmethod
    def of(cls, planned: _Planned) -> _ChunkOutput:
        files = [f for r in planned.results for f in r.files]
        keys = [k for r in planned.results for k in (r.keys or [])]
        digests = [d for r in planned.results for d in (r.digests or [])]
        all_keys = np.concatenate(keys) if keys else np.empty(0, np.int64 if planned.integer_key else "S16")
        return cls(files, keys, digests, all_keys)


def _keep_newest_only(spark: SparkSession, ident: str, mirror: Any, keep: np.ndarray) -> None:
    """Among kept rows, a key with several rows (a duplicate made by hand) keeps only the row written
    last — the one the stream's latest change wrote: the highest data sequence number, then position."""
    from lakestream.sink.index.keys import unpack

    kept = np.flatnonzero(keep)
    if len(kept) < 2:
        return
    keys = mirror.keys[kept]  # sorted: duplicates are neighbours
    if not np.any(keys[1:] == keys[:-1]):
        return
    # The table is at the commit's base snapshot (the commit fails otherwise).
    sequences = {
        r[0]: int(r[1])
        for r in spark.sql(
            f"SELECT data_file.file_path, sequence_number FROM {ident}.entries WHERE status < 2"
        ).collect()
    }
    file_ids, positions = unpack(mirror.locs[kept])
    rank = np.array([sequences.get(mirror.paths[int(f)], 0) for f in file_ids], np.int64)
    _, group = np.unique(keys, return_inverse=True)
    order = np.lexsort((positions, rank, group))
    last = np.r_[group[order][1:] != group[order][:-1], True]
    keep[kept[order[~last]]] = False


def _copies_of(mirror: Any, contents: np.ndarray) -> np.ndarray:
    """Which rows of a keyless mirror (`KeylessIndex`, rows in its copy-key order) hold one of
    ``contents``: all copies of each."""
    from lakestream.sink.index.keyless import copy_keys
    from lakestream.sink.index.keys import MISSING

    keep = np.zeros(len(mirror.rows.keys), bool)
    if not len(contents) or not len(keep):
        return keep
    counts = mirror.counts.lookup(np.unique(contents))
    present = counts != MISSING
    hashes, counts = np.unique(contents)[present], counts[present]
    if not len(hashes):
        return keep
    ordinals = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    copies = copy_keys(np.repeat(hashes, counts), ordinals)
    keep[np.isin(mirror.rows.keys, copies)] = True
    return keep


def _commit_once(
    spark: SparkSession,
    config: PipelineConfig,
    planned: _Planned,
    mirror: Any,
    changed: tuple[np.ndarray, np.ndarray] | None,
    base: int | None,
    committed: dict[int, int],
    high: dict[int, int],
    chunks: _ChunkOutput,
    run_id: str,
) -> dict[str, Any] | None:
    """One commit attempt on top of ``base``: the new snapshot's id and state, or None if another
    commit got there first."""
    from lakestream.sink.commit.lineage import StaleLineage
    from lakestream.snapshot.compare import keep_row_ids

    ns, tbl = planned.lake.split(".", 1)
    plan = _plan_replacement(spark, planned, mirror, changed, chunks)
    deletes = _mirror_deletes(mirror, plan)
    # A changed row keeps the id of the mirror row it replaces (an update); the others get new ones.
    if base is not None and (plan.match.updated or planned.rewritten):
        try:
            keep_row_ids(
                spark,
                config.catalog.name,
                ns,
                tbl,
                base,
                mirror.paths,
                chunks.files,
                plan.match.replaces,
                planned.rewritten,
            )
        except StaleLineage as exc:
            log.info("re-snapshot of %s: %s; planning the commit again", planned.name, exc)
            return None
    added, skipped = _files_to_add(chunks, plan, deletes)
    state = {
        "run": run_id,
        "table": planned.name,
        "rows": int(len(chunks.all_keys) - skipped),
        "stream_kept": skipped,
        "stream_deleted": len(plan.w_deleted) if changed is not None else 0,
        "duplicates_dropped": plan.duplicates,
        "replaced": int((~plan.match.keep).sum()),
        "unchanged": plan.match.unchanged,
        "updated": plan.match.updated,
        "added": int(len(chunks.all_keys) - skipped - plan.match.unchanged),
        "chunks": planned.progress.chunks_total,
        "low": {str(p): o for p, o in planned.window.start.items()},
        "committed": {str(p): o for p, o in committed.items()},
        "high": {str(p): o for p, o in high.items()},
        "high_lsn": _mark_text(planned.high_lsn),
    }
    result = _send_commit(spark, config, planned, base, added, deletes, state, run_id)
    if result is None:
        return None
    in_commit = {f["path"] for f in added}
    _remove_unused([f["path"] for f in chunks.files if f["path"] not in in_commit])
    return {"snapshot_id": result["snapshot_id"], "state": state}


@dataclass
class _Replacement:
    """Which mirror rows stay and which snapshot rows come in (`compare`'s match), given the keys the stream
    changed inside the window (W)."""

    match: Any
    locs: np.ndarray  # the mirror rows' locations, in the match's order
    w_keys: np.ndarray
    w_deleted: np.ndarray
    duplicates: int  # rows of a key duplicated by hand that the stream's newest row replaces


def _plan_replacement(
    spark: SparkSession,
    planned: _Planned,
    mirror: Any,
    changed: tuple[np.ndarray, np.ndarray] | None,
    chunks: _ChunkOutput,
) -> _Replacement:
    """The rows of the keys the stream changed inside the window (W) stay as the stream left them: none if its
    last change deleted the key, else only the newest row (the stream's) should the key have been duplicated by
    hand; the snapshot's rows of those keys do not come in. Outside W the snapshot's row is the key's: a mirror
    row equal to it stays (both lineage fields kept) and the snapshot's is not added; any other mirror row goes."""
    from lakestream.snapshot.compare import match_keyed, match_keyless

    if not planned.key_columns:
        # A row multiset: a content the stream changed keeps every copy the stream left of it.
        w_keys = changed[0] if changed is not None else np.empty(0, "S16")
        match = match_keyless(mirror, _copies_of(mirror, w_keys), w_keys, chunks.keys)
        return _Replacement(match, mirror.rows.locs, w_keys, w_keys[:0], 0)
    w_keys = changed[0] if changed is not None else np.empty(0, mirror.keys.dtype)
    w_deleted = changed[0][changed[1]] if changed is not None else w_keys
    keep_old = np.isin(mirror.keys, w_keys) & ~np.isin(mirror.keys, w_deleted)
    duplicates = int(keep_old.sum())
    _keep_newest_only(spark, planned.ident, mirror, keep_old)
    duplicates -= int(keep_old.sum())
    match = match_keyed(mirror, keep_old, w_keys, chunks.keys, chunks.digests)
    return _Replacement(match, mirror.locs, w_keys, w_deleted, duplicates)


def _mirror_deletes(mirror: Any, plan: _Replacement) -> dict[str, list[np.ndarray]]:
    """The positions of the mirror rows that go, by data file."""
    from lakestream.sink.index.keys import unpack

    deletes: dict[str, list[np.ndarray]] = {}
    locs = plan.locs
    file_ids, positions = unpack(locs[~plan.match.keep & (locs >= 0)])
    for fid in np.unique(file_ids).tolist():
        deletes.setdefault(mirror.paths[fid], []).append(positions[file_ids == fid])
    return deletes


def _files_to_add(
    chunks: _ChunkOutput, plan: _Replacement, deletes: dict[str, list[np.ndarray]]
) -> tuple[list[dict[str, Any]], int]:
    """The snapshot's files the commit adds, and how many of its rows the stream's rows of W kept out. A new file
    none of whose rows comes in is left out of the commit; the others lose the rows that do not (into
    ``deletes``)."""
    added = []
    skipped = 0
    for f, drop, keys in zip(chunks.files, plan.match.drop, chunks.keys, strict=True):
        skipped += int(np.isin(keys[drop], plan.w_keys).sum()) if len(drop) else 0
        if len(drop) == int(f["record_count"]):
            continue
        added.append(f)
        if len(drop):
            deletes.setdefault(f["path"], []).append(drop)
    return added, skipped


def _send_commit(
    spark: SparkSession,
    config: PipelineConfig,
    planned: _Planned,
    base: int | None,
    added: list[dict[str, Any]],
    deletes: dict[str, list[np.ndarray]],
    state: dict[str, Any],
    run_id: str,
) -> dict[str, Any] | None:
    """Commit the files and deletes on top of ``base`` (holding the pipeline's commits as ``run_id``): what
    committed (the new ``snapshot_id``), or None when another commit got there first."""
    from lakestream.sink.catalog.sink import commit_files, table_info

    ns, tbl = planned.lake.split(".", 1)
    request: CommitRequest = {
        "base_snapshot_id": base,
        "expect_snapshot_id": base,
        "data_files": [
            {
                "path": f["path"],
                "file_size": f["file_size"],
                "record_count": f["record_count"],
                "partition": f["partition"],
            }
            for f in added
        ],
        "deletes": [
            {"data_file": path, "positions": np.unique(np.concatenate(parts))} for path, parts in deletes.items()
        ],
        "properties": {RESNAPSHOT_PROPERTY: orjson.dumps(state).decode()},
        "hold_owner": run_id,
    }
    try:
        result = commit_files(spark, config.catalog.name, ns, tbl, request)
    except Exception as exc:  # noqa: BLE001 — classified by the Java exception's class
        cause = conflict_cause(exc)
        if cause is None:
            raise
        if _committed_run(spark, planned.ident) != run_id:
            log.info("re-snapshot of %s: commit conflict (%s); planning it again", planned.name, cause)
            return None
        log.info("re-snapshot of %s: the commit landed despite %s", planned.name, cause)
        return {"snapshot_id": table_info(spark, config.catalog.name, ns, tbl).get("snapshot_id")}
    if result.get("stale"):
        log.info(
            "re-snapshot of %s: the table moved on (snapshot %s); planning the commit again",
            planned.name,
            result.get("snapshot_id"),
        )
        return None
    return dict(result)


def _remove_unused(paths: list[str]) -> None:
    """Delete the re-snapshot's data files its commit left out (every row equal to the mirror's, or the stream's):
    nothing references them. One that cannot be deleted is left to `remove_orphan_files`."""
    from lakestream.storage import filesystem_path

    for path in paths:
        try:
            fs, local = filesystem_path(path)
            fs.delete_file(local)
        except OSError as exc:
            log.warning("re-snapshot: could not delete the unused data file %s: %s", path, exc)
