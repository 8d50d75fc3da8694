"""Health as Prometheus metrics: `/metrics` through prometheus-client, from the latest health round.

A round's report is a set of values measured at one moment, so it is exposed by a custom collector
that yields the report as it is (a table that disappeared disappears, an unknown value is omitted
rather than shown as 0), registered in a dedicated `CollectorRegistry`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lakestream.health.model import HealthReport

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

# (metric name, help, TableMetrics attribute or callable)
_TABLE_GAUGES = [
    ("lakestream_table_rows", "Live rows of the current snapshot (from its summary)", lambda m: m.rows),
    ("lakestream_table_data_files", "Data files in the current snapshot", lambda m: m.data_files),
    ("lakestream_table_data_bytes", "Bytes of data files in the current snapshot", lambda m: m.data_bytes),
    (
        "lakestream_table_files_per_partition_max",
        "Most data files in one partition",
        lambda m: m.files_per_partition_max,
    ),
    (
        "lakestream_table_files_per_partition_p95",
        "95th percentile of data files per partition",
        lambda m: m.files_per_partition_p95,
    ),
    ("lakestream_table_avg_file_bytes", "Average data file size", lambda m: m.avg_file_bytes),
    (
        "lakestream_table_small_file_share",
        "Share of data files below the small-file size",
        lambda m: m.small_file_share,
    ),
    ("lakestream_table_delete_files", "Position and equality delete files", lambda m: m.delete_files),
    ("lakestream_table_snapshots", "Snapshots kept in table metadata", lambda m: m.snapshots),
    ("lakestream_table_manifests", "Manifests of the current snapshot", lambda m: m.manifests),
    ("lakestream_table_metadata_bytes", "Metadata JSON + manifests + manifest lists", lambda m: m.metadata_bytes),
    (
        "lakestream_table_metadata_files",
        "Metadata JSON files: the current one and those on its log",
        lambda m: m.metadata_files,
    ),
    (
        "lakestream_table_seconds_since_compaction",
        "Seconds since the last replace snapshot",
        lambda m: m.seconds_since_compaction,
    ),
    (
        "lakestream_table_rewritten_bytes_1h",
        "Bytes compactions wrote in the last hour (snapshots still kept)",
        lambda m: m.write_amplification()["rewritten_bytes"],
    ),
    (
        "lakestream_table_ingested_bytes_1h",
        "Bytes the writers added in the last hour (snapshots still kept)",
        lambda m: m.write_amplification()["ingested_bytes"],
    ),
    (
        "lakestream_table_write_amplification_1h",
        "Bytes compactions wrote per byte the writers added, last hour",
        lambda m: m.write_amplification()["ratio"],
    ),
    ("lakestream_table_freshness_seconds", "Now minus the newest committed source change", lambda m: m.freshness_s),
    ("lakestream_table_kafka_lag", "Kafka records not yet committed to the table", lambda m: m.kafka_lag),
]


class HealthCollector(Collector):
    """Yields the metric families of the latest report (nothing before the first round)."""

    def __init__(self, report: HealthReport | None = None) -> None:
        self._report = report
        self._lock = threading.Lock()

    def update(self, report: HealthReport) -> None:
        with self._lock:
            self._report = report

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            report = self._report
        if report is None:
            return
        for name, help_text, get in _TABLE_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["table"])
            for m in report.tables:
                value = None if m.error else get(m)
                if value is not None:
                    family.add_metric([m.table], value)
            yield family
        partitions = GaugeMetricFamily(
            "lakestream_partition_data_files", "Data files per partition", labels=["table", "partition"]
        )
        for m in report.tables:
            for p in m.partitions:
                partitions.add_metric([m.table, p.label()], p.data_files)
        yield partitions
        lag = GaugeMetricFamily(
            "lakestream_table_compaction_lag_seconds", "How long compaction has been due", labels=["table"]
        )
        for table, seconds in report.compaction_lag_s.items():
            lag.add_metric([table], seconds)
        yield lag
        alerts = GaugeMetricFamily(
            "lakestream_alert", "1 while a health threshold is crossed", labels=["table", "metric"]
        )
        for alert in report.alerts:
            alerts.add_metric([alert.table, alert.metric], 1)
        yield alerts
        yield GaugeMetricFamily(
            "lakestream_health_collected_timestamp_seconds",
            "When the metrics were measured",
            value=report.collected_ms / 1000,
        )


def render_prometheus(report: HealthReport) -> str:
    """The report in Prometheus text exposition format; unknown values are omitted."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(report))
    return generate_latest(registry).decode()


class MetricsExporter:
    """Serves the latest report on ``http://host:port/metrics``; `update` swaps the report atomically."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self._port, self._host = port, host
        self._collector = HealthCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._collector)
        self._server: WSGIServer | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else self._port

    def start(self) -> MetricsExporter:
        self._server, _ = start_http_server(self._port, addr=self._host, registry=self.registry)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", self._host, self.port)
        return self

    def update(self, report: HealthReport) -> None:
        self._collector.update(report)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
