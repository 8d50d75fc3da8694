"""Health over time: a short summary of each table per health round, one JSON line each, in
``<state_dir>/health/<pipeline>.jsonl``. Written by `monitor` and the dashboard, read by the
dashboard's charts (files per partition over time)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig
from lakestream.jsonlog import append_lines, read_lines

if TYPE_CHECKING:
    from lakestream.health.model import HealthReport

_FIELDS = (
    "rows",
    "data_files",
    "files_per_partition_max",
    "files_per_partition_p95",
    "small_file_share",
    "snapshots",
    "metadata_bytes",
    "freshness_s",
    "kafka_lag",
)


def health_history_path(config: PipelineConfig) -> Path:
    return Path(config.state_dir) / "health" / f"{config.name}.jsonl"


def record_health(config: PipelineConfig, report: HealthReport) -> None:
    """Append one line per measured table of ``report``."""
    summaries = [m.summary() for m in report.tables if not m.error]
    append_lines(
        health_history_path(config),
        [{"collected_ms": report.collected_ms} | {k: s[k] for k in ("table", *_FIELDS)} for s in summaries],
    )


def read_health_history(config: PipelineConfig, since_ms: int = 0, limit: int = 20_000) -> list[dict[str, Any]]:
    """Samples newer than ``since_ms`` (at most the newest ``limit``), oldest first."""
    return read_lines(health_history_path(config), limit, lambda s: s.get("collected_ms", 0) >= since_ms)
