"""Checks, Prometheus text and webhook state without Spark: fast, pure."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lakestream.config import CompactionPolicy, HealthThresholds
from lakestream.health.checks import compaction_lag_s, evaluate
from lakestream.health.exporter import render_prometheus
from lakestream.health.model import HealthReport
from lakestream.health.webhook import AlertNotifier
from lakestream.read.inspection import PartitionMetrics, TableMetrics

NOW = 1_800_000_000_000
DAY_MS = 86_400_000


def crowded_table(files: int = 600) -> TableMetrics:
    return TableMetrics(
        "ns.t",
        NOW,
        data_files=files,
        snapshots=1200,
        oldest_snapshot_ms=NOW - 3 * DAY_MS,
        partitions=[PartitionMetrics({"region": 'e"u'}, 0, files, files * 1000, 0, NOW - 1000)],
    )


def test_default_thresholds_raise_seed_alerts():
    metrics = crowded_table()
    alerts = evaluate(metrics, HealthThresholds(), CompactionPolicy())
    assert {a.metric for a in alerts} == {"files_per_partition", "snapshots", "compaction_lag_s"}
    assert compaction_lag_s(metrics, CompactionPolicy()) == 3 * 86400
    metrics.last_compaction_ms = NOW - 1000
    assert "compaction_lag_s" not in {a.metric for a in evaluate(metrics, HealthThresholds())}


def test_prometheus_text_escapes_labels():
    metrics = crowded_table()
    report = HealthReport(NOW, [metrics], evaluate(metrics, HealthThresholds()), {"ns.t": 5.0})
    text = render_prometheus(report)
    assert 'partition="region=e\\"u"' in text  # the quote in a label value is escaped
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("lakestream_partition_data_files", (("partition", 'region=e"u'), ("table", "ns.t")))] == 600
    assert not [k for k in samples if k[0] == "lakestream_table_kafka_lag"]  # unknown lag is omitted, not 0
    assert samples[("lakestream_alert", (("metric", "snapshots"), ("table", "ns.t")))] == 1
    assert samples[("lakestream_table_metadata_files", (("table", "ns.t"),))] == 0
    assert samples[("lakestream_table_compaction_lag_seconds", (("table", "ns.t"),))] == 5.0


def test_webhook_state_survives_restarts(tmp_path):
    state = tmp_path / "alerts.json"
    alerts = evaluate(crowded_table(), HealthThresholds())
    assert [e["event"] for e in AlertNotifier(None, state).notify(alerts)] == ["raised"] * 3
    assert AlertNotifier(None, state).notify(alerts) == []  # a new process remembers what it already said
    assert [e["event"] for e in AlertNotifier(None, state).notify([])] == ["cleared"] * 3
