"""Where each Kafka partition is read from: discovery of topics and partitions (also ones created while
running), the start position of a new partition (its table's stored offsets, else the consumer group's),
which streams are due, and the offset ranges of the next batch (`lakestream.source.planner`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lakestream.config import PipelineConfig
from lakestream.engine.registry import TableRegistry
from lakestream.errors import DecodeError
from lakestream.routing import Router
from lakestream.sink.commit.offsets import TableOffsets
from lakestream.sink.report import BatchReport
from lakestream.sink.write.task import reread_from
from lakestream.source.kafka import TP, KafkaCluster, consumer_lag
from lakestream.source.planner import OffsetRange, plan_offset_ranges

log = logging.getLogger(__name__)


class Positions:
    """The next offset to read of every partition the pipeline reads, and the batches' plans."""

    def __init__(
        self,
        config: PipelineConfig,
        kafka: KafkaCluster,
        router: Router,
        registry: TableRegistry,
        offsets: TableOffsets,
        parallelism: int,
        clock: Callable[[], float],
    ):
        self.config = config
        self.kafka = kafka
        self.router = router
        self.registry = registry
        self.offsets = offsets
        self.parallelism = parallelism  # tasks a batch's ranges are split for
        self.clock = clock  # when streams come due (replaceable in tests)
        self.positions: dict[TP, int] = {}
        self.maybe_more: set[TP] = set()  # partitions that may hold records beyond their listed end
        self.watermarks: dict[TP, tuple[int, int]] = {}
        self.last_discovery = 0.0
        self.last_read: dict[int, float] = {}  # stream index → when its topics were last read

    def discover_partitions(self) -> None:
        """Pick up topics and partitions (including ones created while running)."""
        now = time.monotonic()
        if self.positions and now - self.last_discovery < self.config.engine.topic_refresh_s:
            return
        self.last_discovery = now
        tps = self.kafka.partitions_of(lambda topic: self.config.stream_for(topic) is not None)
        new = [tp for tp in tps if tp not in self.positions]
        if not new:
            return
        committed = self.kafka.committed(new)
        marks = self.kafka.watermarks(new)
        for tp in new:
            low, high = marks[tp]
            start = self.start_from_tables(tp, low)
            if start is None:
                # Field/header routing: the tables are known only per record, so start from the
                # group's offset (a lower bound: it advances after every table of a batch committed)
                # and let each table skip what it already holds.
                start = committed.get(tp, low)
                if start > high:
                    log.warning(
                        "group offset %d of %s is past the end %d (topic re-created?); reading from %d",
                        start,
                        tp,
                        high,
                        low,
                    )
                    start = low
            if start < low:
                log.warning("%s: offsets %d..%d were deleted by retention before being read", tp, start, low - 1)
            self.positions[tp] = max(start, low)
            self.maybe_more.add(tp)
        log.info("reading %d new partition(s): %s", len(new), ", ".join(str(tp) for tp in new[:10]))

    def due_streams(self, now: float) -> set[int]:
        """Streams whose commit interval has come: only their topics are read in this batch, so
        Kafka (not memory, not small files) buffers the records of slower streams."""
        return {
            i
            for i, stream in enumerate(self.config.streams)
            if now - self.last_read.get(i, float("-inf")) >= self.config.commit_interval(stream) - 0.05
        }

    def plan_batch(self) -> list[OffsetRange]:
        """The ranges of the next batch, from the positions; remembers the watermarks seen."""
        ranges, self.watermarks = self.plan(self.positions, self.maybe_more)
        return ranges

    def plan(
        self, positions: dict[TP, int], maybe_more: set[TP]
    ) -> tuple[list[OffsetRange], dict[TP, tuple[int, int]]]:
        """The ranges to read from ``positions`` (for the streams that are due) and the watermarks seen."""
        self.discover_partitions()
        now = self.clock()
        due = self.due_streams(now)
        positions = {
            tp: positions.get(tp, pos)
            for tp, pos in self.positions.items()
            if self.config.stream_index(tp.topic) in due
        }
        watermarks = self.kafka.watermarks(list(positions)) if positions else {}
        engine = self.config.engine
        ranges = plan_offset_ranges(
            positions,
            watermarks,
            maybe_more,
            engine.max_records_per_batch,
            engine.max_records_per_task,
            parallelism=self.parallelism,
        )
        for i in {self.config.stream_index(r.topic) for r in ranges}:
            if i is not None:  # always: only the topics of due streams were planned
                self.last_read[i] = now
        return ranges, watermarks

    def start_from_tables(self, tp: TP, log_start: int) -> int | None:
        """Where a partition's table says to resume: its stored offset, or the log start when the
        table (or its entry for this partition) does not exist. None with field/header routing."""
        stream = self.config.stream_for(tp.topic)
        if stream is None or stream.route_field or stream.route_header:
            return None
        try:
            _, name = self.router.route(tp.topic)
        except DecodeError:
            return log_start  # unroutable: every record goes to the dead-letter table, which skips its own
        if not self.registry.catalog.exists(name.namespace, name.table):
            return log_start
        if str(name) not in self.registry.specs:
            # Known before the first batch, so its tasks write it at once (shapes are checked in the task).
            self.registry.prepare_table(str(name), [], stream, topic=tp.topic)
        start = self.offsets.load(self.registry.catalog.ident(name.namespace, name.table)).get(tp, log_start)
        # A held output may have committed less of this partition than its input: read from there, and the
        # input skips what it holds already.
        return reread_from(
            self.registry.derived.get(str(name), ()),
            self.registry.specs,
            self.registry.cadence.intervals,
            tp,
            start,
            log_start,
        )

    def advance(self, report: BatchReport) -> int:
        """Move past what the batch read; how many offsets that advanced (tombstones and skipped records too)."""
        advanced = sum(max(end.next_offset - self.positions.get(tp, 0), 0) for tp, end in report.ends.items())
        for tp, end in report.ends.items():
            self.positions[tp] = max(self.positions.get(tp, 0), end.next_offset)
            if end.at_end:
                self.maybe_more.discard(tp)
            else:
                self.maybe_more.add(tp)
        return advanced

    def lag(self) -> int | None:
        """Records in Kafka beyond the positions, over the partitions of the last plan."""
        return consumer_lag({tp: high for tp, (_, high) in self.watermarks.items()}, self.positions)

    def table_lag(self) -> dict[str, int]:
        """Per table read in this batch: records in Kafka beyond the offsets the table stored."""
        highs = {tp: high for tp, (_, high) in self.watermarks.items()}
        out: dict[str, int] = {}
        for name, spec in self.registry.specs.items():
            mine = {tp: high for tp, high in highs.items() if tp in spec.committed}
            if mine:
                out[name] = consumer_lag(mine, spec.committed)
        return out
