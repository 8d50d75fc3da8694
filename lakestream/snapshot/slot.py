"""The handover point between the parallel snapshot and Debezium's stream.

Before anything is read, the publication is made to cover the tables (pgoutput decodes a change
against the publication as it was when the change was written, so it must exist first), then a
logical replication slot is created on a replication connection with ``EXPORT_SNAPSHOT``. The
slot's consistent point and the exported snapshot are the same instant: the snapshot holds every
transaction committed before it, the slot streams every transaction committed after it. The
chunks are read under that snapshot while the connection stays open; Debezium later streams the
slot from the consistent point (`lakestream.capture.handover`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extras
from psycopg2 import sql as pgsql

from lakestream.config import CaptureSettings

log = logging.getLogger(__name__)


def lsn_to_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def one_row(cur: Any) -> tuple[Any, ...]:
    """The row of a statement that always answers exactly one (``SELECT`` of functions, replication commands)."""
    row: tuple[Any, ...] | None = cur.fetchone()
    if row is None:
        raise psycopg2.ProgrammingError("the statement answered no row")
    return row


def ensure_publication(conn: Any, capture: CaptureSettings, tables: list[str]) -> None:
    """Make the capture publication cover ``tables`` and check it publishes them
    (`lakestream.capture.publication.prepare_publication`): before the slot exists."""
    from lakestream.capture.publication import prepare_publication
    from lakestream.identifiers import SourceTableName

    prepare_publication(conn, capture, [SourceTableName.parse(t) for t in tables])


@dataclass
class SlotState:
    exists: bool
    confirmed_flush_lsn: int | None = None
    active: bool = False


def slot_state(conn: Any, slot_name: str) -> SlotState:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)
        )
        row = cur.fetchone()
    if row is None:
        return SlotState(False)
    return SlotState(True, lsn_to_int(row[0]) if row[0] else None, bool(row[1]))


class ExportedSlot:
    """A new logical slot and the snapshot exported at its consistent point; the snapshot lives as long
    as this object's replication connection stays open and idle (use as a context manager)."""

    def __init__(self, dsn: str, slot_name: str):
        self._conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
        cur = self._conn.cursor()
        cur.execute(
            f"CREATE_REPLICATION_SLOT {pgsql.Identifier(slot_name).as_string(self._conn)} "
            "LOGICAL pgoutput EXPORT_SNAPSHOT"
        )
        name, consistent_point, snapshot_name, _plugin = one_row(cur)
        self.slot_name = name
        self.lsn = lsn_to_int(consistent_point)
        self.snapshot_name = snapshot_name
        log.info("snapshot: slot %s created at %s, snapshot %s exported", name, consistent_point, snapshot_name)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ExportedSlot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ExportedSnapshot:
    """A REPEATABLE READ snapshot of now, exported for the chunk tasks (a resumed run, whose slot's
    own snapshot died with the run that created it)."""

    def __init__(self, dsn: str):
        self._conn = psycopg2.connect(dsn)
        with self._conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SELECT pg_export_snapshot(), pg_current_wal_lsn()::text")
            self.snapshot_name, lsn = one_row(cur)
        self.lsn = lsn_to_int(lsn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ExportedSnapshot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
