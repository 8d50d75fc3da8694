"""Batch ids continue across restarts and across the loop's recovery from a failed batch: the
``lakestream.batch-id`` snapshot property and the metrics log never repeat a number."""

from __future__ import annotations

import json
import uuid

import orjson
from conftest import produce_records

from lakestream.engine.loop import metrics_path, run_pipeline
from lakestream.source.kafka import KafkaCluster


def _events(start: int, count: int) -> list[tuple[str, str]]:
    return [
        (json.dumps({"id": i}), json.dumps({"op": "c", "after": {"id": i, "n": i}}))
        for i in range(start, start + count)
    ]


def _snapshot_batch_ids(spark, table: str) -> list[int]:
    rows = spark.sql(
        f"SELECT summary['lakestream.batch-id'] AS b FROM {table}.snapshots ORDER BY committed_at"
    ).collect()
    return [int(r.b) for r in rows if r.b is not None]


def test_batch_ids_continue_after_restart_and_recovery(spark, pipeline_config_factory, monkeypatch):
    suffix = uuid.uuid4().hex[:6]
    topic = f"bid{suffix}.public.items"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "batchids", "table": "items_" + suffix}],
        name=f"bid{suffix}",
        engine={"max_records_per_batch": 10},
    )
    table = f"lake.batchids.items_{suffix}"
    produce_records(config.kafka.bootstrap_servers, topic, _events(0, 30))
    first = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert [r.batch_id for r in first] == [1, 2, 3]

    # A new process (a new Pipeline) continues the count from the tables.
    produce_records(config.kafka.bootstrap_servers, topic, _events(30, 10))
    second = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert [r.batch_id for r in second] == [4]

    # A batch fails after its table committed (the broker goes away before the group commit): the
    # loop recovers with a fresh Pipeline, which must not start again at 1.
    failed = []
    real_commit = KafkaCluster.commit

    def commit_failing_once(self, positions):
        if not failed:
            failed.append(positions)
            raise RuntimeError("broker went away (injected)")
        return real_commit(self, positions)

    monkeypatch.setattr(KafkaCluster, "commit", commit_failing_once)
    produce_records(config.kafka.bootstrap_servers, topic, _events(40, 20))
    third = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert failed, "the injected failure did not happen"
    assert [r.batch_id for r in third] == [6]  # batch 5 committed its table, then failed; 6 reads the rest

    ids = _snapshot_batch_ids(spark, table)
    assert ids == [1, 2, 3, 4, 5, 6]
    logged = [orjson.loads(line)["batch"] for line in metrics_path(config).read_bytes().splitlines()]
    assert logged == sorted(set(logged)) == [1, 2, 3, 4, 6]
    assert spark.table(table).count() == 60


def test_the_metrics_log_says_where_each_batch_and_commit_spent_its_time(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    upserts, events = f"steps{suffix}.public.items", f"steps{suffix}.public.events"
    config = pipeline_config_factory(
        [
            {
                "topics": [upserts],
                "mode": "upsert",
                "namespace": "steps",
                "table": "items_" + suffix,
                "key_columns": ["id"],
            },
            {"topics": [events], "mode": "append", "namespace": "steps", "table": "events_" + suffix},
        ],
        name=f"steps{suffix}",
        engine={"max_records_per_batch": 40},
    )
    produce_records(config.kafka.bootstrap_servers, upserts, _events(0, 20) + _events(10, 20))
    produce_records(config.kafka.bootstrap_servers, events, _events(0, 20))
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert results
    lines = [orjson.loads(line) for line in metrics_path(config).read_bytes().splitlines()]
    assert len(lines) == len(results)
    tables = set()
    for line in lines:
        steps = line["steps_ms"]
        assert list(steps) == ["plan", "write_job", "next_job", "dead_letters", "commit_tables", "advance"]
        # The steps are the batch, lap by lap: they add up to its time.
        assert abs(sum(steps.values()) / 1000 - line["seconds"]) < 0.01 + 0.02 * line["seconds"]
        assert steps["commit_tables"] > 0
        for table, table_steps in line["table_steps_ms"].items():
            tables.add(table)
            assert {"fresh_index", "write", "persist_index", "write.jvm"} <= set(table_steps)
            assert table_steps["write.jvm.iceberg_commit"] <= table_steps["write.jvm"]
            if table.startswith("steps.items_"):  # an upsert: the key index is looked up and moved
                assert {"write.resolve", "write.index_update"} <= set(table_steps)
            else:
                assert "write.index_update" not in table_steps
            assert table_steps["write"] <= steps["commit_tables"] + 0.1
    assert tables == {f"steps.items_{suffix}", f"steps.events_{suffix}"}
