"""The engine end to end on Tansu, whose listed high watermark lags the true end of each partition.

Debezium events (genuine ones from tests/data, re-keyed) for many distinct keys are spread over
the 4 partitions of an auto-created topic and produced in several flushed groups, so every
partition holds several batches and Tansu's watermark under-reports every partition's end.
"""
from __future__ import annotations

import copy
import json
import uuid

from conftest import load_debezium_fixture, produce_records
from lakestream.engine.loop import run_pipeline
from lakestream.sink.offsets import OFFSETS_PROPERTY, decode_offsets
from lakestream.source.kafka import TP, KafkaCluster
from lakestream.config import KafkaSettings

KEYS = 120


class EventFactory:
    """Debezium events for any id, made from the genuine insert / update / delete events."""

    def __init__(self) -> None:
        events = load_debezium_fixture()
        by_op = {}
        for e in events:
            if e["value"] is None:
                continue
            value = json.loads(e["value"])
            by_op.setdefault(value.get("payload", value)["op"], (e["key"], value))
        self.templates = by_op

    def _event(self, op: str, key_id: int, note: str | None) -> tuple[str, str]:
        raw_key, value = self.templates[op]
        key = json.loads(raw_key)
        key.get("payload", key)["id"] = key_id
        value = copy.deepcopy(value)
        payload = value.get("payload", value)
        for side in ("before", "after"):
            if payload.get(side) is not None:
                payload[side]["id"] = key_id
                if side == "after":
                    payload[side]["note"] = note
        return json.dumps(key), json.dumps(value)

    def insert(self, key_id: int) -> tuple[str, str]:
        return self._event("c", key_id, f"row {key_id}")

    def update(self, key_id: int, note: str) -> tuple[str, str]:
        return self._event("u", key_id, note)

    def delete(self, key_id: int) -> list[tuple[str, str | None]]:
        key, value = self._event("d", key_id, None)
        return [(key, value), (key, None)]  # Debezium follows a delete with a tombstone


def _produce_in_groups(bootstrap: str, topic: str, records: list, group: int = 25) -> None:
    for i in range(0, len(records), group):
        produce_records(bootstrap, topic, records[i:i + group])


def _table_rows(spark, table: str) -> dict[int, str]:
    rows = spark.sql(f"SELECT id, note FROM {table}").collect()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate keys in {table}"
    return {r["id"]: r["note"] for r in rows}


def test_pipeline_on_tansu_reads_every_partition_to_its_true_end(tansu_bootstrap, spark, pipeline_config_factory):
    events = EventFactory()
    topic = f"tansu{uuid.uuid4().hex[:6]}.public.all_types"
    expected: dict[int, str] = {}
    records: list = []
    for i in range(1, KEYS + 1):
        records.append(events.insert(i))
        expected[i] = f"row {i}"
    for i in range(3, KEYS + 1, 3):
        for n in range(2):  # two updates of a key in one batch: the last one wins
            records.append(events.update(i, f"upd{n} {i}"))
        expected[i] = f"upd1 {i}"
    for i in range(5, KEYS + 1, 5):
        records.extend(events.delete(i))
        expected.pop(i)
    _produce_in_groups(tansu_bootstrap, topic, records)

    cluster = KafkaCluster(KafkaSettings(bootstrap_servers=tansu_bootstrap))
    try:
        tps = cluster.partitions_of(lambda t: t == topic)
        assert len(tps) == 4
        listed_end = sum(high for _, high in cluster.watermarks(tps).values())
    finally:
        cluster.close()
    assert listed_end < len(records), "Tansu's watermarks should lag the true end here"

    name = f"tansu{topic[5:11]}"
    config = pipeline_config_factory([{"topics": [topic], "namespace": "tansu", "table": "{table}_" + topic[:11]}],
                                     name=name, kafka={"bootstrap_servers": tansu_bootstrap},
                                     engine={"max_records_per_batch": 100})
    table = f"lake.tansu.all_types_{topic[:11]}"
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    changes = len([r for r in records if r[1] is not None])
    assert sum(r.records for r in results) == changes
    assert _table_rows(spark, table) == expected

    # Every partition's offsets in the table are its true end, not the listed one.
    summary = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    stored = decode_offsets(summary[OFFSETS_PROPERTY])
    assert sum(stored.values()) == len(records)
    assert set(stored) == {TP(topic, p) for p in range(4)}

    # A restart picks up more changes (again in lagging batches) and only those.
    more = []
    for i in range(2, KEYS + 1, 7):
        if i in expected:
            more.append(events.update(i, f"later {i}"))
            expected[i] = f"later {i}"
    for i in range(KEYS + 1, KEYS + 21):
        more.append(events.insert(i))
        expected[i] = f"row {i}"
    _produce_in_groups(tansu_bootstrap, topic, more, group=7)
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert sum(r.records for r in results) == len(more)
    assert _table_rows(spark, table) == expected
