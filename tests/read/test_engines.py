"""Spark, DuckDB and pyiceberg read the same rows from a table the pipeline wrote with upserts and deletes.

Debezium change events (the genuine schema-on envelope of tests/data, re-keyed) go through Kafka and
the real engine in three batches: a snapshot load, then updates, deletes and inserts twice, so the
table holds format-v3 deletion vectors over earlier data files. Every engine must return exactly
Spark's rows, now and at an earlier snapshot; where an engine cannot apply a table's delete files it
must refuse.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import decimal
import json
import uuid

import pytest
from conftest import load_debezium_fixture, pipeline_config, produce_records, run_lakestream, write_pipeline_yaml

from lakestream.config import CatalogSettings
from lakestream.engine.loop import run_pipeline
from lakestream.errors import LakestreamError
from lakestream.read.query import ENGINES, read_pandas, read_table, run_sql, sqlalchemy_url

FIRST_IDS = range(1, 401)


def _templates() -> tuple[dict, dict]:
    first = load_debezium_fixture()[0]
    return json.loads(first["key"]), json.loads(first["value"])


KEY, VALUE = _templates()


def change(op: str, row_id: int, note: str = "", cents: int = 0) -> list[tuple[str, str | None]]:
    """A Debezium change (plus its tombstone for a delete) for row ``row_id`` of the fixture's table."""
    key, value = copy.deepcopy(KEY), copy.deepcopy(VALUE)
    key["payload"]["id"] = row_id
    row = dict(
        value["payload"]["after"],
        id=row_id,
        note=note,
        big=row_id * 1_000_003,
        amount=base64.b64encode(cents.to_bytes(8, "big", signed=True)).decode(),
        day=19_000 + row_id,
        ts=1_709_210_096_789_000 + row_id * 1_000_001,
        uid=str(uuid.UUID(int=row_id)),
        tags=[row_id, row_id % 7] if row_id % 4 else None,
    )
    payload = value["payload"]
    payload["op"] = op
    payload["before"], payload["after"] = (row, None) if op == "d" else (None, row)
    records = [(json.dumps(key), json.dumps(value))]
    if op == "d":
        records.append((json.dumps(key), None))
    return records


@pytest.fixture(scope="module")
def cdc_table(stack, spark, service_dir_factory):
    """A CDC-loaded table: (config, ``ns.table``, expected {id: (note, amount)}, first snapshot id, its rows)."""
    tag = uuid.uuid4().hex[:6]
    topic, namespace = f"q{tag}.public.orders", f"query_{tag}"
    config = pipeline_config(
        stack,
        service_dir_factory("state"),
        [{"topics": [topic], "namespace": namespace, "table": "orders"}],
        name=f"query{tag}",
    )
    expected: dict[int, tuple[str, decimal.Decimal]] = {}

    def apply(changes: list[tuple[str, int, str, int]]) -> None:
        records = []
        for op, row_id, note, cents in changes:
            records += change(op, row_id, note, cents)
            if op == "d":
                expected.pop(row_id, None)
            else:
                expected[row_id] = (note, decimal.Decimal(cents).scaleb(-2))
        produce_records(stack.bootstrap_servers, topic, records, partition=0)
        run_pipeline(config, spark=spark, stop_when_idle=True)

    table = f"{namespace}.orders"
    apply([("r", i, f"row {i}", i * 101) for i in FIRST_IDS])
    first_snapshot = spark.sql(
        f"SELECT snapshot_id FROM lake.{table}.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()[0][0]
    first_rows = dict(expected)
    apply(
        [("u", i, f"updated {i}", i * 7) for i in FIRST_IDS if i % 3 == 0]
        + [("d", i, "", 0) for i in FIRST_IDS if i % 5 == 0]
        + [("c", i, f"new {i}", i) for i in range(401, 451)]
    )
    apply(
        [("u", i, f"again {i}", -i) for i in range(7, 451, 7) if i % 5]
        + [("d", i, "", 0) for i in range(11, 451, 11) if i % 5]
    )
    return config, table, expected, first_snapshot, first_rows


def _normalized(table) -> list[dict]:
    """Rows sorted by id with values in one form whatever the engine (UTC datetimes, lists)."""

    def plain(value):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        return value

    rows = [{k: plain(v) for k, v in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: r["id"])


def test_the_table_has_deletion_vectors_over_earlier_files(cdc_table, spark):
    _, table, expected, _, _ = cdc_table
    delete_files = spark.sql(f"SELECT content, file_format FROM lake.{table}.delete_files").collect()
    assert delete_files and {(r["content"], r["file_format"]) for r in delete_files} == {(1, "PUFFIN")}
    spark_rows = {r["id"]: (r["note"], r["amount"]) for r in spark.table(f"lake.{table}").collect()}
    assert spark_rows == expected


@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "spark"])
def test_every_engine_returns_sparks_rows(cdc_table, spark, engine):
    config, table, _, first_snapshot, first_rows = cdc_table
    want = _normalized(read_table(config, table, "spark", spark=spark))
    got = _normalized(read_table(config, table, engine))
    assert len(got) == len(want) and got == want

    then = read_table(config, table, engine, columns=["id", "note", "amount"], snapshot_id=first_snapshot)
    assert {r["id"]: (r["note"], r["amount"]) for r in then.to_pylist()} == first_rows

    filtered = read_table(config, table, engine, columns=["id", "note"], where="id > 400")
    assert sorted(r["id"] for r in filtered.to_pylist()) == [r["id"] for r in want if r["id"] > 400]


def test_pandas_and_duckdb_sql(cdc_table, spark):
    config, table, expected, _, _ = cdc_table
    frame = read_pandas(config, table, "pyiceberg", columns=["id", "note"])
    assert dict(zip(frame["id"], frame["note"], strict=True)) == {k: v[0] for k, v in expected.items()}
    query = f"SELECT count(*) AS n, sum(amount) AS total FROM lake.{table} WHERE note LIKE 'again%'"
    duck = run_sql(config, query, engine="duckdb").to_pylist()
    assert duck == [
        {
            "n": sum(1 for v in expected.values() if v[0].startswith("again")),
            "total": sum(v[1] for v in expected.values() if v[0].startswith("again")),
        }
    ]
    assert run_sql(config, query, engine="spark", spark=spark).to_pylist() == duck


def test_identifiers_are_validated_before_any_sql(cdc_table, spark):
    config, table, _, _, _ = cdc_table
    for bad in ("orders", "x.y; DROP TABLE t", "a.b.c.d"):
        with pytest.raises(LakestreamError):
            read_table(config, bad, "duckdb")
    for engine in ENGINES:
        with pytest.raises(LakestreamError, match="no column"):
            read_table(config, table, engine, columns=['id" FROM t; --'], spark=spark)


def test_cli_query_and_duckdb_sql_print_clean_json(cdc_table, stack, tmp_path):
    config, table, expected, _, _ = cdc_table
    pipeline = str(write_pipeline_yaml(config, stack, tmp_path / "p.yaml"))
    out = run_lakestream(
        "query", pipeline, table, "--engine", "duckdb", "--columns", "id,note", "--format", "json", "--limit", "0"
    )
    assert out.returncode == 0, out.stderr
    assert {r["id"]: r["note"] for r in json.loads(out.stdout)} == {k: v[0] for k, v in expected.items()}
    out = run_lakestream(
        "sql", pipeline, f"SELECT max(id) AS top FROM lake.{table}", "--engine", "duckdb", "--format", "json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"top": max(expected)}]


def _commit_equality_delete(spark, table: str, ids: list[int]) -> None:
    """Commit an equality-delete file on ``id`` (the Iceberg Java API; Spark SQL never writes one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jvm = spark._jvm
    jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    field_id = jtable.schema().findField("id").fieldId()
    path = f"{jtable.location()}/data/eq-delete-{uuid.uuid4().hex}.parquet"
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(field_id).encode()})]
    )
    local = path.removeprefix("file:")
    pq.write_table(pa.table({"id": ids}, schema=schema), local)
    field_ids = spark.sparkContext._gateway.new_array(jvm.int, 1)
    field_ids[0] = field_id
    delete = (
        jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(jtable.spec())
        .ofEqualityDeletes(field_ids)
        .withPath(path)
        .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(__import__("os").path.getsize(local))
        .withRecordCount(len(ids))
        .build()
    )
    jtable.newRowDelta().addDeletes(delete).commit()


def test_equality_deletes_are_applied_or_refused(cdc_table, spark):
    config, table, _, _, _ = cdc_table
    name = f"{table.split('.')[0]}.eq_deletes"
    spark.sql(
        f"CREATE TABLE lake.{name} (id BIGINT NOT NULL, note STRING) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')"
    )
    spark.sql(f"INSERT INTO lake.{name} VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    _commit_equality_delete(spark, f"lake.{name}", [2, 3])
    # A later row with a deleted key: the older delete must not hide it (sequence numbers).
    spark.sql(f"INSERT INTO lake.{name} VALUES (2, 'again')")
    want = [(1, "a"), (2, "again"), (4, "d")]
    rows = read_table(config, name, "spark", spark=spark).to_pylist()
    assert sorted((r["id"], r["note"]) for r in rows) == want
    rows = read_table(config, name, "duckdb").to_pylist()
    assert sorted((r["id"], r["note"]) for r in rows) == want
    with pytest.raises(LakestreamError, match="pyiceberg cannot read .* 1 equality deletes file"):
        read_table(config, name, "pyiceberg")


def test_catalog_url_quotes_credentials_and_errors_never_echo_them():
    catalog = CatalogSettings(
        uri="jdbc:postgresql://db:5432/lake?sslmode=require", user="u", password="p@ss/w:rd", warehouse="file:///w"
    )
    assert sqlalchemy_url(catalog) == "postgresql+psycopg2://u:p%40ss%2Fw%3Ard@db:5432/lake?sslmode=require"
    with pytest.raises(LakestreamError) as raised:
        sqlalchemy_url(CatalogSettings(uri="jdbc:mysql://db/lake?password=secret", warehouse="file:///w"))
    assert "secret" not in str(raised.value)
