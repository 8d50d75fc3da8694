"""One health round over the catalog: metrics per table, alerts, and the surfaces fed from them."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from lakestream.config import PipelineConfig
from lakestream.errors import first_line
from lakestream.health.checks import compaction_lag_s, evaluate
from lakestream.health.history import record_health
from lakestream.health.model import HealthReport
from lakestream.read.inspection import TableMetrics, collect_table_metrics, list_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.health.exporter import MetricsExporter
    from lakestream.health.webhook import AlertNotifier

log = logging.getLogger(__name__)


def collect_health(
    spark: SparkSession,
    config: PipelineConfig,
    tables: list[str] | None = None,
    measure_lag: bool = True,
    now_ms: int | None = None,
) -> HealthReport:
    """Measure ``tables`` (default: every table in the catalog) and evaluate the configured thresholds."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    report = HealthReport(collected_ms=now_ms)
    names = list(tables) if tables else list_tables(spark, config.catalog.name)
    for name in names:
        policy = config.maintenance.policy_for(name)
        try:
            metrics = collect_table_metrics(
                spark, config.catalog.name, name, policy, kafka=config.kafka if measure_lag else None, now_ms=now_ms
            )
        except Exception as exc:  # noqa: BLE001 — a table dropped mid-round or unreadable metadata: report it, go on
            log.error("health of %s could not be collected: %s", name, first_line(exc, 300))
            metrics = TableMetrics(table=name, collected_ms=now_ms, error=first_line(exc, 300))
        report.tables.append(metrics)
        report.compaction_lag_s[name] = compaction_lag_s(metrics, policy.compaction)
        report.alerts.extend(evaluate(metrics, config.health.thresholds, policy.compaction))
    return report


def monitor(
    spark: SparkSession,
    config: PipelineConfig,
    exporter: MetricsExporter | None = None,
    notifier: AlertNotifier | None = None,
    interval_s: float = 60.0,
    stop: threading.Event | None = None,
    tables: list[str] | None = None,
) -> None:
    """Re-measure every ``interval_s`` until ``stop`` is set, feeding the exporter and the webhook."""
    stop = stop or threading.Event()
    while not stop.is_set():
        started = time.time()
        report = collect_health(spark, config, tables)
        try:
            record_health(config, report)
        except OSError as exc:
            log.warning("health history not written: %s", exc)
        if exporter is not None:
            exporter.update(report)
        if notifier is not None:
            notifier.notify(report.alerts)
        stop.wait(max(0.0, interval_s - (time.time() - started)))
