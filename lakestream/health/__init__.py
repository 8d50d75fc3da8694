"""Table health: metrics from Iceberg metadata, threshold alerts, terminal/JSON reports, Prometheus, webhooks."""

from lakestream.health.checks import Alert, evaluate
from lakestream.health.model import HealthReport
from lakestream.health.monitor import collect_health, monitor
from lakestream.read.inspection import TableMetrics, collect_table_metrics

__all__ = ["Alert", "HealthReport", "TableMetrics", "collect_health", "collect_table_metrics", "evaluate", "monitor"]
