"""A Prometheus text-format `/metrics` endpoint (stdlib HTTP server on a daemon thread)."""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lakestream.health.monitor import HealthReport

log = logging.getLogger(__name__)

# (metric name, help, TableMetrics attribute or callable)
_TABLE_GAUGES = [
    ("lakestream_table_data_files", "Data files in the current snapshot", lambda m: m.data_files),
    ("lakestream_table_data_bytes", "Bytes of data files in the current snapshot", lambda m: m.data_bytes),
    ("lakestream_table_files_per_partition_max", "Most data files in one partition", lambda m: m.files_per_partition_max),
    ("lakestream_table_files_per_partition_p95", "95th percentile of data files per partition", lambda m: m.files_per_partition_p95),
    ("lakestream_table_avg_file_bytes", "Average data file size", lambda m: m.avg_file_bytes),
    ("lakestream_table_small_file_share", "Share of data files below the small-file size", lambda m: m.small_file_share),
    ("lakestream_table_delete_files", "Position and equality delete files", lambda m: m.delete_files),
    ("lakestream_table_snapshots", "Snapshots kept in table metadata", lambda m: m.snapshots),
    ("lakestream_table_manifests", "Manifests of the current snapshot", lambda m: m.manifests),
    ("lakestream_table_metadata_bytes", "Metadata JSON + manifests + manifest lists", lambda m: m.metadata_bytes),
    ("lakestream_table_metadata_files", "Metadata JSON files: the current one and those on its log", lambda m: m.metadata_files),
    ("lakestream_table_seconds_since_compaction", "Seconds since the last replace snapshot", lambda m: m.seconds_since_compaction),
    ("lakestream_table_freshness_seconds", "Now minus the newest committed source change", lambda m: m.freshness_s),
    ("lakestream_table_kafka_lag", "Kafka records not yet committed to the table", lambda m: m.kafka_lag),
]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def render_prometheus(report: HealthReport) -> str:
    """The report in Prometheus exposition format 0.0.4; unknown values are omitted."""
    lines: list[str] = []
    for name, help_text, get in _TABLE_GAUGES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for m in report.tables:
            value = None if m.error else get(m)
            if value is not None:
                lines.append(f'{name}{{table="{_label(m.table)}"}} {_number(value)}')
    lines += ["# HELP lakestream_partition_data_files Data files per partition", "# TYPE lakestream_partition_data_files gauge"]
    for m in report.tables:
        for p in m.partitions:
            lines.append(f'lakestream_partition_data_files{{table="{_label(m.table)}",partition="{_label(p.label())}"}} {p.data_files}')
    lines += ["# HELP lakestream_table_compaction_lag_seconds How long compaction has been due",
              "# TYPE lakestream_table_compaction_lag_seconds gauge"]
    for table, lag in report.compaction_lag_s.items():
        lines.append(f'lakestream_table_compaction_lag_seconds{{table="{_label(table)}"}} {_number(lag)}')
    lines += ["# HELP lakestream_alert 1 while a health threshold is crossed", "# TYPE lakestream_alert gauge"]
    for alert in report.alerts:
        lines.append(f'lakestream_alert{{table="{_label(alert.table)}",metric="{_label(alert.metric)}"}} 1')
    lines += ["# HELP lakestream_health_collected_timestamp_seconds When the metrics were measured",
              "# TYPE lakestream_health_collected_timestamp_seconds gauge",
              f"lakestream_health_collected_timestamp_seconds {report.collected_ms / 1000}"]
    return "\n".join(lines) + "\n"


class MetricsExporter:
    """Serves the latest report on ``http://host:port/metrics``; `update` swaps the report atomically."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self._text = "# no health round has completed yet\n"
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("metrics: " + fmt, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="lakestream-metrics", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> MetricsExporter:
        self._thread.start()
        log.info("serving Prometheus metrics on http://%s:%d/metrics", *self._server.server_address[:2])
        return self

    def update(self, report: HealthReport) -> None:
        text = render_prometheus(report)
        with self._lock:
            self._text = text

    def text(self) -> str:
        with self._lock:
            return self._text

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
