"""Health over time: a short summary of each table per health round, one JSON line each, in
``<state_dir>/health/<pipeline>.jsonl``. Written by `monitor` and the dashboard, read by the
dashboard's charts (files per partition over time)."""
from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lakestream.config import PipelineConfig

if TYPE_CHECKING:
    from lakestream.health.monitor import HealthReport

_FIELDS = ("rows", "data_files", "files_per_partition_max", "files_per_partition_p95", "small_file_share",
           "snapshots", "metadata_bytes", "freshness_s", "kafka_lag")


def health_history_path(config: PipelineConfig) -> Path:
    return Path(config.state_dir) / "health" / f"{config.name}.jsonl"


def record_health(config: PipelineConfig, report: HealthReport) -> None:
    """Append one line per measured table of ``report``."""
    lines = []
    for m in report.tables:
        if m.error:
            continue
        summary = m.summary()
        lines.append(orjson.dumps({"collected_ms": report.collected_ms, "table": m.table}
                                  | {k: summary[k] for k in _FIELDS}) + b"\n")
    if not lines:
        return
    path = health_history_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as fh:
        fh.write(b"".join(lines))


def read_health_history(config: PipelineConfig, since_ms: int = 0, limit: int = 20_000) -> list[dict[str, Any]]:
    """Samples newer than ``since_ms`` (at most the newest ``limit``), oldest first."""
    path = health_history_path(config)
    if not path.exists():
        return []
    samples: deque[dict[str, Any]] = deque(maxlen=limit)
    with path.open("rb") as fh:
        for line in fh:
            try:
                sample = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if sample.get("collected_ms", 0) >= since_ms:
                samples.append(sample)
    return list(samples)
