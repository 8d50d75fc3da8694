"""Where a restart resumes: from what the tables say, not from a consumer group that may be stale."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka.admin import AdminClient, NewTopic
from conftest import produce_records

from lakestream.engine.loop import run_pipeline


def _events(start: int, count: int, note: str) -> list[tuple[str, str]]:
    return [
        (json.dumps({"id": i}), json.dumps({"op": "c", "after": {"id": i, "note": note}, "source": {"ts_ms": 1}}))
        for i in range(start, start + count)
    ]


def test_stale_group_offset_after_topic_recreated(spark, pipeline_config_factory):
    topic = f"re{uuid.uuid4().hex[:6]}.public.items"
    name = f"restart{topic[2:8]}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "restart", "table": "{table}_" + topic[2:8]}], name=name
    )
    table = f"lake.restart.items_{topic[2:8]}"
    produce_records(config.kafka.bootstrap_servers, topic, _events(0, 50, "old"))
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert spark.table(table).count() == 50  # the group has now committed offset 50

    # Start over: the table is dropped and the topic re-created with fewer events than before.
    spark.sql(f"DROP TABLE {table} PURGE")
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.time() + 30
    while topic in admin.list_topics(timeout=10).topics and time.time() < deadline:
        time.sleep(0.5)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    produce_records(config.kafka.bootstrap_servers, topic, _events(100, 20, "new"))

    run_pipeline(config, spark=spark, stop_when_idle=True)  # same group id: its offset 50 is stale
    rows = spark.sql(f"SELECT id, note FROM {table}").collect()
    assert sorted(r.id for r in rows) == list(range(100, 120))
    assert {r.note for r in rows} == {"new"}
