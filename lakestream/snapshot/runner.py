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
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg2

from lakestream.config import PipelineConfig
from lakestream.errors import ConfigError
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.chunks import (  # noqa: F401 — KILL_AFTER_CHUNKS_ENV, source_dsn: this module's API too
    KILL_AFTER_CHUNKS_ENV,
    STATE_PROPERTY,
    SnapshotError,
    SnapshotTable,
    load_chunks,
    plan_under,
    read_snapshot_state,
    source_dsn,
    table_work,
)
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.slot import (
    ExportedSlot,
    ExportedSnapshot,
    ensure_publication,
    handover_path,
    int_to_lsn,
    lsn_to_int,
    read_handover,
    slot_state,
    write_handover,
)
from lakestream.snapshot.source import describe_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _parts(name: str) -> tuple[str, str]:
    """(schema, table) of a ``capture.tables`` entry, as PostgreSQL has them."""
    parsed = SourceTableName.parse(name)
    return parsed.schema, parsed.table


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
    from lakestream.engine.registry import TableRegistry
    from lakestream.sink.catalog.sink import table_info
    from lakestream.sink.write.routing import Router
    from lakestream.spark import session_for

    capture = config.capture
    if capture is None:
        raise ConfigError(
            "the pipeline config has no `capture:` section — fix: add capture.database and capture.tables"
        )
    if not capture.schemas_enabled:
        raise ConfigError(
            "capture.schemas_enabled: the parallel snapshot needs Debezium's schemas — fix: set it to true"
        )
    names = [str(SourceTableName.parse(t)) for t in (tables or capture.tables)]
    unknown = [t for t in names if t not in capture.tables]
    if unknown:
        raise ConfigError(
            f"{unknown} not in capture.tables {capture.tables} — fix: capture them first, or name a captured table"
        )
    chunk_rows = chunk_rows or capture.snapshot_chunk_rows
    started = time.monotonic()
    handover = read_handover(config.state_dir, capture)
    resnapshot = tables and (again or (handover is not None and set(names) <= set(handover["tables"])))
    if capture.database.kind == "mariadb" and not resnapshot:
        from lakestream.snapshot.mariadb import run_mariadb_snapshot

        return run_mariadb_snapshot(
            config,
            names,
            spark,
            chunk_rows=chunk_rows,
            parallelism=parallelism,
            progress_interval_s=progress_interval_s,
            on_progress=on_progress,
        )
    if resnapshot:
        from lakestream.snapshot.resnapshot import resnapshot_tables

        return resnapshot_tables(
            config,
            names,
            spark,
            chunk_rows=chunk_rows,
            parallelism=parallelism,
            progress_interval_s=progress_interval_s,
            on_progress=on_progress,
            wait_timeout_s=wait_timeout_s,
        )
    dsn = source_dsn(config)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        if handover is not None and not slot_state(conn, capture.slot_name).exists:
            raise SnapshotError(
                f"a snapshot finished for slot {capture.slot_name}, but the slot is gone — fix: to load "
                f"again, drop the lake tables and delete {handover_path(config.state_dir, capture)}"
            )
        if handover is not None and set(names) <= set(handover["tables"]):
            log.info("snapshot: already complete (handover at %s); nothing to do", handover["lsn_text"])
            return SnapshotReport(capture.slot_name, handover["lsn_text"], already_complete=True)
        if handover is not None:
            raise SnapshotError(
                f"the snapshot of slot {capture.slot_name} finished without "
                f"{sorted(set(names) - set(handover['tables']))}; "
                "a table added after the handover has no mirror to re-snapshot yet — fix: capture it "
                "with Debezium's incremental snapshot, or start over with a new capture.slot_name"
            )
        spark = spark or session_for(config)
        registry = TableRegistry.for_config(config, spark)
        router = Router.from_config(config)
        sources = {name: describe_table(conn, *_parts(name)) for name in names}
        routed = {}
        for name in names:
            topic = capture.topic(name)
            stream, lake = router.route(topic)
            if stream.mode != "upsert":
                raise ConfigError(
                    f"topic {topic} is routed to an append stream; the snapshot fills upsert mirrors — fix: "
                    "route Debezium topics to a stream with mode: upsert"
                )
            routed[name] = (topic, stream, str(lake), registry.catalog.ident(lake.namespace, lake.table))
        states = {}
        for name, (_topic, _stream, lake, ident) in routed.items():
            ns, tbl = lake.split(".", 1)
            info = table_info(spark, config.catalog.name, ns, tbl)
            state = (
                read_snapshot_state(spark, ident) if info["exists"] and info.get("snapshot_id") is not None else None
            )
            if state is None and info["exists"] and info.get("snapshot_id") is not None:
                raise SnapshotError(
                    f"the lake table {lake} already has data that no snapshot of slot {capture.slot_name} "
                    "wrote — fix: drop it (lakestream sql ... DROP TABLE) to load it again, or use "
                    "snapshot: debezium"
                )
            if state is not None:
                states[name] = state
        slot = slot_state(conn, capture.slot_name)
        resumed = bool(states)
        if resumed:
            lsns = {(s["slot"], s["lsn"]) for s in states.values()}
            if len(lsns) != 1 or next(iter(lsns))[0] != capture.slot_name:
                raise SnapshotError(
                    f"the tables were snapshotted by different runs {sorted(lsns)}; cannot resume — fix: "
                    "drop the lake tables and the slot, then snapshot again"
                )
            handover_lsn = next(iter(lsns))[1]
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
            unfinished = [n for n in names if sources[n].keyless and not (states.get(n) or {}).get("complete")]
            if unfinished:
                raise SnapshotError(
                    f"the interrupted snapshot had not finished {unfinished}, without a primary key: such a table can "
                    "only be read at the handover point (read later, the changes made in between would be applied "
                    "to it twice, and nothing tells a row from its equal copy) — fix: drop the lake tables and "
                    f"the slot (SELECT pg_drop_replication_slot('{capture.slot_name}')), then snapshot again; or "
                    "snapshot these tables with Debezium (capture.snapshot: debezium)"
                )
        elif slot.exists:
            raise SnapshotError(
                f"replication slot {capture.slot_name} exists already (Debezium or an earlier run made "
                f"it); the snapshot must create its own — fix: SELECT pg_drop_replication_slot("
                f"'{capture.slot_name}') if nothing uses it, or set capture.slot_name"
            )
        else:
            ensure_publication(conn, capture, names)
        exported: ExportedSlot | ExportedSnapshot = (
            ExportedSnapshot(dsn) if resumed else ExportedSlot(dsn, capture.slot_name)
        )
        with exported:
            if not resumed:
                handover_lsn = exported.lsn
            handover_started = time.time()
            work: dict[str, SnapshotTable] = {}
            for name in names:
                source = sources[name]
                work[name] = table_work(
                    spark,
                    config,
                    registry,
                    name,
                    routed[name],
                    source,
                    states.get(name),
                    partial(plan_under, dsn, exported.snapshot_name, source, chunk_rows),
                )
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
        write_handover(config.state_dir, capture, handover_lsn, names)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            lag_bytes = max(0, lsn_to_int(cur.fetchone()[0]) - handover_lsn)
        report = SnapshotReport(
            capture.slot_name,
            int_to_lsn(handover_lsn),
            [w.progress for w in work.values()],
            time.monotonic() - started,
            resumed,
            False,
            lag_bytes,
            time.time() - handover_started,
        )
        return report
    finally:
        conn.close()
