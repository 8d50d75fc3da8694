"""Metadata stays bounded: after many small commits, one maintenance round leaves a few small metadata files.

Each earlier metadata JSON file lists every snapshot of its time, so a streaming table's metadata JSON
grows with commits × snapshots, and snapshot expiry alone leaves the files written before it on the
metadata log (after 500 commits they are most of the metadata bytes: see bench/small_files.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

from lakestream.config import HealthThresholds
from lakestream.health.checks import evaluate
from lakestream.identifiers import sql_string
from lakestream.maintenance.policy import plan_maintenance
from lakestream.maintenance.runner import maintain_table, plan_table
from lakestream.read.inspection import (
    METADATA_PREVIOUS_VERSIONS_MAX,
    collect_table_metrics,
    count_table_files,
    load_java_table,
)
from lakestream.sink.catalog.schema import DEFAULT_TABLE_PROPERTIES

NS, TABLE = "metadata_bound", "events"
COMMITS = 25


def _metadata_files_on_disk(spark, name: str) -> list[Path]:
    location = urlparse(load_java_table(spark, "lake", name).location()).path
    return sorted((Path(location) / "metadata").glob("*.metadata.json"))


def test_one_round_deletes_old_metadata_and_keeps_the_log_bounded(spark, pipeline_config_factory):
    name = f"{NS}.{TABLE}"
    properties = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in DEFAULT_TABLE_PROPERTIES.items())
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{name} PURGE")
    spark.sql(f"CREATE TABLE lake.{name} (id BIGINT, note STRING) USING iceberg TBLPROPERTIES ({properties})")
    for i in range(COMMITS):  # one small commit each, as a streaming table gets them
        spark.sql(f"INSERT INTO lake.{name} VALUES ({i}, 'event {i}')")
    config = pipeline_config_factory(
        streams=[{"topics": ["unused"]}],
        maintenance={
            "policies": [
                {
                    "retain_last_snapshots": 3,
                    "max_snapshots": 3,
                    "snapshot_retention_s": 0,
                    "compaction": {"quiet_time_s": 0},
                }
            ]
        },
    )
    before = collect_table_metrics(spark, "lake", name)
    assert before.snapshots == COMMITS and before.metadata_files == COMMITS + 1
    # A maintenance plan's reading: all it plans from is the same, without the table-wide totals.
    for_plan = collect_table_metrics(spark, "lake", name, now_ms=before.collected_ms, for_plan=True)
    assert for_plan.metadata_bytes == 0 < before.metadata_bytes and for_plan.data_files == 0 < before.data_files
    for field in (
        "partitions",
        "delete_files",
        "deletion_vectors",
        "manifests",
        "ancestry",
        "snapshots",
        "metadata_files",
        "oldest_snapshot_ms",
        "last_compaction_ms",
        "freshness_s",
        "metadata_delete_after_commit",
        "has_sort_order",
        "rows",
    ):
        assert getattr(for_plan, field) == getattr(before, field), field
    policy = config.maintenance.policy_for(name)
    assert plan_maintenance(for_plan, policy, before.collected_ms) == plan_maintenance(
        before, policy, before.collected_ms
    )
    assert len(_metadata_files_on_disk(spark, name)) == COMMITS + 1

    results = {r.action: r for r in maintain_table(spark, config, name, remove_orphans=False)}
    assert results["expire_snapshots"].status == "ok"
    trim = results["trim_metadata"]
    assert trim.status == "ok" and trim.files_before > COMMITS and trim.files_after <= 3, trim.describe()
    assert trim.bytes_after <= 0.05 * trim.bytes_before, trim.describe()

    after = collect_table_metrics(spark, "lake", name)
    assert after.snapshots <= 3
    assert after.metadata_files <= 3 and len(_metadata_files_on_disk(spark, name)) <= 3
    # What is left is mostly manifests: the kept appends reference one per commit, and compaction's
    # snapshot as many rewritten ones (with 25 commits that is ~60 % of the bytes before the round).
    assert after.metadata_bytes < 0.75 * before.metadata_bytes, (before.metadata_bytes, after.metadata_bytes)
    assert spark.sql(f"SELECT count(*) FROM lake.{name}").collect()[0][0] == COMMITS
    files = count_table_files(spark, "lake", name)
    assert (files.snapshots, files.data_files, files.delete_files) == (after.snapshots, 1, 0)
    jtable = load_java_table(spark, "lake", name)
    assert (
        jtable.properties().get(METADATA_PREVIOUS_VERSIONS_MAX)
        == DEFAULT_TABLE_PROPERTIES[METADATA_PREVIOUS_VERSIONS_MAX]
    )

    # health's threshold sees the difference; the next round has nothing left to trim
    thresholds = HealthThresholds(max_metadata_bytes=(before.metadata_bytes + after.metadata_bytes) // 2)
    assert "metadata_bytes" in {a.metric for a in evaluate(before, thresholds)}
    assert "metadata_bytes" not in {a.metric for a in evaluate(after, thresholds)}
    assert after.to_json()["metadata_files"] == after.metadata_files
    assert not plan_table(spark, config, name).trim_metadata


def test_a_plans_metrics_count_deletion_vectors_and_manifests_as_the_metadata_tables_do(spark):
    from lakestream.config import MaintenancePolicy

    name = f"{NS}.dvs"
    properties = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in DEFAULT_TABLE_PROPERTIES.items())
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{name} PURGE")
    spark.sql(f"CREATE TABLE lake.{name} (id BIGINT, note STRING) USING iceberg TBLPROPERTIES ({properties})")
    for i in range(3):  # a few rows per data file: deleting some leaves a deletion vector, not a removed file
        spark.sql(f"INSERT INTO lake.{name} SELECT id, 'row' FROM range({100 * i}, {100 * i + 100})")
    spark.sql(f"DELETE FROM lake.{name} WHERE id IN (1, 160)")  # deletion vectors in two data files
    spark.sql(f"DELETE FROM lake.{name} WHERE id = 3")
    policy = MaintenancePolicy(max_delete_files=1)
    full = collect_table_metrics(spark, "lake", name, policy)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    for_plan = collect_table_metrics(spark, "lake", name, policy, now_ms=full.collected_ms, for_plan=True)
    # A table never partitioned: the plan's metrics (snapshots and metadata log included) run no Spark job.
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before
    assert (for_plan.ancestry, for_plan.snapshots, for_plan.metadata_files) == (
        full.ancestry,
        full.snapshots,
        full.metadata_files,
    )
    assert full.delete_files == for_plan.delete_files >= 2
    assert full.deletion_vectors == for_plan.deletion_vectors == full.delete_files
    assert full.manifests == for_plan.manifests >= 2
    # A table never partitioned: its one partition read in the JVM, the deletion vectors' commits included.
    assert for_plan.partitions == full.partitions and full.partitions[0].delete_files == full.delete_files
    assert full.partitions[0].last_updated_ms == full.ancestry[0].committed_ms
    # A compaction's plan beside the batches: the live files listed and their deleted rows read in the JVM at a
    # lower priority, no Spark job, the same as Spark's data_files table and as the batches' own reading.
    from lakestream.identifiers import TableName
    from lakestream.maintenance.compaction import live_data_files
    from lakestream.sink.catalog.sink import deleted_positions

    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    listed = live_data_files(spark, "lake", TableName.parse(name))
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before
    by_spark = spark.sql(f"SELECT file_path, file_size_in_bytes, record_count, spec_id FROM lake.{name}.data_files")
    assert sorted(f[:4] for f in listed) == sorted(tuple(r) for r in by_spark.collect())
    assert all(f[4] == {} for f in listed)
    paths = [f[0] for f in listed]
    beside = deleted_positions(spark, "lake", NS, "dvs", paths, nice=10)
    assert beside == deleted_positions(spark, "lake", NS, "dvs", paths)
    assert sum(len(f["positions"]) for f in beside["files"].values()) == 3 and not beside["missing"]
    stats = json.loads(
        spark.sparkContext._jvm.lakestream.TableStats.currentFiles(load_java_table(spark, "lake", name), 0, "")
    )
    assert stats["partition"]["data_files"] == full.partitions[0].data_files == full.data_files  # read there
