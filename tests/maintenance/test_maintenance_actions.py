"""Maintenance on real Iceberg tables (Spark, JDBC catalog on PostgreSQL): compaction, expiry, orphans."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from lakestream.maintenance import InlineMaintenance, maintain_table
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY

NS = "maint"


def config_with(pipeline_config_factory, **policy):
    return pipeline_config_factory(
        streams=[{"topics": ["unused"]}],
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [{"tables": ".*", **policy}],
        },
    )


def make_table(spark, name: str, partitioned: bool = True) -> str:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{NS}.{name} PURGE")
    spec = "PARTITIONED BY (days(ts), region)" if partitioned else ""
    spark.sql(
        f"CREATE TABLE lake.{NS}.{name} (id BIGINT, ts TIMESTAMP, region STRING) USING iceberg {spec} "
        "TBLPROPERTIES ('format-version'='2')"
    )
    return f"{NS}.{name}"


def insert(spark, table: str, rows: list[tuple[int, str, str]]) -> None:
    values = ", ".join(f"({i}, TIMESTAMP '{ts}', '{region}')" for i, ts, region in rows)
    spark.sql(f"INSERT INTO lake.{table} VALUES {values}")


def files_by_partition(spark, table: str) -> dict[tuple[str, str], int]:
    rows = spark.sql(
        f"SELECT partition.ts_day AS day, partition.region AS region, file_count FROM lake.{table}.partitions"
    ).collect()
    return {(str(r.day), r.region): r.file_count for r in rows}


def local_path(uri: str) -> Path:
    return Path(urlparse(uri).path)


def test_hot_partition_untouched_while_cold_ones_are_compacted(spark, pipeline_config_factory):
    table = make_table(spark, "hot_cold")
    for i in range(6):
        insert(spark, table, [(i, "2024-01-01 10:00:00", "eu"), (100 + i, "2024-01-02 10:00:00", "us")])
    time.sleep(4)  # the two partitions above become cold (quiet_time_s=3)
    for i in range(6):
        insert(spark, table, [(200 + i, "2024-01-03 10:00:00", "eu")])
    now_ms = int(time.time() * 1000)  # pinned: a slow, loaded machine must not let the hot partition cool down
    before = files_by_partition(spark, table)
    assert before == {("2024-01-01", "eu"): 6, ("2024-01-02", "us"): 6, ("2024-01-03", "eu"): 6}

    config = config_with(pipeline_config_factory, compaction={"quiet_time_s": 3})
    results = maintain_table(spark, config, table, remove_orphans=False, now_ms=now_ms)

    compact = [r for r in results if r.action == "compact"]
    assert len(compact) == 1 and compact[0].status == "ok", compact
    assert (compact[0].files_before, compact[0].files_after) == (12, 2)
    after = files_by_partition(spark, table)
    assert after == {("2024-01-01", "eu"): 1, ("2024-01-02", "us"): 1, ("2024-01-03", "eu"): 6}
    assert spark.sql(f"SELECT count(*) FROM lake.{table}").collect()[0][0] == 18


def test_inline_hook_runs_at_most_every_interval(spark, pipeline_config_factory):
    table = make_table(spark, "inline_hook", partitioned=False)
    for i in range(3):
        insert(spark, table, [(i, "2024-01-01 10:00:00", "eu")])
    config = config_with(pipeline_config_factory, tables=f"{NS}\\.inline_hook", compaction={"quiet_time_s": 0})
    config.maintenance.policies.append(
        config.maintenance.policies[0].model_copy(update={"tables": ".*", "enabled": False})
    )
    now = time.time()
    maintenance = InlineMaintenance(spark, config)
    first = maintenance.round(now)
    assert {r.action for r in first} >= {"compact"} and all(r.table == table for r in first)
    assert maintenance.round(now + 10) == []  # interval_s=3600 has not passed
    assert spark.sql(f"SELECT count(*) FROM lake.{table}.data_files").collect()[0][0] == 1


def test_expiry_keeps_offsets_snapshot_and_time_travel(spark, pipeline_config_factory):
    table = make_table(spark, "expiry", partitioned=False)
    insert(spark, table, [(i, "2024-01-01 10:00:00", "eu") for i in range(10)])
    first_files = [r[0] for r in spark.sql(f"SELECT file_path FROM lake.{table}.data_files").collect()]
    spark.sql(f"DELETE FROM lake.{table} WHERE id < 5")  # copy-on-write: replaced files live on only in snapshot 1
    current_files = {r[0] for r in spark.sql(f"SELECT file_path FROM lake.{table}.data_files").collect()}
    replaced = set(first_files) - current_files
    assert replaced
    (
        spark.createDataFrame([(20, None, "eu")], "id BIGINT, ts TIMESTAMP, region STRING")
        .writeTo(f"lake.{table}")
        .option(f"snapshot-property.{OFFSETS_PROPERTY}", json.dumps({"cdc.t": {"0": 42}}))
        .append()
    )
    offsets_snapshot = spark.sql(
        f"SELECT snapshot_id FROM lake.{table}.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()[0][0]
    for i in range(2):  # newer snapshots without offsets, like maintenance commits
        insert(spark, table, [(30 + i, "2024-01-01 10:00:00", "eu")])
    snapshots = [
        r[0] for r in spark.sql(f"SELECT snapshot_id FROM lake.{table}.snapshots ORDER BY committed_at").collect()
    ]
    assert len(snapshots) == 5

    config = config_with(pipeline_config_factory, snapshot_retention_s=0, retain_last_snapshots=1)
    results = maintain_table(spark, config, table, remove_orphans=False)

    expire = [r for r in results if r.action == "expire_snapshots"]
    assert len(expire) == 1 and expire[0].status == "ok", expire
    assert expire[0].detail["protected_snapshot_id"] == offsets_snapshot
    kept = [r[0] for r in spark.sql(f"SELECT snapshot_id FROM lake.{table}.snapshots ORDER BY committed_at").collect()]
    assert kept == snapshots[2:] and offsets_snapshot in kept
    assert all(not local_path(f).exists() for f in replaced)
    assert all(local_path(f).exists() for f in current_files)
    assert spark.sql(f"SELECT count(*) FROM lake.{table} VERSION AS OF {offsets_snapshot}").collect()[0][0] == 6
    with pytest.raises(Exception, match="(?i)snapshot"):
        spark.sql(f"SELECT count(*) FROM lake.{table} VERSION AS OF {snapshots[0]}").collect()
    offsets = spark.sparkContext._jvm.lakestream.LakestreamHelper.latestSummaryValue(
        spark._jsparkSession, f"lake.{table}", OFFSETS_PROPERTY
    )
    assert json.loads(offsets) == {"cdc.t": {"0": 42}}


def test_orphans_older_than_threshold_removed_younger_kept(spark, pipeline_config_factory):
    table = make_table(spark, "orphans", partitioned=False)
    insert(spark, table, [(1, "2024-01-01 10:00:00", "eu")])
    location = spark.sql(f"DESCRIBE TABLE EXTENDED lake.{table}").where("col_name = 'Location'").collect()[0][1]
    data_dir = local_path(location) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    old, young = data_dir / "orphan-old.parquet", data_dir / "orphan-young.parquet"
    for path, age_s in ((old, 4 * 86400), (young, 3600)):
        path.write_bytes(b"not referenced by any snapshot")
        os.utime(path, (time.time() - age_s, time.time() - age_s))

    dry = maintain_table(spark, config_with(pipeline_config_factory, orphan_dry_run=True), table)
    [dry_orphans] = [r for r in dry if r.action == "remove_orphans"]
    assert dry_orphans.status == "dry-run" and dry_orphans.files_before == 1 and old.exists()

    results = maintain_table(spark, config_with(pipeline_config_factory, orphan_min_age_s=3 * 86400), table)
    [orphans] = [r for r in results if r.action == "remove_orphans"]
    assert orphans.status == "ok" and (orphans.files_before, orphans.files_after) == (1, 0)
    assert not old.exists() and young.exists()
    assert spark.sql(f"SELECT count(*) FROM lake.{table}").collect()[0][0] == 1
