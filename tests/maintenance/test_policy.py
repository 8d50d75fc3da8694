"""Planning decisions, without Spark: hot vs cold partitions, the offsets snapshot, the orphan floor."""

from __future__ import annotations

from lakestream.config import MaintenancePolicy
from lakestream.maintenance.policy import MIN_ORPHAN_AGE_S, plan_maintenance
from lakestream.read.inspection import PartitionMetrics, SnapshotInfo, TableMetrics

NOW = 1_800_000_000_000


def partition(day: str, files: int, age_s: float, size: int = 1000) -> PartitionMetrics:
    return PartitionMetrics({"day": day}, 0, files, files * size, 0, NOW - int(age_s * 1000))


def test_only_cold_partitions_needing_it_are_compacted():
    metrics = TableMetrics(
        "ns.t",
        NOW,
        partitions=[
            partition("hot", 200, age_s=5),
            partition("cold", 200, age_s=3600),
            partition("single", 1, age_s=3600),
            partition("big", 3, age_s=3600, size=200 * 1024**2),
        ],
    )
    plan = plan_maintenance(metrics, MaintenancePolicy(), NOW)
    assert [p.partition["day"] for p in plan.compact] == ["cold"]
    assert [p.partition["day"] for p in plan.hot_skipped] == ["hot"]


def test_expiry_never_passes_the_newest_offsets_snapshot():
    offsets_ms = NOW - 30 * 86400 * 1000
    metrics = TableMetrics(
        "ns.t",
        NOW,
        snapshots=50,
        oldest_snapshot_ms=NOW - 60 * 86400 * 1000,
        ancestry=[
            SnapshotInfo(3, NOW - 1000, "replace", None, None),
            SnapshotInfo(2, offsets_ms, "append", {"topic": {"0": 10}}, NOW),
            SnapshotInfo(1, offsets_ms - 1000, "append", {"topic": {"0": 5}}, NOW),
        ],
    )
    plan = plan_maintenance(metrics, MaintenancePolicy(snapshot_retention_s=86400, retain_last_snapshots=1), NOW)
    assert plan.expire
    assert plan.protected_snapshot_id == 2
    assert plan.expire_older_than_ms == offsets_ms


def test_orphan_age_never_below_iceberg_floor():
    plan = plan_maintenance(TableMetrics("ns.t", NOW), MaintenancePolicy(orphan_min_age_s=60), NOW)
    assert plan.orphan_older_than_ms == NOW - MIN_ORPHAN_AGE_S * 1000


def test_snapshot_count_cap_expires_young_snapshots_but_not_the_offsets_one():
    # 1,200 snapshots one second apart, all younger than the 7-day retention: only the cap applies.
    ancestry = [
        SnapshotInfo(1200 - i, NOW - i * 1000, "append", {"t": {"0": 1200 - i}} if i % 100 == 0 else None, NOW)
        for i in range(1200)
    ]
    metrics = TableMetrics("ns.t", NOW, snapshots=1200, oldest_snapshot_ms=ancestry[-1].committed_ms, ancestry=ancestry)
    plan = plan_maintenance(metrics, MaintenancePolicy(max_snapshots=500), NOW)
    assert plan.expire
    assert plan.expire_older_than_ms == NOW - 249 * 1000  # past the cap of 500, the 250 newest survive
    assert plan.protected_snapshot_id == 1200 and plan.expire_older_than_ms <= NOW
    uncapped = plan_maintenance(metrics, MaintenancePolicy(max_snapshots=None), NOW)
    assert not uncapped.expire


def test_deletion_vectors_are_not_rewritten_but_position_delete_files_are():
    policy = MaintenancePolicy(max_delete_files=50)
    only_dvs = TableMetrics("ns.t", NOW, delete_files=900, deletion_vectors=900)
    assert not plan_maintenance(only_dvs, policy, NOW).rewrite_deletes
    mixed = TableMetrics("ns.t", NOW, delete_files=900, deletion_vectors=840)
    plan = plan_maintenance(mixed, policy, NOW)
    assert plan.rewrite_deletes and "60 position/equality delete files" in " ".join(plan.reasons)
