"""Decoding Debezium envelopes (genuine events, schemas on and off) and plain JSON events."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest
from conftest import load_debezium_fixture

from lakestream.decode.envelope import SchemaCache, decode_debezium, decode_json_event, decode_key
from lakestream.decode.types import UNAVAILABLE_VALUE
from lakestream.errors import DecodeError


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _decode_all(name: str):
    cache = SchemaCache()
    out = []
    for event in load_debezium_fixture(name):
        if event["value"] is None:
            out.append(None)
            continue
        out.append(decode_debezium(_b(event["key"]), _b(event["value"]), cache))
    return out


@pytest.mark.parametrize("name", ["debezium_events.jsonl", "debezium_events_noschema.jsonl"])
def test_genuine_events_ops_and_keys(name):
    changes = _decode_all(name)
    assert [c and c.op for c in changes] == ["r", "r", "r", "c", "u", "d", None, "c"]
    assert [c and c.key for c in changes] == [
        {"id": 1},
        {"id": 2},
        {"id": 3},
        {"id": 4},
        {"id": 1},
        {"id": 2},
        None,
        {"id": 5},
    ]
    assert changes[4].row["note"] == "changed"
    # the delete's row is its before image (the key is real, the rest are defaults/nulls)
    assert changes[5].row["id"] == 2
    assert all(c.source_ts_ms for c in changes if c)


def test_genuine_events_with_schema_are_typed():
    changes = _decode_all("debezium_events.jsonl")
    first = changes[0]
    types = dict(zip(first.columns.names, (t.ddl for t in first.columns.types), strict=True))
    assert types == {
        "id": "int",
        "big": "bigint",
        "amount": "decimal(10,2)",
        "note": "string",
        "flag": "boolean",
        "day": "date",
        "ts": "timestamp_ntz",
        "tstz": "timestamp",
        "doc": "string",
        "uid": "string",
        "raw": "binary",
        "tags": "array<int>",
    }
    assert not first.columns.inferred
    row = first.row
    assert (
        row["amount"] == decimal.Decimal("1234.56") and row["day"] == (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days
    )
    epoch = dt.datetime(1970, 1, 1)
    assert row["ts"] == (dt.datetime(2024, 2, 29, 12, 34, 56, 789000) - epoch) // dt.timedelta(microseconds=1)
    assert row["tstz"] == (dt.datetime(2024, 2, 29, 10, 34, 56, 789000) - epoch) // dt.timedelta(microseconds=1)
    assert json.loads(row["doc"]) == {"a": [1, 2], "b": None}
    assert row["raw"] == bytes.fromhex("deadbeef") and row["tags"] == [1, 2, 3] and row["big"] == 9000000000
    assert changes[4].row["amount"] == decimal.Decimal("1.50")
    # same schema bytes → same shape id (one shape per table per batch)
    assert len({c.columns.schema_id for c in changes if c}) == 1


def test_genuine_events_without_schema_are_inferred():
    changes = _decode_all("debezium_events_noschema.jsonl")
    first = changes[0]
    assert first.columns.inferred
    types = dict(zip(first.columns.names, (t.ddl for t in first.columns.types), strict=True))
    assert types["id"] == "bigint" and types["note"] == "string" and types["tags"] == "array<bigint>"
    assert first.row["amount"] == "AeJA"  # no schema: the raw wire value is kept


def _envelope(payload: dict, schema: dict | None = None) -> bytes:
    if schema is None:
        return json.dumps(payload).encode()
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


ROW_SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "field": "before",
            "optional": True,
            "fields": [
                {"type": "int32", "field": "id"},
                {"type": "string", "field": "body"},
                {"type": "int32", "field": "n"},
            ],
        },
        {
            "type": "struct",
            "field": "after",
            "optional": True,
            "fields": [
                {"type": "int32", "field": "id"},
                {"type": "string", "field": "body"},
                {"type": "int32", "field": "n"},
            ],
        },
        {"type": "string", "field": "op"},
    ],
}


def test_unavailable_value_is_reported_not_written():
    payload = {"before": None, "after": {"id": 1, "body": UNAVAILABLE_VALUE, "n": 2}, "op": "u", "source": {"ts_ms": 5}}
    for schema in (ROW_SCHEMA, None):
        change = decode_debezium(b'{"id":1}', _envelope(payload, schema), SchemaCache())
        assert change.unavailable == ["body"]
        assert change.row == {"id": 1, "body": None, "n": 2}
        assert change.source_ts_ms == 5


def test_schema_cache_reuses_schema_and_parses_payload():
    cache = SchemaCache()
    a = decode_debezium(None, _envelope({"after": {"id": 1, "body": "x", "n": 1}, "op": "c"}, ROW_SCHEMA), cache)
    b = decode_debezium(None, _envelope({"after": {"id": 2, "body": "y", "n": 2}, "op": "c"}, ROW_SCHEMA), cache)
    assert a.columns is b.columns
    assert b.row == {"id": 2, "body": "y", "n": 2}
    # a changed schema (column added) is a new shape
    schema2 = json.loads(json.dumps(ROW_SCHEMA))
    schema2["fields"][1]["fields"].append({"type": "string", "field": "extra"})
    c = decode_debezium(
        None, _envelope({"after": {"id": 3, "body": "z", "n": 3, "extra": "e"}, "op": "c"}, schema2), cache
    )
    assert c.columns.schema_id != a.columns.schema_id
    assert c.columns.names[-1] == "extra"


def test_envelope_with_spaces_is_still_decoded():
    value = json.dumps({"schema": ROW_SCHEMA, "payload": {"after": {"id": 1, "body": "x", "n": 1}, "op": "r"}}).encode()
    assert b", " in value
    change = decode_debezium(None, value, SchemaCache())
    assert change.op == "r" and change.row["id"] == 1 and not change.columns.inferred


def test_ts_ms_falls_back_to_envelope():
    change = decode_debezium(None, _envelope({"after": {"id": 1}, "op": "c", "ts_ms": 99}), SchemaCache())
    assert change.source_ts_ms == 99


@pytest.mark.parametrize(
    "value, message",
    [
        (b'{"after": {"id": 1}, "op": "c"', "malformed JSON"),
        (b"not json at all", "malformed JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"after": {"id": 1}}', "missing 'op'"),
        (b'{"after": {"id": 1}, "op": "x"}', "unknown op 'x'"),
        (b'{"after": null, "op": "c"}', "without a 'after'"),
        (b'{"before": null, "after": null, "op": "d"}', "without a 'before'"),
        (
            b'{"schema": {"type": "struct", "fields": []}, "payload": {"after": {"id": 1}, "op": "c"}}',
            "no 'after'/'before'",
        ),
        (
            b'{"schema": {"type": "struct", "fields": [{"type": "struct", "field": "after", "fields": []}]}, '
            b'"payload": "text"}',
            "payload is not a JSON object",
        ),
    ],
)
def test_bad_envelopes_are_decode_errors(value, message):
    with pytest.raises(DecodeError, match=message):
        decode_debezium(b'{"id":1}', value, SchemaCache())


def test_conversion_failure_names_the_column():
    schema = {
        "type": "struct",
        "fields": [
            {
                "type": "struct",
                "field": "after",
                "fields": [
                    {"type": "int32", "field": "id"},
                    {
                        "type": "bytes",
                        "field": "amount",
                        "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    },
                ],
            }
        ],
    }
    with pytest.raises(DecodeError, match=r"^column 'amount': invalid base64 decimal '%%%'"):
        decode_debezium(None, _envelope({"after": {"id": 1, "amount": "%%%"}, "op": "c"}, schema), SchemaCache())
    with pytest.raises(DecodeError, match=r"^column 'amount': expected a decimal, got True$"):
        decode_debezium(None, _envelope({"after": {"id": 1, "amount": True}, "op": "c"}, schema), SchemaCache())
    # a non-integer where an integer is expected names the column and the value
    typed = {
        "type": "struct",
        "fields": [
            {
                "type": "struct",
                "field": "after",
                "fields": [
                    {"type": "int32", "field": "day", "name": "io.debezium.time.Date"},
                    {"type": "int64", "field": "ts", "name": "io.debezium.time.MicroTimestamp"},
                    {"type": "struct", "field": "s", "fields": [{"type": "int32", "field": "n"}]},
                ],
            }
        ],
    }
    with pytest.raises(DecodeError, match=r"^column 'day': expected an integer, got str '2024-02-29'$"):
        decode_debezium(None, _envelope({"after": {"day": "2024-02-29"}, "op": "c"}, typed), SchemaCache())
    with pytest.raises(DecodeError, match=r"^column 'ts': expected an integer, got float '1.5'$"):
        decode_debezium(None, _envelope({"after": {"ts": 1.5}, "op": "c"}, typed), SchemaCache())
    # a non-DecodeError failure (a struct column holding a string) is still a DecodeError naming the column
    with pytest.raises(DecodeError, match=r"^column 's': cannot convert 'x' to struct<`n`:int>: "):
        decode_debezium(None, _envelope({"after": {"s": "x"}, "op": "c"}, typed), SchemaCache())


def test_typed_values_with_nulls_and_pre_epoch():
    schema = {
        "type": "struct",
        "fields": [
            {
                "type": "struct",
                "field": "after",
                "fields": [
                    {"type": "int32", "field": "id"},
                    {"type": "int32", "field": "day", "name": "io.debezium.time.Date", "optional": True},
                    {"type": "int64", "field": "ts", "name": "io.debezium.time.Timestamp", "optional": True},
                    {
                        "type": "bytes",
                        "field": "amount",
                        "name": "org.apache.kafka.connect.data.Decimal",
                        "optional": True,
                        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    },
                ],
            }
        ],
    }
    change = decode_debezium(
        None, _envelope({"after": {"id": 1, "day": -1, "ts": -1, "amount": "/4U="}, "op": "c"}, schema), SchemaCache()
    )
    assert change.row == {"id": 1, "day": -1, "ts": -1000, "amount": decimal.Decimal("-1.23")}
    nulls = decode_debezium(
        None, _envelope({"after": {"id": 2, "day": None, "ts": None, "amount": None}, "op": "c"}, schema), SchemaCache()
    )
    assert nulls.row == {"id": 2, "day": None, "ts": None, "amount": None}


def test_nan_float_is_accepted():
    change = decode_debezium(None, b'{"after": {"id": 1, "x": NaN}, "op": "c"}', SchemaCache())
    assert change.row["id"] == 1


def test_keys_with_and_without_schema():
    assert decode_key(None) is None
    assert decode_key(b'{"id": 7}') == {"id": 7}
    with_schema = json.dumps(
        {
            "schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]},
            "payload": {"id": 7, "region": "eu"},
        }
    ).encode()
    assert decode_key(with_schema) == {"id": 7, "region": "eu"}
    with pytest.raises(DecodeError, match="not a JSON object"):
        decode_key(b"42")
    with pytest.raises(DecodeError, match="malformed"):
        decode_key(b"{")


def test_json_events_are_inferred_and_unioned_by_shape():
    cache = SchemaCache()
    a = decode_json_event(b'{"id": "e1", "n": 1, "meta": {"ua": "x"}}', cache)
    b = decode_json_event(b'{"id": "e2", "n": 2, "meta": {"ua": "y"}}', cache)
    c = decode_json_event(b'{"id": "e3", "n": 2.5, "extra": null}', cache)
    assert a.op == "c" and a.key is None and a.row["meta"] == {"ua": "x"}
    assert a.columns is b.columns
    assert dict(zip(a.columns.names, (t.ddl for t in a.columns.types), strict=True)) == {
        "id": "string",
        "n": "bigint",
        "meta": "struct<`ua`:string>",
    }
    # null fields give no type evidence
    assert dict(zip(c.columns.names, (t.ddl for t in c.columns.types), strict=True)) == {"id": "string", "n": "double"}
    with pytest.raises(DecodeError, match="not a JSON object"):
        decode_json_event(b'"just a string"', cache)
    with pytest.raises(DecodeError, match="malformed"):
        decode_json_event(b"{oops", cache)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ('"2024-03-01T10:00:00Z"', dt.datetime(2024, 3, 1, 10)),
        ('"2024-03-03T01:00:00+02:00"', dt.datetime(2024, 3, 2, 23)),
        ("1709287200", dt.datetime(2024, 3, 1, 10)),
        ("1709287200123", dt.datetime(2024, 3, 1, 10, 0, 0, 123000)),
        ('"1969-12-31T23:59:59Z"', dt.datetime(1969, 12, 31, 23, 59, 59)),
    ],
)
def test_json_event_time_field_becomes_utc_micros(raw, expected):
    change = decode_json_event(b'{"device": "a", "at": ' + raw.encode() + b"}", SchemaCache(), time_field="at")
    micros = (expected - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    assert change.row["at"] == micros and isinstance(change.row["at"], int)
    assert change.source_ts_ms == micros // 1000
    types = dict(zip(change.columns.names, (t.ddl for t in change.columns.types), strict=True))
    assert types == {"device": "string", "at": "timestamp"}


def test_json_event_time_field_missing_or_bad():
    with pytest.raises(DecodeError, match="event time field 'at' is missing or null"):
        decode_json_event(b'{"device": "a"}', SchemaCache(), time_field="at")
    with pytest.raises(DecodeError, match="event time field 'at' is missing or null"):
        decode_json_event(b'{"at": null}', SchemaCache(), time_field="at")
    with pytest.raises(DecodeError, match="not an ISO-8601 timestamp: 'soon'"):
        decode_json_event(b'{"at": "soon"}', SchemaCache(), time_field="at")
    with pytest.raises(DecodeError, match="event time True is not a timestamp"):
        decode_json_event(b'{"at": true}', SchemaCache(), time_field="at")


def _envelope_with(after_fields: list[dict], payload: dict) -> bytes:
    row = {"type": "struct", "optional": True, "name": "p.public.t.Value", "fields": after_fields}
    schema = {
        "type": "struct",
        "name": "p.public.t.Envelope",
        "fields": [
            dict(row, field="before"),
            dict(row, field="after"),
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    return json.dumps({"schema": schema, "payload": payload}).encode()


def test_truncate_and_message_events_carry_no_row():
    cache = SchemaCache()
    fields = [{"type": "int32", "optional": False, "field": "id"}]
    truncate = decode_debezium(
        None,
        _envelope_with(fields, {"op": "t", "before": None, "after": None, "source": {"ts_ms": 1700000000123}}),
        cache,
    )
    assert (truncate.op, truncate.row, truncate.key, truncate.source_ts_ms) == ("t", {}, None, 1700000000123)
    message = decode_debezium(
        b'{"prefix":"app"}',
        json.dumps({"op": "m", "ts_ms": 5, "message": {"prefix": "app", "content": "aGk="}}).encode(),
        cache,
    )
    assert (message.op, message.row) == ("m", {})
    with pytest.raises(DecodeError, match="unknown op 'x'"):
        decode_debezium(None, json.dumps({"op": "x", "after": {"id": 1}}).encode(), cache)


def test_column_defaults_are_read_from_the_connect_schema_in_wire_form():
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "int32", "optional": True, "default": 7, "field": "loyalty"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "default": 18295, "field": "since"},
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "default": "BOI=",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "field": "credit",
        },
        {"type": "string", "optional": True, "field": "note"},
    ]
    change = decode_debezium(None, _envelope_with(fields, {"op": "c", "after": {"id": 1}}), SchemaCache())
    assert change.columns.defaults == {"loyalty": 7, "since": 18295, "credit": decimal.Decimal("12.50")}
    without = decode_debezium(
        None, _envelope_with([fields[0], fields[1] | {"default": None}], {"op": "c", "after": {"id": 1}}), SchemaCache()
    )
    assert without.columns.defaults == {}
    assert without.columns.schema_id != change.columns.schema_id


@pytest.mark.parametrize(
    "ddl, iceberg_type, wire, json_value",
    [
        ("int", "int", 7, 7),
        ("string", "string", "gold", "gold"),
        ("date", "date", 18295, "2020-02-03"),
        ("timestamp_ntz", "timestamp", 1_580_688_000_000_001, "2020-02-03T00:00:00.000001"),
        ("timestamp", "timestamptz", -1, "1969-12-31T23:59:59.999999+00:00"),
        ("decimal(10,2)", "decimal(10, 2)", decimal.Decimal("-12.50"), "-12.50"),
    ],
)
def test_defaults_round_trip_through_icebergs_single_value_json(ddl, iceberg_type, wire, json_value):
    from lakestream.sink.write.defaults import iceberg_json, wire_value

    assert iceberg_json(ddl, wire) == json_value
    assert wire_value(iceberg_type, json_value) == wire


def test_a_schemas_on_message_event_has_no_row_struct_and_still_decodes():
    schema = {
        "type": "struct",
        "name": "io.debezium.connector.postgresql.MessageValue",
        "fields": [
            {"type": "string", "optional": False, "field": "op"},
            {
                "type": "struct",
                "optional": True,
                "field": "message",
                "fields": [{"type": "string", "optional": False, "field": "prefix"}],
            },
        ],
    }
    value = json.dumps({"schema": schema, "payload": {"op": "m", "message": {"prefix": "app"}}}).encode()
    assert decode_debezium(None, value, SchemaCache()).op == "m"
