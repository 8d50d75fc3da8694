"""Apache Kafka keeps every record it acknowledged when it is stopped (SIGTERM: a controlled shutdown) or
killed (SIGKILL: its logs recovered at the next start) under an idempotent produce load, and the same
producer carries on without an error.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lakestream.stack import StackSettings
from lakestream.stack.broker import KafkaBroker
from lakestream.stack.process import free_ports

TOPIC = "durability"


class IdempotentLoad(threading.Thread):
    """Batches of 20 records with distinct keys from one idempotent producer (acks=all, as capture
    produces: each batch flushed before the next), until stopped or the producer reports an error."""

    def __init__(self, bootstrap: str, prefix: str = "") -> None:
        super().__init__(daemon=True, name="idempotent-load")
        self.prefix = prefix
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 20, "log_level": 0}
        )
        self.stop_event = threading.Event()
        self.acked: set[bytes] = set()
        self.errors: list[str] = []

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked.add(msg.key())
        else:
            self.errors.append(str(err))

    def run(self) -> None:
        sent = 0
        try:
            while not self.stop_event.is_set() and not self.errors:
                for _ in range(20):
                    self.producer.produce(
                        TOPIC, key=f"{self.prefix}{sent}".encode(), value=b"x" * 200, on_delivery=self._delivered
                    )
                    sent += 1
                self.producer.flush(60)
                time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 — a fatal producer error, reported by the test
            self.errors.append(str(exc))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(90)
        assert not self.is_alive(), "the producer did not stop"


def stored_keys(bootstrap: str) -> list[bytes]:
    """The keys of every record in the topic, in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        keys: list[bytes] = []
        while True:
            msg = consumer.poll(10)
            assert msg is not None, "no partition end within 10 s"
            if msg.error():
                return keys  # partition EOF
            keys.append(msg.key())
    finally:
        consumer.close()


@pytest.fixture
def kafka(service_dir_factory) -> Iterator[KafkaBroker]:
    pg_port_unused, kafka_port = free_ports(2)
    broker = KafkaBroker(
        StackSettings(state_dir=service_dir_factory("kafka"), pg_port=pg_port_unused, kafka_port=kafka_port)
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_restarts_under_load_keep_every_acknowledged_record(kafka, how):
    """Three stops (or SIGKILLs) and restarts while the producer writes: the topic then holds every
    acknowledged record exactly once, and the same idempotent producer carried on without an error."""
    load = IdempotentLoad(kafka.bootstrap_servers)
    load.start()
    try:
        for _ in range(3):
            time.sleep(1.5)
            kafka.stop() if how == "stop" else kafka.kill()
            assert kafka.pid() is None
            time.sleep(1.0)
            kafka.start()
        time.sleep(1.5)
    finally:
        load.stop()
    assert load.errors == []
    keys = stored_keys(kafka.bootstrap_servers)
    assert len(keys) == len(set(keys)) and set(keys) == load.acked and len(load.acked) > 1000
