"""`HealthReport`: the metrics and alerts of every table at one moment, as every health surface reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lakestream.health.checks import Alert
from lakestream.read.inspection import TableMetrics


@dataclass
class HealthReport:
    """Metrics and alerts of every table at one moment."""

    collected_ms: int
    tables: list[TableMetrics] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    compaction_lag_s: dict[str, float] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.alerts

    def to_json(self) -> dict[str, Any]:
        return {
            "collected_ms": self.collected_ms,
            "healthy": self.healthy,
            "tables": [
                m.to_json() | {"compaction_lag_s": round(self.compaction_lag_s.get(m.table, 0.0), 1)}
                for m in self.tables
            ],
            "alerts": [a.to_json() for a in self.alerts],
        }
