"""The parallel initial load of a MariaDB source: chunks read under one consistent snapshot, converted and written
in Spark tasks, and the binlog position that snapshot corresponds to left for ``lakestream capture``.

MariaDB cannot hand one transaction's snapshot to other sessions (PostgreSQL exports it), but it tells each
session the binlog position its snapshot corresponds to: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` then, in the
same session, ``SHOW STATUS LIKE 'binlog_snapshot_%'`` (MariaDB takes both at one instant, without a lock: every
transaction committed before the position is in the snapshot, every one after it is not). Snapshots at the same
position therefore hold the same data: the load starts one per chunk thread and keeps those that share a position
(`ConsistentSnapshot`). Each chunk is read in a free session, rendered by the server as one JSON object per row;
the Spark tasks parse, convert and write it while the sessions read the next ones (`load_chunks` with a driver-side
`task`). No RELOAD grant and no lock: the sessions' metadata locks only hold back DDL on the tables being loaded,
until the load ends.

Debezium then starts at that position (`lakestream.capture.handover`): its offsets are seeded with the binlog file
and position, and its first start runs ``snapshot.mode=recovery`` (the tables' schemas into its history, no rows).
The schemas it records are the tables' as they are then; a table changed by DDL since the snapshot would be
misread from the binlog before the change, so capture refuses to start when a table's columns differ from those
the handover recorded.

The re-snapshot of a table while it streams reads it with the same sessions (`lakestream.snapshot.resnapshot`).

A run interrupted by a crash resumes as PostgreSQL's does (`lakestream.snapshot.postgresql`): the chunks committed stay,
the rest are read under a new snapshot, later, and the stream still starts at the first run's position; every
binlog row event holds the whole row and the mirror keeps the latest change per key, so the mirror converges. A
table without a primary key is one chunk, committed at once, so it is never resumed half-way.
"""

from __future__ import annotations

import io
import logging
import queue
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.json as pjson

from lakestream.capture.databases.mariadb import table_signature
from lakestream.capture.handover import handover_path, read_handover, write_handover
from lakestream.capture.source_columns import MARIADB_INTEGER_TYPES, mariadb_source_column
from lakestream.config import PipelineConfig
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.chunks import ChunkTask, SnapshotError, SnapshotTable, captured, load_chunks, table_work
from lakestream.snapshot.mirrors import RoutedTable, already_complete, interrupted_states, route_mirrors
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.reader import ChunkResult, ChunkTarget, hex_to_binary, write_chunk
from lakestream.snapshot.source import Chunk, ChunkPlan, SourceTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.engine.registry import TableRegistry

log = logging.getLogger(__name__)


def quote(name: str) -> str:
    """A MariaDB identifier, backquoted."""
    return "`" + name.replace("`", "``") + "`"


def describe_table(cur: Any, database: str, table: str) -> SourceTable:
    """The columns and primary key of ``database.table`` (a table without one: a row multiset)."""
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    rows = cur.fetchall()
    if not rows:
        raise SnapshotError(
            f"source table {database}.{table} does not exist (or the user cannot see it) — fix: "
            "create it, GRANT SELECT on it, or remove it from capture.tables"
        )
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
        (database, table),
    )
    key = [r[0] for r in cur.fetchall()]
    cur.execute(
        "SELECT COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (database, table),
    )
    estimated = int(cur.fetchone()[0])
    columns = [mariadb_source_column(*r) for r in rows]
    types = {r[0]: str(r[1]).lower() for r in rows}
    integer_key = len(key) == 1 and types[key[0]] in MARIADB_INTEGER_TYPES
    return SourceTable(database, table, columns, key, estimated, integer_key)


def chunk_query(source: SourceTable, chunk: Chunk) -> str:
    """``SELECT JSON_OBJECT(<rendered columns>) FROM t WHERE lower <= key < upper``: one JSON line per row."""
    pairs = ", ".join(
        f"'{col.name.replace(chr(39), chr(39) * 2)}', " + col.expression.replace("{c}", quote(col.name))
        for col in source.columns
    )
    where = []
    if source.key and chunk.lower is not None:
        where.append(f"{quote(source.key[0])} >= {int(chunk.lower[0])}")
    if source.key and chunk.upper is not None:
        where.append(f"{quote(source.key[0])} < {int(chunk.upper[0])}")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT JSON_OBJECT({pairs}) FROM {quote(source.schema)}.{quote(source.table)}{clause}"


def parse_json_chunk(data: bytes, source: SourceTable, arrow_schema: pa.Schema) -> pa.Table:
    """A chunk's JSON lines as a table in ``arrow_schema`` (strict: a value that does not convert fails)."""
    if not data:
        return arrow_schema.empty_table()
    read_schema = pa.schema([(c.name, c.read_type) for c in source.columns])
    parsed = pjson.read_json(
        io.BytesIO(data),
        read_options=pjson.ReadOptions(block_size=16 << 20),
        parse_options=pjson.ParseOptions(
            explicit_schema=read_schema, unexpected_field_behavior="ignore", newlines_in_values=False
        ),
    )
    hex_columns = {c.name for c in source.columns if c.hex_bytes}
    columns = []
    for f in arrow_schema:
        if f.name not in read_schema.names:  # a column the lake table has and the source no longer does
            columns.append(pa.nulls(parsed.num_rows, f.type))
            continue
        column = parsed.column(f.name)
        if f.name in hex_columns:
            column = hex_to_binary(column)
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            # '...Z' strings parse as UTC instants; the table's zone is UTC
            column = column.cast(pa.timestamp("us", tz="UTC"))
        columns.append(column.cast(f.type, safe=True))
    return pa.Table.from_arrays(columns, schema=arrow_schema)


def write_json_chunk(
    data: bytes, source: SourceTable, chunk: Chunk, target: ChunkTarget, read_seconds: float
) -> ChunkResult:
    """The Spark task: parse the rows the driver read and write them as the table's data files."""
    return write_chunk(data, parse_json_chunk, source, chunk, target, time.monotonic() - read_seconds)


class ConsistentSnapshot:
    """MariaDB sessions each holding ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` at one and the same binlog
    position, which is the handover point; each chunk is read in a free session by one of the driver's chunk threads
    (use as a context manager).

    MariaDB cannot share one transaction's snapshot between sessions, but it reports each snapshot's binlog position,
    and two snapshots at the same position hold the same committed transactions (every transaction that reaches the
    binlog moves the position). So ``sessions`` snapshots are started one after another; those at the position most
    of them share are kept, the others rolled back, and the whole start is tried again (``START_ATTEMPTS``) while
    writes keep them apart. Under a heavy write load the load may read with fewer sessions, at worst one: never a
    lock (no FLUSH TABLES WITH READ LOCK, no RELOAD grant)."""

    START_ATTEMPTS = 5

    def __init__(self, config: PipelineConfig, tables: list[SourceTableName], sessions: int = 1):
        from lakestream.capture.mariadb_connection import source_connection

        capture = captured(config)
        conns = [source_connection(capture) for _ in range(max(1, sessions))]
        kept: list[Any] = []
        try:
            for conn in conns:
                with conn.cursor() as cur:
                    # Rendering: timestamps in UTC, text in utf8mb4; REPEATABLE READ is what the snapshot holds on to.
                    cur.execute("SET SESSION time_zone = '+00:00'")
                    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for attempt in range(self.START_ATTEMPTS):
                positions = [_begin_snapshot(conn) for conn in conns]
                ((best, count),) = Counter(positions).most_common(1)
                if count == len(conns) or attempt == self.START_ATTEMPTS - 1:
                    break
                for conn in conns:
                    conn.rollback()
            kept = [conn for conn, position in zip(conns, positions, strict=True) if position == best]
        finally:
            for conn in conns:
                if conn not in kept:
                    conn.close()
        self.file, self.pos = best
        self.sessions = len(kept)
        self._free: queue.Queue[Any] = queue.Queue()
        try:
            with kept[0].cursor() as cur:
                # The GTID state at that position: Debezium's MariaDB connector asks the server for the stream by GTID.
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (self.file, self.pos))
                self.gtids = str(cur.fetchone()[0] or "")
            for conn in kept:
                # Touch every table inside each transaction: the metadata lock holds DDL on it back until the load
                # ends (a DDL committed since the snapshot began fails the read: "Table definition has changed").
                with conn.cursor() as cur:
                    for name in tables:
                        cur.execute(f"SELECT 1 FROM {quote(name.schema)}.{quote(name.table)} LIMIT 0")
                        cur.fetchall()
                self._free.put(conn)
        except BaseException:
            for conn in kept:
                conn.close()
            raise
        self._conns = kept
        log.info(
            "snapshot: %d of %d sessions share the consistent snapshot at binlog %s:%d (GTID %s)",
            len(kept),
            len(conns),
            self.file,
            self.pos,
            self.gtids,
        )

    @property
    def position(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtids": self.gtids}

    @contextmanager
    def _session(self) -> Iterator[Any]:
        """A cursor of a free session (waits for one)."""
        conn = self._free.get()
        try:
            with conn.cursor() as cur:
                yield cur
        finally:
            self._free.put(conn)

    def describe(self, name: SourceTableName) -> tuple[SourceTable, list[list[str]]]:
        with self._session() as cur:
            return describe_table(cur, name.schema, name.table), table_signature(cur, name.schema, name.table)

    def plan(self, source: SourceTable, chunk_rows: int) -> ChunkPlan:
        """Chunks of about ``chunk_rows`` rows: an integer primary key split evenly between its min and max as
        the snapshot sees them; any other table is one chunk."""
        bounds: list[int] = []
        if source.integer_key:
            key = quote(source.key[0])
            with self._session() as cur:
                cur.execute(
                    f"SELECT MIN({key}), MAX({key}), COUNT(*) FROM {quote(source.schema)}.{quote(source.table)}"
                )
                low, high, count = cur.fetchone()
            if count:
                pieces = max(1, round(int(count) / chunk_rows))
                step = max(1, -(-(int(high) - int(low) + 1) // pieces))
                bounds = list(range(int(low) + step, int(high) + 1, step))
        cuts: list[list[Any] | None] = [None, *([b] for b in bounds), None]
        return ChunkPlan(source.name, [Chunk(source.name, i, cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)])

    def task(self, w: SnapshotTable, chunk: Chunk) -> ChunkTask:
        """Read ``chunk`` in a free session (the chunk threads take turns when there are fewer sessions than
        threads) and give the Spark task that converts and writes it."""
        started = time.monotonic()
        with self._session() as cur:
            cur.execute(chunk_query(w.source, chunk))
            rows = cur.fetchall()
            # A value the server could not render (HEX() or JSON_OBJECT() longer than max_allowed_packet, ...) is
            # NULL with a warning: fail the chunk rather than load a NULL.
            cur.execute("SHOW WARNINGS LIMIT 3")
            warnings = [str(w[2]) for w in cur.fetchall()]
        if warnings or any(row[0] is None for row in rows):
            raise SnapshotError(
                f"{w.source.name} {chunk.describe(w.source)}: MariaDB could not render every value "
                f"({'; '.join(warnings) or 'a row is NULL'}) — fix: SET GLOBAL max_allowed_packet = "
                "1073741824 (the largest) if a value is too long, or snapshot this table with "
                "Debezium (capture.snapshot: debezium)"
            )
        data = b"\n".join(row[0].encode() for row in rows)
        return write_json_chunk, (data, w.source, chunk, w.target, time.monotonic() - started)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.rollback()
            finally:
                conn.close()

    def __enter__(self) -> ConsistentSnapshot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _begin_snapshot(conn: Any) -> tuple[str, int]:
    """Start the session's consistent snapshot; the binlog (file, position) it corresponds to."""
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
    file, pos = status.get("binlog_snapshot_file", ""), int(status.get("binlog_snapshot_position", "0") or 0)
    if not file:
        raise SnapshotError(
            "MariaDB reports no binlog position for the snapshot (the binary log is off) — fix: start "
            "MariaDB with log-bin, binlog_format=ROW and binlog_row_image=FULL"
        )
    return file, pos


def _binlog_lag(config: PipelineConfig, position: dict[str, Any]) -> int:
    """Binlog bytes written since ``position`` (what streaming reads first)."""
    from lakestream.capture.mariadb_connection import source_connection

    conn = source_connection(captured(config))
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
    finally:
        conn.close()
    names = [n for n, _ in logs]
    if position["file"] not in names:
        return 0
    after = logs[names.index(position["file"]) :]
    return max(0, sum(size for _, size in after) - int(position["pos"]))


def binlog_files(config: PipelineConfig) -> list[str]:
    from lakestream.capture.mariadb_connection import source_connection

    conn = source_connection(captured(config))
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [str(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()


def run_mariadb_snapshot(
    config: PipelineConfig,
    names: list[str],
    spark: SparkSession | None,
    *,
    chunk_rows: int,
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None = None,
) -> SnapshotReport:
    """`lakestream.snapshot.run_snapshot` for a MariaDB source (module doc)."""
    from lakestream.engine.registry import TableRegistry
    from lakestream.runtime.spark import session_for

    capture = captured(config)
    started = time.monotonic()
    finished = _finished_run(config, names)
    if finished is not None:
        return finished
    spark = spark or session_for(config)
    registry = TableRegistry.for_config(config, spark)
    routed = route_mirrors(config, registry, names)
    states = interrupted_states(spark, config, routed)
    resumed_at = _resume_position(config, states) if states else None
    sources = [SourceTableName.parse(n) for n in names]
    sessions = parallelism or capture.snapshot_parallelism or spark.sparkContext.defaultParallelism
    with ConsistentSnapshot(config, sources, sessions) as snapshot:
        position = resumed_at or snapshot.position
        handover_started = time.time()
        work, signatures = _tables_work(spark, config, registry, snapshot, routed, states, chunk_rows)
        load_chunks(
            spark,
            config,
            "",
            "",
            work,
            position,
            parallelism or capture.snapshot_parallelism,
            progress_interval_s,
            on_progress,
            task=snapshot.task,
        )
    position_text = f"{position['file']}:{position['pos']}"
    point = {"kind": "mariadb", "binlog": position, "lsn_text": position_text, "columns": signatures}
    write_handover(config.state_dir, capture, names, point)
    return SnapshotReport(
        capture.slot_name,
        position_text,
        [w.progress for w in work.values()],
        time.monotonic() - started,
        resumed_at is not None,
        False,
        _binlog_lag(config, position),
        time.time() - handover_started,
    )


def _finished_run(config: PipelineConfig, names: list[str]) -> SnapshotReport | None:
    """The report of a snapshot of ``names`` that finished already (nothing to do), None when none did;
    SnapshotError when the finished one lacks a table."""
    capture = captured(config)
    handover = read_handover(config.state_dir, capture)
    report = already_complete(capture, names, handover)
    if handover is not None and report is None:
        raise SnapshotError(
            f"the snapshot finished without {sorted(set(names) - set(handover['tables']))}; a table "
            "added after the handover cannot be loaded by it — fix: capture it with Debezium's "
            "snapshot under another capture.slot_name and topic_prefix, or start over (drop the lake "
            f"tables, delete {handover_path(config.state_dir, capture)} and the capture offsets)"
        )
    return report


def _resume_position(config: PipelineConfig, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The binlog position of the interrupted run whose chunks ``states`` hold; SnapshotError when that run
    cannot be resumed (runs mixed, or the binlog since its position purged)."""
    positions = {orjson.dumps(s["lsn"]) for s in states.values()}
    if len(positions) != 1 or not isinstance(next(iter(states.values()))["lsn"], dict):
        raise SnapshotError(
            "the lake tables were loaded by different snapshot runs; cannot resume — fix: drop "
            "the lake tables and snapshot again"
        )
    position: dict[str, Any] = next(iter(states.values()))["lsn"]
    if position["file"] not in binlog_files(config):
        raise SnapshotError(
            f"the interrupted snapshot's binlog position {position['file']}:{position['pos']} "
            "was purged, and with it the changes since — fix: drop the lake tables and snapshot "
            "again (and keep binlogs longer: binlog_expire_logs_seconds)"
        )
    return position


def _tables_work(
    spark: SparkSession,
    config: PipelineConfig,
    registry: TableRegistry,
    snapshot: ConsistentSnapshot,
    routed: dict[str, RoutedTable],
    states: dict[str, dict[str, Any]],
    chunk_rows: int,
) -> tuple[dict[str, SnapshotTable], dict[str, list[list[str]]]]:
    """Each table described in the snapshot, its mirror prepared and its chunks planned (or the interrupted run's
    plan kept), with the columns the handover records; SnapshotError for a keyless table the interrupted run
    had not finished."""
    work: dict[str, SnapshotTable] = {}
    signatures: dict[str, list[list[str]]] = {}
    for name, table in routed.items():
        source, signatures[name] = snapshot.describe(SourceTableName.parse(name))
        state = states.get(name)
        if states and source.keyless and not (state or {}).get("complete"):
            raise SnapshotError(
                f"the interrupted snapshot had not finished {name}, without a primary key: read "
                "later than the handover point, the changes made in between would be applied to "
                "it twice, and nothing tells a row from its equal copy — fix: drop the lake "
                "tables and snapshot again, or snapshot such tables with Debezium "
                "(capture.snapshot: debezium)"
            )
        work[name] = table_work(
            spark, config, registry, name, table, source, state, partial(snapshot.plan, source, chunk_rows)
        )
    return work, signatures
