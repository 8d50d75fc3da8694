"""The dashboard's charts as Plotly figures (plain dicts in Plotly's JSON schema, drawn in the page by
plotly.js): freshness p50/p99, throughput and lag per batch from the batch log, files per partition per
health round. Times are epoch milliseconds on date axes (Plotly reads numbers there as ms, in UTC)."""

from __future__ import annotations

from typing import Any


def _figure(title: str, y_title: str, traces: list[dict[str, Any]], log_y: bool = False) -> dict[str, Any]:
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"{title} · UTC", "font": {"size": 14}},
            "xaxis": {"type": "date"},
            "yaxis": {"title": {"text": y_title}} | ({"type": "log"} if log_y else {"rangemode": "tozero"}),
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "height": 280,
            "legend": {"orientation": "h", "y": -0.25},
            "showlegend": True,
        },
    }


def _line(name: str, x: list, y: list, **extra: Any) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines+markers", "name": name, "x": x, "y": y, "marker": {"size": 4}} | extra


def freshness_figure(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch: how long its changes took from the source commit to visible in Iceberg (p50, p99)."""
    x, p50, p99 = [], [], []
    for batch in batches:
        q, commit = batch.get("source_ts_quantiles"), batch.get("commit_ts_ms")
        if q and commit is not None and (batch.get("records") or 0) > 0:
            # Within one batch, freshness quantiles are its source-time quantiles mirrored around the
            # commit (what `freshness_of_batches` computes for a single batch, without the search).
            x.append(commit)
            p50.append(round((commit - q[1]) / 1000, 3))
            p99.append(round((commit - q[0]) / 1000, 3))
    # Log scale: a backfill of old changes (hours or days) and steady seconds share one chart.
    return _figure(
        "Freshness: source commit → visible (per batch)",
        "seconds",
        [_line("p50", x, p50), _line("p99", x, p99)],
        log_y=True,
    )


def throughput_figure(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Records per second per table: a batch's records over the time since that table's previous batch
    (its own run time for the first), so an idle hour shows as a low rate, not a gap."""
    series: dict[str, tuple[list, list]] = {}
    previous: dict[str, int] = {}
    for batch in batches:
        commit = batch.get("commit_ts_ms")
        if commit is None:
            continue
        for table, records in (batch.get("table_records") or {}).items():
            since = previous.get(table)
            seconds = (commit - since) / 1000 if since is not None else float(batch.get("seconds") or 0)
            previous[table] = commit
            x, y = series.setdefault(table, ([], []))
            x.append(commit)
            y.append(round(records / seconds, 3) if seconds > 0 else None)
    return _figure(
        "Throughput (records/s)", "records/s", [_line(table, x, y) for table, (x, y) in sorted(series.items())]
    )


def lag_figure(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Kafka records not yet committed, per table and over the partitions each batch read."""
    series: dict[str, tuple[list, list]] = {}
    overall: tuple[list, list] = ([], [])
    for batch in batches:
        commit = batch.get("commit_ts_ms")
        if commit is None:
            continue
        for table, lag in (batch.get("table_lag") or {}).items():
            x, y = series.setdefault(table, ([], []))
            x.append(commit)
            y.append(lag)
        if batch.get("lag") is not None:
            overall[0].append(commit)
            overall[1].append(batch["lag"])
    traces = [_line(table, x, y) for table, (x, y) in sorted(series.items())]
    traces.append(_line("consumer (partitions read)", *overall, line={"dash": "dot"}))
    return _figure("Kafka lag (records)", "records", traces)


def partition_files_figure(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Data files in the fullest partition of each table, per health round (p95 dotted)."""
    series: dict[str, tuple[list, list, list]] = {}
    for sample in samples:
        x, most, p95 = series.setdefault(sample["table"], ([], [], []))
        x.append(sample["collected_ms"])
        most.append(sample.get("files_per_partition_max"))
        p95.append(sample.get("files_per_partition_p95"))
    traces = []
    for table, (x, most, p95) in sorted(series.items()):
        traces.append(_line(f"{table} max", x, most, legendgroup=table))
        traces.append(_line(f"{table} p95", x, p95, legendgroup=table, line={"dash": "dot"}))
    return _figure("Data files per partition (per health round)", "files", traces)
