"""Executor-side reading of one planned offset range with confluent-kafka."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from lakestream.errors import OffsetError
from lakestream.source.planner import OffsetRange


@dataclass(slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


@dataclass(slots=True)
class RangeEnd:
    """Where a range read stopped: ``next_offset`` is the next offset to read, ``at_end`` is True
    when the broker reported end-of-partition (False when the limit or the range end was hit)."""

    next_offset: int
    at_end: bool


@dataclass(slots=True)
class RecordRun:
    """Consecutive records of one partition from one fetch, as columns (no object per record)."""

    topic: str
    partition: int
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes]] | None] | None = None  # None: no record had headers

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, i: int) -> RawRecord:
        return RawRecord(self.topic, self.partition, self.offsets[i], self.timestamps[i], self.keys[i],
                         self.values[i], self.headers[i] if self.headers is not None else None)

    def records(self) -> list[RawRecord]:
        return [self.record(i) for i in range(len(self.offsets))]

    def tail(self, start: int) -> RecordRun:
        """The run from row ``start`` on."""
        return RecordRun(self.topic, self.partition, self.offsets[start:], self.timestamps[start:], self.keys[start:],
                         self.values[start:], None if self.headers is None else self.headers[start:])

    def select(self, rows: list[int]) -> RecordRun:
        """The run of these rows only (in the given order)."""
        headers = self.headers
        return RecordRun(self.topic, self.partition, [self.offsets[i] for i in rows],
                         [self.timestamps[i] for i in rows], [self.keys[i] for i in rows],
                         [self.values[i] for i in rows], None if headers is None else [headers[i] for i in rows])

    @classmethod
    def of(cls, records: list[RawRecord]) -> RecordRun:
        """The run of ``records`` (one partition)."""
        first = records[0]
        headers = [r.headers for r in records]
        return cls(first.topic, first.partition, [r.offset for r in records], [r.timestamp_ms for r in records],
                   [r.key for r in records], [r.value for r in records],
                   headers if any(h is not None for h in headers) else None)


def read_offset_range(
    consumer_conf: dict[str, Any], rng: OffsetRange, stall_timeout_s: float = 60.0, chunk: int = 5000
) -> Iterator[list[RawRecord] | RangeEnd]:
    """Yield lists of records in ``rng``, then one RangeEnd (see `read_offset_ranges`)."""
    for item in read_offset_ranges(consumer_conf, [rng], stall_timeout_s, chunk):
        yield item[1] if isinstance(item, tuple) else item


# An open range (no end offset) normally ends at end-of-partition. While a producer keeps writing,
# that end keeps moving and a task could read live data for as long as it lasts, holding back the
# whole batch: once past the end known when the batch was planned, an open range stops this long
# after (the rest is read next batch). A backlog known at planning time is always read in full.
OPEN_RANGE_MAX_S = 1.0


class _RangeState:
    __slots__ = ("rng", "next_offset", "remaining", "done", "at_end", "past_known_at")

    def __init__(self, rng: OffsetRange):
        self.rng = rng
        self.next_offset = rng.start
        self.remaining = rng.limit if rng.end is None else min(rng.limit, rng.end - rng.start)
        self.done = self.remaining <= 0
        self.at_end = False
        self.past_known_at: float | None = None  # when the read passed rng.known_end


def read_offset_ranges(
    consumer_conf: dict[str, Any], ranges: list[OffsetRange], stall_timeout_s: float = 60.0, chunk: int = 5000
) -> Iterator[list[RawRecord] | tuple[OffsetRange, RangeEnd]]:
    """`read_runs`, with each run as a list of records."""
    for item in read_runs(consumer_conf, ranges, stall_timeout_s, chunk):
        yield item if isinstance(item, tuple) else item.records()


def read_runs(
    consumer_conf: dict[str, Any], ranges: list[OffsetRange], stall_timeout_s: float = 60.0, chunk: int = 5000
) -> Iterator[RecordRun | tuple[OffsetRange, RangeEnd]]:
    """Read several ranges (of distinct partitions) with one consumer; yield runs of records (one
    partition each, in offset order), then one (range, RangeEnd) per range.

    Each range is read until ``end`` (exclusive), ``limit`` records, or end-of-partition, whichever
    comes first. Offsets may have gaps (transaction markers, compaction). One consumer for many
    small ranges keeps a batch over hundreds of partitions from paying a consumer start per partition.
    """
    states = {(r.topic, r.partition): _RangeState(r) for r in ranges}
    if len(states) != len(ranges):
        raise ValueError("read_offset_ranges needs ranges of distinct partitions")
    conf = dict(consumer_conf)
    # Bigger fetches than librdkafka's defaults (1 MB per partition): a range is read to its end at
    # once, and schemas-on Debezium messages are ~5 KB each. Settings the user gave win.
    for key, value in (("fetch.max.bytes", 64 * 1024 * 1024), ("max.partition.fetch.bytes", 16 * 1024 * 1024),
                       ("queued.max.messages.kbytes", 256 * 1024)):
        conf.setdefault(key, value)
    conf.update({
        "enable.partition.eof": True,
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # a start below the log start is a loss we must not hide
        "enable.auto.offset.store": False,
    })
    pending = [st for st in states.values() if not st.done]
    if pending:
        consumer = Consumer(conf)
        try:
            consumer.assign([TopicPartition(st.rng.topic, st.rng.partition, st.rng.start) for st in pending])
            open_count = len(pending)
            last_progress = time.monotonic()
            while open_count:
                # consume() waits for `chunk` messages or the timeout: keep the wait short so the
                # last, partial chunk of a range is not held back.
                messages = consumer.consume(num_messages=chunk, timeout=0.05)
                if not messages:
                    if time.monotonic() - last_progress > stall_timeout_s:
                        stuck = ", ".join(f"{st.rng.topic}[{st.rng.partition}]@{st.next_offset}"
                                          for st in states.values() if not st.done)
                        raise OffsetError(f"no progress reading {stuck} for {stall_timeout_s:.0f}s")
                    continue
                last_progress = time.monotonic()
                runs: dict[tuple[str, int], RecordRun] = {}
                finished: list[TopicPartition] = []
                current: tuple[str, int] | None = None
                st: _RangeState | None = None
                run: RecordRun | None = None
                for msg in messages:
                    tp = (msg.topic(), msg.partition())
                    if tp != current:
                        current, st = tp, states.get(tp)
                        run = runs.get(tp)
                        if run is None and st is not None:
                            run = runs[tp] = RecordRun(tp[0], tp[1], [], [], [], [])
                    if st is None or st.done:
                        continue  # fetched before its partition was paused
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            st.done = st.at_end = True
                        else:
                            hint = ""
                            if err.code() == KafkaError._BAD_MSG:
                                hint = (" — the broker sent a malformed or oversized response; noida-db does this "
                                        "for fetches over large uncompressed batches (produce with compression)")
                            raise OffsetError(f"reading {st.rng.topic}[{st.rng.partition}] at {st.next_offset}: "
                                              f"{err}{hint}")
                    else:
                        offset = msg.offset()
                        if st.rng.end is not None and offset >= st.rng.end:
                            st.done = True
                        else:
                            run.offsets.append(offset)
                            run.timestamps.append(msg.timestamp()[1])
                            run.keys.append(msg.key())
                            run.values.append(msg.value())
                            headers = msg.headers()
                            if headers is not None or run.headers is not None:
                                if run.headers is None:
                                    run.headers = [None] * (len(run.offsets) - 1)
                                run.headers.append(headers)
                            # The next offset to read is one past the last record consumed.
                            st.next_offset = offset + 1
                            if st.past_known_at is None and offset >= st.rng.known_end:
                                st.past_known_at = last_progress
                            st.remaining -= 1
                            st.done = st.remaining <= 0
                    if st.done:
                        open_count -= 1
                        finished.append(TopicPartition(st.rng.topic, st.rng.partition))
                for st in states.values():
                    if (not st.done and st.rng.end is None and st.past_known_at is not None
                            and last_progress - st.past_known_at > OPEN_RANGE_MAX_S):
                        st.done = True
                        open_count -= 1
                        finished.append(TopicPartition(st.rng.topic, st.rng.partition))
                if finished:
                    consumer.pause(finished)
                for run in runs.values():
                    if run.offsets:
                        yield run
        finally:
            consumer.close()
    for st in states.values():
        yield st.rng, RangeEnd(st.next_offset, st.at_end)
