"""Renders a health report: a coloured terminal table for people, JSON for machines."""

from __future__ import annotations

import json
import sys
from typing import IO

from lakestream.health.model import HealthReport
from lakestream.read.inspection import format_bytes


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _amplification(figures: dict) -> str:
    """``rewritten / ingested (ratio×)`` over the last hour, e.g. ``120 MB / 80 MB (1.5×)``."""
    if not figures["rewritten_bytes"] and not figures["ingested_bytes"]:
        return "-"
    ratio = "" if figures["ratio"] is None else f" ({figures['ratio']:g}×)"
    return f"{format_bytes(figures['rewritten_bytes'])} / {format_bytes(figures['ingested_bytes'])}{ratio}"


def render_json(report: HealthReport, out: IO[str]) -> None:
    out.write(json.dumps(report.to_json(), indent=2, default=str) + "\n")


def render_table(report: HealthReport, out: IO[str] | None = None) -> None:
    """A rich table, one row per table; cells whose metric raised an alert are red."""
    from rich.console import Console
    from rich.table import Table

    target = out or sys.stdout
    # Off a terminal (pipes, logs, CI) rich would squeeze the table into 80 columns.
    console = Console(file=out, highlight=False, width=None if target.isatty() else 200)
    alerted = {(a.table, a.metric) for a in report.alerts}

    def cell(table: str, metric: str, text: str) -> str:
        return f"[bold red]{text}[/]" if (table, metric) in alerted else f"[green]{text}[/]"

    grid = Table(title="Lakestream table health", header_style="bold")
    for column in (
        "table",
        "rows",
        "files",
        "files/part max",
        "p95",
        "avg file",
        "small %",
        "deletes",
        "snapshots",
        "metadata",
        "since compaction",
        "rewritten/ingested 1h",
        "freshness",
        "kafka lag",
    ):
        grid.add_column(column, justify="left" if column == "table" else "right")
    for m in report.tables:
        t = m.table
        if m.error:
            grid.add_row(f"[bold red]{t}[/]", f"[red]{m.error[:80]}[/]", *[""] * 12)
            continue
        grid.add_row(
            t,
            "?" if m.rows is None else str(m.rows),
            str(m.data_files),
            cell(t, "files_per_partition", str(m.files_per_partition_max)),
            f"{m.files_per_partition_p95:.0f}",
            format_bytes(m.avg_file_bytes),
            cell(t, "small_file_share", f"{m.small_file_share:.0%}"),
            str(m.delete_files),
            cell(t, "snapshots", str(m.snapshots)),
            cell(t, "metadata_bytes", format_bytes(m.metadata_bytes)),
            cell(t, "compaction_lag_s", _duration(m.seconds_since_compaction)),
            _amplification(m.write_amplification()),
            cell(t, "freshness_s", _duration(m.freshness_s)),
            cell(t, "kafka_lag", "?" if m.kafka_lag is None else str(m.kafka_lag)),
        )
    console.print(grid)
    if report.alerts:
        for alert in report.alerts:
            console.print(f"[bold red]ALERT[/] {alert.table} {alert.metric}: {alert.message}")
    else:
        console.print(f"[bold green]healthy[/]: {len(report.tables)} table(s), no threshold crossed")
