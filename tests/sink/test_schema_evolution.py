"""Schema evolution mid-stream with real Debezium on a real PostgreSQL, the engine running between
steps: ADD COLUMN, int→bigint, a new table, and an incompatible change that must only dead-letter.

The steps share one captured database, each building on the one before, so they are one test that runs them in
order; each step checks its own scenario and `lakestream verify` (source vs Iceberg) after every compatible one.
"""

from __future__ import annotations

import pytest
from capture_harness import dead_letters, start_captured_source, stop_captured_source, verify_ok

SETUP = [
    "CREATE TABLE public.evo_orders (id integer PRIMARY KEY, qty integer, note text)",
    "CREATE TABLE public.evo_other (id integer PRIMARY KEY, v text)",
    "INSERT INTO public.evo_orders VALUES (1, 10, 'one'), (2, 20, 'two'), (3, 30, 'three')",
    "INSERT INTO public.evo_other VALUES (1, 'a'), (2, 'b')",
]


@pytest.fixture(scope="module")
def src(stack, spark):
    source = start_captured_source(stack, SETUP, ["evo_orders", "evo_other", "evo_new"], "evo")
    try:
        yield source
    finally:
        stop_captured_source(source)


def _types(spark, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}


def _rows(spark, table: str) -> dict:
    return {r["id"]: r.asDict() for r in spark.table(table).collect()}


def _snapshot_lands(src, spark) -> None:
    src.sync({"evo_orders": 3, "evo_other": 2})
    assert sorted(_rows(spark, src.table("evo_orders"))) == [1, 2, 3]
    assert _types(spark, src.table("evo_orders"))["qty"] == "int"
    verify_ok(src, spark, ["evo_orders", "evo_other"])


def _add_column_while_running(src, spark) -> None:
    src.sql(
        "ALTER TABLE public.evo_orders ADD COLUMN color text",
        "INSERT INTO public.evo_orders VALUES (4, 40, 'four', 'red')",
        "UPDATE public.evo_orders SET color = 'blue' WHERE id = 2",
    )
    src.sync({"evo_orders": 5})
    assert _types(spark, src.table("evo_orders"))["color"] == "string"
    rows = _rows(spark, src.table("evo_orders"))
    assert rows[4]["color"] == "red" and rows[2]["color"] == "blue"
    assert rows[1]["color"] is None and rows[3]["color"] is None  # old rows: null
    verify_ok(src, spark, ["evo_orders"])


def _int_to_bigint_at_the_source(src, spark) -> None:
    src.sql(
        "ALTER TABLE public.evo_orders ALTER COLUMN qty TYPE bigint",
        "INSERT INTO public.evo_orders VALUES (5, 5000000000, 'five', 'green')",
        "UPDATE public.evo_orders SET qty = 3000000000 WHERE id = 1",
    )
    src.sync({"evo_orders": 7})
    assert _types(spark, src.table("evo_orders"))["qty"] == "bigint"
    rows = _rows(spark, src.table("evo_orders"))
    assert rows[5]["qty"] == 5_000_000_000 and rows[1]["qty"] == 3_000_000_000
    assert rows[2]["qty"] == 20  # values written as int read back under the widened type
    verify_ok(src, spark, ["evo_orders"])


def _new_source_table_becomes_a_new_iceberg_table(src, spark) -> None:
    assert not spark.catalog.tableExists(src.table("evo_new"))
    src.sql(
        "CREATE TABLE public.evo_new (id integer PRIMARY KEY, label text, price numeric(8,2))",
        "INSERT INTO public.evo_new VALUES (1, 'x', 1.25), (2, 'y', -3.50)",
    )
    src.sync({"evo_new": 2})
    assert spark.catalog.tableExists(src.table("evo_new"))
    assert _types(spark, src.table("evo_new")) == {"id": "int", "label": "string", "price": "decimal(8,2)"}
    assert sorted(_rows(spark, src.table("evo_new"))) == [1, 2]
    verify_ok(src, spark, ["evo_new", "evo_orders", "evo_other"])


def _incompatible_change_dead_letters_and_pipeline_keeps_going(src, spark) -> None:
    before = src.end_offset("evo_orders")
    other_before = src.end_offset("evo_other")
    src.sql(
        "ALTER TABLE public.evo_orders ALTER COLUMN qty TYPE text USING qty::text",
        "INSERT INTO public.evo_orders VALUES (6, 'abc', 'six', 'pink')",
        "UPDATE public.evo_other SET v = 'changed' WHERE id = 1",
        "INSERT INTO public.evo_other VALUES (3, 'c')",
    )
    results = src.sync({"evo_orders": before + 1, "evo_other": other_before + 2})
    # the same run wrote the other table and the dead letter: nothing crashed, nothing waited
    assert any(f"{src.namespace}.evo_other" in r.tables for r in results), [r.tables for r in results]
    assert sum(r.dead_letters for r in results) == 1, [(r.tables, r.dead_letters) for r in results]
    assert [r.dead_letter_kinds for r in results if r.dead_letters] == [{"incompatible_schema": 1}]
    dead = dead_letters(spark, src.topic("evo_orders"))
    assert [d["offset"] for d in dead] == [before], dead
    error = dead[0]["error"]
    assert "column qty" in error and "string" in error and "bigint" in error, error
    assert dead[0]["target_table"] == f"{src.namespace}.evo_orders"
    assert b'"abc"' in bytes(dead[0]["value"])
    rows = _rows(spark, src.table("evo_orders"))
    assert 6 not in rows and sorted(rows) == [1, 2, 3, 4, 5]
    assert _types(spark, src.table("evo_orders"))["qty"] == "bigint"  # the table was not touched
    other = _rows(spark, src.table("evo_other"))
    assert other[1]["v"] == "changed" and other[3]["v"] == "c"
    verify_ok(src, spark, ["evo_other", "evo_new"])

    # and it keeps going afterwards
    src.sql("INSERT INTO public.evo_other VALUES (4, 'd')", "INSERT INTO public.evo_new VALUES (3, 'z', 0.01)")
    src.sync({"evo_other": other_before + 3, "evo_new": 3})
    assert _rows(spark, src.table("evo_other"))[4]["v"] == "d"
    verify_ok(src, spark, ["evo_other", "evo_new"])


def test_schema_evolution_while_running(src, spark):
    """The steps in order: the snapshot, ADD COLUMN, int to bigint, a new table, an incompatible change."""
    _snapshot_lands(src, spark)
    _add_column_while_running(src, spark)
    _int_to_bigint_at_the_source(src, spark)
    _new_source_table_becomes_a_new_iceberg_table(src, spark)
    _incompatible_change_dead_letters_and_pipeline_keeps_going(src, spark)


def test_parse_type_fast_path_equals_sparks_parser(spark):
    """Primitive DDL types are parsed without the JVM; each equals what Spark's own parser returns."""
    from pyspark.sql.types import _parse_datatype_string

    from lakestream.sink.catalog.schema import parse_type

    for ddl in [
        "int",
        "INTEGER",
        "bigint",
        "long",
        "smallint",
        "short",
        "tinyint",
        "byte",
        "string",
        "boolean",
        "double",
        "float",
        "real",
        "date",
        "timestamp",
        "timestamp_ntz",
        "binary",
        "decimal(10,2)",
        "DECIMAL(38, 0)",
        " decimal(5,5) ",
        "array<int>",
        "struct<a:int,b:string>",
        "map<string,bigint>",
    ]:
        parse_type.cache_clear()
        assert parse_type(ddl) == _parse_datatype_string(ddl), ddl
    for bad in ["decimal(39,2)", "decimal(5,6)", "nosuchtype"]:
        parse_type.cache_clear()
        try:
            want = _parse_datatype_string(bad)
        except Exception as exc:  # noqa: BLE001 — Spark's own error type
            with pytest.raises(type(exc)):
                parse_type(bad)
        else:
            assert parse_type(bad) == want, bad
