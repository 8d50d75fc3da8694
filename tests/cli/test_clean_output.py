"""Machine-readable output of the real `lakestream` command parses: the JVM's log never reaches stdout."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from conftest import run_lakestream, write_pipeline_yaml

NS = "cli_output"


def test_sql_json_and_health_json_are_clean_on_stdout(spark, stack, pipeline_config_factory, tmp_path):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{NS}.orders PURGE")
    spark.sql(f"CREATE TABLE lake.{NS}.orders (id BIGINT, region STRING) USING iceberg")
    spark.sql(f"INSERT INTO lake.{NS}.orders VALUES (1, 'eu'), (2, 'us')")
    pipeline = str(write_pipeline_yaml(pipeline_config_factory([{"topics": ["unused"]}]), stack, tmp_path / "p.yaml"))

    # Two processes at once: each spends most of its time starting a JVM.
    with ThreadPoolExecutor(2) as pool:
        sql_run = pool.submit(
            run_lakestream, "sql", pipeline, f"SELECT id, region FROM lake.{NS}.orders ORDER BY id", "--format", "json"
        )
        health_run = pool.submit(run_lakestream, "health", pipeline, "--json", "--no-lag", "--table", f"{NS}.orders")
        sql, health = sql_run.result(), health_run.result()

    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout) == [{"id": 1, "region": "eu"}, {"id": 2, "region": "us"}], sql.stdout
    assert health.returncode == 0, health.stderr
    report = json.loads(health.stdout)
    assert [t["table"] for t in report["tables"]] == [f"{NS}.orders"]
    assert report["tables"][0]["data_files"] >= 1
