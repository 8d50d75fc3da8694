"""DDL at the source with real Debezium on a real PostgreSQL: ADD COLUMN with a DEFAULT, TRUNCATE (inside one
batch and across batches), DROP COLUMN, and logical-decoding messages. Each scenario ends with `lakestream
verify` (source vs Iceberg) passing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest
from capture_harness import dead_letters, start_captured_source, stop_captured_source, verify_ok
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import produce_records

SETUP = [
    "CREATE TABLE public.ddl_dflt (id integer PRIMARY KEY, name text)",
    "INSERT INTO public.ddl_dflt VALUES (1, 'one'), (2, 'two'), (3, 'three')",
    "CREATE TABLE public.ddl_trunc (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.ddl_trunc SELECT g, 'v' || g FROM generate_series(1, 5) g",
    # the truncate across batches and the dropped table's neighbour: ddl_trunc stays as the one-batch test expects it
    "CREATE TABLE public.ddl_trunc2 (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.ddl_trunc2 SELECT g, 'v' || g FROM generate_series(1, 5) g",
    "CREATE TABLE public.ddl_drop (id integer PRIMARY KEY, a text, b text)",
    "INSERT INTO public.ddl_drop VALUES (1, 'a1', 'b1')",
    "CREATE TABLE public.ddl_drop2 (id integer PRIMARY KEY, a text, b text)",
    "INSERT INTO public.ddl_drop2 VALUES (1, 'a1', 'b1')",
    "CREATE TABLE public.ddl_ren (id integer PRIMARY KEY, old_name text)",
    "INSERT INTO public.ddl_ren VALUES (1, 'x1'), (2, 'x2')",
    "CREATE TABLE public.ddl_gone (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.ddl_gone VALUES (1, 'kept')",
]
TABLES = ["ddl_dflt", "ddl_trunc", "ddl_trunc2", "ddl_drop", "ddl_drop2", "ddl_ren", "ddl_gone"]


@pytest.fixture(scope="module")
def src(stack, spark):
    source = start_captured_source(stack, SETUP, TABLES, "ddl")
    try:
        source.sync(
            {"ddl_dflt": 3, "ddl_trunc": 5, "ddl_trunc2": 5, "ddl_drop": 1, "ddl_drop2": 1, "ddl_ren": 2, "ddl_gone": 1}
        )
        yield source
    finally:
        stop_captured_source(source)


def _rows(spark, table: str) -> dict:
    return {r["id"]: r.asDict() for r in spark.table(table).collect()}


def test_add_column_with_default_gives_existing_rows_the_default(src, spark):
    start = src.end_offset("ddl_dflt")
    src.sql(
        "ALTER TABLE public.ddl_dflt ADD COLUMN loyalty integer DEFAULT 7",
        "ALTER TABLE public.ddl_dflt ADD COLUMN tier text DEFAULT 'gold'",
        "ALTER TABLE public.ddl_dflt ADD COLUMN since date DEFAULT '2020-02-03'",
        "ALTER TABLE public.ddl_dflt ADD COLUMN credit numeric(10,2) DEFAULT 12.50",
        "ALTER TABLE public.ddl_dflt ADD COLUMN plain integer",  # no default: existing rows read NULL
        "INSERT INTO public.ddl_dflt (id, name, loyalty, tier) VALUES (4, 'four', 9, NULL)",
        "UPDATE public.ddl_dflt SET name = 'ONE' WHERE id = 1",
    )
    src.sync({"ddl_dflt": start + 2})
    rows = _rows(spark, src.table("ddl_dflt"))
    # rows 2 and 3 never changed: no event carried them, and they read the defaults all the same
    for i in (2, 3):
        assert rows[i]["loyalty"] == 7 and rows[i]["tier"] == "gold", rows[i]
        assert rows[i]["since"] == dt.date(2020, 2, 3) and rows[i]["credit"] == decimal.Decimal("12.50"), rows[i]
        assert rows[i]["plain"] is None
    assert rows[1]["name"] == "ONE" and rows[1]["loyalty"] == 7  # the update carried the default value
    assert rows[4]["loyalty"] == 9 and rows[4]["tier"] is None  # an explicit NULL stays NULL
    verify_ok(src, spark, ["ddl_dflt"])


def test_truncate_inside_one_batch(src, spark):
    start = src.end_offset("ddl_trunc")
    src.sql(
        "INSERT INTO public.ddl_trunc VALUES (6, 'v6'), (7, 'v7')",
        "UPDATE public.ddl_trunc SET v = 'changed' WHERE id = 2",
        "TRUNCATE public.ddl_trunc",
        "INSERT INTO public.ddl_trunc VALUES (10, 'ten'), (11, 'eleven'), (2, 'two again')",
        "UPDATE public.ddl_trunc SET v = 'ten!' WHERE id = 10",
    )
    results = src.sync({"ddl_trunc": start + 8})
    ops = [m["value"] and m["value"]["op"] for m in src.published("ddl_trunc")[start:]]
    assert "t" in ops, ops  # Debezium really emitted the truncate (skipped.operations=none)
    assert [r.truncated for r in results if r.truncated] == [[src.table("ddl_trunc").removeprefix("lake.")]]
    assert sum(1 for r in results if r.table_records) == 1, "the whole sequence was meant to land in one batch"
    assert {k: v["v"] for k, v in _rows(spark, src.table("ddl_trunc")).items()} == {
        10: "ten!",
        11: "eleven",
        2: "two again",
    }
    assert dead_letters(spark, src.topic("ddl_trunc")) == []
    verify_ok(src, spark, ["ddl_trunc"])


def test_truncate_across_batches(src, spark):
    start = src.end_offset("ddl_trunc2")
    src.sql("TRUNCATE public.ddl_trunc2")
    src.sync({"ddl_trunc2": start + 1})
    assert _rows(spark, src.table("ddl_trunc2")) == {}
    verify_ok(src, spark, ["ddl_trunc2"])
    src.sql(
        "INSERT INTO public.ddl_trunc2 VALUES (10, 'back'), (20, 'new')", "DELETE FROM public.ddl_trunc2 WHERE id = 20"
    )
    src.sync({"ddl_trunc2": start + 5})  # 2 inserts, a delete and its tombstone
    assert {k: v["v"] for k, v in _rows(spark, src.table("ddl_trunc2")).items()} == {10: "back"}
    verify_ok(src, spark, ["ddl_trunc2"])


def test_dropped_column_is_kept_and_new_rows_get_null(src, spark):
    start = src.end_offset("ddl_drop")
    src.sql(
        "ALTER TABLE public.ddl_drop DROP COLUMN b",
        "INSERT INTO public.ddl_drop VALUES (2, 'a2')",
        "UPDATE public.ddl_drop SET a = 'a1!' WHERE id = 1",
    )
    src.sync({"ddl_drop": start + 2})
    rows = _rows(spark, src.table("ddl_drop"))
    assert rows[2] == {"id": 2, "a": "a2", "b": None}
    assert rows[1] == {"id": 1, "a": "a1!", "b": None}  # the update's row image has no b any more
    verify_ok(src, spark, ["ddl_drop"])


def test_dropped_column_is_dropped_with_on_dropped_column_drop(src, spark):
    start = src.end_offset("ddl_drop2")
    src.sql("ALTER TABLE public.ddl_drop2 DROP COLUMN b", "INSERT INTO public.ddl_drop2 VALUES (2, 'a2')")
    keep = src.config
    stream = keep.streams[0].model_copy(update={"on_dropped_column": "drop"})
    src.config = keep.model_copy(update={"streams": [stream]})
    try:
        src.sync({"ddl_drop2": start + 1})
    finally:
        src.config = keep
    assert [f.name for f in spark.table(src.table("ddl_drop2")).schema.fields] == ["id", "a"]
    assert _rows(spark, src.table("ddl_drop2")) == {1: {"id": 1, "a": "a1"}, 2: {"id": 2, "a": "a2"}}
    verify_ok(src, spark, ["ddl_drop2"])


def test_rename_is_a_drop_plus_an_add_and_converges_as_rows_change(src, spark):
    start = src.end_offset("ddl_ren")
    src.sql(
        "ALTER TABLE public.ddl_ren RENAME COLUMN old_name TO new_name",
        "INSERT INTO public.ddl_ren VALUES (3, 'x3')",
        "UPDATE public.ddl_ren SET new_name = new_name",
    )
    src.sync({"ddl_ren": start + 3})
    rows = _rows(spark, src.table("ddl_ren"))
    # The mirror keeps the old column (NULL in rows written since); the new one is filled as rows change.
    assert rows[1] == {"id": 1, "old_name": None, "new_name": "x1"}
    assert rows[3] == {"id": 3, "old_name": None, "new_name": "x3"}
    verify_ok(src, spark, ["ddl_ren"])


def test_a_dropped_source_table_leaves_its_mirror_queryable(src, spark):
    start = src.end_offset("ddl_trunc2")
    src.sql("DROP TABLE public.ddl_gone", "INSERT INTO public.ddl_trunc2 VALUES (30, 'after the drop')")
    src.sync({"ddl_trunc2": start + 1})
    assert _rows(spark, src.table("ddl_gone")) == {1: {"id": 1, "v": "kept"}}
    assert _rows(spark, src.table("ddl_trunc2"))[30]["v"] == "after the drop"
    assert dead_letters(spark, src.topic("ddl_gone")) == []
    verify_ok(src, spark, ["ddl_trunc2"])


def test_logical_decoding_messages_are_skipped_and_counted(src, spark):
    """A real Debezium message event (pg_logical_emit_message) is skipped and counted, never a dead letter."""
    src.sql("SELECT pg_logical_emit_message(true, 'app-audit', 'hello from the app')")
    message_topic = f"{src.prefix}.message"
    consumer = Consumer(
        {"bootstrap.servers": src.stack.bootstrap_servers, "group.id": f"msg-{src.prefix}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(message_topic, 0, OFFSET_BEGINNING)])
    raw = None
    for _ in range(240):
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            raw = (msg.key(), msg.value())
            break
    consumer.close()
    assert raw is not None, "Debezium published no logical-decoding message"
    value = json.loads(raw[1])
    assert (value.get("payload") or value)["op"] == "m"
    # The same bytes on a topic the pipeline reads (a stream pattern like <prefix>\..* would read the
    # message topic itself).
    topic = src.topic("ddl_msgs")
    produce_records(src.stack.bootstrap_servers, topic, [raw] * 3)
    results = src.run()
    assert sum(r.skipped.get("logical_decoding_message", 0) for r in results) == 3
    assert dead_letters(spark, topic) == []
    assert not spark.catalog.tableExists(src.table("ddl_msgs"))
