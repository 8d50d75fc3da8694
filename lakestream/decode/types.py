"""Debezium/Kafka Connect field schemas → table column types, and values → their typed form.

A column type is a Spark DDL type string (``bigint``, ``decimal(10,2)``, ``timestamp_ntz``,
``array<int>``, ``struct<a:int>``), which Iceberg maps one to one. Values are converted into the
Python form pyarrow builds that column type from without a second parse: dates as days since the
epoch, timestamps as microseconds since the epoch (UTC), decimals as ``decimal.Decimal``, bytes as
``bytes``. Anything that cannot be converted raises `DecodeError` (the record becomes a dead letter).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

from lakestream.errors import BadValue, DecodeError

# The value Debezium sends for an unchanged TOASTed column (REPLICA IDENTITY DEFAULT).
UNAVAILABLE_VALUE = "__debezium_unavailable_value"

_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MAX_DECIMAL_PRECISION = 38

Converter = Callable[[Any], Any]


def identity(value: Any) -> Any:
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"expected an integer, got {type(value).__name__} {str(value)[:40]!r}")
    return value


# The range Spark and the SQL engines reading the tables represent: 0001-01-01 .. 9999-12-31 (Arrow and
# Parquet store far more, so a value outside would land and then break or mislead every reader).
MIN_DAYS, MAX_DAYS = -719_162, 2_932_896
MIN_MICROS, MAX_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999


def _days_in_range(days: int) -> int:
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise DecodeError(f"date {days} days from 1970-01-01 is outside 0001-01-01..9999-12-31")
    return days


def _micros_in_range(micros: int) -> int:
    if not MIN_MICROS <= micros <= MAX_MICROS:
        raise DecodeError(f"timestamp {micros} µs from 1970-01-01 is outside 0001-01-01..9999-12-31")
    return micros


def _date_from_days(value: Any) -> int:
    return _days_in_range(_integer(value))


def _micros(value: Any) -> int:
    return _micros_in_range(_integer(value))


def _micros_from_millis(value: Any) -> int:
    return _micros_in_range(_integer(value) * 1000)


def _micros_from_nanos(value: Any) -> int:
    return _micros_in_range(_integer(value) // 1000)


def _micros_from_datetime(parsed: dt.datetime) -> int:
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    delta = parsed - _EPOCH_UTC
    return _micros_in_range((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def _zoned_timestamp(value: Any) -> int:
    """An ISO-8601 timestamp (with an offset, or UTC when it has none) as UTC microseconds."""
    if not isinstance(value, str):
        raise BadValue(f"not an ISO-8601 timestamp: {str(value)[:40]!r}")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadValue(f"not an ISO-8601 timestamp: {value!r}") from exc
    return _micros_from_datetime(parsed)


def _time_from_micros(micros: int) -> str:
    """``HH:MM:SS.ffffff``; a MariaDB/MySQL TIME is a duration (-838:59:59 .. 838:59:59), so the hours may
    exceed 23 and the value may be negative (``-HH:MM:SS.ffffff``)."""
    micros = _integer(micros)
    sign = "-" if micros < 0 else ""
    seconds, frac = divmod(abs(micros), 1_000_000)
    hours, rest = divmod(seconds, 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{frac:06d}"


def _finite_decimal(value: decimal.Decimal, text: Any) -> decimal.Decimal:
    if not value.is_finite():
        raise BadValue(f"decimal value {str(text)[:40]!r} is not a finite number")
    return value


def _scaled(unscaled: int, scale: int) -> decimal.Decimal:
    """unscaled × 10^-scale, exactly (``scaleb`` would round to the context's 28 digits)."""
    return decimal.Decimal(f"{unscaled}E{-scale}")


def _decimal_from_bytes(scale: int) -> Converter:
    """Kafka Connect Decimal: base64 of the big-endian two's-complement unscaled value."""

    def convert(value: Any) -> decimal.Decimal:
        if isinstance(value, bool):
            raise BadValue(f"expected a decimal, got {value!r}")
        if isinstance(value, int):
            return decimal.Decimal(value)
        if isinstance(value, float):
            return _finite_decimal(decimal.Decimal(repr(value)), value)
        if isinstance(value, (bytes, bytearray)):  # Avro: the unscaled bytes themselves
            return _scaled(int.from_bytes(value, "big", signed=True), scale)
        if not isinstance(value, str):
            raise BadValue(f"expected base64 decimal bytes, got {type(value).__name__}")
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadValue(f"invalid base64 decimal {value[:40]!r}: {exc}") from None
        unscaled = int.from_bytes(raw, "big", signed=True)
        return _scaled(unscaled, scale)

    return convert


def _decimal_text(value: Any) -> decimal.Decimal:
    """decimal.handling.mode=string sends the number as text."""
    if isinstance(value, bool):
        raise BadValue(f"expected a decimal, got {value!r}")
    try:
        return _finite_decimal(decimal.Decimal(str(value)), value)
    except decimal.InvalidOperation:
        raise BadValue(f"not a decimal number: {str(value)[:40]!r}") from None


def _as_text(convert: Converter) -> Converter:
    return lambda value: str(convert(value))


def _variable_scale_decimal(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        try:
            raw = value["value"]
            raw = raw if isinstance(raw, (bytes, bytearray)) else base64.b64decode(raw, validate=True)
            unscaled = int.from_bytes(raw, "big", signed=True)
            return str(_scaled(unscaled, int(value["scale"])))
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise BadValue(f"invalid variable-scale decimal {str(value)[:60]!r}: {exc}") from None
    return str(value)


def _bytes_from_base64(value: Any) -> bytes:
    """Kafka Connect's JsonConverter sends BYTES as base64 text."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise BadValue(f"expected base64 bytes, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadValue(f"invalid base64 bytes {value[:40]!r}: {exc}") from None


def _json_text(value: Any) -> str:
    import orjson

    def bytes_as_base64(obj: Any) -> str:  # Avro geometry structs hold raw WKB bytes
        if isinstance(obj, (bytes, bytearray)):
            return base64.b64encode(obj).decode()
        raise TypeError

    return value if isinstance(value, str) else orjson.dumps(value, default=bytes_as_base64).decode()


class FieldType:
    """A column's table type plus the function that turns a Debezium value into its wire form."""

    __slots__ = ("ddl", "convert")

    def __init__(self, ddl: str, convert: Converter = identity):
        self.ddl = ddl
        self.convert = convert

    def __repr__(self) -> str:
        return f"FieldType({self.ddl})"


_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "bigint",
    # Kafka Connect's JsonConverter writes FLOAT32/FLOAT64 as "float"/"double" in schemas.
    "float32": "float",
    "float64": "double",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}

_SEMANTIC: dict[str, Callable[[dict[str, Any]], FieldType]] = {
    "io.debezium.time.Date": lambda s: FieldType("date", _date_from_days),
    "org.apache.kafka.connect.data.Date": lambda s: FieldType("date", _date_from_days),
    "io.debezium.time.Timestamp": lambda s: FieldType("timestamp_ntz", _micros_from_millis),
    "org.apache.kafka.connect.data.Timestamp": lambda s: FieldType("timestamp_ntz", _micros_from_millis),
    "io.debezium.time.MicroTimestamp": lambda s: FieldType("timestamp_ntz", _micros),
    "io.debezium.time.NanoTimestamp": lambda s: FieldType("timestamp_ntz", _micros_from_nanos),
    "io.debezium.time.ZonedTimestamp": lambda s: FieldType("timestamp", _zoned_timestamp),
    "io.debezium.time.Time": lambda s: FieldType("string", lambda v: _time_from_micros(_integer(v) * 1000)),
    "org.apache.kafka.connect.data.Time": lambda s: FieldType(
        "string", lambda v: _time_from_micros(_integer(v) * 1000)
    ),
    "io.debezium.time.MicroTime": lambda s: FieldType("string", _time_from_micros),
    "io.debezium.time.NanoTime": lambda s: FieldType("string", lambda v: _time_from_micros(_integer(v) // 1000)),
    "io.debezium.time.ZonedTime": lambda s: FieldType("string"),
    "io.debezium.time.MicroDuration": lambda s: FieldType("bigint"),
    "io.debezium.time.Interval": lambda s: FieldType("string"),
    "io.debezium.data.Json": lambda s: FieldType("string", _json_text),
    "io.debezium.data.Uuid": lambda s: FieldType("string"),
    "io.debezium.data.Enum": lambda s: FieldType("string"),
    "io.debezium.data.EnumSet": lambda s: FieldType("string"),
    "io.debezium.data.Xml": lambda s: FieldType("string"),
    "io.debezium.data.Ltree": lambda s: FieldType("string"),
    "io.debezium.data.Bits": lambda s: FieldType("binary", _bytes_from_base64),
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
        return FieldType("string", _as_text(convert))
    return FieldType(f"decimal({int(precision)},{scale})", convert)


# The values lakestream's ZeroDateConverter (capture.database.zero_dates: dead_letter) writes for a zero date in a
# NOT NULL MariaDB/MySQL date column; its schema says so with this parameter.
ZERO_DATE_PARAMETER = "lakestream.zero_date"
_ZERO_DATES = {-(2**31), -(2**63), "0000-00-00T00:00:00Z"}


def _refusing_zero_dates(convert: Converter) -> Converter:
    def refuse(value: Any) -> Any:
        if not isinstance(value, bool) and value in _ZERO_DATES:
            raise BadValue(
                "a zero date (0000-00-00) in a NOT NULL column — fix: correct the row at the source, or "
                "set capture.database.zero_dates: null to mirror zero dates as NULL"
            )
        return convert(value)

    return refuse


def field_type(schema: dict[str, Any]) -> FieldType:
    """Map one Kafka Connect JSON field schema onto a table column type."""
    if (schema.get("parameters") or {}).get(ZERO_DATE_PARAMETER) == "dead_letter":
        plain = field_type({k: v for k, v in schema.items() if k != "parameters"})
        return FieldType(plain.ddl, _refusing_zero_dates(plain.convert))
    name = schema.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return _decimal_type(schema)
    if name in _SEMANTIC:
        return _SEMANTIC[name](schema)
    if name and name.startswith("io.debezium.data.geometry."):
        return FieldType("string", _json_text)
    kind = schema.get("type")
    if kind == "bytes":
        return FieldType("binary", _bytes_from_base64)
    if kind in _PRIMITIVES:
        return FieldType(_PRIMITIVES[kind])
    if kind == "array":
        element = field_type(schema.get("items") or {"type": "string"})
        convert = element.convert

        def convert_array(value: Any) -> list[Any]:
            if not isinstance(value, list):  # a string or object would otherwise iterate into elements
                raise BadValue(f"expected an array, got {type(value).__name__} {str(value)[:40]!r}")
            return [None if x is None else convert(x) for x in value]

        return FieldType(f"array<{element.ddl}>", convert_array)
    if kind == "map":
        value = field_type(schema.get("values") or {"type": "string"})
        convert = value.convert
        return FieldType(
            f"map<string,{value.ddl}>", lambda v: {str(k): None if x is None else convert(x) for k, x in v.items()}
        )
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


_WIDENING = {
    ("int", "bigint"): "bigint",
    ("float", "double"): "double",
    ("bigint", "double"): "double",
    ("int", "double"): "double",
}


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


def event_time(value: Any) -> int:
    """An event-time value (ISO string, or epoch seconds/ms/µs as a number) as UTC microseconds."""
    if isinstance(value, bool):
        raise BadValue(f"event time {value!r} is not a timestamp")
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise BadValue(f"event time {value!r} is not a timestamp")
    if isinstance(value, (int, float)):
        magnitude = abs(value)
        # Epoch seconds, milliseconds or microseconds, told apart by magnitude (valid for 1973..5138).
        micros = value * 1_000_000 if magnitude < 1e11 else value * 1000 if magnitude < 1e14 else value
        return _micros_in_range(round(micros))  # round, not truncate: 1095846138.37 * 1e6 is 1095846138369999.9
    if isinstance(value, str):
        return _zoned_timestamp(value)  # a string without an offset is taken as UTC
    raise BadValue(f"event time {str(value)[:40]!r} is neither an ISO-8601 string nor an epoch number")
