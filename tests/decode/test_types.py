"""Debezium / Kafka Connect field schemas → column types, and values → the typed Python values pyarrow builds
the columns from (dates as epoch days, timestamps as epoch microseconds UTC, decimals as Decimal, bytes)."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal

import pytest

from lakestream.decode.types import field_type, infer_type, merge_types
from lakestream.errors import DecodeError

_EPOCH = dt.datetime(1970, 1, 1)


def _days(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days


def _micros(when: dt.datetime) -> int:
    """Microseconds since the epoch of a naive (UTC) datetime, computed independently of the code under test."""
    return (when - _EPOCH) // dt.timedelta(microseconds=1)


def _unscaled_b64(unscaled: int) -> str:
    length = max(1, (unscaled.bit_length() + 8) // 8)  # room for the sign bit
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def _decimal_schema(precision: int | None, scale: int, kind: str = "bytes") -> dict:
    params = {"scale": str(scale)}
    if precision is not None:
        params["connect.decimal.precision"] = str(precision)
    return {"type": kind, "name": "org.apache.kafka.connect.data.Decimal", "parameters": params}


@pytest.mark.parametrize(
    "kind, ddl",
    [
        ("int8", "int"),
        ("int16", "int"),
        ("int32", "int"),
        ("int64", "bigint"),
        ("float32", "float"),
        ("float64", "double"),
        ("boolean", "boolean"),
        ("string", "string"),
    ],
)
def test_primitive_types(kind, ddl):
    ftype = field_type({"type": kind})
    assert ftype.ddl == ddl
    assert ftype.convert(7) == 7


def test_bytes_are_base64_decoded_strictly():
    ftype = field_type({"type": "bytes"})
    assert ftype.ddl == "binary"
    assert ftype.convert("3q2+7w==") == bytes.fromhex("deadbeef")
    assert ftype.convert("") == b""
    with pytest.raises(DecodeError, match=r"invalid base64 bytes 'not base64!!'"):
        ftype.convert("not base64!!")
    with pytest.raises(DecodeError, match=r"invalid base64 bytes '3q2\+7w': Incorrect padding"):
        ftype.convert("3q2+7w")
    with pytest.raises(DecodeError, match="expected base64 bytes, got int"):
        ftype.convert(7)


@pytest.mark.parametrize(
    "unscaled, scale, text",
    [
        (123456, 2, "1234.56"),
        (-123456, 2, "-1234.56"),
        (-1, 2, "-0.01"),
        (150, 2, "1.50"),
        (0, 3, "0.000"),
        (-(2**70), 0, str(-(2**70))),
        (2**70 + 5, 4, f"{2**70 + 5}"[:-4] + "." + f"{2**70 + 5}"[-4:]),
        (-(10**29 + 7), 3, "-100000000000000000000000000.007"),  # 30 digits: more than Decimal's default 28
    ],
)
def test_decimal_bytes_two_complement(unscaled, scale, text):
    ftype = field_type(_decimal_schema(30, scale))
    assert ftype.ddl == f"decimal(30,{scale})"
    value = ftype.convert(_unscaled_b64(unscaled))
    assert isinstance(value, Decimal)
    assert value == Decimal(text) and str(value) == text  # the scale is kept: 1.50, 0.000


def test_decimal_genuine_values():
    # 'AeJA' and 'AJY=' are what Debezium sent for 1234.56 and 1.50 (tests/data/debezium_events.jsonl)
    ftype = field_type(_decimal_schema(10, 2))
    assert ftype.convert("AeJA") == Decimal("1234.56")
    assert str(ftype.convert("AJY=")) == "1.50"
    # a negative value whose first byte has the sign bit set: 0xFF 0x85 = -123 → -1.23
    assert ftype.convert(base64.b64encode(b"\xff\x85").decode()) == Decimal("-1.23")


def test_decimal_string_mode_and_unbounded_precision():
    string_mode = field_type(_decimal_schema(10, 2, kind="string"))
    assert string_mode.ddl == "decimal(10,2)"
    assert string_mode.convert("-12.30") == Decimal("-12.30") and str(string_mode.convert("-12.30")) == "-12.30"
    with pytest.raises(DecodeError, match=r"not a decimal number: 'abc'"):
        string_mode.convert("abc")
    with pytest.raises(DecodeError, match=r"decimal value 'NaN' is not a finite number"):
        string_mode.convert("NaN")
    unbounded = field_type(_decimal_schema(None, 2))
    assert unbounded.ddl == "string"
    assert unbounded.convert(_unscaled_b64(-5)) == "-0.05"  # unbounded precision stays text, every digit kept
    big = -(10**50 + 7)
    assert unbounded.convert(_unscaled_b64(big)) == str(big)[:-2] + "." + str(big)[-2:]
    wide = field_type(_decimal_schema(60, 2))
    assert wide.ddl == "string"
    assert wide.convert(_unscaled_b64(12345)) == "123.45"
    assert field_type(_decimal_schema(None, 2, kind="string")).convert("-0.05") == "-0.05"


def test_decimal_bad_values_raise():
    ftype = field_type(_decimal_schema(10, 2))
    with pytest.raises(DecodeError, match=r"invalid base64 decimal 'not base64!!'"):
        ftype.convert("not base64!!")
    with pytest.raises(DecodeError, match="expected a decimal, got True"):
        ftype.convert(True)
    with pytest.raises(DecodeError, match="expected base64 decimal bytes, got list"):
        ftype.convert([1])
    with pytest.raises(DecodeError, match="decimal value 'nan' is not a finite number"):
        ftype.convert(float("nan"))


def test_variable_scale_decimal():
    ftype = field_type({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    assert ftype.ddl == "string"
    assert ftype.convert({"scale": 3, "value": _unscaled_b64(-12345)}) == "-12.345"
    assert ftype.convert({"scale": 0, "value": _unscaled_b64(42)}) == "42"
    assert (
        ftype.convert({"scale": 30, "value": _unscaled_b64(-(2**100))}) == "-1.267650600228229401496703205376"
    )  # all 31 digits, not rounded to 28
    assert ftype.convert(None) is None
    with pytest.raises(DecodeError, match="invalid variable-scale decimal"):
        ftype.convert({"scale": 1, "value": "%%%"})
    with pytest.raises(DecodeError, match="invalid variable-scale decimal"):
        ftype.convert({"value": _unscaled_b64(1)})


@pytest.mark.parametrize("name", ["io.debezium.time.Date", "org.apache.kafka.connect.data.Date"])
def test_date(name):
    ftype = field_type({"type": "int32", "name": name})
    assert ftype.ddl == "date"
    assert ftype.convert(19782) == _days(dt.date(2024, 2, 29)) == 19782
    assert ftype.convert(0) == _days(dt.date(1970, 1, 1)) == 0
    assert ftype.convert(-1) == _days(dt.date(1969, 12, 31)) == -1
    assert ftype.convert(-25567) == _days(dt.date(1900, 1, 1))
    for bad, kind in (("2024-02-29", "str"), (19782.0, "float"), (True, "bool")):
        with pytest.raises(DecodeError, match=f"expected an integer, got {kind} "):
            ftype.convert(bad)


@pytest.mark.parametrize(
    "name, value",
    [
        ("io.debezium.time.Timestamp", 1709210096789),
        ("org.apache.kafka.connect.data.Timestamp", 1709210096789),
        ("io.debezium.time.MicroTimestamp", 1709210096789000),
        ("io.debezium.time.NanoTimestamp", 1709210096789000123),
    ],
)
def test_timestamps_without_zone(name, value):
    ftype = field_type({"type": "int64", "name": name})
    assert ftype.ddl == "timestamp_ntz"
    assert ftype.convert(value) == _micros(dt.datetime(2024, 2, 29, 12, 34, 56, 789000)) == 1709210096789000
    with pytest.raises(DecodeError, match="expected an integer, got str '2024-02-29T12:34:56'"):
        ftype.convert("2024-02-29T12:34:56")


def test_timestamp_before_epoch():
    ftype = field_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert ftype.convert(-1) == _micros(dt.datetime(1969, 12, 31, 23, 59, 59, 999999)) == -1
    millis = field_type({"type": "int64", "name": "io.debezium.time.Timestamp"})
    assert millis.convert(-1) == _micros(dt.datetime(1969, 12, 31, 23, 59, 59, 999000))
    nanos = field_type({"type": "int64", "name": "io.debezium.time.NanoTimestamp"})
    assert nanos.convert(-1) == -1  # floored to the microsecond that contains it: 1969-12-31T23:59:59.999999
    assert nanos.convert(-1000) == -1


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2024-02-29T10:34:56.789000Z", dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),
        ("2024-02-29T12:34:56.789+02:00", dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),
        ("2024-02-29T00:30:00-05:30", dt.datetime(2024, 2, 29, 6, 0, 0)),
        ("2024-03-01T01:00:00+09:00", dt.datetime(2024, 2, 29, 16, 0, 0)),
        ("1969-12-31T23:59:59.999999Z", dt.datetime(1969, 12, 31, 23, 59, 59, 999999)),
        ("1900-01-01T01:00:00+01:00", dt.datetime(1900, 1, 1)),
        ("2024-02-29T10:34:56.789123456Z", dt.datetime(2024, 2, 29, 10, 34, 56, 789123)),  # nanos truncated
    ],
)
def test_zoned_timestamp_normalised_to_utc(value, expected):
    ftype = field_type({"type": "string", "name": "io.debezium.time.ZonedTimestamp"})
    assert ftype.ddl == "timestamp"
    assert ftype.convert(value) == _micros(expected)


def test_zoned_timestamp_garbage_is_a_decode_error():
    ftype = field_type({"type": "string", "name": "io.debezium.time.ZonedTimestamp"})
    with pytest.raises(DecodeError, match="not an ISO-8601 timestamp: 'yesterday'"):
        ftype.convert("yesterday")
    with pytest.raises(DecodeError, match="not an ISO-8601 timestamp: '5'"):
        ftype.convert(5)


@pytest.mark.parametrize(
    "name, value",
    [
        ("io.debezium.time.Time", 45296789),
        ("org.apache.kafka.connect.data.Time", 45296789),
        ("io.debezium.time.MicroTime", 45296789000),
        ("io.debezium.time.NanoTime", 45296789000000),
    ],
)
def test_time_types(name, value):
    ftype = field_type({"type": "int64", "name": name})
    assert ftype.ddl == "string"
    assert ftype.convert(value) == "12:34:56.789000"
    assert ftype.convert(0) == "00:00:00.000000"
    with pytest.raises(DecodeError, match="expected an integer, got str '12:34:56'"):
        ftype.convert("12:34:56")


def test_zoned_time_and_other_string_semantics():
    assert field_type({"type": "string", "name": "io.debezium.time.ZonedTime"}).convert("12:00:00Z") == "12:00:00Z"
    for name in (
        "io.debezium.data.Uuid",
        "io.debezium.data.Enum",
        "io.debezium.data.Xml",
        "io.debezium.data.EnumSet",
        "io.debezium.time.Interval",
        "io.debezium.data.Ltree",
    ):
        assert field_type({"type": "string", "name": name}).ddl == "string"
    assert field_type({"type": "int64", "name": "io.debezium.time.MicroDuration"}).ddl == "bigint"
    bits = field_type({"type": "bytes", "name": "io.debezium.data.Bits"})
    assert bits.ddl == "binary" and bits.convert("AQ==") == b"\x01"


def test_json_column_stays_text():
    ftype = field_type({"type": "string", "name": "io.debezium.data.Json"})
    assert ftype.ddl == "string"
    assert ftype.convert('{"a": [1, 2], "b": null}') == '{"a": [1, 2], "b": null}'
    assert ftype.convert({"a": 1}) == '{"a":1}'


def test_geometry_is_json_text():
    ftype = field_type({"type": "struct", "name": "io.debezium.data.geometry.Point"})
    assert ftype.ddl == "string"
    assert '"x":1.0' in ftype.convert({"x": 1.0, "y": 2.0})


def test_arrays_convert_elements_and_keep_nulls():
    ftype = field_type({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}})
    assert ftype.ddl == "array<date>"
    assert ftype.convert([0, None, 19782, -1]) == [0, None, _days(dt.date(2024, 2, 29)), _days(dt.date(1969, 12, 31))]
    assert ftype.convert([]) == []
    assert field_type({"type": "array", "items": {"type": "int32"}}).ddl == "array<int>"
    decimals = field_type({"type": "array", "items": _decimal_schema(5, 1)})
    assert decimals.ddl == "array<decimal(5,1)>"
    assert decimals.convert([_unscaled_b64(-15), None]) == [Decimal("-1.5"), None]
    stamps = field_type({"type": "array", "items": {"type": "int64", "name": "io.debezium.time.Timestamp"}})
    assert stamps.convert([-1, 1709210096789]) == [-1000, _micros(dt.datetime(2024, 2, 29, 12, 34, 56, 789000))]
    nested = field_type({"type": "array", "items": {"type": "array", "items": {"type": "bytes"}}})
    assert nested.ddl == "array<array<binary>>"
    assert nested.convert([["3q2+7w==", None], None, []]) == [[bytes.fromhex("deadbeef"), None], None, []]
    with pytest.raises(DecodeError, match="expected an integer, got str 'x'"):
        ftype.convert([0, "x"])


def test_array_rejects_a_non_array_value():
    # a string or object must not be iterated into characters/keys
    ftype = field_type({"type": "array", "items": {"type": "string"}})
    with pytest.raises(DecodeError, match="expected an array, got str 'abc'"):
        ftype.convert("abc")
    with pytest.raises(DecodeError, match="expected an array, got dict"):
        ftype.convert({"a": 1})


def test_map_type():
    ftype = field_type({"type": "map", "keys": {"type": "string"}, "values": {"type": "int64"}})
    assert ftype.ddl == "map<string,bigint>"
    assert ftype.convert({"a": 1, "b": None}) == {"a": 1, "b": None}
    dates = field_type(
        {"type": "map", "keys": {"type": "string"}, "values": {"type": "int32", "name": "io.debezium.time.Date"}}
    )
    assert dates.ddl == "map<string,date>"
    assert dates.convert({"x": -1, "y": None}) == {"x": -1, "y": None}


def test_struct_type_nested_conversion():
    schema = {
        "type": "struct",
        "fields": [
            {"field": "when", "type": "int32", "name": "io.debezium.time.Date"},
            {"field": "price", **_decimal_schema(8, 2)},
            {"field": "inner", "type": "struct", "fields": [{"field": "n", "type": "int64"}]},
        ],
    }
    ftype = field_type(schema)
    assert ftype.ddl == "struct<`when`:date,`price`:decimal(8,2),`inner`:struct<`n`:bigint>>"
    assert ftype.convert({"when": 1, "price": _unscaled_b64(-999), "inner": {"n": 3}}) == {
        "when": 1,
        "price": Decimal("-9.99"),
        "inner": {"n": 3},
    }
    assert ftype.convert({"when": None}) == {"when": None, "price": None, "inner": None}
    typed = field_type(
        {
            "type": "struct",
            "fields": [
                {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
                {
                    "field": "list",
                    "type": "array",
                    "items": {
                        "type": "struct",
                        "fields": [
                            {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
                            {"field": "b", "type": "bytes"},
                        ],
                    },
                },
            ],
        }
    )
    assert typed.ddl == "struct<`at`:timestamp_ntz,`list`:array<struct<`d`:date,`b`:binary>>>"
    assert typed.convert({"at": -1, "list": [{"d": -1, "b": "AQ=="}, None, {"d": None}]}) == {
        "at": -1,
        "list": [{"d": -1, "b": b"\x01"}, None, {"d": None, "b": None}],
    }


def test_unknown_type_raises():
    with pytest.raises(DecodeError, match="unsupported"):
        field_type({"type": "weird"})


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        (True, "boolean"),
        (3, "bigint"),
        (2.5, "double"),
        ("x", "string"),
        ([1, 2], "array<bigint>"),
        ([1, 2.5], "array<double>"),
        ([], "array<string>"),
        ({}, None),
        ({"a": 1, "b": {"c": "x"}}, "struct<`a`:bigint,`b`:struct<`c`:string>>"),
        ({"a": None}, "struct<`a`:string>"),
    ],
)
def test_infer_type(value, expected):
    assert infer_type(value) == expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (None, "bigint", "bigint"),
        ("bigint", None, "bigint"),
        ("int", "bigint", "bigint"),
        ("bigint", "double", "double"),
        ("double", "bigint", "double"),
        ("float", "double", "double"),
        ("bigint", "string", "string"),
        ("boolean", "bigint", "string"),
        ("string", "string", "string"),
    ],
)
def test_merge_types(a, b, expected):
    assert merge_types(a, b) == expected


def test_decimal_timestamps_land_exactly():
    # the conversions are exact to the microsecond, including far past dates
    ftype = field_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    micros = int((dt.datetime(1900, 1, 1, 0, 0, 0, 1) - dt.datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    assert ftype.convert(micros) == micros == _micros(dt.datetime(1900, 1, 1, 0, 0, 0, 1))


def test_json_converter_float_type_names():
    """Kafka Connect's JsonConverter names FLOAT64/FLOAT32 "double"/"float" in schemas (real Debezium output)."""
    from lakestream.decode.types import field_type

    assert field_type({"type": "double", "optional": True, "field": "price"}).ddl == "double"
    assert field_type({"type": "float", "optional": True, "field": "ratio"}).ddl == "float"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2024-02-29T10:34:56.789Z", dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),
        ("2024-02-29T12:34:56.789+02:00", dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),
        ("2024-02-29T10:34:56", dt.datetime(2024, 2, 29, 10, 34, 56)),  # no offset: UTC
        ("1969-12-31T23:59:59.5Z", dt.datetime(1969, 12, 31, 23, 59, 59, 500000)),
        (1709202896, dt.datetime(2024, 2, 29, 10, 34, 56)),  # epoch seconds
        (1709202896.789, dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),  # float seconds: rounded, not truncated
        (1095846138.37, dt.datetime(2004, 9, 22, 9, 42, 18, 370000)),
        (1709202896789, dt.datetime(2024, 2, 29, 10, 34, 56, 789000)),  # epoch milliseconds
        (1709202896789123, dt.datetime(2024, 2, 29, 10, 34, 56, 789123)),  # epoch microseconds
        (0, dt.datetime(1970, 1, 1)),
        (-86400, dt.datetime(1969, 12, 31)),
    ],
)
def test_event_time_is_utc_micros(value, expected):
    from lakestream.decode.types import event_time

    result = event_time(value)
    assert isinstance(result, int) and result == _micros(expected)


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "event time True is not a timestamp"),
        (float("nan"), "event time nan is not a timestamp"),
        (float("inf"), "event time inf is not a timestamp"),
        ("yesterday", "not an ISO-8601 timestamp: 'yesterday'"),
        ([1], r"event time '\[1\]' is neither an ISO-8601 string nor an epoch number"),
    ],
)
def test_event_time_rejects_non_timestamps(value, message):
    from lakestream.decode.types import event_time

    with pytest.raises(DecodeError, match=message):
        event_time(value)
