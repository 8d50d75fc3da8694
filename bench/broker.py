"""The local broker alone: how long Apache Kafka takes to start (storage formatted, or kept), stop and
recover from a SIGKILL, and produce/consume rates with confluent-kafka as capture and the readers use it.

    .venv/bin/python bench/broker.py [--records 1000000] [--value-bytes 300]

The broker runs in a fresh state directory on free ports and is removed afterwards. Human-readable figures
first; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_load, say  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from lakestream.stack import StackSettings  # noqa: E402
from lakestream.stack.broker import KafkaBroker  # noqa: E402
from lakestream.stack.process import free_ports  # noqa: E402


def timed(action) -> float:
    started = time.monotonic()
    action()
    return round(time.monotonic() - started, 2)


def produce(bootstrap: str, topic: str, records: int, value_bytes: int) -> float:
    """Records/s acknowledged by an idempotent, lz4-compressing producer (capture's settings)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
        }
    )
    value = b'{"op":"u","after":{"id":%d,"pad":"' + b"x" * value_bytes + b'"}}'
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b'{"id":%d}' % i, value=value % i)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "records left undelivered"
    return records / (time.monotonic() - started)


def consume(bootstrap: str, topic: str, records: int) -> float:
    """Records/s read from offset 0 to the end by one consumer with the readers' fetch sizes."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
            "queued.max.messages.kbytes": 256 << 10,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, started = 0, time.monotonic()
    while True:
        messages = consumer.consume(10_000, timeout=5)
        if not messages:
            raise RuntimeError(f"no progress after {seen} records")
        errors = [m for m in messages if m.error()]
        seen += len(messages) - len(errors)
        if any(e.error().code() == KafkaError._PARTITION_EOF for e in errors):
            break
    consumer.close()
    assert seen == records, f"read {seen} of {records}"
    return seen / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    args = parser.parse_args()
    state_dir = Path(tempfile.mkdtemp(prefix="lakestream-bench-broker-"))
    pg_unused, port = free_ports(2)
    broker = KafkaBroker(StackSettings(state_dir=state_dir, pg_port=pg_unused, kafka_port=port))
    figures: dict = {}
    try:
        figures["start_formatting_s"] = timed(broker.start)
        figures["produce_per_s"] = round(produce(broker.bootstrap_servers, "bench", args.records, args.value_bytes))
        figures["consume_per_s"] = round(consume(broker.bootstrap_servers, "bench", args.records))
        figures["stop_s"] = timed(broker.stop)
        figures["restart_s"] = timed(broker.start)
        broker.kill()
        figures["restart_after_sigkill_s"] = timed(broker.start)
        figures["consume_after_sigkill_per_s"] = round(consume(broker.bootstrap_servers, "bench", args.records))
    finally:
        broker.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
    for name, value in figures.items():
        say(f"{name:>30}: {value:,}")
    print(json.dumps({**figures, "records": args.records, "value_bytes": args.value_bytes, **machine_load()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
