"""Driver-side Kafka access: topic discovery, watermarks, and the consumer group's offsets.

The consumer group's committed offsets are only a lower bound for where to start reading: the
truth is in the tables' snapshot summaries (see `lakestream.sink.commit.offsets`). They are committed after
every table of a batch has committed, so restarting from them never skips a change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from lakestream.config import KafkaSettings
from lakestream.errors import OffsetError
from lakestream.kafka_access import check_access, refusals_raised

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class TP:
    """A topic partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


class KafkaCluster:
    """A driver-side client for metadata and group offsets (it never reads records)."""

    def __init__(self, settings: KafkaSettings, timeout_s: float = 10.0):
        self.settings = settings
        self.timeout_s = timeout_s
        # Group commits are asynchronous (see commit): their outcomes arrive in _on_commit, served by poll().
        self._unacknowledged = 0
        self._consumer = Consumer(
            refusals_raised(settings.consumer_config(**{"auto.offset.reset": "earliest"}, on_commit=self._on_commit))
        )
        self._admin: AdminClient | None = None
        self._batched_offsets_ok = True
        try:
            check_access(self._consumer, timeout_s)
        except BaseException:
            self._consumer.close()
            raise

    def close(self) -> None:
        """Close within about 2 × timeout_s. librdkafka's close can wait without end on a group commit to a
        coordinator that no longer answers (seen after a broker SIGKILL and restart: the request stays queued):
        past timeout_s the client is left to close in the background, and the commit's offsets are in the tables."""
        self._settle()
        closer = threading.Thread(target=self._consumer.close, name="kafka-cluster-close", daemon=True)
        closer.start()
        closer.join(self.timeout_s)
        if closer.is_alive():
            log.warning(
                "the driver's Kafka client did not close within %.0fs (a group commit the coordinator does not "
                "answer); left to close in the background",
                self.timeout_s,
            )

    def list_topics(self) -> dict[str, list[int]]:
        """Every topic (internal ones excluded) and its partitions."""
        try:
            metadata = self._consumer.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise OffsetError(f"cannot reach Kafka at {self.settings.bootstrap_servers}: {exc}") from None
        topics = {}
        for name, meta in metadata.topics.items():
            if name.startswith("__") or meta.error is not None:
                continue
            topics[name] = sorted(meta.partitions)
        return topics

    def partitions_of(self, wanted: Callable[[str], bool]) -> list[TP]:
        """The partitions of every topic for which ``wanted(topic)`` is true."""
        topics = self.list_topics()
        return [TP(t, p) for t in sorted(topics) if wanted(t) for p in topics[t]]

    def watermarks(self, tps: list[TP]) -> dict[TP, tuple[int, int]]:
        """(low, high) per partition; for a read_committed client (librdkafka's default) Kafka lists the
        last stable offset as high: the records of open transactions are not counted."""
        if len(tps) > 8 and self._batched_offsets_ok:
            try:
                return self._watermarks_batched(tps)
            except Exception as exc:  # noqa: BLE001 — some brokers lack batched ListOffsets; fall back
                log.info("batched ListOffsets unavailable (%s); asking per partition", exc)
                self._batched_offsets_ok = False
        result = {}
        for tp in tps:
            try:
                result[tp] = self._consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s, cached=False
                )
            except KafkaException as exc:
                raise OffsetError(f"cannot read watermarks of {tp}: {exc}") from None
        return result

    def _watermarks_batched(self, tps: list[TP]) -> dict[TP, tuple[int, int]]:
        """Both watermarks of many partitions in two ListOffsets round trips (fan-out to 100s of topics)."""
        from confluent_kafka.admin import OffsetSpec

        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            conf = {
                k: v
                for k, v in self.settings.consumer_config().items()
                if k not in ("group.id", "enable.auto.commit", "auto.offset.reset", "session.timeout.ms")
            }
            self._admin = AdminClient(refusals_raised(conf))
        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
        ends = {}
        for name, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
            futures = self._admin.list_offsets({p: spec for p in parts}, request_timeout=self.timeout_s)
            ends[name] = {TP(p.topic, p.partition): f.result(timeout=self.timeout_s).offset for p, f in futures.items()}
        return {tp: (ends["low"][tp], ends["high"][tp]) for tp in tps}

    def committed(self, tps: list[TP]) -> dict[TP, int]:
        """The consumer group's committed offsets (only partitions that have one)."""
        if not tps:
            return {}
        self._settle()  # this client's own commits first
        try:
            parts = self._consumer.committed(
                [TopicPartition(t.topic, t.partition) for t in tps], timeout=self.timeout_s
            )
        except KafkaException as exc:
            log.warning("cannot read committed offsets of group %s: %s", self.settings.group_id, exc)
            return {}
        return {TP(p.topic, p.partition): p.offset for p in parts if p.offset >= 0}

    def commit(self, positions: dict[TP, int]) -> None:
        """Store ``positions`` (next offsets to read) as the group's committed offsets.

        The commit is sent and not waited for: the tables hold the truth, and a failed or unacknowledged group
        commit only makes a restart re-read a little more, so a batch must not wait a broker round trip for it
        (waiting cost ~50 ms a batch: poll() returns at its timeout, not at the acknowledgement). Outcomes are
        collected at the next commit (a failure is logged), in full before `committed` and at `close`."""
        if not positions:
            return
        self._consumer.poll(0)  # serve the outcomes of earlier commits
        if self._unacknowledged >= MAX_UNACKNOWLEDGED_COMMITS:
            self._settle()
        offsets = [TopicPartition(tp.topic, tp.partition, off) for tp, off in positions.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            log.warning("could not commit group offsets: %s", exc)
            return
        self._unacknowledged += 1

    def _settle(self) -> None:
        """Wait (at most timeout_s) for the outcomes of the commits sent so far."""
        deadline = time.monotonic() + self.timeout_s
        while self._unacknowledged > 0 and time.monotonic() < deadline:
            self._consumer.poll(0.01)
        if self._unacknowledged > 0:
            log.warning(
                "%d group offset commit(s) not acknowledged within %.0fs (broker away?); the next commit "
                "carries their offsets",
                self._unacknowledged,
                self.timeout_s,
            )
            self._unacknowledged = 0

    def _on_commit(self, err: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        self._unacknowledged = max(0, self._unacknowledged - 1)
        if err is not None:
            log.warning("could not commit group offsets: %s", err)


# Group commits in flight before a commit waits for their outcomes (a broker that stopped answering).
MAX_UNACKNOWLEDGED_COMMITS = 20


def consumer_lag(high_watermarks: dict[TP, int], positions: dict[TP, int]) -> int:
    """Records behind: Σ (high watermark − next offset to read) over partitions with a known position.

    A partition without a position counts as caught up (nothing has been read from it yet, so there is
    no backlog to speak of); a position past the watermark (a broker that under-reports it) counts 0.
    """
    return sum(max(0, high - positions.get(tp, high)) for tp, high in high_watermarks.items())


def kafka_lag(kafka: KafkaSettings, positions: dict[TP, int], timeout_s: float = 2.0) -> int | None:
    """`consumer_lag` of ``positions`` against the broker's watermarks now; None if the broker does not answer."""
    cluster = KafkaCluster(
        kafka.model_copy(
            update={"client": {**kafka.client, "socket.timeout.ms": int(timeout_s * 1000), "log_level": 3}}
        ),
        timeout_s=timeout_s,
    )
    try:
        watermarks = cluster.watermarks(sorted(positions))
    except OffsetError as exc:
        log.info("kafka lag unknown: %s", exc)
        return None
    finally:
        cluster.close()
    if any(high is None or high < 0 for _, high in watermarks.values()):
        return None
    return consumer_lag({tp: high for tp, (_, high) in watermarks.items()}, positions)
