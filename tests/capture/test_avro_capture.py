"""Avro end to end: Debezium's AvroConverter (embedded, through `lakestream capture` with format avro)
registers schemas in a Confluent-compatible registry and writes Confluent-framed records; the pipeline
reads them with confluent-kafka's registry client and fastavro into Iceberg. Real PostgreSQL, Debezium,
broker, Spark and Iceberg; the registry is Apicurio Registry through its Confluent-compatible API.

The tests run in any order: each schema change the registry or the table refuses has a table of its own
(``avro_wide``, ``avro_narrow``, ``avro_forbid``), so no test's refused shape reaches another's, and the test that
stops capture starts it again before it ends."""

from __future__ import annotations

import decimal
import os
import time
import uuid

import pytest
from capture_harness import dead_letters, start_captured_source, stop_captured_source, verify_ok
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import run_lakestream

SETUP = [
    """CREATE TABLE public.avro_items (
        id integer PRIMARY KEY, small smallint, big bigint, amount numeric(10,2), note text, flag boolean,
        day date, ts timestamp, tstz timestamptz, doc jsonb, uid uuid, raw bytea, tags integer[], mood text)""",
    "INSERT INTO public.avro_items VALUES (1, 2, 9000000000, 1234.56, 'first', true, '2024-02-29', "
    "'2024-02-29 12:34:56.789123', '2024-02-29 12:34:56.789+02', '{\"a\": [1, 2]}', "
    "'0e8f4c1e-3b7a-4d7f-9a34-1a2b3c4d5e6f', '\\xdeadbeef', '{1,2,3}', 'ok'), "
    "(2, NULL, NULL, -0.01, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "CREATE TABLE public.avro_other (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.avro_other VALUES (1, 'one')",
    "CREATE TABLE public.avro_wide (id integer PRIMARY KEY, small smallint, note text)",
    "INSERT INTO public.avro_wide VALUES (1, 1, 'one')",
    "CREATE TABLE public.avro_narrow (id integer PRIMARY KEY, amount numeric(10,2), note text)",
    "INSERT INTO public.avro_narrow VALUES (1, 1.25, 'one')",
    "CREATE TABLE public.avro_forbid (id integer PRIMARY KEY, note text)",
    "INSERT INTO public.avro_forbid VALUES (1, 'one')",
]
TABLES = ["avro_items", "avro_other", "avro_wide", "avro_narrow", "avro_forbid"]


AUTH_ENV = "LAKESTREAM_TEST_SCHEMA_REGISTRY_AUTH"


@pytest.fixture(scope="module")
def src(stack, spark, secured_schema_registry):
    """Capture with format avro against a registry that demands basic auth (credentials from the environment)."""
    registry = secured_schema_registry
    os.environ[AUTH_ENV] = registry.user_info  # inherited by the capture and `lakestream run` processes
    extra = {
        "kafka": {"schema_registry": {"url": registry.url, "basic_auth_user_info_env": AUTH_ENV}},
        "capture": {"format": "avro"},
    }
    source = start_captured_source(stack, SETUP, TABLES, "avro", extra)
    source.registry = registry
    try:
        source.sync({"avro_items": 2, "avro_other": 1, "avro_wide": 1, "avro_narrow": 1, "avro_forbid": 1})
        yield source
    finally:
        stop_captured_source(source)
        os.environ.pop(AUTH_ENV, None)


def _raw_values(src, table: str) -> list[bytes | None]:
    end = src.end_offset(table)
    consumer = Consumer(
        {
            "bootstrap.servers": src.stack.bootstrap_servers,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(src.topic(table), 0, OFFSET_BEGINNING)])
    out: list[bytes | None] = []
    try:
        while len(out) < end:
            msg = consumer.poll(5)
            assert msg is not None, f"read {len(out)} of {end}"
            if not msg.error():
                out.append(msg.value())
    finally:
        consumer.close()
    return out


def _subject_versions(src, table: str) -> int:
    return len(src.registry.versions(f"{src.topic(table)}-value"))


def test_avro_capture_mirror_is_exact(src, spark):
    values = _raw_values(src, "avro_items")
    assert values and all(v[:1] == b"\x00" for v in values if v is not None), "not Confluent-framed Avro"
    assert _subject_versions(src, "avro_items") >= 1 and f"{src.topic('avro_items')}-key" in src.registry.subjects()
    start = src.end_offset("avro_items")
    src.sql(
        "INSERT INTO public.avro_items (id, amount, note, tstz) VALUES (3, 99999999.99, 'third', now())",
        "UPDATE public.avro_items SET note = 'changed', amount = 0.5 WHERE id = 1",
        "DELETE FROM public.avro_items WHERE id = 2",
    )
    src.sync({"avro_items": start + 4})  # insert, update, delete, tombstone
    rows = {r["id"]: r.asDict() for r in spark.table(src.table("avro_items")).collect()}
    assert {1, 3} <= set(rows) and 2 not in rows
    assert rows[1]["amount"] == decimal.Decimal("0.50") and rows[1]["note"] == "changed"
    assert rows[1]["raw"] == bytearray(b"\xde\xad\xbe\xef") and rows[1]["tags"] == [1, 2, 3]
    types = dict(spark.table(src.table("avro_items")).dtypes)
    assert types["amount"] == "decimal(10,2)" and types["day"] == "date" and types["ts"] == "timestamp_ntz"
    assert types["tstz"] == "timestamp" and types["small"] == "int" and types["big"] == "bigint"
    assert dead_letters(spark, src.topic("avro_items")) == []
    verify_ok(src, spark, ["avro_items", "avro_other"])
    password = src.registry.user_info.split(":", 1)[1]
    assert password not in src.capture.log_text(), "the registry password is in the capture log"
    assert password not in (src.workdir / "pipeline.yaml").read_text()


def test_add_column_while_running(src, spark):
    start = src.end_offset("avro_items")
    versions = _subject_versions(src, "avro_items")
    src.sql(
        "ALTER TABLE public.avro_items ADD COLUMN loyalty integer",
        "INSERT INTO public.avro_items (id, note, loyalty) VALUES (10, 'new shape', 7)",
        "UPDATE public.avro_items SET loyalty = 1 WHERE id = 1",
    )
    src.sync({"avro_items": start + 2})
    assert _subject_versions(src, "avro_items") == versions + 1  # Debezium registered the new version
    rows = {r["id"]: r.asDict() for r in spark.table(src.table("avro_items")).collect()}
    assert rows[10]["loyalty"] == 7 and rows[1]["loyalty"] == 1
    assert all(row["loyalty"] is None for key, row in rows.items() if key not in (1, 10))
    assert dead_letters(spark, src.topic("avro_items")) == []
    verify_ok(src, spark, ["avro_items"])


def _set_level(src, subject: str, level: str) -> None:
    """PUT /config/<subject> on the registry, as an operator would (basic auth)."""
    import base64
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{src.registry.url}/config/{subject}",
        method="PUT",
        data=json.dumps({"compatibility": level}).encode(),
        headers={
            "Content-Type": "application/vnd.schemaregistry.v1+json",
            "Authorization": "Basic " + base64.b64encode(src.registry.user_info.encode()).decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read())["compatibility"] == level


def _wait_for_capture_to_stop(src) -> str:
    deadline = time.monotonic() + 180
    while src.capture.running and time.monotonic() < deadline:
        time.sleep(1)
    assert not src.capture.running, "capture kept running after the registry refused a schema"
    return src.capture.log_text()


def test_full_transitive_refuses_a_widened_column_then_backward_takes_it(src, spark):
    """smallint → bigint is Avro int → long: a reader of the new schema reads old records (BACKWARD holds) but a
    reader of an old one cannot read new records, so FULL_TRANSITIVE refuses it. Capture stops and says why
    and what to do; with the subject's level set back to BACKWARD, capture started again publishes the change
    from the slot (nothing lost) and the mirror takes the wider column."""
    subject = f"{src.topic('avro_wide')}-value"
    start = src.end_offset("avro_wide")
    _set_level(src, subject, "FULL_TRANSITIVE")
    src.sql(
        "ALTER TABLE public.avro_wide ALTER COLUMN small TYPE bigint",
        "INSERT INTO public.avro_wide (id, small, note) VALUES (25, 3000000000, 'wide')",
    )
    log = _wait_for_capture_to_stop(src)
    assert f"lakestream: error: the Schema Registry ({src.registry.url}) refused a table's new schema" in log, log[
        -3000:
    ]
    # The registry's own reason, passed through (Apicurio names the incompatible differences, not the level).
    assert subject in log and "ncompatible" in log, log[-3000:]
    assert "lower that subject's level" in log
    assert src.end_offset("avro_wide") == start  # nothing of the refused shape was published
    _set_level(src, subject, "BACKWARD")
    src.capture.start()
    src.capture.wait_until_streaming(timeout=300)
    src.sync({"avro_wide": start + 1})
    assert dict(spark.table(src.table("avro_wide")).dtypes)["small"] == "bigint"
    assert {r["id"]: r["small"] for r in spark.table(src.table("avro_wide")).where("id = 25").collect()} == {
        25: 3000000000
    }
    verify_ok(src, spark, ["avro_wide"])


def test_incompatible_change_is_dead_lettered_while_other_tables_update(src, spark):
    """numeric(10,2) → numeric(10,0) is one Avro type (bytes) to the registry, which accepts it, but it
    narrows the column's scale: the table refuses the new shape and its records become dead letters."""
    start = src.end_offset("avro_narrow")
    other_start = src.end_offset("avro_other")
    versions = _subject_versions(src, "avro_narrow")
    src.sql(
        "ALTER TABLE public.avro_narrow ALTER COLUMN amount TYPE numeric(10,0)",
        "INSERT INTO public.avro_narrow (id, amount, note) VALUES (20, 42, 'narrowed')",
        "INSERT INTO public.avro_other VALUES (2, 'two')",
    )
    src.sync({"avro_narrow": start + 1, "avro_other": other_start + 1})
    assert _subject_versions(src, "avro_narrow") == versions + 1
    letters = dead_letters(spark, src.topic("avro_narrow"))
    assert [r["offset"] for r in letters] == [start]
    error = letters[0]["error"]
    assert "column amount: incoming type decimal(10,0) is incompatible with the table's decimal(10,2)" in error, error
    new_id = src.registry.versions(f"{src.topic('avro_narrow')}-value")[-1]
    assert f"Avro writer schema id {new_id}" in error, error
    assert 20 not in {r["id"] for r in spark.table(src.table("avro_narrow")).collect()}
    # the other table keeps updating in the same batches
    assert {r["id"]: r["v"] for r in spark.table(src.table("avro_other")).where("id = 2").collect()} == {2: "two"}
    verify_ok(src, spark, ["avro_other"])


def test_cold_restart_reads_schema_ids_from_the_registry_again(src, spark):
    """A new engine process starts with an empty schema cache: it asks the registry by id again."""
    start = src.end_offset("avro_other")
    src.sql(
        "INSERT INTO public.avro_other VALUES (3, 'after restart')",
        "UPDATE public.avro_other SET v = 'uno' WHERE id = 1",
    )
    src.wait_for_events({"avro_other": start + 2})
    fetches = src.registry.requests("GET", "/schemas/ids/")
    done = run_lakestream("run", str(src.workdir / "pipeline.yaml"), "--until-idle", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert src.registry.requests("GET", "/schemas/ids/") > fetches
    spark.catalog.refreshTable(src.table("avro_other"))
    rows = {r["id"]: r["v"] for r in spark.table(src.table("avro_other")).collect()}
    assert (rows[1], rows[3]) == ("uno", "after restart")  # this test's changes; verify checks every other row
    verify_ok(src, spark, ["avro_other"])


def test_a_change_the_registry_forbids_stops_capture_before_any_record(src):
    """text → integer breaks BACKWARD (the subject's level): the registry refuses the schema, the
    AvroConverter cannot serialize, and capture stops instead of publishing, saying why. With the subject's level
    set to NONE, capture started again publishes the change from the slot: nothing was lost, and the tests after
    this one find capture running."""
    subject = f"{src.topic('avro_forbid')}-value"
    start = src.end_offset("avro_forbid")
    src.sql(
        "ALTER TABLE public.avro_forbid ALTER COLUMN note TYPE integer USING length(note)",
        "INSERT INTO public.avro_forbid (id, note) VALUES (30, 5)",
    )
    log = _wait_for_capture_to_stop(src)
    assert "ncompatible" in log, log[-3000:]  # the registry's reason (Apicurio: "Incompatible artifact: ...")
    assert f"lakestream: error: the Schema Registry ({src.registry.url}) refused a table's new schema" in log, log[
        -3000:
    ]
    assert src.registry.user_info.split(":", 1)[1] not in log
    assert src.end_offset("avro_forbid") == start
    _set_level(src, subject, "NONE")
    src.capture.start()
    src.capture.wait_until_streaming(timeout=300)
    src.wait_for_events({"avro_forbid": start + 1})
