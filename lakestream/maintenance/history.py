"""The maintenance log: every action a (non dry-run) maintenance round carried out, one JSON line each,
in ``<state_dir>/maintenance/<pipeline>.jsonl``. Expiry, orphan removal and metadata trims leave no
snapshot behind, so this log is the only record of them; the dashboard shows it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig
from lakestream.jsonlog import append_lines, read_lines

if TYPE_CHECKING:
    from lakestream.maintenance.actions import MaintenanceResult


def maintenance_log_path(config: PipelineConfig) -> Path:
    return Path(config.state_dir) / "maintenance" / f"{config.name}.jsonl"


def record_maintenance(
    config: PipelineConfig, results: Iterable[MaintenanceResult], finished_ms: int, started_ms: int | None = None
) -> None:
    """Append ``results`` (one round, from ``started_ms`` — its tables' metrics read included — to
    ``finished_ms``) to the pipeline's maintenance log."""
    window = {"finished_ms": finished_ms} | ({"round_started_ms": started_ms} if started_ms is not None else {})
    append_lines(maintenance_log_path(config), [r.to_json() | window for r in results])


def read_maintenance_log(config: PipelineConfig, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` entries, oldest first."""
    return read_lines(maintenance_log_path(config), limit)
