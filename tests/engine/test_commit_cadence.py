"""Each stream is read and committed at its own commit_interval_s; Kafka holds the rest meanwhile."""

from __future__ import annotations

import json
import uuid

from conftest import produce_records

from lakestream.engine.pipeline import Pipeline


def test_slow_stream_is_read_only_when_due(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    fast, slow = f"fast{suffix}", f"slow{suffix}"
    config = pipeline_config_factory(
        [
            {"topics": [fast], "mode": "append", "namespace": "cadence", "table": f"fast_{suffix}"},
            {
                "topics": [slow],
                "mode": "append",
                "namespace": "cadence",
                "table": f"slow_{suffix}",
                "commit_interval_s": 15,
            },
        ],
        name=f"cadence{suffix}",
    )
    assert config.commit_interval(config.streams[0]) == 0 and config.commit_interval(config.streams[1]) == 15

    def produce(start: int) -> None:
        for topic in (fast, slow):
            produce_records(
                config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": i})) for i in range(start, start + 10)]
            )

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


def test_output_table_commits_at_its_own_interval(spark, pipeline_config_factory):
    """A transform's output with its own commit_interval_s holds its files between commits; a crash
    loses nothing (the restart reads from its offsets again), and a clean close commits what it holds."""
    suffix = uuid.uuid4().hex[:6]
    topic, ns = f"held{suffix}", f"held_{suffix}"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "events",
                "transforms": [
                    {
                        "name": "copy",
                        "table": "history",
                        "commit_interval_s": 30,
                        "sql": "SELECT n, _kafka_offset AS src FROM batch",
                    }
                ],
            },
        ],
        name=f"held{suffix}",
    )
    history = f"{ns}.history"
    sent = [0]

    def produce(n: int) -> None:
        produce_records(
            config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": i})) for i in range(sent[0], sent[0] + n)]
        )
        sent[0] += n

    def rows(table: str) -> list[int]:
        return sorted(r[0] for r in spark.sql(f"SELECT n FROM lake.{ns}.{table}").collect())

    now = [1000.0]
    produce(10)
    first = Pipeline(config, spark)
    first.clock = lambda: now[0]
    first.run_batch()
    assert rows("events") == list(range(10)) and rows("history") == []
    produce(10)
    now[0] += 10
    second = first.run_batch()
    assert history not in second.tables and second.held == {history: 20}
    assert rows("events") == list(range(20)) and rows("history") == []
    # The consumer group stays at the held table's first record, not at the input's position.
    from lakestream.source.kafka import TP

    assert first.kafka.committed([TP(topic, 0)]).get(TP(topic, 0)) == 0
    first.kafka.close()  # the process dies here: nothing held is committed

    again = Pipeline(config, spark)
    again.clock = lambda: now[0]
    try:
        produce(5)
        replay = again.run_batch()  # from the history's offsets (none yet): the events table skips 0..19
        assert replay.held == {history: 25} and rows("events") == list(range(25))
        now[0] += 31
        assert again.run_batch() is None  # idle, but the history's interval is due: it commits
        assert rows("history") == list(range(25))
        produce(5)
        assert again.run_batch().held == {history: 5}
    finally:
        again.close()  # a clean close commits what is held
    assert rows("history") == list(range(30)) and rows("events") == list(range(30))
    srcs = sorted(r[0] for r in spark.sql(f"SELECT src FROM lake.{ns}.history").collect())
    assert srcs == list(range(30))  # every record once, at its own offset


def test_output_interval_shorter_than_the_stream_is_a_config_error(pipeline_config_factory):
    import pytest

    from lakestream.errors import ConfigError

    with pytest.raises(ConfigError, match=r"streams\[0\]\.transforms\[0\]\.commit_interval_s .* fix: raise it"):
        pipeline_config_factory(
            [
                {
                    "topics": ["t"],
                    "mode": "append",
                    "namespace": "n",
                    "table": "t",
                    "commit_interval_s": 60,
                    "transforms": [
                        {"name": "copy", "table": "h", "commit_interval_s": 10, "sql": "SELECT * FROM batch"}
                    ],
                },
            ]
        )
