"""Debezium / Kafka Connect field schemas → column types, and values → the wire form Spark parses."""
from __future__ import annotations

import decimal
import base64
import datetime as dt

import pytest

from lakestream.decode.types import field_type, infer_type, merge_types
from lakestream.errors import DecodeError



def wire(ftype, value):
    """The converted value in the text form the assertions below were written in (dates ISO, timestamps
    ISO with microseconds, decimals as text), so each expectation stays readable."""
    return _as_text(ftype.ddl, ftype.convert(value))


def _as_text(ddl, v):
    import datetime as _dt
    import decimal as _dec

    if v is None:
        return None
    if ddl.startswith("array<"):
        return [_as_text(ddl[6:-1], x) for x in v]
    if ddl.startswith("struct<"):
        return {k: (x if not isinstance(x, (_dec.Decimal,)) else str(x)) for k, x in v.items()}
    if ddl == "date":
        return (_dt.date(1970, 1, 1) + _dt.timedelta(days=v)).isoformat()
    if ddl == "timestamp_ntz":
        return (_dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=v)).isoformat(timespec="microseconds")
    if ddl == "timestamp":
        return (_dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=v)).isoformat(timespec="microseconds") + "Z"
    if isinstance(v, _dec.Decimal):
        return str(v)
    return v

def _unscaled_b64(unscaled: int) -> str:
    length = max(1, (unscaled.bit_length() + 8) // 8)  # room for the sign bit
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def _decimal_schema(precision: int | None, scale: int, kind: str = "bytes") -> dict:
    params = {"scale": str(scale)}
    if precision is not None:
        params["connect.decimal.precision"] = str(precision)
    return {"type": kind, "name": "org.apache.kafka.connect.data.Decimal", "parameters": params}


@pytest.mark.parametrize("kind, ddl", [
    ("int8", "int"), ("int16", "int"), ("int32", "int"), ("int64", "bigint"), ("float32", "float"),
    ("float64", "double"), ("boolean", "boolean"), ("string", "string"),
])
def test_primitive_types(kind, ddl):
    ftype = field_type({"type": kind})
    assert ftype.ddl == ddl
    assert wire(ftype, 7) == 7


def test_bytes_are_base64_decoded_strictly():
    ftype = field_type({"type": "bytes"})
    assert ftype.ddl == "binary"
    assert ftype.convert("3q2+7w==") == bytes.fromhex("deadbeef")
    with pytest.raises(DecodeError, match="base64"):
        ftype.convert("not base64!!")
    with pytest.raises(DecodeError, match="expected base64 bytes, got int"):
        ftype.convert(7)


@pytest.mark.parametrize("unscaled, scale, text", [
    (123456, 2, "1234.56"),
    (-123456, 2, "-1234.56"),
    (-1, 2, "-0.01"),
    (150, 2, "1.50"),
    (0, 3, "0.000"),
    (-(2**70), 0, str(-(2**70))),
    (2**70 + 5, 4, f"{2**70 + 5}"[:-4] + "." + f"{2**70 + 5}"[-4:]),
])
def test_decimal_bytes_two_complement(unscaled, scale, text):
    ftype = field_type(_decimal_schema(30, scale))
    assert ftype.ddl == f"decimal(30,{scale})"
    assert wire(ftype, _unscaled_b64(unscaled)) == text


def test_decimal_genuine_values():
    # 'AeJA' and 'AJY=' are what Debezium sent for 1234.56 and 1.50 (tests/data/debezium_events.jsonl)
    ftype = field_type(_decimal_schema(10, 2))
    assert wire(ftype, "AeJA") == "1234.56"
    assert wire(ftype, "AJY=") == "1.50"
    # a negative value whose first byte has the sign bit set: 0xFF 0x85 = -123 → -1.23
    assert wire(ftype, base64.b64encode(b"\xff\x85").decode()) == "-1.23"


def test_decimal_string_mode_and_unbounded_precision():
    assert field_type(_decimal_schema(10, 2, kind="string")).convert("-12.30") == decimal.Decimal("-12.30")
    unbounded = field_type(_decimal_schema(None, 2))
    assert unbounded.ddl == "string"
    assert unbounded.convert(_unscaled_b64(-5)) == "-0.05"
    assert field_type(_decimal_schema(60, 2)).ddl == "string"


def test_decimal_bad_base64_raises():
    with pytest.raises(Exception):
        field_type(_decimal_schema(10, 2)).convert("not base64!!")


def test_variable_scale_decimal():
    ftype = field_type({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    assert ftype.ddl == "string"
    assert wire(ftype, {"scale": 3, "value": _unscaled_b64(-12345)}) == "-12.345"
    assert wire(ftype, {"scale": 0, "value": _unscaled_b64(42)}) == "42"
    assert wire(ftype, None) is None


@pytest.mark.parametrize("name", ["io.debezium.time.Date", "org.apache.kafka.connect.data.Date"])
def test_date(name):
    ftype = field_type({"type": "int32", "name": name})
    assert ftype.ddl == "date"
    assert wire(ftype, 19782) == "2024-02-29"
    assert wire(ftype, 0) == "1970-01-01"
    assert wire(ftype, -1) == "1969-12-31"


@pytest.mark.parametrize("name, value", [
    ("io.debezium.time.Timestamp", 1709210096789),
    ("org.apache.kafka.connect.data.Timestamp", 1709210096789),
    ("io.debezium.time.MicroTimestamp", 1709210096789000),
    ("io.debezium.time.NanoTimestamp", 1709210096789000123),
])
def test_timestamps_without_zone(name, value):
    ftype = field_type({"type": "int64", "name": name})
    assert ftype.ddl == "timestamp_ntz"
    assert wire(ftype, value) == "2024-02-29T12:34:56.789000"


def test_timestamp_before_epoch():
    ftype = field_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert wire(ftype, -1) == "1969-12-31T23:59:59.999999"


@pytest.mark.parametrize("value, expected", [
    ("2024-02-29T10:34:56.789000Z", "2024-02-29T10:34:56.789000Z"),
    ("2024-02-29T12:34:56.789+02:00", "2024-02-29T10:34:56.789000Z"),
    ("2024-02-29T00:30:00-05:30", "2024-02-29T06:00:00.000000Z"),
    ("2024-03-01T01:00:00+09:00", "2024-02-29T16:00:00.000000Z"),
])
def test_zoned_timestamp_normalised_to_utc(value, expected):
    ftype = field_type({"type": "string", "name": "io.debezium.time.ZonedTimestamp"})
    assert ftype.ddl == "timestamp"
    assert wire(ftype, value) == expected


def test_zoned_timestamp_garbage_is_a_decode_error():
    with pytest.raises(DecodeError, match="ISO-8601"):
        field_type({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}).convert("yesterday")


@pytest.mark.parametrize("name, value", [
    ("io.debezium.time.Time", 45296789),
    ("org.apache.kafka.connect.data.Time", 45296789),
    ("io.debezium.time.MicroTime", 45296789000),
    ("io.debezium.time.NanoTime", 45296789000000),
])
def test_time_types(name, value):
    ftype = field_type({"type": "int64", "name": name})
    assert ftype.ddl == "string"
    assert wire(ftype, value) == "12:34:56.789000"


def test_zoned_time_and_other_string_semantics():
    assert field_type({"type": "string", "name": "io.debezium.time.ZonedTime"}).convert("12:00:00Z") == "12:00:00Z"
    for name in ("io.debezium.data.Uuid", "io.debezium.data.Enum", "io.debezium.data.Xml",
                 "io.debezium.data.EnumSet", "io.debezium.time.Interval", "io.debezium.data.Ltree"):
        assert field_type({"type": "string", "name": name}).ddl == "string"
    assert field_type({"type": "int64", "name": "io.debezium.time.MicroDuration"}).ddl == "bigint"
    assert field_type({"type": "bytes", "name": "io.debezium.data.Bits"}).ddl == "binary"


def test_json_column_stays_text():
    ftype = field_type({"type": "string", "name": "io.debezium.data.Json"})
    assert ftype.ddl == "string"
    assert wire(ftype, '{"a": [1, 2], "b": null}') == '{"a": [1, 2], "b": null}'
    assert wire(ftype, {"a": 1}) == '{"a":1}'


def test_geometry_is_json_text():
    ftype = field_type({"type": "struct", "name": "io.debezium.data.geometry.Point"})
    assert ftype.ddl == "string"
    assert '"x":1.0' in wire(ftype, {"x": 1.0, "y": 2.0})


def test_arrays_convert_elements_and_keep_nulls():
    ftype = field_type({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}})
    assert ftype.ddl == "array<date>"
    assert wire(ftype, [0, None, 19782]) == ["1970-01-01", None, "2024-02-29"]
    assert field_type({"type": "array", "items": {"type": "int32"}}).ddl == "array<int>"
    assert field_type({"type": "array", "items": _decimal_schema(5, 1)}).convert([_unscaled_b64(-15)]) == [decimal.Decimal("-1.5")]


def test_map_type():
    ftype = field_type({"type": "map", "keys": {"type": "string"}, "values": {"type": "int64"}})
    assert ftype.ddl == "map<string,bigint>"
    assert wire(ftype, {"a": 1, "b": None}) == {"a": 1, "b": None}


def test_struct_type_nested_conversion():
    schema = {"type": "struct", "fields": [
        {"field": "when", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "price", **_decimal_schema(8, 2)},
        {"field": "inner", "type": "struct", "fields": [{"field": "n", "type": "int64"}]},
    ]}
    ftype = field_type(schema)
    assert ftype.ddl == "struct<`when`:date,`price`:decimal(8,2),`inner`:struct<`n`:bigint>>"
    assert ftype.convert({"when": 1, "price": _unscaled_b64(-999), "inner": {"n": 3}}) == {
        "when": 1, "price": decimal.Decimal("-9.99"), "inner": {"n": 3}}
    assert wire(ftype, {"when": None}) == {"when": None, "price": None, "inner": None}


def test_unknown_type_raises():
    with pytest.raises(DecodeError, match="unsupported"):
        field_type({"type": "weird"})


@pytest.mark.parametrize("value, expected", [
    (None, None), (True, "boolean"), (3, "bigint"), (2.5, "double"), ("x", "string"),
    ([1, 2], "array<bigint>"), ([1, 2.5], "array<double>"), ([], "array<string>"), ({}, None),
    ({"a": 1, "b": {"c": "x"}}, "struct<`a`:bigint,`b`:struct<`c`:string>>"),
    ({"a": None}, "struct<`a`:string>"),
])
def test_infer_type(value, expected):
    assert infer_type(value) == expected


@pytest.mark.parametrize("a, b, expected", [
    (None, "bigint", "bigint"), ("bigint", None, "bigint"), ("int", "bigint", "bigint"),
    ("bigint", "double", "double"), ("double", "bigint", "double"), ("float", "double", "double"),
    ("bigint", "string", "string"), ("boolean", "bigint", "string"), ("string", "string", "string"),
])
def test_merge_types(a, b, expected):
    assert merge_types(a, b) == expected


def test_decimal_timestamps_land_exactly():
    # the conversions are exact to the microsecond, including far past dates
    ftype = field_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    micros = int((dt.datetime(1900, 1, 1, 0, 0, 0, 1) - dt.datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    assert wire(ftype, micros) == "1900-01-01T00:00:00.000001"


def test_json_converter_float_type_names():
    """Kafka Connect's JsonConverter names FLOAT64/FLOAT32 "double"/"float" in schemas (real Debezium output)."""
    from lakestream.decode.types import field_type

    assert field_type({"type": "double", "optional": True, "field": "price"}).ddl == "double"
    assert field_type({"type": "float", "optional": True, "field": "ratio"}).ddl == "float"
