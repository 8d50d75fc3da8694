"""Publishes Debezium change events to Kafka, batch by batch, acknowledging only delivered events.

The embedded engine marks a batch's offsets processed only after ``publish`` returns, and this handler
returns only after Kafka acknowledged every event in it — so capture is at-least-once.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import Counter
from typing import Any

from confluent_kafka import KafkaError, Producer

from lakestream.errors import CaptureError
from lakestream.faults import pause_point

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")
_TWO_INTS = struct.Struct(">ii")

# How long a batch may wait for Kafka before capture stops rather than block forever.
FLUSH_TIMEOUT_S = 120.0


def unpack_batch(packed: bytes | memoryview) -> list[tuple[str, bytes | None, bytes | None]]:
    """(topic, key, value) of each record of a batch packed by ``CaptureBatchConsumer.pack`` (Java): int32
    big-endian counts and lengths, -1 for null, topics once per batch and then referred to by index."""
    view = memoryview(packed)
    unpack_int = _INT.unpack_from
    (n_topics,) = unpack_int(view, 0)
    pos, topics = 4, []
    for _ in range(n_topics):
        (length,) = unpack_int(view, pos)
        topics.append(bytes(view[pos + 4 : pos + 4 + length]).decode())
        pos += 4 + length
    records: list[tuple[str, bytes | None, bytes | None]] = []
    end = len(view)
    while pos < end:
        topic_index, key_length = _TWO_INTS.unpack_from(view, pos)
        pos += 8
        key = None
        if key_length >= 0:
            key = bytes(view[pos : pos + key_length])
            pos += key_length
        (value_length,) = unpack_int(view, pos)
        pos += 4
        value = None
        if value_length >= 0:
            value = bytes(view[pos : pos + value_length])
            pos += value_length
        records.append((topics[topic_index], key, value))
    if pos != end:
        raise ValueError(f"a packed batch of {end} bytes ends inside a record (at {pos})")
    return records


class KafkaPublishingHandler:
    """Produces each Debezium batch to its destination topics and flushes before returning.

    The JVM side (``lakestream/java/capture/CaptureBatchConsumer.java``) packs a batch into one byte
    array and calls ``publish`` once per batch, through a JPype proxy: no JPype call per record. Key =
    Debezium key (JSON text or Avro bytes), value likewise, a delete's tombstone = null value. After the
    first failed delivery the handler refuses every later batch, so the engine can never mark offsets past
    an event Kafka did not take.
    """

    def __init__(
        self, producer: Producer, flush_timeout_s: float = FLUSH_TIMEOUT_S, topic_renames: dict[str, str] | None = None
    ) -> None:
        self._producer = producer
        # Debezium's topic → lakestream's, for tables whose names hold a dot (`SourceTableName.topic`).
        self._renames = dict(topic_renames or {})
        self._flush_timeout_s = flush_timeout_s
        self._lock = threading.Lock()
        self.topic_counts: Counter[str] = Counter()
        self.total = 0
        self.batches = 0
        self.error: CaptureError | None = None
        self.failed = threading.Event()

    def publish(self, packed: Any, records: int) -> None:
        """Produce one packed batch (a Java byte[]) and wait for Kafka to acknowledge all of it."""
        try:
            self.publish_records(unpack_batch(packed), expected=int(records))
        except CaptureError:
            raise
        except Exception as exc:  # noqa: BLE001 — anything else is a bug to report, never a silent skip
            self._fail(CaptureError(f"capture could not publish a batch: {type(exc).__name__}: {exc}"))
            raise self.error from exc  # type: ignore[misc]

    def publish_records(self, batch: list[tuple[str, bytes | None, bytes | None]], expected: int | None = None) -> None:
        if self.error is not None:
            raise self.error
        if expected is not None and expected != len(batch):
            self._fail(CaptureError(f"a packed batch held {len(batch)} records, the engine sent {expected}"))
            raise self.error  # type: ignore[misc]
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        batch_counts: Counter[str] = Counter()
        produce = self._producer.produce
        renames = self._renames
        for topic, key, value in batch:
            if renames:
                topic = renames.get(topic, topic)
            while True:
                try:
                    if key is None:
                        # A keyless table's events have no key: one partition keeps them in source order
                        # (the default partitioner would scatter them when the topic has several).
                        produce(topic, value=value, key=None, partition=0, on_delivery=on_delivery)
                    else:
                        produce(topic, value=value, key=key, on_delivery=on_delivery)
                    break
                except BufferError:
                    # The local queue is full: serve delivery reports until room frees up.
                    self._producer.poll(0.1)
            batch_counts[topic] += 1
        pause_point("capture.batch.produced")
        deadline = time.monotonic() + self._flush_timeout_s
        remaining = self._producer.flush(self._flush_timeout_s)
        while remaining and time.monotonic() < deadline:
            remaining = self._producer.flush(max(0.1, deadline - time.monotonic()))
        if remaining or errors:
            detail = errors[0] if errors else f"{remaining} events not acknowledged within {self._flush_timeout_s:.0f}s"
            self._fail(CaptureError(f"Kafka did not accept a batch of change events: {detail}"))
            raise self.error  # type: ignore[misc]
        with self._lock:
            self.topic_counts.update(batch_counts)
            self.total += sum(batch_counts.values())
            self.batches += 1
        pause_point("capture.batch.acknowledged")

    def _fail(self, error: CaptureError) -> None:
        log.error("%s — stopping capture; offsets of this batch stay unprocessed", error)
        self.error = error
        self.failed.set()

    def snapshot_counts(self) -> tuple[int, dict[str, int]]:
        """(total events published, per-topic counts), consistent with each other."""
        with self._lock:
            return self.total, dict(self.topic_counts)
