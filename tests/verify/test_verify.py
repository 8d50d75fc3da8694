"""`verify_tables` against a real PostgreSQL table and a real Iceberg mirror.

The mirror is written with Spark in the exact shape the engine gives Debezium-mirrored tables
(decimal, timestamp / timestamp_ntz, date, time and json/uuid as strings, binary, arrays), then
changed, deleted from and duplicated to check that every kind of difference is counted.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import catalog_settings
from pyspark.sql import functions as F

from lakestream.verify.compare import PASS_MARKER, verify_tables

ROWS = 300

SOURCE_DDL = """CREATE TABLE public.{table} (
    id bigint PRIMARY KEY,
    region text NOT NULL,
    amount numeric(12,2),
    ratio double precision,
    flag boolean,
    created_at timestamptz,
    local_ts timestamp,
    day date,
    at_time time,
    doc jsonb,
    uid uuid,
    blob bytea,
    tags text[],
    nums integer[],
    small smallint
)"""

LAKE_DDL = """id bigint NOT NULL, region string NOT NULL, amount decimal(12,2), ratio double, flag boolean,
    created_at timestamp, local_ts timestamp_ntz, day date, at_time string, doc string, uid string,
    blob binary, tags array<string>, nums array<int>, small int"""

# The source rendered as the engine writes Debezium values: json/uuid/time as text.
MIRROR_QUERY = """SELECT id, region, amount, ratio, flag, created_at, local_ts, day,
    to_char(at_time, 'HH24:MI:SS.US'), doc::text, uid::text, blob, tags, nums, small FROM public.{table} ORDER BY id"""


def _seed(pg_conn, table: str) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SOURCE_DDL.format(table=table))
        cur.execute(
            f"""INSERT INTO public.{table}
            SELECT g, CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END,
                   CASE WHEN g % 7 = 0 THEN NULL ELSE (g * 1.25)::numeric(12,2) END,
                   g / 3.0, g % 2 = 0,
                   timestamptz '2024-03-01 10:00:00.123456+02' + g * interval '1 minute 1.5 second',
                   timestamp '2024-03-01 00:00:00' + g * interval '1 hour',
                   date '2024-01-01' + g,
                   time '08:00:00' + g * interval '1.25 second',
                   jsonb_build_object('g', g, 'name', 'n' || g, 'nested', jsonb_build_array(g, 1.50)),
                   md5(g::text)::uuid,
                   decode(lpad(to_hex(g), 8, '0'), 'hex'),
                   ARRAY['a' || g, NULL, 'é'],
                   ARRAY[g, g + 1],
                   (g % 100)::smallint
            FROM generate_series(1, {ROWS}) g"""
        )


def _mirror(spark, pg_conn, table: str, lake_table: str) -> None:
    """Write the Iceberg mirror from the source rows, typed as the engine types them."""
    with pg_conn.cursor() as cur:
        cur.execute(MIRROR_QUERY.format(table=table))
        rows = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in cur.fetchall()]
    spark.sql(f"CREATE TABLE {lake_table} ({LAKE_DDL}) USING iceberg")
    spark.createDataFrame(rows, " ".join(LAKE_DDL.split())).writeTo(lake_table).append()


@pytest.fixture
def mirrored(stack, pg_conn, spark, pipeline_config_factory):
    """(config, lake table name): a seeded source table and its identical Iceberg mirror."""
    suffix = uuid.uuid4().hex[:8]
    table, namespace, prefix = f"vt_{suffix}", f"verify_{suffix}", f"vt{suffix}"
    _seed(pg_conn, table)
    config = pipeline_config_factory(
        name=f"verify-{suffix}",
        streams=[{"topic_pattern": rf"{prefix}\.public\..*", "namespace": namespace, "table": "{table}"}],
        capture={
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": stack.source_db,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": [f"public.{table}"],
            "topic_prefix": prefix,
        },
    )
    lake_table = f"lake.{namespace}.{table}"
    _mirror(spark, pg_conn, table, lake_table)
    yield config, lake_table
    spark.sql(f"DROP TABLE IF EXISTS {lake_table} PURGE")
    with pg_conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{table}")


def test_identical_mirror_passes(mirrored, spark):
    config, _ = mirrored
    report = verify_tables(config, spark)
    [table] = report.tables
    assert report.ok, report.to_text()
    assert (table.source_rows, table.lake_rows) == (ROWS, ROWS)
    assert table.key_columns == ["id"]
    assert report.to_text().splitlines()[-1].startswith(PASS_MARKER)
    assert report.to_dict()["ok"] is True


def test_changed_deleted_duplicated_and_extra_rows_are_counted(mirrored, spark, pg_conn):
    config, lake_table = mirrored
    spark.sql(f"UPDATE {lake_table} SET amount = amount + 0.01 WHERE id = 3")
    spark.sql(f"UPDATE {lake_table} SET created_at = created_at + INTERVAL 1 SECOND WHERE id = 4")
    spark.sql(f"DELETE FROM {lake_table} WHERE id IN (5, 6)")
    spark.sql(f"INSERT INTO {lake_table} SELECT * FROM {lake_table} WHERE id = 7")
    spark.table(lake_table).where("id = 8").withColumn("id", F.expr("id + 100000")).writeTo(lake_table).append()
    table = config.capture.tables[0]
    with pg_conn.cursor() as cur:
        cur.execute(f"UPDATE {table} SET tags = ARRAY['changed'] WHERE id = 9")

    report = verify_tables(config, spark, samples=10)
    [result] = report.tables
    assert not report.ok
    assert result.source_rows == ROWS
    assert result.lake_rows == ROWS - 2 + 1 + 1
    assert result.missing == 2 and sorted(result.samples["missing"]) == ["id=5", "id=6"]
    assert result.extra == 1 and result.samples["extra"] == ["id=100008"]
    assert result.duplicate_keys == 1 and result.samples["duplicate_keys"] == ["id=7"]
    assert result.differing == 3 and sorted(result.samples["differing"]) == ["id=3", "id=4", "id=9"]
    text = report.to_text()
    assert "MISMATCH" in text and text.splitlines()[-1].startswith("verify: FAILED")


def test_missing_lake_table_fails_unless_source_is_empty(mirrored, spark, pg_conn):
    config, lake_table = mirrored
    spark.sql(f"DROP TABLE {lake_table} PURGE")
    report = verify_tables(config, spark)
    assert not report.ok and "does not exist" in report.tables[0].error
    with pg_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {config.capture.tables[0]}")
    assert verify_tables(config, spark).ok


def test_cli_exit_status_and_json(mirrored, spark, stack, tmp_path: Path):
    config, lake_table = mirrored
    data = config.model_dump(mode="json")
    data["catalog"]["password"] = stack.pg_password
    data["capture"]["database"]["password"] = stack.pg_password
    data["catalog"] |= {k: v for k, v in catalog_settings(stack).model_dump(mode="json").items() if k != "password"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    cmd = [sys.executable, "-m", "lakestream", "verify", str(path)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert PASS_MARKER in ok.stdout
    spark.sql(f"DELETE FROM {lake_table} WHERE id = 1")
    bad = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert '"missing": 1' in bad.stdout


def test_mixed_case_and_quoted_column_names_match_by_name(stack, pg_conn, spark, pipeline_config_factory):
    """Columns are matched by their exact names (not by position, not folded): "Name" with "Name", whatever the
    mirror's column order; a source with "Name" and name (no mirror can hold both) is reported, not a crash."""
    suffix = uuid.uuid4().hex[:8]
    table, both, namespace, prefix = f"Vq_{suffix}", f"Both_{suffix}", f"verify_{suffix}", f"vq{suffix}"
    with pg_conn.cursor() as cur:
        cur.execute(
            f'CREATE TABLE public."{table}" ("Id" int PRIMARY KEY, "Name" text, "Value" int, "select" text, '
            '"naïve col" text)'
        )
        cur.execute(f"""INSERT INTO public."{table}" SELECT g, 'N' || g, g * 10, 's' || g, 'é' || g
                        FROM generate_series(1, 50) g""")
        cur.execute(f'CREATE TABLE public."{both}" (id int PRIMARY KEY, "Name" text, name text)')
        cur.execute(f"""INSERT INTO public."{both}" VALUES (1, 'A', 'a')""")
    config = pipeline_config_factory(
        name=f"verify-{suffix}",
        streams=[{"topic_pattern": rf"{prefix}\.public\..*", "namespace": namespace, "table": "{table}"}],
        capture={
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": stack.source_db,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": [f"public.{table}", f"public.{both}"],
            "topic_prefix": prefix,
        },
    )
    lake_table = f"lake.{namespace}.vq_{suffix}"
    # The mirror's columns in another order than the source's, and "Value" next to a lower-case value-ish name.
    spark.sql(
        f"CREATE TABLE {lake_table} (`select` string, `Name` string, `naïve col` string, `Id` int NOT NULL, "
        "`Value` int) USING iceberg"
    )
    spark.sql(
        f"INSERT INTO {lake_table} SELECT concat('s', g), concat('N', g), concat('é', g), g, g * 10 "
        "FROM (SELECT explode(sequence(1, 50)) AS g)"
    )
    try:
        report = verify_tables(config, spark, tables=[f"public.{table}"])
        assert report.ok, report.to_text()
        assert report.tables[0].key_columns == ["Id"]
        spark.sql(f"UPDATE {lake_table} SET `Name` = 'changed' WHERE `Id` = 7")
        result, clash = verify_tables(config, spark).tables
        assert result.differing == 1 and result.samples["differing"] == ["Id=7"], result
        assert not clash.ok and "'Name' and 'name' differ only by case" in clash.error, clash
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {lake_table} PURGE")
        with pg_conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS public."{table}", public."{both}"')
