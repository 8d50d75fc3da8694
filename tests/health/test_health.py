"""Health on real Iceberg tables: thresholds and `lakestream health --check`, freshness, Kafka lag, surfaces."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

from conftest import produce_records, write_pipeline_yaml
from prometheus_client.parser import text_string_to_metric_families

from lakestream.cli import main
from lakestream.config import KafkaSettings
from lakestream.health.exporter import MetricsExporter
from lakestream.health.monitor import collect_health
from lakestream.health.report import render_table
from lakestream.health.webhook import AlertNotifier
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, SOURCE_TS_PROPERTY
from lakestream.source.kafka import TP, kafka_lag

NS = "health"


def make_table(spark, name: str) -> str:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{NS}.{name} PURGE")
    spark.sql(
        f"CREATE TABLE lake.{NS}.{name} (id BIGINT, region STRING) USING iceberg TBLPROPERTIES ('format-version'='2')"
    )
    return f"{NS}.{name}"


def test_check_fails_over_threshold_and_passes_after_maintenance(
    spark, stack, pipeline_config_factory, tmp_path, capsys
):
    table = make_table(spark, "crowded")
    for i in range(8):
        spark.sql(f"INSERT INTO lake.{table} VALUES ({i}, 'eu')")
    config = pipeline_config_factory(
        streams=[{"topics": ["unused"]}],
        maintenance={"policies": [{"compaction": {"quiet_time_s": 0}}]},
        health={"thresholds": {"max_files_per_partition": 5}},
    )
    pipeline = str(write_pipeline_yaml(config, stack, tmp_path / "pipeline.yaml"))

    assert main(["health", pipeline, "--check", "--no-lag", "--table", table]) == 1
    out = capsys.readouterr().out
    assert "ALERT" in out and "files_per_partition" in out

    assert main(["maintain", pipeline, "--dry-run", "--table", table]) == 0
    assert "compact health.crowded: planned, files 8 → ?" in capsys.readouterr().out
    assert spark.sql(f"SELECT count(*) FROM lake.{table}.data_files").collect()[0][0] == 8

    assert main(["maintain", pipeline, "--table", table]) == 0
    assert "compact health.crowded: ok, files 8 → 1" in capsys.readouterr().out

    assert main(["health", pipeline, "--check", "--no-lag", "--json", "--table", table]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] and report["tables"][0]["files_per_partition_max"] == 1
    assert report["tables"][0]["seconds_since_compaction"] is not None


class _Collector(BaseHTTPRequestHandler):
    events: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Collector.events.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_freshness_lag_alerts_webhook_and_prometheus(spark, stack, pipeline_config_factory):
    table = make_table(spark, "fresh")
    topic = f"health-fresh-{int(time.time())}"
    produce_records(stack.bootstrap_servers, topic, [(str(i), "{}") for i in range(10)], partition=0)
    (
        spark.createDataFrame([(1, "eu")], "id BIGINT, region STRING")
        .writeTo(f"lake.{table}")
        .option(f"snapshot-property.{OFFSETS_PROPERTY}", json.dumps({topic: {"0": 4}}))
        .option(f"snapshot-property.{SOURCE_TS_PROPERTY}", str(int(time.time() * 1000) - 120_000))
        .append()
    )
    spark.sql(f"INSERT INTO lake.{table} VALUES (2, 'us')")  # a newer snapshot without offsets
    config = pipeline_config_factory(
        streams=[{"topics": [topic]}],
        health={"thresholds": {"max_freshness_s": 60, "max_consumer_lag": 5}},
    )

    report = collect_health(spark, config, [table])
    [metrics] = report.tables
    assert metrics.kafka_lag == 6
    assert 119 <= metrics.freshness_s < 600
    assert {a.metric for a in report.alerts} == {"freshness_s", "kafka_lag"}
    rendered = io.StringIO()
    render_table(report, rendered)
    assert "ALERT" in rendered.getvalue()

    server = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = MetricsExporter(0).start()
    try:
        notifier = AlertNotifier(f"http://127.0.0.1:{server.server_address[1]}/hook")
        notifier.notify(report.alerts)
        notifier.notify(report.alerts)  # unchanged: nothing new to say
        notifier.notify([])
        assert [(e["event"], e["metric"]) for e in _Collector.events] == [
            ("raised", "freshness_s"),
            ("raised", "kafka_lag"),
            ("cleared", "freshness_s"),
            ("cleared", "kafka_lag"),
        ]

        exporter.update(report)
        text = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).read().decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("lakestream_table_kafka_lag", (("table", table),))] == 6
        assert samples[("lakestream_alert", (("metric", "kafka_lag"), ("table", table)))] == 1
        assert samples[("lakestream_table_snapshots", (("table", table),))] == 2
    finally:
        exporter.stop()
        server.shutdown()


def test_lag_unknown_when_broker_unreachable():
    started = time.monotonic()
    assert kafka_lag(KafkaSettings(bootstrap_servers="127.0.0.1:1"), {TP("t", 0): 1}, timeout_s=1.0) is None
    assert time.monotonic() - started < 10
