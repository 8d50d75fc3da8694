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


def read_offset_range(
    consumer_conf: dict[str, Any], rng: OffsetRange, stall_timeout_s: float = 60.0, chunk: int = 5000
) -> Iterator[list[RawRecord] | RangeEnd]:
    """Yield lists of records in ``rng``, then one RangeEnd.

    Reads until ``rng.end`` (exclusive), ``rng.limit`` records, or end-of-partition, whichever
    comes first. Offsets may have gaps (transaction markers, compaction).
    """
    conf = dict(consumer_conf)
    conf.update({
        "enable.partition.eof": True,
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # a start below the log start is a loss we must not hide
        "enable.auto.offset.store": False,
    })
    consumer = Consumer(conf)
    next_offset = rng.start
    remaining = rng.limit if rng.end is None else min(rng.limit, rng.end - rng.start)
    try:
        if remaining <= 0:
            yield RangeEnd(next_offset, at_end=False)
            return
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        last_progress = time.monotonic()
        while True:
            messages = consumer.consume(num_messages=min(chunk, remaining), timeout=1.0)
            if not messages:
                if time.monotonic() - last_progress > stall_timeout_s:
                    raise OffsetError(
                        f"no progress reading {rng.topic}[{rng.partition}] at offset {next_offset} for {stall_timeout_s:.0f}s")
                continue
            last_progress = time.monotonic()
            batch: list[RawRecord] = []
            done = False
            at_end = False
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = at_end = True
                        break
                    hint = ""
                    if err.code() == KafkaError._BAD_MSG:
                        hint = (" — the broker sent a malformed or oversized response; noida-db does this for "
                                "fetches over large uncompressed batches (produce with compression, e.g. lz4)")
                    raise OffsetError(f"reading {rng.topic}[{rng.partition}] at {next_offset}: {err}{hint}")
                offset = msg.offset()
                if rng.end is not None and offset >= rng.end:
                    done = True
                    break
                batch.append(RawRecord(rng.topic, rng.partition, offset, msg.timestamp()[1], msg.key(), msg.value(),
                                       msg.headers()))
                # The next offset to read is one past the last record consumed.
                next_offset = offset + 1
                remaining -= 1
                if remaining <= 0:
                    done = True
                    break
            if batch:
                yield batch
            if done:
                yield RangeEnd(next_offset, at_end)
                return
    finally:
        consumer.close()
