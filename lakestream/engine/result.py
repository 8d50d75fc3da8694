"""What one micro-batch did: `BatchResult`, its progress line and its metrics-log record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lakestream.engine.freshness import mixture_quantiles


@dataclass
class BatchResult:
    batch_id: int
    records: int
    changes: int
    tables: dict[str, str]  # table → write kind
    dead_letters: int
    seconds: float
    read_seconds: float
    lag: int | None
    commit_ts_ms: int
    source_ts_quantiles: list[float] | None = None
    advanced: int = 0  # Kafka messages consumed, tombstones and skipped records included
    jobs: int = 1
    isolated: int = 0  # records dead-lettered because a write job failed with them alone
    table_records: dict[str, int] = field(default_factory=dict)  # Kafka records routed to each table
    table_changes: dict[str, int] = field(default_factory=dict)  # row changes each table's commit applied
    table_source_ts_ms: dict[str, int] = field(default_factory=dict)  # newest source change committed per table
    table_lag: dict[str, int] = field(default_factory=dict)  # records in Kafka beyond each table's offsets
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)  # DEAD_LETTER_KINDS → dead letters written
    commit_conflicts: list[tuple[str, str]] = field(default_factory=list)  # (table, cause) per conflict met
    commit_retries: dict[str, int] = field(default_factory=dict)  # table → commit attempts repeated
    skipped: dict[str, int] = field(default_factory=dict)  # reason → records skipped on purpose (no row change)
    truncated: list[str] = field(default_factory=list)  # tables a source TRUNCATE emptied in this batch
    overlapped: bool = False  # this batch's write job ran while the previous batch committed
    held: dict[str, int] = field(default_factory=dict)  # table → records written but held for its own cadence
    steps_ms: dict[str, float] = field(default_factory=dict)  # where the batch's time went, step → ms, in order
    table_steps_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # table → its commit's steps (ms)

    def progress_line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        return (
            f"batch {self.batch_id}: {self.records:,} records → {len(self.tables)} table(s), "
            f"{self.dead_letters:,} dead-letter{f' ({self.isolated} isolated)' if self.isolated else ''}, "
            f"{self.seconds:.2f}s (read+write {self.read_seconds:.2f}s, "
            f"{self.jobs} job(s){', overlapped' if self.overlapped else ''}), {rate:,.0f} rec/s, lag {lag}"
            + (f", truncated {', '.join(self.truncated)}" if self.truncated else "")
            + (f", skipped {sum(self.skipped.values()):,}" if self.skipped else "")
            + (f", held {sum(self.held.values()):,} for later commits" if self.held else "")
        )


def combine_quantiles(groups: list[tuple[int, list[float], int, int]]) -> list[float] | None:
    """[q01, q50, q99, min] of source times over all groups of (count, [q01, q50, q99], min, max)."""
    quantiles = mixture_quantiles(groups)
    return None if quantiles is None else quantiles + [float(min(g[2] for g in groups))]


def describe_batch(result: BatchResult) -> dict[str, Any]:
    """A JSON-able record of one batch (the metrics log line)."""
    return {
        "batch": result.batch_id,
        "records": result.records,
        "changes": result.changes,
        "tables": result.tables,
        "dead_letters": result.dead_letters,
        "seconds": round(result.seconds, 3),
        "read_seconds": round(result.read_seconds, 3),
        "lag": result.lag,
        "commit_ts_ms": result.commit_ts_ms,
        "source_ts_quantiles": result.source_ts_quantiles,
        "jobs": result.jobs,
        "isolated": result.isolated,
        "table_records": result.table_records,
        "table_changes": result.table_changes,
        "table_lag": result.table_lag,
        "dead_letter_kinds": result.dead_letter_kinds,
        "commit_conflicts": [list(c) for c in result.commit_conflicts],
        "commit_retries": result.commit_retries,
        "skipped": result.skipped,
        "truncated": result.truncated,
        "overlapped": result.overlapped,
        "held": result.held,
        "steps_ms": result.steps_ms,
        "table_steps_ms": result.table_steps_ms,
    }
