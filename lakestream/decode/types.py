"""Debezium/Kafka Connect field schemas → table column types, and values → their JSON wire form.

A column type is a Spark DDL type string (``bigint``, ``decimal(10,2)``, ``timestamp_ntz``,
``array<int>``, ``struct<a:int>``), which Iceberg maps one to one. Values are rewritten into the
form Spark's ``from_json`` parses straight into that type: dates as ``YYYY-MM-DD``, timestamps as
ISO strings with microseconds, decimals as plain strings, bytes as base64 (as Debezium sends them).
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

from lakestream.errors import DecodeError

# The value Debezium sends for an unchanged TOASTed column (REPLICA IDENTITY DEFAULT).
UNAVAILABLE_VALUE = "__debezium_unavailable_value"

TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
TIMESTAMP_NTZ_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
JSON_OPTIONS = {
    "timestampFormat": TIMESTAMP_FORMAT,
    "timestampNTZFormat": TIMESTAMP_NTZ_FORMAT,
    "dateFormat": "yyyy-MM-dd",
    "mode": "PERMISSIVE",
}

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)
_MAX_DECIMAL_PRECISION = 38

Converter = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _date_from_days(value: Any) -> str:
    return (_EPOCH_DATE + dt.timedelta(days=int(value))).isoformat()


def _ntz_from_micros(micros: int) -> str:
    return (_EPOCH + dt.timedelta(microseconds=int(micros))).isoformat(timespec="microseconds")


def _tz_from_micros(micros: int) -> str:
    return _ntz_from_micros(micros) + "Z"


def _zoned_timestamp(value: str) -> str:
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise DecodeError(f"not an ISO-8601 timestamp: {value!r}") from exc
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return parsed.isoformat(timespec="microseconds") + "Z"


def _time_from_micros(micros: int) -> str:
    micros = int(micros)
    seconds, frac = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{frac:06d}"


def _decimal_from_bytes(scale: int) -> Converter:
    """Kafka Connect Decimal: base64 of the big-endian two's-complement unscaled value."""

    def convert(value: Any) -> str:
        if isinstance(value, (int, float)):
            return str(value)
        unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
        return str(decimal.Decimal(unscaled).scaleb(-scale))

    return convert


def _decimal_text(value: Any) -> str:
    return str(value)


def _variable_scale_decimal(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        unscaled = int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
        return str(decimal.Decimal(unscaled).scaleb(-int(value["scale"])))
    return str(value)


def _json_text(value: Any) -> str:
    import orjson

    return value if isinstance(value, str) else orjson.dumps(value).decode()


class FieldType:
    """A column's table type plus the function that turns a Debezium value into its wire form."""

    __slots__ = ("ddl", "convert")

    def __init__(self, ddl: str, convert: Converter = _identity):
        self.ddl = ddl
        self.convert = convert

    def __repr__(self) -> str:
        return f"FieldType({self.ddl})"


_PRIMITIVES = {
    "int8": "int", "int16": "int", "int32": "int", "int64": "bigint",
    # Kafka Connect's JsonConverter writes FLOAT32/FLOAT64 as "float"/"double" in schemas.
    "float32": "float", "float64": "double", "float": "float", "double": "double", "boolean": "boolean",
    "string": "string", "bytes": "binary",
}

_SEMANTIC: dict[str, Callable[[dict[str, Any]], FieldType]] = {
    "io.debezium.time.Date": lambda s: FieldType("date", _date_from_days),
    "org.apache.kafka.connect.data.Date": lambda s: FieldType("date", _date_from_days),
    "io.debezium.time.Timestamp": lambda s: FieldType("timestamp_ntz", lambda v: _ntz_from_micros(int(v) * 1000)),
    "org.apache.kafka.connect.data.Timestamp": lambda s: FieldType("timestamp_ntz", lambda v: _ntz_from_micros(int(v) * 1000)),
    "io.debezium.time.MicroTimestamp": lambda s: FieldType("timestamp_ntz", _ntz_from_micros),
    "io.debezium.time.NanoTimestamp": lambda s: FieldType("timestamp_ntz", lambda v: _ntz_from_micros(int(v) // 1000)),
    "io.debezium.time.ZonedTimestamp": lambda s: FieldType("timestamp", _zoned_timestamp),
    "io.debezium.time.Time": lambda s: FieldType("string", lambda v: _time_from_micros(int(v) * 1000)),
    "org.apache.kafka.connect.data.Time": lambda s: FieldType("string", lambda v: _time_from_micros(int(v) * 1000)),
    "io.debezium.time.MicroTime": lambda s: FieldType("string", _time_from_micros),
    "io.debezium.time.NanoTime": lambda s: FieldType("string", lambda v: _time_from_micros(int(v) // 1000)),
    "io.debezium.time.ZonedTime": lambda s: FieldType("string"),
    "io.debezium.time.MicroDuration": lambda s: FieldType("bigint"),
    "io.debezium.time.Interval": lambda s: FieldType("string"),
    "io.debezium.data.Json": lambda s: FieldType("string", _json_text),
    "io.debezium.data.Uuid": lambda s: FieldType("string"),
    "io.debezium.data.Enum": lambda s: FieldType("string"),
    "io.debezium.data.EnumSet": lambda s: FieldType("string"),
    "io.debezium.data.Xml": lambda s: FieldType("string"),
    "io.debezium.data.Ltree": lambda s: FieldType("string"),
    "io.debezium.data.Bits": lambda s: FieldType("binary"),
    "io.debezium.data.VariableScaleDecimal": lambda s: FieldType("string", _variable_scale_decimal),
}


def _decimal_type(schema: dict[str, Any]) -> FieldType:
    params = schema.get("parameters") or {}
    scale = int(params.get("scale", 0))
    precision = params.get("connect.decimal.precision")
    # decimal.handling.mode=precise sends bytes; =string sends text.
    convert = _decimal_from_bytes(scale) if schema.get("type") == "bytes" else _decimal_text
    if precision is None or int(precision) > _MAX_DECIMAL_PRECISION:
        # Unbounded precision cannot be an Iceberg decimal; keep every digit as text.
        return FieldType("string", convert)
    return FieldType(f"decimal({int(precision)},{scale})", convert)


def field_type(schema: dict[str, Any]) -> FieldType:
    """Map one Kafka Connect JSON field schema onto a table column type."""
    name = schema.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return _decimal_type(schema)
    if name in _SEMANTIC:
        return _SEMANTIC[name](schema)
    if name and name.startswith("io.debezium.data.geometry."):
        return FieldType("string", _json_text)
    kind = schema.get("type")
    if kind in _PRIMITIVES:
        return FieldType(_PRIMITIVES[kind])
    if kind == "array":
        element = field_type(schema.get("items") or {"type": "string"})
        convert = element.convert
        return FieldType(f"array<{element.ddl}>", lambda v: [None if x is None else convert(x) for x in v])
    if kind == "map":
        value = field_type(schema.get("values") or {"type": "string"})
        convert = value.convert
        return FieldType(f"map<string,{value.ddl}>", lambda v: {str(k): None if x is None else convert(x) for k, x in v.items()})
    if kind == "struct":
        fields = [(f["field"], field_type(f)) for f in schema.get("fields", [])]
        ddl = "struct<" + ",".join(f"`{n}`:{t.ddl}" for n, t in fields) + ">"

        def convert(value: dict[str, Any]) -> dict[str, Any]:
            return {n: (None if value.get(n) is None else t.convert(value[n])) for n, t in fields}

        return FieldType(ddl, convert)
    raise DecodeError(f"unsupported Kafka Connect schema type {kind!r} (name {name!r})")


def infer_type(value: Any) -> str | None:
    """The column type of a schemaless JSON value (None for null: no evidence)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        element = None
        for item in value:
            element = merge_types(element, infer_type(item))
        return f"array<{element or 'string'}>"
    if isinstance(value, dict):
        if not value:
            return None
        return "struct<" + ",".join(f"`{k}`:{infer_type(v) or 'string'}" for k, v in value.items()) + ">"
    return "string"


_WIDENING = {("int", "bigint"): "bigint", ("float", "double"): "double", ("bigint", "double"): "double",
             ("int", "double"): "double"}


def merge_types(a: str | None, b: str | None) -> str | None:
    """The type both ``a`` and ``b`` values fit in, for schemaless inference; 'string' when they clash."""
    if a is None or a == b:
        return b if a is None else a
    if b is None:
        return a
    for pair in ((a, b), (b, a)):
        if pair in _WIDENING:
            return _WIDENING[pair]
    return "string"


def event_time(value: Any) -> str:
    """An event-time value (ISO string, or epoch seconds/ms/µs as a number) as a UTC timestamp wire string."""
    if isinstance(value, bool):
        raise DecodeError(f"event time {value!r} is not a timestamp")
    if isinstance(value, (int, float)):
        magnitude = abs(value)
        # Epoch seconds, milliseconds or microseconds, told apart by magnitude (valid for 1973..5138).
        micros = value * 1_000_000 if magnitude < 1e11 else value * 1000 if magnitude < 1e14 else value
        return _tz_from_micros(int(micros))
    if isinstance(value, str):
        return _zoned_timestamp(value)  # a string without an offset is taken as UTC
    raise DecodeError(f"event time {str(value)[:40]!r} is neither an ISO-8601 string nor an epoch number")
