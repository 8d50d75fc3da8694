"""Column records: a captured table's columns as the source catalog holds them, published on the table's own
topic when they change, so the mirror gains an added or widened column without waiting for a row to change.

Debezium puts a table's new schema only into the next row event of that table: a table no one writes after
``ALTER TABLE ... ADD COLUMN`` would keep a mirror without the column. `ColumnWatch` reads the columns of every
captured table from the catalog (`CaptureDatabase.read_columns`: PostgreSQL's ``information_schema``/``pg_type``,
MariaDB's ``information_schema.COLUMNS``) at start and every ``capture.column_check_interval_s``, and publishes a
column record for each table whose columns differ from those it last published (kept in a file beside capture's
offsets, so a change made while capture was down, or just before it died, is published when it starts again; a
first start only records them). The sink evolves the mirror from it as from a row of that shape (adds, widens, the
default as Iceberg's ``initial-default``), writes no row, and never creates a table or drops a column from one
(`lakestream.sink.write.task`).

A column record is a JSON object on the table's topic, partition 0, without a key::

    {"op": "lakestream.columns", "table": "shop.orders", "ts_ms": 1765000000000,
     "columns": [{"name": "id", "type": "int"}, {"name": "q", "type": "string", "default": "qd"}]}

``type`` is the table type the parallel snapshot gives the column (the one Debezium's events give it, see
`lakestream.capture.source_columns`), ``default`` the column's literal default in the decoder's wire form. A column
whose type that mapping does not know is left out (it arrives with its next row).
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from lakestream.config import CaptureSettings

log = logging.getLogger(__name__)

# The op of a column record (no Debezium event has it).
COLUMNS_OP = "lakestream.columns"
DEFAULT_CHECK_INTERVAL_S = 5.0


@dataclass(frozen=True)
class CatalogColumn:
    """One column of a captured table: its name, its table type (Spark DDL) and its default in wire form."""

    name: str
    ddl: str
    default: Any = None


def column_record(table: str, columns: list[CatalogColumn], ts_ms: int) -> bytes:
    """The value of a column record for ``table`` (``schema.table`` as captured)."""
    return orjson.dumps(
        {
            "op": COLUMNS_OP,
            "table": table,
            "ts_ms": ts_ms,
            "columns": [
                {"name": c.name, "type": c.ddl, **({"default": c.default} if c.default is not None else {})}
                for c in columns
            ],
        }
    )


_EPOCH_DATE = dt.date(1970, 1, 1)


def default_wire_value(ddl: str, literal: str | None) -> Any:
    """A default written as ``literal`` (the catalog's text, unquoted) in the wire form of a ``ddl`` column; None
    for no default, or one this type takes no literal for (binary, timestamps, nested types)."""
    if literal is None:
        return None
    try:
        if ddl == "string":
            return literal
        if ddl in ("int", "bigint"):
            return int(decimal.Decimal(literal))
        if ddl in ("float", "double"):
            return float(literal)
        if ddl == "boolean":
            lowered = literal.strip().lower()
            if lowered in ("true", "t", "false", "f"):
                return lowered.startswith("t")
            return int(decimal.Decimal(lowered)) != 0
        if ddl.startswith("decimal("):
            scale = int(ddl[8:-1].split(",")[1])
            return str(decimal.Decimal(literal).quantize(decimal.Decimal(1).scaleb(-scale)))
        if ddl == "date":
            return (dt.date.fromisoformat(literal.strip()) - _EPOCH_DATE).days
    except (ValueError, ArithmeticError, IndexError):
        return None
    return None


_PG_QUOTED = re.compile(r"^'((?:[^']|'')*)'(?:::[\w \".\[\]()]+)*$", re.S)
_PG_NUMBER = re.compile(r"^\(?(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\)?(?:::[\w \".()]+)*$")


def postgresql_default_literal(expression: str | None) -> str | None:
    """The literal of a PostgreSQL column default (``information_schema.columns.column_default``): ``'qd'::text``
    → ``qd``, ``42``, ``(-1.5)::numeric`` → ``-1.5``, ``true``; None for an expression (``now()``, ``nextval``)."""
    if expression is None:
        return None
    text = expression.strip()
    if (quoted := _PG_QUOTED.match(text)) is not None:
        return quoted.group(1).replace("''", "'")
    if (number := _PG_NUMBER.match(text)) is not None:
        return number.group(1)
    if text in ("true", "false"):
        return text
    return None


_MARIADB_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_MARIADB_ENUM_FIRST = re.compile(r"^enum\('((?:[^']|'')*)'")


def mariadb_default_literal(
    column_default: str | None, nullable: bool, data_type: str, column_type: str, ddl: str
) -> str | None:
    """The literal of a MariaDB column default (``information_schema.COLUMNS.COLUMN_DEFAULT``, which quotes string
    literals since 10.2.7): ``'qd'`` → ``qd``, ``5``; None for ``NULL`` or an expression (``current_timestamp()``).
    A ``NOT NULL`` column without a default holds MariaDB's implicit one in rows that predate it: ``''`` for a
    string, 0 for a number, an ENUM's first value."""
    if column_default is None or column_default == "NULL":
        if nullable:
            return None
        if data_type == "enum" and (first := _MARIADB_ENUM_FIRST.match(column_type)) is not None:
            return first.group(1).replace("''", "'")
        if ddl == "string" and data_type in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext"):
            return ""
        if ddl in ("int", "bigint", "float", "double", "boolean") or ddl.startswith("decimal("):
            return "0"
        return None
    text = column_default.strip()
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        return text[1:-1].replace("''", "'").replace("\\\\", "\\")
    if _MARIADB_NUMBER.match(text):
        return text
    return None


class ColumnWatch:
    """Publishes a column record for each captured table whose catalog columns changed since it last published
    one. Runs on its own thread; a database or Kafka that does not answer is logged and
    tried again at the next check, never a reason to stop capture."""

    def __init__(
        self, capture: CaptureSettings, database: Any, producer: Any, interval_s: float, state_file: Path
    ) -> None:
        """``database``: the source kind's `lakestream.capture.databases.CaptureDatabase` (its catalog reads)."""
        self._capture = capture
        self._database = database
        self._producer = producer
        self._interval_s = interval_s
        self._state_file = state_file
        self._published = _load_state(state_file)
        # No state (a first start): the columns as they are now are the baseline, published by no record (the
        # snapshot's and the next rows' events carry them); from then on every change is published.
        self._baseline = not state_file.exists()
        self._conn: Any = None
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="column-watch", daemon=True)
        self.records = 0  # column records Kafka acknowledged

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
                if self._failing:
                    log.info("capture: column check works again")
                self._failing = False
            except Exception as exc:  # noqa: BLE001 — the next check tries again; capture goes on
                if not self._failing:
                    log.warning("capture: column check failed (tried again every %.0fs): %s", self._interval_s, exc)
                self._failing = True
                self._close()
            self._stop.wait(self._interval_s)

    def check(self) -> int:
        """Read the captured tables' columns and publish those that changed; the number of records published."""
        if self._conn is None:
            self._conn = self._database.source_connection(self._capture)
        current = self._database.read_columns(self._conn, self._capture.source_tables)
        if self._baseline:
            self._published = {table: cols for table, cols in current.items() if cols}
            _save_state(self._state_file, self._published)
            self._baseline = False
            return 0
        changed = {table: cols for table, cols in current.items() if cols and self._published.get(table) != cols}
        if not changed:
            return 0
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        now_ms = int(time.time() * 1000)
        for table, columns in changed.items():
            topic = self._capture.topic(table)
            self._producer.produce(
                topic, value=column_record(table, list(columns), now_ms), partition=0, on_delivery=on_delivery
            )
        remaining = self._producer.flush(30)
        if remaining or errors:
            raise RuntimeError(f"Kafka did not take the column records: {errors[0] if errors else 'timed out'}")
        for table, columns in changed.items():
            log.info("capture: columns of %s changed: published them (%d columns)", table, len(columns))
            self._published[table] = columns
        _save_state(self._state_file, self._published)
        self.records += len(changed)
        return len(changed)

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 — a broken connection is dropped either way
                pass
            self._conn = None


def _load_state(path: Path) -> dict[str, tuple[CatalogColumn, ...]]:
    """The columns last published per table (a state file that cannot be read: none, so every table is published
    again: a column record of unchanged columns changes nothing)."""
    try:
        stored = orjson.loads(path.read_bytes())
        return {table: tuple(CatalogColumn(*c) for c in columns) for table, columns in stored.items()}
    except (OSError, orjson.JSONDecodeError, TypeError, AttributeError):
        return {}


def _save_state(path: Path, published: dict[str, tuple[CatalogColumn, ...]]) -> None:
    """Written after Kafka acknowledged the records (a crash before: they are published again at the next start)."""
    data = {table: [[c.name, c.ddl, c.default] for c in columns] for table, columns in published.items()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data))
    tmp.replace(path)
