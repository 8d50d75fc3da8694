"""When a writer has drained its topic: the end offset of every partition against the offsets the system itself
records as written, on every partition (not one marker on one partition).

- Lakestream: the table's own offsets, ``lakestream.offsets`` in the summary of the snapshot that committed the
  data (sink/commit/offsets.py), read by the bench's probe;
- the Spark MERGE job: its checkpoint's offset log for the newest batch in its commit log (Structured Streaming
  writes a batch's commit log entry after the batch's sink, here the MERGE, committed);
- Flink: the offsets its Kafka source commits to the consumer group when a checkpoint completes, the checkpoint at
  which the Iceberg sink commits the same records' files.
"""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from workload import PARTITIONS


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """partition → the offset after its last record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "peers-bench-watermarks", "log_level": 0})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def spark_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """partition → the next offset of the newest batch the MERGE job committed (its checkpoint's logs)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    # v1, then the batch's metadata, then one line per source: {"topic": {"0": next offset, ...}}
    offsets = json.loads(lines[-1]).get(topic, {})
    return {int(p): int(o) for p, o in offsets.items()}


def group_offsets(bootstrap: str, group_id: str, topic: str) -> dict[int, int]:
    """partition → the offset the consumer group committed (absent where it committed none)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    request = [ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p) for p in range(PARTITIONS)])]
    try:
        result = admin.list_consumer_group_offsets(request)[group_id].result(timeout=30)
    except Exception:  # noqa: BLE001 — the group does not exist yet
        return {}
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def drained(written: dict[int, int], end: dict[int, int]) -> bool:
    """Every partition's written offset at or past its end offset."""
    return all(written.get(p, 0) >= o for p, o in end.items())
