"""Planning a micro-batch: which offset range of which partition each Spark task reads.

Ranges are capped per batch and split per task. A partition's last range is *open* (``end is None``): the
task reads until the broker says end-of-partition or ``limit`` records, and reports where it really stopped.
Kafka lists a read_committed client the last stable offset as the end, so the end planned is exact; the
open last range also takes what arrived since planning (for at most ``OPEN_RANGE_MAX_S`` past the planned
end, ``reader.py``), and a range never waits for records that are not readable yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakestream.source.kafka import TP


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int | None  # exclusive; None = until end-of-partition
    limit: int  # at most this many records
    known_end: int = 0  # the high watermark when planned: an open range reads at least this far

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)

    @property
    def size(self) -> int:
        """How many offsets a closed range spans (isolation splits closed ranges only)."""
        if self.end is None:
            raise TypeError(f"{self.topic}[{self.partition}] from {self.start} is open-ended: it has no size")
        return self.end - self.start


def plan_offset_ranges(
    positions: dict[TP, int],
    watermarks: dict[TP, tuple[int, int]],
    maybe_more: set[TP],
    max_records: int,
    max_per_task: int,
    parallelism: int = 1,
    min_per_task: int = 2000,
) -> list[OffsetRange]:
    """Ranges for the next batch.

    ``positions`` are the next offsets to read; ``maybe_more`` holds partitions whose last read
    stopped at its limit rather than at the end (so there is data even if the high watermark
    says otherwise). Partitions with nothing new are left out: a batch touching 3 of 200
    partitions costs about what 3 partitions cost.
    """
    active: list[tuple[TP, int, int]] = []
    for tp, pos in positions.items():
        low, high = watermarks.get(tp, (0, 0))
        start = max(pos, low)  # records below the low watermark were deleted by retention
        known = max(high - start, 0)
        if known > 0 or tp in maybe_more:
            active.append((tp, start, known))
    if not active:
        return []
    share = max(max_records // len(active), 1)
    # Spread known records over at least `parallelism` tasks so every core decodes.
    total_known = sum(min(known, share) for _, _, known in active)
    per_task = max_per_task
    if total_known and parallelism > 1:
        per_task = max(min(max_per_task, -(-total_known // parallelism)), min(min_per_task, max_per_task))
    ranges: list[OffsetRange] = []
    for tp, start, known in sorted(active):
        # Known records are split into equal closed per-task chunks; the last chunk stays open (module doc).
        # A partition gets the nearest whole number of `per_task` chunks, not one per `per_task` and a
        # remainder: two partitions a little over half the batch each are two tasks, not three, since a
        # third task on two cores runs after another one and doubles the batch's write time.
        take = min(known, share)
        chunks = max(1, (2 * take + per_task) // (2 * per_task), -(-take // max_per_task))
        size = -(-take // chunks)
        for i in range(chunks - 1):
            ranges.append(OffsetRange(tp.topic, tp.partition, start + i * size, start + (i + 1) * size, size))
        rest = (chunks - 1) * size
        ranges.append(
            OffsetRange(tp.topic, tp.partition, start + rest, None, min(share - rest, max_per_task), start + known)
        )
    return ranges


def pack_ranges(ranges: list[OffsetRange], slots: int) -> list[list[OffsetRange]]:
    """Group ranges into Spark tasks: each chunk of a split backlog is a task of its own; single
    ranges of different partitions share ``slots`` tasks (one consumer each), largest first."""
    from collections import Counter

    per_tp = Counter(r.tp for r in ranges)
    tasks = [[r] for r in ranges if per_tp[r.tp] > 1]
    singles = sorted((r for r in ranges if per_tp[r.tp] == 1), key=lambda r: (-r.limit, r.topic, r.partition))
    if singles:
        bins: list[list[OffsetRange]] = [[] for _ in range(max(1, min(slots, len(singles))))]
        weights = [0] * len(bins)
        for rng in singles:
            i = weights.index(min(weights))
            bins[i].append(rng)
            weights[i] += rng.limit
        tasks += bins
    return tasks
