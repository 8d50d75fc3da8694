"""Avro in Confluent's wire format: the framing, the registry lookup by id, and the mapping of Avro and
Connect logical types onto the same column types the JSON path gives (Apicurio Registry through its
Confluent-compatible API, and real confluent-kafka / fastavro clients; no mocks)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import os
import time

import fastavro
import orjson
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from lakestream.config import ConfigError, SchemaRegistrySettings
from lakestream.decode.avro import AvroSchemas, connect_schema, decode_avro, schema_id_of
from lakestream.decode.envelope import SchemaCache, decode_debezium
from lakestream.decode.types import field_type
from lakestream.errors import DecodeError, SchemaRegistryUnavailable

# The row struct as Confluent's AvroConverter writes it for a Debezium PostgreSQL table: Connect
# types and semantic names kept as connect.type / connect.name / connect.parameters.
VALUE = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.items",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "small", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None},
        {
            "name": "amount",
            "type": [
                "null",
                {
                    "type": "bytes",
                    "scale": 2,
                    "precision": 10,
                    "connect.version": 1,
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "logicalType": "decimal",
                },
            ],
            "default": None,
        },
        {
            "name": "day",
            "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}],
            "default": None,
        },
        {
            "name": "ts",
            "type": ["null", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}],
            "default": None,
        },
        {
            "name": "tstz",
            "type": [
                "null",
                {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"},
            ],
            "default": None,
        },
        {
            "name": "doc",
            "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}],
            "default": None,
        },
        {
            "name": "uid",
            "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Uuid"}],
            "default": None,
        },
        {
            "name": "mood",
            "type": [
                "null",
                {
                    "type": "string",
                    "connect.version": 1,
                    "connect.parameters": {"allowed": "sad,ok,happy"},
                    "connect.name": "io.debezium.data.Enum",
                },
            ],
            "default": None,
        },
        {"name": "raw", "type": ["null", "bytes"], "default": None},
        {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "int"]}], "default": None},
        # Avro logical types without Connect names (a schema not written by AvroConverter)
        {"name": "paid_ms", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
        {"name": "paid_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
        {"name": "born", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {
            "name": "price",
            "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 3}],
            "default": None,
        },
    ],
    "connect.name": "shop.public.items.Value",
}
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.items",
    "fields": [
        {"name": "before", "type": ["null", VALUE], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [{"name": "ts_ms", "type": "long"}, {"name": "table", "type": "string"}],
                "connect.name": "io.debezium.connector.postgresql.Source",
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
    "connect.version": 2,
    "connect.name": "shop.public.items.Envelope",
}
KEY = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.items",
    "fields": [{"name": "id", "type": "int"}],
    "connect.name": "shop.public.items.Key",
}

ROW = {
    "id": 7,
    "small": 3,
    "amount": (123456).to_bytes(3, "big", signed=True),
    "day": 19782,
    "ts": 1_709_210_096_789_000,
    "tstz": "2024-02-29T10:34:56.789Z",
    "doc": '{"a": [1, 2]}',
    "uid": "0e8f4c1e-3b7a-4d7f-9a34-1a2b3c4d5e6f",
    "mood": "happy",
    "raw": b"\xde\xad\xbe\xef",
    "tags": [1, None, 3],
    "paid_ms": 1_709_210_096_789,
    "paid_us": 1_709_210_096_789_123,
    "born": -1,
    "price": (-1500).to_bytes(2, "big", signed=True),
}


def frame(schema_id: int, schema: dict, datum: dict) -> bytes:
    """A Confluent-framed Avro record, written the way the serializers write it."""
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    raw = {k: v for k, v in schema.items()}
    fastavro.schemaless_writer(out, fastavro.parse_schema(_no_logical(raw)), datum)
    return out.getvalue()


def _no_logical(schema):
    if isinstance(schema, list):
        return [_no_logical(x) for x in schema]
    if isinstance(schema, dict):
        return {k: _no_logical(v) for k, v in schema.items() if k != "logicalType"}
    return schema


@pytest.fixture
def registered(schema_registry):
    client = SchemaRegistryClient({"url": schema_registry.url})
    value_id = client.register_schema("shop.public.items-value", Schema(orjson.dumps(ENVELOPE).decode(), "AVRO"))
    key_id = client.register_schema("shop.public.items-key", Schema(orjson.dumps(KEY).decode(), "AVRO"))
    return schema_registry, value_id, key_id


def test_wire_format_header():
    assert schema_id_of(b"\x00\x00\x00\x01\x02body") == 258
    assert schema_id_of(b"\x00\x00\x00\x01") is None  # too short for a header
    assert schema_id_of(b'{"id": 1}') is None
    assert schema_id_of(b"\x01\x00\x00\x00\x01x") is None  # another magic byte


def test_avro_change_decodes_to_the_json_paths_types(registered):
    server, value_id, key_id = registered
    schemas = AvroSchemas({"url": server.url})
    value = frame(
        value_id,
        ENVELOPE,
        {
            "before": None,
            "after": ROW,
            "source": {"ts_ms": 1709210096789, "table": "items"},
            "op": "c",
            "ts_ms": 1709210097000,
        },
    )
    change = decode_debezium(frame(key_id, KEY, {"id": 7}), value, SchemaCache(), schemas)
    assert change.op == "c" and change.key == {"id": 7} and change.source_ts_ms == 1709210096789
    ddl = dict(zip(change.columns.names, [t.ddl for t in change.columns.types], strict=True))
    assert ddl == {
        "id": "int",
        "small": "int",
        "amount": "decimal(10,2)",
        "day": "date",
        "ts": "timestamp_ntz",
        "tstz": "timestamp",
        "doc": "string",
        "uid": "string",
        "mood": "string",
        "raw": "binary",
        "tags": "array<int>",
        "paid_ms": "timestamp_ntz",
        "paid_us": "timestamp_ntz",
        "born": "date",
        "price": "decimal(6,3)",
    }
    row = change.row
    assert row["amount"] == decimal.Decimal("1234.56")
    assert row["price"] == decimal.Decimal("-1.500")
    assert row["day"] == (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days and row["born"] == -1
    assert row["ts"] == 1_709_210_096_789_000
    assert row["tstz"] == 1_709_202_896_789_000  # 10:34:56.789Z as UTC microseconds
    assert row["paid_ms"] == 1_709_210_096_789_000 and row["paid_us"] == 1_709_210_096_789_123
    assert row["raw"] == b"\xde\xad\xbe\xef" and row["tags"] == [1, None, 3]
    assert (row["doc"], row["mood"], row["small"]) == ('{"a": [1, 2]}', "happy", 3)
    assert change.columns.inferred is False


def test_avro_and_json_schemas_give_the_same_shape(registered):
    """The Connect schema derived from Avro maps through the same `field_type` as JsonConverter's."""
    json_fields = {  # the same columns as JsonConverter would describe them
        "amount": {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        "day": {"type": "int32", "name": "io.debezium.time.Date"},
        "ts": {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        "small": {"type": "int16"},
    }
    derived = {f["field"]: f for f in connect_schema(VALUE)["fields"]}
    for name, js in json_fields.items():
        assert field_type(derived[name]).ddl == field_type(js).ddl, name
    assert derived["small"]["optional"] is True and derived["id"]["optional"] is False


def test_schemas_are_fetched_once_per_id(registered):
    server, value_id, _ = registered
    schemas = AvroSchemas({"url": server.url})
    value = frame(
        value_id,
        ENVELOPE,
        {"before": None, "after": ROW, "source": {"ts_ms": 1, "table": "items"}, "op": "u", "ts_ms": None},
    )
    before = server.requests("GET", f"/schemas/ids/{value_id}")
    for _ in range(50):
        decode_avro(value, schemas)
    assert server.requests("GET", f"/schemas/ids/{value_id}") - before == 1
    assert schemas.fetches == 1


def test_unknown_id_and_corrupt_body_are_record_errors(registered):
    server, value_id, _ = registered
    schemas = AvroSchemas({"url": server.url})
    with pytest.raises(DecodeError, match="schema id 999 is not in the schema registry"):
        decode_avro(b"\x00\x00\x00\x03\xe7" + b"\x02", schemas)
    good = frame(
        value_id,
        ENVELOPE,
        {"before": None, "after": ROW, "source": {"ts_ms": 1, "table": "t"}, "op": "c", "ts_ms": None},
    )
    with pytest.raises(DecodeError, match=f"does not match schema id {value_id}"):
        decode_avro(good[:20], schemas)
    with pytest.raises(DecodeError, match="bytes after the record"):
        decode_avro(good + b"\x00\x00", schemas)


def test_registry_down_is_not_the_records_fault():
    schemas = AvroSchemas({"url": "http://127.0.0.1:9", "timeout": 2, "max.retries": 0})
    with pytest.raises(SchemaRegistryUnavailable, match="schema id 5"):
        decode_avro(b"\x00\x00\x00\x00\x05\x02", schemas)


def test_confluent_framed_without_a_registry_stays_a_dead_letter():
    with pytest.raises(DecodeError, match="no schema registry is configured"):
        decode_debezium(None, b"\x00\x00\x00\x00\x05\x02\x04", SchemaCache())


def test_basic_auth_from_environment(secured_schema_registry, monkeypatch):
    server = secured_schema_registry
    user, password = server.user_info.split(":", 1)
    client = SchemaRegistryClient({"url": server.url, "basic.auth.user.info": server.user_info})
    key_id = client.register_schema("decode-auth-key", Schema(orjson.dumps(KEY).decode(), "AVRO"))
    settings = SchemaRegistrySettings(url=server.url, basic_auth_user_info_env="LAKESTREAM_TEST_SR_AUTH")
    monkeypatch.delenv("LAKESTREAM_TEST_SR_AUTH", raising=False)
    with pytest.raises(ConfigError, match="basic_auth_user_info_env: environment variable LAKESTREAM_TEST_SR_AUTH"):
        settings.client_config()
    monkeypatch.setenv("LAKESTREAM_TEST_SR_AUTH", f"{user}:wrong")
    with pytest.raises(SchemaRegistryUnavailable, match="HTTP 401"):
        decode_avro(frame(key_id, KEY, {"id": 1}), AvroSchemas(settings.client_config()))
    monkeypatch.setenv("LAKESTREAM_TEST_SR_AUTH", server.user_info)
    datum, _ = decode_avro(frame(key_id, KEY, {"id": 1}), AvroSchemas(settings.client_config()))
    assert datum == {"id": 1}
    assert password not in repr(settings) and password not in str(settings.model_dump())


def test_registry_settings_validation():
    with pytest.raises(ValueError, match="not an http"):
        SchemaRegistrySettings(url="registry:8081")
    with pytest.raises(ValueError, match="not an environment variable name"):
        SchemaRegistrySettings(url="http://r:8081", basic_auth_user_info_env="user:pass")


def test_registry_compatibility_rules(schema_registry):
    """The registry (BACKWARD by default, as Confluent's) refuses what Avro resolution refuses, through the
    Confluent API the capture's converter and the pipeline's client speak."""
    v1 = {"type": "record", "name": "V", "fields": [{"name": "id", "type": "int"}]}
    added_optional = {
        "type": "record",
        "name": "V",
        "fields": [{"name": "id", "type": "int"}, {"name": "n", "type": ["null", "int"], "default": None}],
    }
    added_required = {
        "type": "record",
        "name": "V",
        "fields": [{"name": "id", "type": "int"}, {"name": "n", "type": "int"}],
    }
    widened = {"type": "record", "name": "V", "fields": [{"name": "id", "type": "long"}]}
    client = SchemaRegistryClient({"url": schema_registry.url})
    assert client.get_compatibility() == "BACKWARD"
    first = client.register_schema("s-value", Schema(orjson.dumps(v1).decode(), "AVRO"))
    assert client.register_schema("s-value", Schema(orjson.dumps(v1).decode(), "AVRO")) == first
    assert client.register_schema("other-value", Schema(orjson.dumps(v1).decode(), "AVRO")) == first
    assert client.test_compatibility("s-value", Schema(orjson.dumps(added_optional).decode(), "AVRO")) is True
    assert client.test_compatibility("s-value", Schema(orjson.dumps(widened).decode(), "AVRO")) is True  # int → long
    # Old data lacks n, which has no default: a reader of the new schema cannot read it.
    assert client.test_compatibility("s-value", Schema(orjson.dumps(added_required).decode(), "AVRO")) is False
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    with pytest.raises(SchemaRegistryError, match="incompatible"):
        client.register_schema("s-value", Schema(orjson.dumps(added_required).decode(), "AVRO"))
    client.set_compatibility("s-value", "NONE")
    assert client.get_compatibility("s-value") == "NONE"
    second = client.register_schema("s-value", Schema(orjson.dumps(added_required).decode(), "AVRO"))
    assert second != first and client.get_latest_version("s-value").schema_id == second
    assert client.lookup_schema("s-value", Schema(orjson.dumps(v1).decode(), "AVRO")).version == 1


def test_decode_speed(registered):
    """Decode-only throughput of Avro change events: reported (run with -s); the floor only catches a
    pathological regression (it holds on a 2-core machine at load 30+)."""
    server, value_id, key_id = registered
    schemas = AvroSchemas({"url": server.url})
    cache = SchemaCache()
    key = frame(key_id, KEY, {"id": 7})
    value = frame(
        value_id,
        ENVELOPE,
        {"before": None, "after": ROW, "source": {"ts_ms": 1, "table": "items"}, "op": "c", "ts_ms": None},
    )
    decode_debezium(key, value, cache, schemas)
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        decode_debezium(key, value, cache, schemas)
    rate = n / (time.perf_counter() - start)
    print(f"avro decode: {rate:,.0f} records/s (15 columns, load {os.getloadavg()[0]:.2f})")
    assert rate > 200
    assert schemas.fetches == 2  # the key's schema and the value's, once each


def test_record_decoder_reads_avro_on_debezium_streams_only(registered):
    from types import SimpleNamespace

    from lakestream.config import StreamSettings
    from lakestream.decode.records import RecordDecoder
    from lakestream.routing import Router

    server, value_id, key_id = registered
    router = Router(
        [
            StreamSettings(topics=["shop.public.items"], namespace="shop", table="{table}"),
            StreamSettings(topics=["clicks"], mode="append", namespace="events", table="clicks"),
        ]
    )
    decoder = RecordDecoder(router, {"url": server.url})
    value = frame(
        value_id,
        ENVELOPE,
        {"before": None, "after": ROW, "source": {"ts_ms": 1, "table": "items"}, "op": "c", "ts_ms": None},
    )
    rec = SimpleNamespace(topic="shop.public.items", key=frame(key_id, KEY, {"id": 7}), value=value, headers=None)
    change = decoder.decode(rec)
    assert (change.table, change.op, change.key_columns, change.row["id"]) == ("shop.items", "c", ["id"], 7)
    with pytest.raises(DecodeError, match="on a plain-JSON stream"):
        decoder.decode(SimpleNamespace(topic="clicks", key=None, value=value, headers=None))
