"""Iceberg types (the JSON form `LakestreamSink.tableInfo` answers) as Arrow types and Spark DDL, shared by the
driver and the write tasks: every Arrow field carries its Iceberg field id (``PARQUET:field_id``), which is how
Iceberg readers match Parquet columns."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

_FIELD_ID = b"PARQUET:field_id"

# -- Iceberg schema JSON -> Arrow / Spark DDL --------------------------------------------------------

_SIMPLE_ARROW = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "uuid": pa.binary(16),
    "binary": pa.binary(),
}


def decimal_ps(t: str) -> tuple[int, int]:
    p, s = t[t.index("(") + 1 : -1].split(",")
    return int(p), int(s)


def _arrow_type(t: Any) -> pa.DataType:
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "struct":
            return pa.struct([_arrow_field(f) for f in t["fields"]])
        if kind == "list":
            element = pa.field(
                "element",
                _arrow_type(t["element"]),
                nullable=not t.get("element-required", False),
                metadata={_FIELD_ID: str(t["element-id"])},
            )
            return pa.list_(element)
        if kind == "map":
            key = pa.field("key", _arrow_type(t["key"]), nullable=False, metadata={_FIELD_ID: str(t["key-id"])})
            value = pa.field(
                "value",
                _arrow_type(t["value"]),
                nullable=not t.get("value-required", False),
                metadata={_FIELD_ID: str(t["value-id"])},
            )
            return pa.map_(key, value)
        raise ValueError(f"unsupported Iceberg type {t}")
    if t in _SIMPLE_ARROW:
        return _SIMPLE_ARROW[t]
    if t.startswith("decimal("):
        return pa.decimal128(*decimal_ps(t))
    if t.startswith("fixed["):
        return pa.binary(int(t[6:-1]))
    raise ValueError(f"unsupported Iceberg type {t!r}")


DEFAULT_KEY = b"lakestream.write-default"  # field metadata: the column's write-default, Iceberg single-value JSON
DEFAULT_TYPE_KEY = b"lakestream.iceberg-type"


def _arrow_field(f: dict[str, Any]) -> pa.Field:
    metadata: dict[bytes, bytes | str] = {_FIELD_ID: str(f["id"])}
    if f.get("write-default") is not None and isinstance(f["type"], str):
        metadata[DEFAULT_KEY] = orjson.dumps(f["write-default"])
        metadata[DEFAULT_TYPE_KEY] = f["type"]
    return pa.field(f["name"], _arrow_type(f["type"]), nullable=not f.get("required", False), metadata=metadata)


def write_default(f: pa.Field) -> tuple[bool, Any]:
    """(has one, value in wire form) of a field's write-default (see `_arrow_field`)."""
    if not f.metadata or DEFAULT_KEY not in f.metadata:
        return False, None
    from lakestream.sink.write.defaults import wire_value

    return True, wire_value(f.metadata[DEFAULT_TYPE_KEY].decode(), orjson.loads(f.metadata[DEFAULT_KEY]))


def arrow_schema(iceberg_schema: dict[str, Any]) -> pa.Schema:
    """The Arrow schema of an Iceberg schema (JSON form, as `table_info` returns it), with a
    ``PARQUET:field_id`` on every field, nested ones included; required fields are not nullable."""
    return pa.schema([_arrow_field(f) for f in iceberg_schema["fields"]])


_SIMPLE_DDL = {
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "string": "string",
    "uuid": "string",
    "binary": "binary",
}


def spark_ddl(iceberg_type: Any) -> str:
    """The Spark DDL type string of an Iceberg type (JSON form): long -> bigint, timestamp ->
    timestamp_ntz, timestamptz -> timestamp, fixed[L] -> binary, uuid -> string, struct fields
    back-quoted (``struct<`a`:int,`b`:string>``), ``array<...>``, ``map<k,v>``."""
    t = iceberg_type
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "struct":
            fields = ",".join(f"`{f['name'].replace('`', '``')}`:{spark_ddl(f['type'])}" for f in t["fields"])
            return f"struct<{fields}>"
        if kind == "list":
            return f"array<{spark_ddl(t['element'])}>"
        if kind == "map":
            return f"map<{spark_ddl(t['key'])},{spark_ddl(t['value'])}>"
        raise ValueError(f"unsupported Iceberg type {t}")
    if t in _SIMPLE_DDL:
        return _SIMPLE_DDL[t]
    if t.startswith("decimal("):
        p, s = decimal_ps(t)
        return f"decimal({p},{s})"
    if t.startswith("fixed["):
        return "binary"
    raise ValueError(f"Iceberg type {t!r} has no Spark 3.5 equivalent")


_DDL_ICEBERG = {ddl: iceberg for iceberg, ddl in _SIMPLE_DDL.items() if iceberg != "uuid"}


def ddl_arrow_type(ddl: str) -> pa.DataType | None:
    """The Arrow type a table gets for a flat Spark DDL type (``bigint`` → int64, ``decimal(p,s)``,
    ``timestamp`` → UTC micros), or None for nested types."""
    if ddl in _DDL_ICEBERG:
        return _SIMPLE_ARROW[_DDL_ICEBERG[ddl]]
    if ddl.startswith("decimal("):
        p, s = ddl[8:-1].split(",")
        return pa.decimal128(int(p), int(s))
    return None
