"""The maintenance log: every action a (non dry-run) maintenance round carried out, one JSON line each,
in ``<state_dir>/maintenance/<pipeline>.jsonl``. Expiry, orphan removal and metadata trims leave no
snapshot behind, so this log is the only record of them; the dashboard shows it."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lakestream.config import PipelineConfig

if TYPE_CHECKING:
    from lakestream.maintenance.actions import MaintenanceResult


def maintenance_log_path(config: PipelineConfig) -> Path:
    return Path(config.state_dir) / "maintenance" / f"{config.name}.jsonl"


def record_maintenance(config: PipelineConfig, results: Iterable[MaintenanceResult], finished_ms: int) -> None:
    """Append ``results`` (one round) to the pipeline's maintenance log."""
    lines = [orjson.dumps(r.to_json() | {"finished_ms": finished_ms}, default=str) + b"\n" for r in results]
    if not lines:
        return
    path = maintenance_log_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as fh:
        fh.write(b"".join(lines))


def read_maintenance_log(config: PipelineConfig, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` entries, oldest first (unreadable lines, e.g. a torn last write, are skipped)."""
    path = maintenance_log_path(config)
    if not path.exists():
        return []
    entries: deque[dict[str, Any]] = deque(maxlen=limit)
    with path.open("rb") as fh:
        for line in fh:
            try:
                entries.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return list(entries)
