"""The initial load of a PostgreSQL source's captured tables at Spark speed, with an exact handover to
Debezium's stream.

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

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg2

from lakestream.capture.handover import handover_path, read_handover, write_handover
from lakestream.config import CaptureSettings, PipelineConfig
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.chunks import SnapshotError, captured, load_chunks, plan_under, source_dsn, table_work
from lakestream.snapshot.mirrors import already_complete, interrupted_states, route_mirrors
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.slot import (
    ExportedSlot,
    ExportedSnapshot,
    ensure_publication,
    int_to_lsn,
    lsn_to_int,
    one_row,
    slot_state,
)
from lakestream.snapshot.source import SourceTable, describe_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_postgresql_snapshot(
    config: PipelineConfig,
    names: list[str],
    spark: SparkSession | None,
    *,
    chunk_rows: int,
    parallelism: int | None,
    progress_interval_s: float,
    on_progress: Callable[[list[TableProgress]], Any] | None = None,
) -> SnapshotReport:
    """`lakestream.snapshot.run_snapshot` for a PostgreSQL source (module doc)."""
    from lakestream.engine.registry import TableRegistry
    from lakestream.runtime.spark import session_for

    capture = captured(config)
    started = time.monotonic()
    dsn = source_dsn(config)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        finished = _finished_run(conn, config, names)
        if finished is not None:
            return finished
        spark = spark or session_for(config)
        registry = TableRegistry.for_config(config, spark)
        sources = {name: describe_table(conn, *_parts(name)) for name in names}
        routed = route_mirrors(config, registry, names)
        states = interrupted_states(spark, config, routed)
        resumed_at = _resume_point(conn, capture, sources, states) if states else None
        if resumed_at is None:
            _claim_slot(conn, capture, names)
        exported = ExportedSnapshot(dsn) if resumed_at is not None else ExportedSlot(dsn, capture.slot_name)
        with exported:
            handover_lsn = exported.lsn if resumed_at is None else resumed_at
            handover_started = time.time()
            work = {
                name: table_work(
                    spark,
                    config,
                    registry,
                    name,
                    routed[name],
                    sources[name],
                    states.get(name),
                    partial(plan_under, dsn, exported.snapshot_name, sources[name], chunk_rows),
                )
                for name in names
            }
            load_chunks(
                spark,
                config,
                dsn,
                exported.snapshot_name,
                work,
                handover_lsn,
                parallelism or capture.snapshot_parallelism,
                progress_interval_s,
                on_progress,
            )
        write_handover(config.state_dir, capture, names, {"lsn": handover_lsn, "lsn_text": int_to_lsn(handover_lsn)})
        return SnapshotReport(
            capture.slot_name,
            int_to_lsn(handover_lsn),
            [w.progress for w in work.values()],
            time.monotonic() - started,
            resumed_at is not None,
            False,
            _wal_since(conn, handover_lsn),
            time.time() - handover_started,
        )
    finally:
        conn.close()


def _parts(name: str) -> tuple[str, str]:
    """(schema, table) of a ``capture.tables`` entry, as PostgreSQL has them."""
    parsed = SourceTableName.parse(name)
    return parsed.schema, parsed.table


def _finished_run(conn: Any, config: PipelineConfig, names: list[str]) -> SnapshotReport | None:
    """The report of a snapshot of ``names`` that finished already (nothing to do), None when none did;
    SnapshotError when the finished one cannot be built on (its slot is gone, or it lacks a table)."""
    capture = captured(config)
    handover = read_handover(config.state_dir, capture)
    if handover is None:
        return None
    if not slot_state(conn, capture.slot_name).exists:
        raise SnapshotError(
            f"a snapshot finished for slot {capture.slot_name}, but the slot is gone — fix: to load "
            f"again, drop the lake tables and delete {handover_path(config.state_dir, capture)}"
        )
    report = already_complete(capture, names, handover)
    if report is None:
        raise SnapshotError(
            f"the snapshot of slot {capture.slot_name} finished without "
            f"{sorted(set(names) - set(handover['tables']))}; "
            "a table added after the handover has no mirror to re-snapshot yet — fix: capture it "
            "with Debezium's incremental snapshot, or start over with a new capture.slot_name"
        )
    return report


def _resume_point(
    conn: Any, capture: CaptureSettings, sources: dict[str, SourceTable], states: dict[str, dict[str, Any]]
) -> int:
    """The handover LSN of the interrupted run whose chunks ``states`` hold; SnapshotError when that run cannot
    be resumed safely (runs mixed, its slot gone or streamed past, a keyless table it had not finished)."""
    lsns = {(s["slot"], s["lsn"]) for s in states.values()}
    if len(lsns) != 1 or next(iter(lsns))[0] != capture.slot_name:
        raise SnapshotError(
            f"the tables were snapshotted by different runs {sorted(lsns)}; cannot resume — fix: "
            "drop the lake tables and the slot, then snapshot again"
        )
    handover_lsn: int = next(iter(lsns))[1]
    slot = slot_state(conn, capture.slot_name)
    if not slot.exists:
        raise SnapshotError(
            f"slot {capture.slot_name} of the interrupted snapshot is gone, and with it the "
            "changes since its start — fix: drop the lake tables and snapshot again"
        )
    if slot.confirmed_flush_lsn is not None and slot.confirmed_flush_lsn > handover_lsn:
        raise SnapshotError(
            f"slot {capture.slot_name} was streamed past the snapshot's handover point before "
            "the snapshot finished — fix: drop the lake tables and the slot, snapshot again"
        )
    unfinished = [n for n, source in sources.items() if source.keyless and not (states.get(n) or {}).get("complete")]
    if unfinished:
        raise SnapshotError(
            f"the interrupted snapshot had not finished {unfinished}, without a primary key: such a table can "
            "only be read at the handover point (read later, the changes made in between would be applied "
            "to it twice, and nothing tells a row from its equal copy) — fix: drop the lake tables and "
            f"the slot (SELECT pg_drop_replication_slot('{capture.slot_name}')), then snapshot again; or "
            "snapshot these tables with Debezium (capture.snapshot: debezium)"
        )
    return handover_lsn


def _claim_slot(conn: Any, capture: CaptureSettings, names: list[str]) -> None:
    """Before a new run creates its slot: refuse a slot that exists already, and make the publication cover
    the tables."""
    if slot_state(conn, capture.slot_name).exists:
        raise SnapshotError(
            f"replication slot {capture.slot_name} exists already (Debezium or an earlier run made "
            f"it); the snapshot must create its own — fix: SELECT pg_drop_replication_slot("
            f"'{capture.slot_name}') if nothing uses it, or set capture.slot_name"
        )
    ensure_publication(conn, capture, names)


def _wal_since(conn: Any, lsn: int) -> int:
    """WAL bytes written since ``lsn`` (what streaming reads first)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        (current,) = one_row(cur)
    return max(0, lsn_to_int(current) - lsn)
