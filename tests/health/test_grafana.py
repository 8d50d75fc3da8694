"""The shipped Grafana dashboard only queries metrics the exporters really export, so renaming a
metric without updating the dashboard fails here instead of leaving an empty panel."""

from __future__ import annotations

import json
import re
from importlib.resources import files

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lakestream.config import HealthThresholds
from lakestream.engine.metrics import EngineMetrics
from lakestream.engine.result import BatchResult
from lakestream.health.checks import evaluate
from lakestream.health.exporter import render_prometheus
from lakestream.health.model import HealthReport
from lakestream.read.inspection import PartitionMetrics, TableMetrics

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "le",
}


def exported_names() -> set[str]:
    """Every sample name the engine and the health exporter expose, with each kind of value present."""
    engine = EngineMetrics("p")
    engine.observe(
        BatchResult(
            batch_id=1,
            records=3,
            changes=2,
            tables={"ns.t": "upsert"},
            dead_letters=1,
            seconds=0.5,
            read_seconds=0.2,
            lag=0,
            commit_ts_ms=1_800_000_000_000,
            table_records={"ns.t": 3},
            table_changes={"ns.t": 2},
            table_source_ts_ms={"ns.t": 1_799_999_999_000},
            table_lag={"ns.t": 0},
            dead_letter_kinds={"malformed": 1},
            commit_conflicts=[("ns.t", "stale_index")],
            commit_retries={"ns.t": 1},
        )
    )
    engine.batch_failed()
    metrics = TableMetrics(
        "ns.t",
        1_800_000_000_000,
        rows=5,
        data_files=600,
        snapshots=1200,
        freshness_s=3.0,
        kafka_lag=0,
        last_compaction_ms=1_799_000_000_000,
        partitions=[PartitionMetrics({"d": 1}, 0, 600, 6000, 0, None)],
    )
    health = render_prometheus(
        HealthReport(1_800_000_000_000, [metrics], evaluate(metrics, HealthThresholds()), {"ns.t": 1.0})
    )
    names = set()
    for text in (generate_latest(engine.registry).decode(), health):
        names |= {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    return names


def expressions(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in expressions(value)]
    return []


def metric_names(expr: str) -> set[str]:
    """Identifiers of a PromQL expression that name metrics: not functions, keywords, label matchers,
    grouping labels, ranges or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors ([5m], [$__rate_interval])
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\w+", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if not text[match.end() :].lstrip().startswith("(") and match.group() not in PROMQL_WORDS:
            names.add(match.group())  # an identifier followed by "(" is a function
    return names


def test_every_grafana_query_uses_exported_metrics():
    dashboard = json.loads((files("lakestream.health") / "grafana" / "lakestream.json").read_text())
    exprs = expressions(dashboard["panels"]) + expressions(dashboard["templating"])
    assert len(exprs) >= 20
    exported = exported_names()
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{expr!r} queries {sorted(unknown)}, which no lakestream exporter exports"
        used |= names
    # Each concern the issue names has a panel: throughput, freshness, lag, dead letters, conflicts,
    # batch seconds, files per partition, snapshots, metadata, alerts.
    for name in (
        "lakestream_table_records_total",
        "lakestream_table_freshness_seconds",
        "lakestream_table_kafka_lag",
        "lakestream_dead_letters_total",
        "lakestream_commit_conflicts_total",
        "lakestream_batch_seconds_bucket",
        "lakestream_table_files_per_partition_max",
        "lakestream_table_snapshots",
        "lakestream_table_metadata_bytes",
        "lakestream_alert",
        "lakestream_table_rows",
    ):
        assert name in used, f"no panel shows {name}"


def test_metric_name_extraction_catches_a_renamed_metric():
    assert metric_names('sum by (table) (rate(lakestream_table_records_total{table=~"$table"}[$__rate_interval]))') == {
        "lakestream_table_records_total"
    }
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(lakestream_batch_secs_bucket[5m])))") == {
        "lakestream_batch_secs_bucket"
    }
    assert "lakestream_batch_secs_bucket" not in exported_names()
