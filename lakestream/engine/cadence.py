"""Output tables that commit less often than their stream is read (a transform's ``commit_interval_s``).

The stream's topics are read at the stream's cadence, and every table the batch wrote commits then,
except these: their data files wait, written but referenced by no snapshot, until the table's own
interval comes due, and then commit together with the offsets of every batch they hold. Until that
commit the table's stored offsets stay where its last commit left them, so a restart reads from the
lowest offsets among a topic's tables (`Pipeline._start_from_tables`) and the held records are read,
transformed and written again; the tables already past them skip them, as after any crash. The
consumer group's offset is held back the same way. Memory holds only the files' metadata.

Only append tables are held (transform outputs): an upsert's deletes are planned against the table's
state at the commit, which a file written minutes earlier would not see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lakestream.sink.report import TableReport
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange


@dataclass
class Held:
    """What one table holds uncommitted: the batches' files and facts, their ends and their ranges."""

    report: TableReport
    ends: dict[TP, int] = field(default_factory=dict)
    ranges: list[OffsetRange] = field(default_factory=list)


class Cadence:
    """Which tables hold their commits, what they hold, and when each is due."""

    def __init__(self) -> None:
        self.intervals: dict[str, float] = {}
        self.held: dict[str, Held] = {}
        self._last_commit: dict[str, float] = {}  # or, before its first commit, when it first held records

    def set_interval(self, table: str, seconds: float) -> None:
        """``table`` commits at most every ``seconds`` (the shortest of the transforms that write it)."""
        self.intervals[table] = min(seconds, self.intervals.get(table, seconds))

    def holds(self, table: str) -> bool:
        return table in self.intervals

    def due(self, table: str, now: float) -> bool:
        return now - self._last_commit.get(table, now) >= self.intervals[table] - 0.05

    def add(self, table: str, report: TableReport, ends: dict[TP, int], ranges: list[OffsetRange], now: float) -> None:
        """Fold one batch's part of ``table`` (its facts, the batch's ends, its closed ranges) into what it holds."""
        self._last_commit.setdefault(table, now)
        held = self.held.get(table)
        if held is None:
            held = self.held[table] = Held(TableReport(table))
        acc = held.report
        acc.files.extend(report.files)
        acc.locations.extend(report.locations)
        acc.stats.extend(report.stats)
        acc.changed_keys.extend(report.changed_keys)
        for tp, offset in report.truncates.items():
            acc.truncates[tp] = max(offset, acc.truncates.get(tp, offset))
        fed = report.tp_offsets()
        for tp, end in ends.items():
            if tp in fed:
                held.ends[tp] = max(end, held.ends.get(tp, end))
        held.ranges.extend(r for r in ranges if r.tp in fed)

    def take(self, table: str, now: float) -> Held | None:
        """What ``table`` holds, handed over for its commit (None if nothing); its interval restarts now."""
        self._last_commit[table] = now
        return self.held.pop(table, None)

    def due_tables(self, now: float) -> list[str]:
        return sorted(t for t in self.held if self.due(t, now))

    def records(self) -> dict[str, int]:
        """Per table: the records it holds uncommitted."""
        return {t: h.report.count for t, h in sorted(self.held.items()) if h.report.count}

    def floor(self, committed: dict[str, dict[TP, int]]) -> dict[TP, int]:
        """Per partition, the lowest stored offset of a table that holds records of it: the consumer
        group must not move past it. ``committed``: each held table's stored offsets."""
        out: dict[TP, int] = {}
        for table, held in self.held.items():
            stored = committed.get(table, {})
            for tp, (lowest, _) in held.report.tp_offsets().items():
                start = stored.get(tp, lowest)
                out[tp] = min(start, out.get(tp, start))
        return out
