"""Debezium edge cases with real capture: unchanged TOAST values, primary-key changes, deletes under
REPLICA IDENTITY DEFAULT (defaults in `before`), and many changes of one key in one batch."""

from __future__ import annotations

import pytest
from capture_harness import dead_letters, start_captured_source, stop_captured_source, verify_ok

from lakestream.decode.types import UNAVAILABLE_VALUE

# ~20 KB of md5 hex: pglz cannot shrink it below the TOAST threshold, so it is stored out of line
BIG_VALUE_SQL = "(SELECT string_agg(md5(i::text || random()::text), '') FROM generate_series(1, 640) AS i)"

SETUP = [
    "CREATE TABLE public.edge_toast (id integer PRIMARY KEY, body text, n integer)",
    "ALTER TABLE public.edge_toast REPLICA IDENTITY DEFAULT",
    f"INSERT INTO public.edge_toast VALUES (1, {BIG_VALUE_SQL}, 1)",
    "CREATE TABLE public.edge_pk (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.edge_pk VALUES (1, 'first'), (2, 'second')",
    "CREATE TABLE public.edge_defaults (id integer PRIMARY KEY, status text NOT NULL DEFAULT 'dflt-status', "
    "qty integer NOT NULL DEFAULT 777, note text DEFAULT 'dflt-note')",
    "INSERT INTO public.edge_defaults VALUES (1, 'shipped', 3, 'real'), (2, 'open', 4, 'kept')",
    "CREATE TABLE public.edge_hot (id integer PRIMARY KEY, n integer, label text)",
]


@pytest.fixture(scope="module")
def src(stack, spark):
    source = start_captured_source(stack, SETUP, ["edge_toast", "edge_pk", "edge_defaults", "edge_hot"], "edge")
    try:
        source.sync({"edge_toast": 1, "edge_pk": 2, "edge_defaults": 2})
        yield source
    finally:
        stop_captured_source(source)


def _rows(spark, table: str) -> dict:
    return {r["id"]: r.asDict() for r in spark.table(table).collect()}


def _source_value(src, sql: str):
    with src.conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def test_unchanged_toast_value_keeps_the_stored_value(src, spark):
    big = _source_value(src, "SELECT body FROM public.edge_toast WHERE id = 1")
    assert len(big) == 20480
    assert _rows(spark, src.table("edge_toast"))[1]["body"] == big  # from the snapshot
    src.sql("UPDATE public.edge_toast SET n = 2 WHERE id = 1")
    src.sync({"edge_toast": 2})
    # Debezium really withheld the value (otherwise this test proves nothing)
    update = [m["value"] for m in src.published("edge_toast") if m["value"] and m["value"]["op"] == "u"]
    assert update and update[-1]["after"]["body"] == UNAVAILABLE_VALUE, update
    row = _rows(spark, src.table("edge_toast"))[1]
    assert row["n"] == 2
    assert row["body"] == big
    verify_ok(src, spark, ["edge_toast"])


def test_unchanged_toast_value_of_a_row_inserted_in_the_same_batch(src, spark):
    # insert then update before the engine runs: the insert and the TOAST-less update meet in one batch
    start = src.end_offset("edge_toast")
    src.sql(
        f"INSERT INTO public.edge_toast VALUES (2, {BIG_VALUE_SQL}, 1)",
        "UPDATE public.edge_toast SET n = 5 WHERE id = 2",
    )
    big = _source_value(src, "SELECT body FROM public.edge_toast WHERE id = 2")
    src.sync({"edge_toast": start + 2})
    update = [m["value"] for m in src.published("edge_toast")[start:] if m["value"]["op"] == "u"]
    assert update and update[-1]["after"]["body"] == UNAVAILABLE_VALUE
    row = _rows(spark, src.table("edge_toast"))[2]
    assert row["n"] == 5
    assert row["body"] == big, (
        f"body is {None if row['body'] is None else len(row['body'])} chars, not the inserted value"
    )


def test_primary_key_change_leaves_exactly_the_new_row(src, spark):
    start = src.end_offset("edge_pk")
    src.sql("UPDATE public.edge_pk SET id = 100 WHERE id = 1")
    src.sync({"edge_pk": start + 3})  # delete(old) + tombstone + create(new)
    ops = [m["value"] and m["value"]["op"] for m in src.published("edge_pk")[start:]]
    assert ops == ["d", None, "c"], ops
    rows = _rows(spark, src.table("edge_pk"))
    assert sorted(rows) == [2, 100]
    assert rows[100]["v"] == "first" and rows[2]["v"] == "second"
    # and a key changed back and forth within one batch
    start = src.end_offset("edge_pk")
    src.sql("UPDATE public.edge_pk SET id = 3 WHERE id = 2", "UPDATE public.edge_pk SET id = 2 WHERE id = 3")
    src.sync({"edge_pk": start + 6})
    rows = _rows(spark, src.table("edge_pk"))
    assert sorted(rows) == [2, 100] and rows[2]["v"] == "second"
    verify_ok(src, spark, ["edge_pk"])


def test_default_identity_delete_writes_no_defaults(src, spark):
    start = src.end_offset("edge_defaults")
    src.sql(
        "DELETE FROM public.edge_defaults WHERE id = 1",
        "INSERT INTO public.edge_defaults VALUES (3, 'fresh', 5, 'gone soon')",
        "DELETE FROM public.edge_defaults WHERE id = 3",
    )
    src.sync({"edge_defaults": start + 5})
    deletes = [m["value"] for m in src.published("edge_defaults")[start:] if m["value"] and m["value"]["op"] == "d"]
    assert deletes and deletes[0]["before"]["id"] == 1
    rows = _rows(spark, src.table("edge_defaults"))
    assert sorted(rows) == [2]
    assert rows[2] == {"id": 2, "status": "open", "qty": 4, "note": "kept"}
    # in no snapshot of the table did a default (or an all-null ghost row) appear
    table = src.table("edge_defaults")
    for (snapshot_id,) in spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect():
        bad = spark.sql(
            f"SELECT * FROM {table} VERSION AS OF {snapshot_id} "
            "WHERE status = 'dflt-status' OR qty = 777 OR note = 'dflt-note' OR status IS NULL"
        ).collect()
        assert not bad, (snapshot_id, bad)
    assert not dead_letters(spark, src.topic("edge_defaults"))
    verify_ok(src, spark, ["edge_defaults"])


def test_many_changes_of_one_key_in_one_batch_last_wins(src, spark):
    statements = ["INSERT INTO public.edge_hot VALUES (1, 0, 'v0'), (2, 0, 'keep')"]
    statements += [f"UPDATE public.edge_hot SET n = {i}, label = 'v{i}' WHERE id = 1" for i in range(1, 61)]
    src.sql(*statements)
    results = src.sync({"edge_hot": 62})
    assert len(results) == 1 and results[0].records == 62, [(r.records, r.tables) for r in results]
    rows = _rows(spark, src.table("edge_hot"))
    assert rows[1]["n"] == 60 and rows[1]["label"] == "v60"
    assert rows[2]["label"] == "keep"
    # interleaved updates and a delete+reinsert in the next batch: still the last one
    src.sql(
        "UPDATE public.edge_hot SET n = 61 WHERE id = 1",
        "DELETE FROM public.edge_hot WHERE id = 1",
        "INSERT INTO public.edge_hot VALUES (1, 99, 'reborn')",
        "UPDATE public.edge_hot SET n = 100 WHERE id = 2",
        "UPDATE public.edge_hot SET n = 101 WHERE id = 2",
    )
    src.sync({"edge_hot": 62 + 6})
    rows = _rows(spark, src.table("edge_hot"))
    assert (rows[1]["n"], rows[1]["label"]) == (99, "reborn") and rows[2]["n"] == 101
    verify_ok(src, spark, ["edge_hot"])
