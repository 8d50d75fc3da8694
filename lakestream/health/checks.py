"""Turns table metrics into alerts, by the configured thresholds."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lakestream.config import CompactionPolicy, HealthThresholds
from lakestream.read.inspection import TableMetrics


@dataclass(frozen=True)
class Alert:
    """One crossed threshold on one table (``partition`` names the worst one for per-partition checks)."""

    table: str
    metric: str
    value: float
    threshold: float
    message: str
    partition: str | None = None

    @property
    def key(self) -> str:
        """Identity across rounds: a webhook says "raised" / "cleared" per key."""
        return f"{self.table}:{self.metric}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"key": self.key}


def compaction_pending(metrics: TableMetrics, compaction: CompactionPolicy) -> bool:
    """Some partition needs compaction by the policy (hot or not)."""
    from lakestream.maintenance.policy import needs_compaction

    return any(needs_compaction(p, compaction) for p in metrics.partitions)


def compaction_lag_s(metrics: TableMetrics, compaction: CompactionPolicy) -> float:
    """How long compaction has been due: time since the last compaction (or the oldest snapshot) while
    some partition needs it; 0 when nothing needs compacting. A table that never needs compaction is
    never "late"."""
    if not compaction_pending(metrics, compaction):
        return 0.0
    since = metrics.last_compaction_ms if metrics.last_compaction_ms is not None else metrics.oldest_snapshot_ms
    if since is None:
        return 0.0
    return max(0.0, (metrics.collected_ms - since) / 1000)


def evaluate(
    metrics: TableMetrics, thresholds: HealthThresholds, compaction: CompactionPolicy | None = None
) -> list[Alert]:
    """Alerts for every threshold ``metrics`` crosses (strictly above the threshold)."""
    compaction = compaction or CompactionPolicy()
    table = metrics.table
    alerts: list[Alert] = []
    if metrics.error:
        alerts.append(Alert(table, "collection_error", 1, 0, f"metrics could not be collected: {metrics.error}"))
        return alerts

    if metrics.partitions:
        worst = max(metrics.partitions, key=lambda p: p.data_files)
        if worst.data_files > thresholds.max_files_per_partition:
            alerts.append(
                Alert(
                    table,
                    "files_per_partition",
                    worst.data_files,
                    thresholds.max_files_per_partition,
                    f"{worst.data_files} data files in partition {worst.label()} "
                    f"> {thresholds.max_files_per_partition}",
                    partition=worst.label(),
                )
            )
    if metrics.snapshots > thresholds.max_snapshots:
        alerts.append(
            Alert(
                table,
                "snapshots",
                metrics.snapshots,
                thresholds.max_snapshots,
                f"{metrics.snapshots} snapshots > {thresholds.max_snapshots}: expire snapshots",
            )
        )
    if metrics.metadata_bytes > thresholds.max_metadata_bytes:
        alerts.append(
            Alert(
                table,
                "metadata_bytes",
                metrics.metadata_bytes,
                thresholds.max_metadata_bytes,
                f"metadata is {metrics.metadata_bytes} bytes > {thresholds.max_metadata_bytes}",
            )
        )
    lag = compaction_lag_s(metrics, compaction)
    if lag > thresholds.max_compaction_lag_s:
        alerts.append(
            Alert(
                table,
                "compaction_lag_s",
                round(lag, 1),
                thresholds.max_compaction_lag_s,
                f"compaction due for {lag:.0f}s > {thresholds.max_compaction_lag_s:g}s",
            )
        )
    if (
        thresholds.max_freshness_s is not None
        and metrics.freshness_s is not None
        and metrics.freshness_s > thresholds.max_freshness_s
    ):
        alerts.append(
            Alert(
                table,
                "freshness_s",
                round(metrics.freshness_s, 1),
                thresholds.max_freshness_s,
                f"newest source change is {metrics.freshness_s:.0f}s old > {thresholds.max_freshness_s:g}s",
            )
        )
    if (
        thresholds.max_consumer_lag is not None
        and metrics.kafka_lag is not None
        and metrics.kafka_lag > thresholds.max_consumer_lag
    ):
        alerts.append(
            Alert(
                table,
                "kafka_lag",
                metrics.kafka_lag,
                thresholds.max_consumer_lag,
                f"{metrics.kafka_lag} Kafka records not yet committed > {thresholds.max_consumer_lag}",
            )
        )
    if (
        thresholds.max_small_file_share is not None
        and metrics.data_files
        and metrics.small_file_share > thresholds.max_small_file_share
    ):
        alerts.append(
            Alert(
                table,
                "small_file_share",
                round(metrics.small_file_share, 4),
                thresholds.max_small_file_share,
                f"{metrics.small_file_share:.0%} of data files are small > {thresholds.max_small_file_share:.0%}",
            )
        )
    return alerts
