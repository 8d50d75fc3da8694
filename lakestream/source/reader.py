"""Executor-side reading of one planned offset range with confluent-kafka."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from lakestream.errors import OffsetError, ReadStalled
from lakestream.kafka_access import denied_on_topic, refusals_raised
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
        return RawRecord(
            self.topic,
            self.partition,
            self.offsets[i],
            self.timestamps[i],
            self.keys[i],
            self.values[i],
            self.headers[i] if self.headers is not None else None,
        )

    def records(self) -> list[RawRecord]:
        return [self.record(i) for i in range(len(self.offsets))]

    def tail(self, start: int) -> RecordRun:
        """The run from row ``start`` on."""
        return RecordRun(
            self.topic,
            self.partition,
            self.offsets[start:],
            self.timestamps[start:],
            self.keys[start:],
            self.values[start:],
            None if self.headers is None else self.headers[start:],
        )

    def select(self, rows: list[int]) -> RecordRun:
        """The run of these rows only (in the given order)."""
        headers = self.headers
        return RecordRun(
            self.topic,
            self.partition,
            [self.offsets[i] for i in rows],
            [self.timestamps[i] for i in rows],
            [self.keys[i] for i in rows],
            [self.values[i] for i in rows],
            None if headers is None else [headers[i] for i in rows],
        )

    @classmethod
    def of(cls, records: list[RawRecord]) -> RecordRun:
        """The run of ``records`` (one partition)."""
        first = records[0]
        headers = [r.headers for r in records]
        return cls(
            first.topic,
            first.partition,
            [r.offset for r in records],
            [r.timestamp_ms for r in records],
            [r.key for r in records],
            [r.value for r in records],
            headers if any(h is not None for h in headers) else None,
        )


def read_offset_range(
    consumer_conf: dict[str, Any], rng: OffsetRange, stall_timeout_s: float = 60.0, chunk: int = 5000
) -> Iterator[list[RawRecord] | RangeEnd]:
    """Yield lists of records in ``rng``, then one RangeEnd (see `read_runs`)."""
    for item in read_runs(consumer_conf, [rng], stall_timeout_s, chunk):
        yield item[1] if isinstance(item, tuple) else item.records()


# An open range (no end offset) normally ends at end-of-partition. While a producer keeps writing,
# that end keeps moving and a task could read live data for as long as it lasts, holding back the
# whole batch: once past the end known when the batch was planned, an open range stops this long
# after (the rest is read next batch). A backlog known at planning time is always read in full.
OPEN_RANGE_MAX_S = 1.0


class _RangeState:
    __slots__ = ("rng", "next_offset", "remaining", "done", "at_end", "past_known_at", "paused")

    def __init__(self, rng: OffsetRange):
        self.rng = rng
        self.next_offset = rng.start
        self.remaining = rng.limit if rng.end is None else min(rng.limit, rng.end - rng.start)
        self.done = self.remaining <= 0
        self.at_end = False
        self.past_known_at: float | None = None  # when the read passed rng.known_end
        self.paused = self.done  # counted as finished (and its partition paused)


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
        raise ValueError("read_runs needs ranges of distinct partitions")
    conf = dict(consumer_conf)
    # Fetches of 2 MB per partition (librdkafka: 1 MB), 8 MB a response, 32 MB queued per partition, and a 5-ms
    # back-off when that queue is full (librdkafka: 1 s): a range is read to its end at once, and the reader drains
    # the queue as fast as it fills. Larger fetches cost more than they save: their buffers are fresh memory the
    # kernel zeroes page by page (a third of a page fault per message at 16 MB fetches and a 256 MB queue, the
    # workers' largest CPU cost in a backlog's drain), and with the 1-s back-off a full queue stalled the read: 330k
    # of the peers' 3.3-KB messages in 1.1-1.5 s against 2.9-4.0 s, 3.8-4.1 against 3.4-5.5 us of CPU each
    # (bench/task.py's stack, read_runs alone). Settings the user gave win. Kafka keeps a response within
    # fetch.max.bytes (but for one record batch larger than it, which the broker's message.max.bytes bounds), so
    # librdkafka's default receive.message.max.bytes (100 MB) holds it.
    # fetch.wait.max.ms: at a partition's end Kafka holds an empty fetch this long before answering, and
    # end-of-partition (where an open range stops) is known only then: at librdkafka's 500 ms default that
    # was most of a small batch's read (bench/scale.py: tasks 0.69 s against 0.25 s). A range reader does
    # not idle, so it asks for an answer within 5 ms (a 2,000-record read with its consumer's start and close:
    # 41-47 ms at 20 ms, 36 ms at 5 ms).
    for key, value in (
        ("fetch.max.bytes", 8 * 1024 * 1024),
        ("max.partition.fetch.bytes", 2 * 1024 * 1024),
        ("queued.max.messages.kbytes", 32 * 1024),
        ("fetch.queue.backoff.ms", 5),
        ("fetch.wait.max.ms", 5),
    ):
        conf.setdefault(key, value)
    conf.update(
        {
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "auto.offset.reset": "error",  # a start below the log start is a loss we must not hide
            "enable.auto.offset.store": False,
        }
    )
    pending = [st for st in states.values() if not st.done]
    if pending:
        consumer = Consumer(refusals_raised(conf))
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
                        stuck = ", ".join(
                            f"{st.rng.topic}[{st.rng.partition}]@{st.next_offset}"
                            for st in states.values()
                            if not st.done
                        )
                        raise ReadStalled(f"no progress reading {stuck} for {stall_timeout_s:.0f}s")
                    continue
                last_progress = time.monotonic()
                finished: list[TopicPartition] = []
                yield from _take(messages, states, last_progress, conf)
                for st in states.values():
                    if st.done and not st.paused:
                        st.paused = True
                        open_count -= 1
                        finished.append(TopicPartition(st.rng.topic, st.rng.partition))
                for st in states.values():
                    if (
                        not st.done
                        and st.rng.end is None
                        and st.past_known_at is not None
                        and last_progress - st.past_known_at > OPEN_RANGE_MAX_S
                    ):
                        st.done = st.paused = True
                        open_count -= 1
                        finished.append(TopicPartition(st.rng.topic, st.rng.partition))
                if finished:
                    consumer.pause(finished)
        finally:
            consumer.close()
    for st in states.values():
        yield st.rng, RangeEnd(st.next_offset, st.at_end)


def _take(
    messages: list[Message], states: dict[tuple[str, int], _RangeState], now: float, conf: dict[str, Any]
) -> list[RecordRun]:
    """The records of a fetched chunk that belong to their ranges, as one run per partition.

    Columns are pulled from the messages with C-level ``map`` calls; only errors (end-of-partition
    markers) are looked at one by one. Updates each range's state. An ACL refusal raises
    `KafkaAccessError` (``conf`` names the principal)."""
    errors = list(map(Message.error, messages))
    # A fetched message always has its topic, partition and offset (confluent-kafka types them optional for
    # messages a client builds itself).
    topics = cast("list[str]", list(map(Message.topic, messages)))
    partitions = cast("list[int]", list(map(Message.partition, messages)))
    n = len(messages)
    cut: dict[tuple[str, int], int] = {}  # a partition's records after its end-of-partition are not taken
    # (KafkaError compares unequal to None by raising: no list.count(None) here.)
    clean = not any(err is not None for err in errors)
    if not clean:
        for i, err in enumerate(errors):
            if err is None:
                continue
            tp = (topics[i], partitions[i])
            st = states.get(tp)
            if st is None or st.done:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                cut.setdefault(tp, i)
                continue
            denied = denied_on_topic(err, conf, "READ", st.rng.topic)
            if denied is not None:
                raise denied
            raise OffsetError(f"reading {st.rng.topic}[{st.rng.partition}] at {st.next_offset}: {err}")
    if n and clean and topics.count(topics[0]) == n and partitions.count(partitions[0]) == n:
        # The usual chunk: one partition, no marker.
        groups: dict[tuple[str, int], list[int] | None] = {(topics[0], partitions[0]): None}
    else:
        groups = {}
        for i, (t, p, err) in enumerate(zip(topics, partitions, errors, strict=True)):
            if err is None:
                rows_of_tp = groups.setdefault((t, p), [])
                assert rows_of_tp is not None  # None only in the single-partition branch above
                rows_of_tp.append(i)
    offsets = cast("list[int]", list(map(Message.offset, messages)))
    runs = []
    for tp, rows in groups.items():
        st = states.get(tp)
        if st is None or st.done:
            continue  # fetched before its partition was paused
        if rows is None:
            offs = offsets
        else:
            if tp in cut:
                rows = [i for i in rows if i < cut[tp]]
            offs = [offsets[i] for i in rows]
        take = len(offs)
        if st.rng.end is not None and take and offs[-1] >= st.rng.end:
            take = bisect.bisect_left(offs, st.rng.end)
            st.done = True
        if take >= st.remaining:
            take = st.remaining
            st.done = True
        if tp in cut and not st.done:  # every record before the marker taken: the true end
            st.done = st.at_end = True
        if take:
            if rows is None:
                picked = messages if take == n else messages[:take]
            else:
                picked = [messages[i] for i in rows[:take]]
            offs = offs[:take]
            # A consumer's headers are a list of (name, bytes) pairs, never the dict a producer may take.
            headers = cast("list[list[tuple[str, bytes]] | None]", list(map(Message.headers, picked)))
            run = RecordRun(
                tp[0],
                tp[1],
                offs,
                [ts for _, ts in map(Message.timestamp, picked)],
                list(map(Message.key, picked)),
                list(map(Message.value, picked)),
                headers if headers.count(None) != take else None,
            )
            runs.append(run)
            # The next offset to read is one past the last record consumed.
            st.next_offset = offs[-1] + 1
            st.remaining -= take
            if st.past_known_at is None and offs[-1] >= st.rng.known_end:
                st.past_known_at = now
    for tp, i in cut.items():
        st = states.get(tp)
        if st is None:
            continue
        if tp not in groups and not st.done:
            st.done = st.at_end = True
        if st.at_end:
            # The end-of-partition marker carries the end offset: past a transaction's commit marker (or
            # aborted records), which no record reports, so the next batch does not plan an empty range.
            eof = offsets[i]
            st.next_offset = max(st.next_offset, eof if st.rng.end is None else min(eof, st.rng.end))
    return runs
