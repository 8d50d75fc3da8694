"""Decides what maintenance a table needs from its metrics and its policy; pure, no Spark.

The decisions that keep streaming safe live here: only *cold* partitions (not written for the quiet
time) are compacted, and snapshot expiry never reaches the newest snapshot carrying the engine's
Kafka offsets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lakestream.config import CompactionPolicy, MaintenancePolicy
from lakestream.read.inspection import PartitionMetrics, TableMetrics

log = logging.getLogger(__name__)

# Iceberg's remove_orphan_files procedure refuses younger thresholds (files of in-flight commits).
MIN_ORPHAN_AGE_S = 24 * 3600


@dataclass
class MaintenancePlan:
    """The actions one round will run on one table, with the reason for each."""

    table: str
    compact: list[PartitionMetrics] = field(default_factory=list)
    hot_skipped: list[PartitionMetrics] = field(default_factory=list)
    rewrite_deletes: bool = False
    rewrite_manifests: bool = False
    expire: bool = False
    expire_older_than_ms: int = 0
    retain_last: int = 1
    protected_snapshot_id: int | None = None
    trim_metadata: bool = False
    orphan_older_than_ms: int = 0
    orphan_dry_run: bool = False
    reasons: list[str] = field(default_factory=list)


def needs_compaction(partition: PartitionMetrics, policy: CompactionPolicy) -> bool:
    """Too many files, files far below the target size on average (a lone file never needs either), or a large
    share of its rows deleted."""
    if partition.deleted_ratio >= policy.delete_ratio_threshold:
        return True
    if partition.data_files < 2:
        return False
    if partition.data_files > policy.max_files_per_partition:
        return True
    return partition.avg_file_bytes < policy.min_avg_file_size_ratio * policy.target_file_size_bytes


def is_cold(partition: PartitionMetrics, policy: CompactionPolicy, now_ms: int) -> bool:
    """Not written for ``quiet_time_s``. No timestamp means its last writer was expired long ago: cold."""
    if partition.last_updated_ms is None:
        return True
    return now_ms - partition.last_updated_ms >= policy.quiet_time_s * 1000


def plan_maintenance(metrics: TableMetrics, policy: MaintenancePolicy, now_ms: int) -> MaintenancePlan:
    """The maintenance ``metrics.table`` needs under ``policy`` at ``now_ms``."""
    plan = MaintenancePlan(table=metrics.table, orphan_dry_run=policy.orphan_dry_run)

    for partition in metrics.partitions:
        if not needs_compaction(partition, policy.compaction):
            continue
        if is_cold(partition, policy.compaction, now_ms):
            plan.compact.append(partition)
        else:
            plan.hot_skipped.append(partition)
    if plan.compact:
        plan.reasons.append(f"compact {len(plan.compact)} cold partition(s) with too many or too small files")
    if plan.hot_skipped:
        plan.reasons.append(
            f"{len(plan.hot_skipped)} hot partition(s) left alone until quiet for {policy.compaction.quiet_time_s:g}s"
        )

    # Deletion vectors are left alone: rewrite_position_delete_files has nothing to merge in them (beside
    # a stream it spent 1-3 s of Spark jobs per round on a 100M-row mirror and changed no file).
    rewritable = metrics.delete_files - metrics.deletion_vectors
    if rewritable > policy.max_delete_files:
        plan.rewrite_deletes = True
        plan.reasons.append(f"{rewritable} position/equality delete files > {policy.max_delete_files}")

    if metrics.manifests > policy.max_manifests:
        plan.rewrite_manifests = True
        plan.reasons.append(f"{metrics.manifests} manifests > {policy.max_manifests}")

    plan.retain_last = policy.retain_last_snapshots
    older_than = now_ms - int(policy.snapshot_retention_s * 1000)
    cap = policy.max_snapshots
    over_cap = cap is not None and len(metrics.ancestry) > cap
    if cap is not None and over_cap:
        # Past the cap, keep the newest half of it: expiry reads every manifest of every snapshot it keeps (a
        # minute at 500 snapshots of a 100M-row mirror), so it runs once per max/2 commits, not every round.
        keep = max(1, cap // 2)
        older_than = max(older_than, metrics.ancestry[keep - 1].committed_ms)
    protected = metrics.newest_offsets_snapshot()
    if protected is not None:
        plan.protected_snapshot_id = protected.snapshot_id
        # expire_snapshots removes snapshots strictly older than older_than, so capping it at the
        # offsets snapshot's own commit time keeps that snapshot (and everything after it).
        older_than = min(older_than, protected.committed_ms)
    plan.expire_older_than_ms = older_than
    if (
        metrics.snapshots > plan.retain_last
        and metrics.oldest_snapshot_ms is not None
        and metrics.oldest_snapshot_ms < older_than
    ):
        plan.expire = True
        if over_cap:
            plan.reasons.append(f"{len(metrics.ancestry)} snapshots > max_snapshots {policy.max_snapshots}")
        else:
            plan.reasons.append(
                f"snapshots older than {policy.snapshot_retention_s:g}s (keeping the last {plan.retain_last})"
            )

    # Each metadata file written before expiry lists every snapshot expiry then removes: together the
    # bulk of a streaming table's metadata, and Iceberg only deletes them as later commits push them off.
    if plan.expire:
        plan.trim_metadata = True
        plan.reasons.append("delete the metadata files written before snapshot expiry")
    elif not metrics.metadata_delete_after_commit or metrics.metadata_files > policy.metadata_previous_versions + 1:
        plan.trim_metadata = True
        plan.reasons.append(
            f"{metrics.metadata_files} metadata files: bound them to {policy.metadata_previous_versions} earlier ones"
        )

    orphan_age_s = policy.orphan_min_age_s
    if orphan_age_s < MIN_ORPHAN_AGE_S:
        log.warning(
            "%s: orphan_min_age_s=%gs is below Iceberg's 24 h safety floor; using 24 h", metrics.table, orphan_age_s
        )
        orphan_age_s = MIN_ORPHAN_AGE_S
    plan.orphan_older_than_ms = now_ms - int(orphan_age_s * 1000)
    return plan
