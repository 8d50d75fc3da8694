"""A Spark session started as on a cluster, with the Iceberg runtime and the JDBC driver given by Maven
coordinates (``spark.jars_from: packages`` → ``spark.jars.packages``, resolved by Spark's Ivy from Maven
Central), writes and commits a mirror: `lakestream run` in its own process, the rows read back here."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from conftest import load_debezium_fixture, produce_records, run_lakestream, write_pipeline_yaml

from lakestream.config import SparkSettings
from lakestream.errors import LakestreamError
from lakestream.runtime import jars
from lakestream.runtime.jvm_jars import iceberg_runtime_jar
from lakestream.runtime.spark import session_jars, session_packages


def _runtime_artifact() -> str:
    """Iceberg's runtime artifact for the installed pyspark: ``iceberg-spark-runtime-3.5_2.12`` on pyspark 3.5,
    ``iceberg-spark-runtime-4.1_2.13`` on 4.1."""
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    return f"iceberg-spark-runtime-{line}_{'2.12' if line == '3.5' else '2.13'}"


def test_the_spark_group_follows_the_running_pyspark():
    assert jars.spark_group("3.5.9") == "spark"
    assert jars.spark_group("4.1.4") == "spark4"
    assert "iceberg-spark-runtime-4.1_2.13" in jars.packages("spark4")
    with pytest.raises(LakestreamError, match=r"pyspark 4\.0\.1 is not supported.*Spark 3\.5, 4\.1"):
        jars.spark_group("4.0.1")
    assert iceberg_runtime_jar().name.startswith(_runtime_artifact() + "-")


def test_packages_mode_gives_coordinates_not_cached_jars():
    settings = SparkSettings(jars_from="packages", bundled_aws_sdk=False)
    assert session_packages(settings) == jars.packages(jars.spark_group())
    assert f"org.apache.iceberg:{_runtime_artifact()}:" in session_packages(settings)
    assert not any("iceberg-spark-runtime" in j or "postgresql" in j for j in session_jars(settings))
    assert session_packages(SparkSettings()) is None


def test_a_session_with_jars_by_coordinates_writes_and_commits_a_mirror(
    stack, spark, pipeline_config_factory, tmp_path
):
    events = [e for e in load_debezium_fixture() if e["topic"].endswith(".all_types")]
    topic = f"pkg{uuid.uuid4().hex[:6]}.public.all_types"
    produce_records(stack.bootstrap_servers, topic, [(e["key"], e["value"]) for e in events])
    ivy = jars.cache_root().parent / "ivy"  # Ivy's own cache, kept between runs like Maven's
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "pkg", "table": "{table}_" + topic[:9]}],
        name=f"pkg{topic[3:9]}",
        spark={
            "master": "local[1]",
            "driver_memory": "1g",
            "jars_from": "packages",
            "bundled_aws_sdk": False,
            "conf": {"spark.jars.ivy": str(ivy)},
        },
    )
    path = write_pipeline_yaml(config, stack, tmp_path / "pipeline.yaml")
    os.chmod(path, 0o600)
    done = run_lakestream("run", str(path), "--until-idle", timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    # Ivy's resolution report names the runtime it fetched for this session (from Central or its cache).
    assert f"org.apache.iceberg#{_runtime_artifact()}" in done.stderr, done.stderr[-3000:]
    table = f"lake.pkg.all_types_{topic[:9]}"
    rows = spark.table(table).collect()
    expected_keys = set()
    for e in events:
        key = json.loads(e["key"])["payload"]["id"]
        (
            expected_keys.discard
            if json.loads(e["value"] or "null") is None or (json.loads(e["value"])["payload"] or {}).get("op") == "d"
            else expected_keys.add
        )(key)
    assert {r["id"] for r in rows} == expected_keys and rows
    summary = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    assert topic in summary.get("lakestream.offsets", ""), summary
