"""What the dashboard shows, as one JSON-ready dict: a row per table (the health metrics, dead letters
and the state of every threshold), charts over time as Plotly figures, and the maintenance log.

`collect_dashboard(spark, config)` measures (one health round) and reads the logs; `build_dashboard`
assembles the dict from those inputs and touches nothing else, so a notebook can call either.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lakestream.config import HealthThresholds, PipelineConfig
from lakestream.dashboard.charts import freshness_figure, lag_figure, partition_files_figure, throughput_figure
from lakestream.engine.freshness import freshness_of_batches
from lakestream.errors import first_line
from lakestream.health.model import HealthReport
from lakestream.read.inspection import TableMetrics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_HISTORY_S = 6 * 3600
# The summary's freshness quantiles cover the newest batches only: the mixture's cost grows with them.
SUMMARY_BATCHES = 500

# (alert metric, HealthThresholds field, the measured value): one per threshold `health` checks.
THRESHOLDS: list[tuple[str, str, Callable[[TableMetrics, float], float | None]]] = [
    ("files_per_partition", "max_files_per_partition", lambda m, lag: m.files_per_partition_max),
    ("small_file_share", "max_small_file_share", lambda m, lag: round(m.small_file_share, 4)),
    ("snapshots", "max_snapshots", lambda m, lag: m.snapshots),
    ("metadata_bytes", "max_metadata_bytes", lambda m, lag: m.metadata_bytes),
    ("compaction_lag_s", "max_compaction_lag_s", lambda m, lag: round(lag, 1)),
    ("freshness_s", "max_freshness_s", lambda m, lag: m.freshness_s),
    ("kafka_lag", "max_consumer_lag", lambda m, lag: m.kafka_lag),
]


class BatchLog:
    """The engine's per-batch metrics log (``<state_dir>/metrics/<name>.jsonl``), read incrementally:
    each `read` parses only the lines appended since the last one and keeps the newest ``limit``."""

    def __init__(self, path: Path, limit: int = 20_000) -> None:
        self.path = path
        self._batches: deque[dict[str, Any]] = deque(maxlen=limit)
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return list(self._batches)
        if size < self._offset:  # the log was replaced (a demo resets it): start over
            self._batches.clear()
            self._offset = 0
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read(size - self._offset)
        # A line still being written has no newline yet: leave it for the next read.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                self._batches.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        return list(self._batches)


def threshold_states(
    metrics: TableMetrics, compaction_lag: float, thresholds: HealthThresholds, alerted: set[str]
) -> list[dict[str, Any]]:
    """Every threshold of one table: ``alert`` (crossed), ``ok``, ``off`` (not configured) or
    ``unknown`` (the value could not be measured, e.g. lag with the broker away)."""
    states = []
    for metric, field, value_of in THRESHOLDS:
        limit = getattr(thresholds, field)
        value = None if metrics.error else value_of(metrics, compaction_lag)
        if metric in alerted:
            state = "alert"
        elif limit is None:
            state = "off"
        elif value is None:
            state = "unknown"
        else:
            state = "ok"
        states.append({"metric": metric, "state": state, "value": value, "threshold": limit})
    return states


def table_row(
    metrics: TableMetrics, report: HealthReport, thresholds: HealthThresholds, dead_letters: dict[str, int]
) -> dict[str, Any]:
    """One table's row: the health summary, its dead letters and its thresholds."""
    lag = report.compaction_lag_s.get(metrics.table, 0.0)
    alerted = {a.metric for a in report.alerts if a.table == metrics.table}
    return metrics.summary() | {
        "last_compaction_ms": metrics.last_compaction_ms,
        "compaction_lag_s": round(lag, 1),
        "dead_letters": dead_letters.get(metrics.table, 0),
        "thresholds": threshold_states(metrics, lag, thresholds, alerted),
    }


def build_dashboard(
    config: PipelineConfig,
    report: HealthReport,
    batches: list[dict[str, Any]],
    health_history: list[dict[str, Any]],
    maintenance: list[dict[str, Any]],
    dead_letters: dict[str, int],
    history_s: float = DEFAULT_HISTORY_S,
) -> dict[str, Any]:
    """The dashboard's state from its inputs (a health report, the batch log, the health history, the
    maintenance log, dead letters per target table); charts cover the last ``history_s`` seconds."""
    since_ms = report.collected_ms - int(history_s * 1000)
    recent = [b for b in batches if (b.get("commit_ts_ms") or 0) >= since_ms]
    window = freshness_of_batches(recent[-SUMMARY_BATCHES:])
    last = batches[-1] if batches else None
    thresholds = config.health.thresholds
    return {
        "pipeline": config.name,
        "collected_ms": report.collected_ms,
        "healthy": report.healthy,
        "history_s": history_s,
        "summary": {
            "tables": len(report.tables),
            "alerts": len(report.alerts),
            "batches": len(recent),
            "records": sum(int(b.get("records") or 0) for b in recent),
            "dead_letters": sum(dead_letters.values()),
            "last_batch": last.get("batch") if last else None,
            "last_commit_ms": last.get("commit_ts_ms") if last else None,
            "freshness_p50_s": None if window is None else round(window.p50_s, 3),
            "freshness_p99_s": None if window is None else round(window.p99_s, 3),
            "freshness_batches": 0 if window is None else window.batches,
        },
        "thresholds": thresholds.model_dump(),
        "tables": [table_row(m, report, thresholds, dead_letters) for m in report.tables],
        "alerts": [a.to_json() for a in report.alerts],
        "charts": {
            "freshness": freshness_figure(recent),
            "throughput": throughput_figure(recent),
            "lag": lag_figure(recent),
            "files_per_partition": partition_files_figure(
                [s for s in health_history if s.get("collected_ms", 0) >= since_ms]
            ),
        },
        "maintenance": [m for m in maintenance if (m.get("finished_ms") or 0) >= since_ms][::-1],
    }


def count_dead_letters(spark: SparkSession, config: PipelineConfig) -> dict[str, int]:
    """Dead letters of this pipeline per target table (``-`` for records no table was chosen for);
    empty while the dead-letter table does not exist yet."""
    from pyspark.errors import AnalysisException

    from lakestream.identifiers import quote_table, sql_string

    namespace, table = config.engine.dead_letter_table.split(".", 1)
    ident = quote_table(config.catalog.name, namespace, table)
    try:
        rows = spark.sql(
            f"SELECT coalesce(target_table, '-') AS t, count(*) AS n FROM {ident} "
            f"WHERE pipeline = {sql_string(config.name)} GROUP BY 1"
        ).collect()
    except AnalysisException as exc:
        if exc.getErrorClass() == "TABLE_OR_VIEW_NOT_FOUND":
            return {}
        raise
    return {r.t: int(r.n) for r in rows}


def collect_dashboard(
    spark: SparkSession,
    config: PipelineConfig,
    batch_log: BatchLog | None = None,
    history_s: float = DEFAULT_HISTORY_S,
    record: bool = True,
    tables: list[str] | None = None,
) -> dict[str, Any]:
    """Measure ``tables`` (default: every table in the catalog; a `lakestream health` round), read the
    batch and maintenance logs, and build the dashboard's state. ``record`` appends the round to the
    health history (the charts of files per partition over time come from it)."""
    from lakestream.engine.loop import metrics_path
    from lakestream.health.history import read_health_history, record_health
    from lakestream.health.monitor import collect_health
    from lakestream.maintenance.history import read_maintenance_log

    started = time.monotonic()
    report = collect_health(spark, config, tables)
    if record:
        try:
            record_health(config, report)
        except OSError as exc:
            log.warning("health history not written: %s", exc)
    try:
        dead_letters = count_dead_letters(spark, config)
    except Exception as exc:  # noqa: BLE001 — the rest of the page is still worth showing
        log.error("dead letters could not be counted: %s", first_line(exc, 300))
        dead_letters = {}
    batches = (batch_log or BatchLog(metrics_path(config))).read()
    since_ms = report.collected_ms - int(history_s * 1000)
    state = build_dashboard(
        config,
        report,
        batches,
        read_health_history(config, since_ms),
        read_maintenance_log(config),
        dead_letters,
        history_s,
    )
    state["collect_seconds"] = round(time.monotonic() - started, 2)
    return state
