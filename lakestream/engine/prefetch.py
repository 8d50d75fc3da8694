"""Overlapping a batch's commit with the next batch's write job (`engine.overlap_commits`).

While a batch commits, the next batch is planned from where this one's job stopped and its write job
starts in the background, if it is due by then. Its files become visible only through its own commit,
after this batch's: a crash leaves them unreferenced, and the restart reads from the tables' offsets.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from lakestream.config import PipelineConfig
from lakestream.engine.positions import Positions
from lakestream.engine.registry import TableRegistry
from lakestream.engine.writejob import WriteJob
from lakestream.errors import first_line, is_infrastructure_failure
from lakestream.sink.report import BatchReport
from lakestream.sink.write.files import delete_quietly
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange

log = logging.getLogger(__name__)


class Prefetch:
    """At most one next write job in flight: its ranges, the watermarks it was planned with, its future."""

    def __init__(self, config: PipelineConfig, positions: Positions, registry: TableRegistry, job: WriteJob):
        self.config = config
        self.positions = positions
        self.registry = registry
        self.job = job
        self.pending: tuple[list[OffsetRange], dict[TP, tuple[int, int]], Future[BatchReport]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self, report: BatchReport, started: float) -> None:
        """Plan the next batch from where ``report``'s job stopped and start its write job, if it is due."""
        if not self.config.engine.overlap_commits or time.monotonic() - started < self.config.fastest_commit_interval:
            return
        positions = dict(self.positions.positions)
        maybe_more = set(self.positions.maybe_more)
        for tp, end in report.ends.items():
            positions[tp] = max(positions.get(tp, 0), end.next_offset)
            (maybe_more.discard if end.at_end else maybe_more.add)(tp)
        ranges, watermarks = self.positions.plan(positions, maybe_more)
        ranges = [r for r in ranges if r.end is None or r.end > r.start]
        if not ranges:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-write-job")
        # Built here, on this thread: this batch's commits go on changing the specs meanwhile, and the
        # references are refreshed only while no job is in flight (a refresh releases old broadcasts).
        self.registry.refresh_references()
        self.job.prepare_new_tables(ranges)
        ctx = self.job.write_context(copy_specs=True)
        self.pending = (ranges, watermarks, self._pool.submit(self.job.run, ranges, ctx=ctx))

    def take(self) -> tuple[list[OffsetRange], BatchReport | None] | None:
        """The prefetched batch: its ranges and report (None if its job failed for a record: the batch
        then runs its job again, isolating). An infrastructure failure is raised, as a batch's would be."""
        if self.pending is None:
            return None
        ranges, watermarks, job = self.pending
        self.pending = None
        self.positions.watermarks = watermarks
        try:
            return ranges, job.result()
        except Exception as exc:  # noqa: BLE001 — classified just below
            if is_infrastructure_failure(exc):
                raise
            log.info(
                "the write job started during the last commit failed (%s); running it again, isolating", first_line(exc)
            )
            return ranges, None

    def discard(self) -> None:
        """Wait for a prefetched job nobody will commit and delete the files it wrote."""
        if self.pending is None:
            return
        _, _, job = self.pending
        self.pending = None
        try:
            report = job.result()
        except Exception:  # noqa: BLE001 — nothing of it is committed either way
            return
        delete_quietly([f.path for tr in report.tables.values() for f in tr.files])

    def close(self) -> None:
        self.discard()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
