"""Isolating the record that makes a write or a commit fail: the batch's offset ranges are bisected
until the failing record is alone; it becomes a dead letter (`write_failed`) and everything else is
written. Infrastructure failures are never bisected: they fail the batch, which the loop retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lakestream.engine.writejob import WriteJob
from lakestream.errors import LakestreamError, first_line, is_infrastructure_failure
from lakestream.sink.commit.tables import TableCommit
from lakestream.sink.report import BatchReport, DeadLetter, RangeEnd, TableReport
from lakestream.sink.write.task import topic_table
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange

log = logging.getLogger(__name__)

# Commits one table's part: (table, its changes, the next offset per partition) → what it committed.
CommitTable = Callable[[str, TableReport, dict[TP, int]], "TableCommit | None"]


class Isolator:
    """Writes a batch, bisecting around records that fail it; remembers the batch's culprits."""

    def __init__(self, job: WriteJob):
        self.job = job
        self.config = job.config
        self.isolations = 0  # records isolated since this engine started
        self.culprits: set[tuple[TP, int]] = set()  # isolated in the batch in flight

    def write(
        self,
        ranges: list[OffsetRange],
        watermarks: dict[TP, tuple[int, int]],
        only_tables: frozenset[str] | None = None,
    ) -> BatchReport:
        """`write_files`, but a job that fails for a reason other than infrastructure is split (the
        offset ranges bisected) until the record(s) that make it fail are alone; those become dead
        letters and everything else is written."""
        ranges = without(ranges, self.culprits)
        try:
            return self.job.run(ranges, only_tables)
        except Exception as exc:  # noqa: BLE001 — classified just below
            if is_infrastructure_failure(exc):
                raise
            error = exc
        log.warning("write job failed, isolating the record(s) that make it fail: %s", first_line(error))
        report = BatchReport()
        self._bisect(closed_at_watermarks(ranges, watermarks), only_tables, report, error)
        return report

    def _bisect(
        self, ranges: list[OffsetRange], only_tables: frozenset[str] | None, report: BatchReport, error: BaseException
    ) -> None:
        ranges = [r for r in ranges if r.size > 0]
        if sum(r.size for r in ranges) == 1:
            try:  # once more alone: a transient failure must not make a good record a dead letter
                self.job.run_part(ranges, only_tables, report)
                return
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc):
                    raise
                error = exc
            self.isolate(ranges[0], report, error)
            return
        for half in halves(ranges):
            try:
                self.job.run_part(half, only_tables, report)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc):
                    raise
                self._bisect(half, only_tables, report, exc)

    def isolate(self, rng: OffsetRange, report: BatchReport, error: BaseException) -> None:
        from lakestream.source.reader import read_offset_range

        if len(self.culprits) >= self.config.engine.max_isolations_per_batch:
            log.error(
                "more than %d records of one batch fail the write alone: giving up on isolation",
                self.config.engine.max_isolations_per_batch,
            )
            raise error
        record = None
        for item in read_offset_range(self.config.kafka.consumer_config(), rng):
            if isinstance(item, list) and item:
                record = item[0]
        tp, offset = rng.tp, rng.start
        self.culprits.add((tp, offset))
        prev = report.ends.get(tp)
        if prev is None or prev.next_offset <= offset:
            report.ends[tp] = RangeEnd(tp, offset + 1, False)
        if record is None:
            return  # no record at this offset (a transaction marker): nothing to dead-letter
        self.isolations += 1
        reason = f"the write failed with this record alone (isolated): {first_line(error)}"
        log.warning("isolated %s offset %d: %s", tp, offset, reason)
        report.dead_letters.append(
            DeadLetter(
                tp,
                offset,
                record.timestamp_ms,
                reason[:2000],
                record.key,
                record.value,
                topic_table(self.job.router, tp.topic),
                "write_failed",
            )
        )

    def bisect_commit(
        self, name: str, ranges: list[OffsetRange], report: BatchReport, error: BaseException, commit_table: CommitTable
    ) -> TableCommit | None:
        """Write and commit table ``name`` over ``ranges`` in halves (each half its own snapshot, in
        Kafka order, so the table's offsets only move forward); a lone failing record is a dead letter."""
        ranges = [r for r in without(ranges, self.culprits) if r.size > 0]
        if not ranges:
            return None
        if sum(r.size for r in ranges) == 1:
            self.isolate(ranges[0], report, error)
            return None
        done: TableCommit | None = None
        for half in halves(ranges):
            try:
                sub = self.job.run_part(half, frozenset({name}), BatchReport())
                tr = sub.tables.get(name)
                if tr is not None and tr.shapes:
                    raise LakestreamError(f"table {name}: unprepared shapes while isolating: {sorted(tr.shapes)}")
                if tr is not None and tr.count > 0:
                    part = commit_table(name, tr, {tp: e.next_offset for tp, e in sub.ends.items()})
                    done = sum_commits(done, part)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc) or isinstance(exc, LakestreamError):
                    raise
                done = sum_commits(done, self.bisect_commit(name, half, report, exc, commit_table))
        return done


def closed_at_watermarks(ranges: list[OffsetRange], watermarks: dict[TP, tuple[int, int]]) -> list[OffsetRange]:
    """Open-ended ranges closed at the partition's listed end (what lies beyond is read next batch)."""
    out = []
    for r in ranges:
        if r.end is None:
            high = watermarks.get(r.tp, (0, r.start + 1))[1]
            r = OffsetRange(r.topic, r.partition, r.start, r.start + max(1, min(r.limit, high - r.start)), r.limit)
        out.append(r)
    return out


def without(ranges: list[OffsetRange], culprits: set[tuple[TP, int]]) -> list[OffsetRange]:
    """``ranges`` with the offsets of isolated records cut out (they are dead letters already)."""
    if not culprits:
        return ranges
    out = []
    for r in ranges:
        cuts = sorted(o for tp, o in culprits if tp == r.tp and o >= r.start and (r.end is None or o < r.end))
        start = r.start
        for o in cuts:
            if o > start:
                out.append(OffsetRange(r.topic, r.partition, start, o, r.limit))
            start = o + 1
        if r.end is None or r.end > start:
            out.append(OffsetRange(r.topic, r.partition, start, r.end, r.limit))
    return out


def halves(ranges: list[OffsetRange]) -> list[list[OffsetRange]]:
    """Closed ``ranges`` split into two lists of about the same number of offsets."""
    total = sum(r.size for r in ranges)
    target = total // 2
    left: list[OffsetRange] = []
    right: list[OffsetRange] = []
    seen = 0
    for r in ranges:
        size = r.size
        if seen >= target:
            right.append(r)
        elif seen + size <= target:
            left.append(r)
        else:
            cut = r.start + (target - seen)
            left.append(OffsetRange(r.topic, r.partition, r.start, cut, r.limit))
            right.append(OffsetRange(r.topic, r.partition, cut, r.end, r.limit))
        seen += size
    return [h for h in (left, right) if h]


def sum_commits(a: TableCommit | None, b: TableCommit | None) -> TableCommit | None:
    """One table's commits in parts, as one."""
    if a is None or b is None:
        return a or b
    newest = max((t for t in (a.source_ts_ms, b.source_ts_ms) if t is not None), default=None)
    timings = dict(a.timings_ms)
    for step, ms in b.timings_ms.items():
        timings[step] = round(timings.get(step, 0.0) + ms, 1)
    return TableCommit(b.kind, a.changes + b.changes, newest, timings)
