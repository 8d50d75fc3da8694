"""Column defaults: PostgreSQL's ``ADD COLUMN ... DEFAULT v`` reaches the mirror as Iceberg v3's
``initial-default`` (what rows written before the column existed read) and ``write-default``.

Debezium's Connect schema carries the default (``"default": 7``); the decoder turns it into the
column's wire form like any value (`lakestream.decode.types`). Here it is written in Iceberg's
single-value JSON form for the table commit, and read back from a table schema into the wire form
the write tasks fill in for rows whose record predates the column.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)
_PRIMITIVE_JSON = ("boolean", "int", "bigint", "smallint", "tinyint", "float", "double", "string")


def iceberg_json(ddl: str, wire: Any) -> Any | None:
    """``wire`` (a value in the column's wire form) in Iceberg's single-value JSON form for a column
    of Spark DDL type ``ddl``; None when the type takes no default here (nested types, binary)."""
    if wire is None:
        return None
    if ddl in _PRIMITIVE_JSON:
        return wire
    if ddl.startswith("decimal("):
        return str(wire)
    if ddl == "date":
        return (_EPOCH_DATE + dt.timedelta(days=int(wire))).isoformat()
    if ddl == "timestamp_ntz":
        return (_EPOCH + dt.timedelta(microseconds=int(wire))).isoformat(timespec="microseconds")
    if ddl == "timestamp":
        return (_EPOCH + dt.timedelta(microseconds=int(wire))).isoformat(timespec="microseconds") + "+00:00"
    return None


def wire_value(iceberg_type: Any, value: Any) -> Any:
    """An Iceberg single-value JSON ``value`` of ``iceberg_type`` (schema JSON form) in wire form."""
    if value is None or not isinstance(iceberg_type, str):
        return None
    if iceberg_type == "date":
        return (dt.date.fromisoformat(value) - _EPOCH_DATE).days
    if iceberg_type in ("timestamp", "timestamptz"):
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
        delta = parsed - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if iceberg_type.startswith("decimal("):
        return decimal.Decimal(value)
    if iceberg_type == "binary" or iceberg_type.startswith("fixed["):
        return bytes.fromhex(value)
    return value
