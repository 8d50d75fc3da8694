"""Each stream is read and committed at its own commit_interval_s; Kafka holds the rest meanwhile."""
from __future__ import annotations

import json
import uuid

from conftest import produce_records
from lakestream.engine.pipeline import Pipeline


def test_slow_stream_is_read_only_when_due(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    fast, slow = f"fast{suffix}", f"slow{suffix}"
    config = pipeline_config_factory([
        {"topics": [fast], "mode": "append", "namespace": "cadence", "table": f"fast_{suffix}"},
        {"topics": [slow], "mode": "append", "namespace": "cadence", "table": f"slow_{suffix}",
         "commit_interval_s": 15},
    ], name=f"cadence{suffix}")
    assert config.commit_interval(config.streams[0]) == 0 and config.commit_interval(config.streams[1]) == 15

    def produce(start: int) -> None:
        for topic in (fast, slow):
            produce_records(config.kafka.bootstrap_servers, topic,
                            [(None, json.dumps({"n": i})) for i in range(start, start + 10)])

    def count(table: str) -> int:
        return spark.sql(f"SELECT count(*) FROM lake.cadence.{table}_{suffix}").collect()[0][0]

    produce(0)
    pipeline = Pipeline(config, spark)
    now = [1000.0]
    pipeline.clock = lambda: now[0]  # the engine's notion of time, moved by hand
    try:
        first = pipeline.run_batch()  # everything is due at the start
        assert set(first.tables) == {f"cadence.fast_{suffix}", f"cadence.slow_{suffix}"}
        produce(10)
        now[0] += 14.0  # the slow stream's interval has not passed
        second = pipeline.run_batch()
        assert set(second.tables) == {f"cadence.fast_{suffix}"}
        assert count("fast") == 20 and count("slow") == 10  # slow records still wait in Kafka
        now[0] += 1.5
        third = pipeline.run_batch()
        assert set(third.tables) == {f"cadence.slow_{suffix}"}
        assert count("slow") == 20
    finally:
        pipeline.close()
