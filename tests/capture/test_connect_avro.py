"""Avro through Kafka Connect: Debezium's PostgreSQL connector in a real Connect worker writes its records with
Apicurio Registry's AvroConverter (``capture.avro_converter: apicurio``) against Apicurio Registry, in Confluent's
wire format; the pipeline reads them through the registry's Confluent-compatible API and mirrors the tables
exactly. The configuration is the one `lakestream capture --print-connector-config` prints, posted as printed: the
registry's credentials, like the database password, are placeholders the worker's FileConfigProvider resolves.

Real PostgreSQL, Kafka, Connect, Debezium, Apicurio Registry (basic auth), Spark and Iceberg.
"""

from __future__ import annotations

import decimal
import json
import os
import uuid

import pytest
from capture_harness import (
    DEAD_LETTER,
    CapturedSource,
    ConnectCapture,
    prepare_captured_source,
    stop_captured_source,
    verify_ok,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import run_lakestream

from lakestream.config import parse_config

SETUP = [
    "CREATE TABLE public.cav_orders (id integer PRIMARY KEY, amount numeric(10,2), note text, day date, "
    "at timestamptz, tags integer[], raw bytea)",
    "INSERT INTO public.cav_orders SELECT g, g * 1.25, 'order ' || g, date '2024-02-29' + g, "
    "timestamptz '2024-01-01 00:00+00' + g * interval '1 hour', ARRAY[g, g + 1], '\\xdeadbeef' "
    "FROM generate_series(1, 200) g",
    "CREATE TABLE public.cav_items (order_id integer, line integer, qty smallint, PRIMARY KEY (order_id, line))",
    "INSERT INTO public.cav_items SELECT g, l, l FROM generate_series(1, 50) g, generate_series(1, 2) l",
]
TABLES = ["cav_orders", "cav_items"]
TOPICS = {"cav_orders": 200, "cav_items": 100}
AUTH_ENV = "LAKESTREAM_TEST_CONNECT_REGISTRY_AUTH"


@pytest.fixture(scope="module")
def src(stack, spark, connect_worker, secured_schema_registry):
    registry = secured_schema_registry
    os.environ[AUTH_ENV] = registry.user_info  # the pipeline's decoder reads the registry with it
    extra = {
        "kafka": {"schema_registry": {"url": registry.url, "basic_auth_user_info_env": AUTH_ENV}},
        "capture": {"format": "avro", "avro_converter": "apicurio", "connector": {"heartbeat.interval.ms": "1000"}},
    }
    dbname, conn, prefix, namespace, data, workdir = prepare_captured_source(stack, SETUP, TABLES, "cav", extra=extra)
    user, password = registry.user_info.split(":", 1)
    secrets = workdir / "connect-secrets.properties"
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(
            f"database.password={stack.pg_password}\n"
            f"schema.registry.username={user}\n"
            f"schema.registry.password={password}\n"
        )
    printed = run_lakestream(
        "capture",
        str(workdir / "pipeline.yaml"),
        "--print-connector-config",
        "--connect-secrets-file",
        str(secrets),
        timeout=120,
    )
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert password not in printed.stdout + printed.stderr
    doc = json.loads(printed.stdout)
    connect_worker.create_connector(doc)
    capture = ConnectCapture(connect_worker, doc["name"], stack.pg_dsn(dbname), data["capture"]["slot_name"])
    source = CapturedSource(
        stack, dbname, conn, prefix, namespace, parse_config(data, "<connect avro test>"), capture, workdir
    )
    source.connector = doc
    source.registry = registry
    try:
        capture.wait_until_running()
        source.sync(TOPICS)
        yield source
    finally:
        stop_captured_source(source)
        os.environ.pop(AUTH_ENV, None)


def _first_value(src, table: str) -> bytes:
    consumer = Consumer(
        {
            "bootstrap.servers": src.stack.bootstrap_servers,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(src.topic(table), 0, OFFSET_BEGINNING)])
    try:
        for _ in range(30):
            msg = consumer.poll(5)
            if msg is not None and not msg.error() and msg.value():
                return msg.value()
    finally:
        consumer.close()
    raise AssertionError(f"no record on {src.topic(table)}")


def test_the_printed_configuration_names_apicurios_converter_and_placeholders(src, connect_worker):
    config = src.connector["config"]
    for side in ("key", "value"):
        assert config[f"{side}.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
        assert config[f"{side}.converter.apicurio.registry.url"].endswith("/apis/registry/v2")
        assert config[f"{side}.converter.apicurio.registry.as-confluent"] == "true"
        assert config[f"{side}.converter.apicurio.auth.password"].startswith("${file:")
    stored = connect_worker.request("GET", f"/connectors/{src.connector['name']}/config")
    assert stored["value.converter.apicurio.auth.password"].startswith("${file:")  # resolved only in the task


def test_records_are_confluent_framed_with_ids_the_compatible_api_serves(src):
    value = _first_value(src, "cav_orders")
    assert value[:1] == b"\x00", "not Confluent's wire format (a zero magic byte)"
    schema_id = int.from_bytes(value[1:5], "big")
    subject = f"{src.topic('cav_orders')}-value"
    assert schema_id in src.registry.versions(subject)  # the converter registered it under the topic's subject
    assert f"{src.topic('cav_orders')}-key" in src.registry.subjects()


def test_the_snapshot_and_streamed_changes_are_mirrored_exactly(src, spark):
    rows = {r["id"]: r.asDict() for r in spark.table(src.table("cav_orders")).where("id IN (1, 200)").collect()}
    assert rows[1]["amount"] == decimal.Decimal("1.25") and rows[200]["note"] == "order 200"
    assert rows[1]["tags"] == [1, 2] and rows[1]["raw"] == bytearray(b"\xde\xad\xbe\xef")
    types = dict(spark.table(src.table("cav_orders")).dtypes)
    assert types["amount"] == "decimal(10,2)" and types["day"] == "date" and types["at"] == "timestamp"
    ends = {t: src.end_offset(t) for t in TOPICS}
    src.sql(
        "INSERT INTO public.cav_orders (id, amount, note) VALUES (1001, 10.01, 'new'), (1002, NULL, NULL)",
        "UPDATE public.cav_orders SET note = 'changed', amount = amount + 1 WHERE id <= 5",
        "DELETE FROM public.cav_orders WHERE id BETWEEN 100 AND 102",
        "UPDATE public.cav_items SET qty = -1 WHERE order_id = 1",
    )
    src.sync({"cav_orders": ends["cav_orders"] + 2 + 5 + 3 * 2, "cav_items": ends["cav_items"] + 2})
    changed = {r["id"]: r["note"] for r in spark.table(src.table("cav_orders")).where("id <= 5 OR id > 1000").collect()}
    assert changed == {**{i: "changed" for i in range(1, 6)}, 1001: "new", 1002: None}
    if spark.catalog.tableExists(DEAD_LETTER):
        letters = spark.sql(f"SELECT topic, error FROM {DEAD_LETTER} WHERE topic LIKE '{src.prefix}.%'").collect()
        assert not letters, letters[:5]
    verify_ok(src, spark, TABLES)
