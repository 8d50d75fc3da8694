"""Dead letters survive a crash at any point of a batch's commits, exactly once: they commit before the
tables (the restart reads from the tables' offsets, past their records), and a batch read again after a
crash leaves out the dead letters the dead-letter table already holds."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import produce_records

from lakestream.engine.loop import run_pipeline
from lakestream.engine.pipeline import Pipeline

DEAD_LETTER = "lake.lakestream.dead_letter"


class Crash(Exception):
    """The process dies here (nothing after this point of the batch runs)."""


@pytest.mark.parametrize("when", ["before the tables commit", "after the tables commit"])
def test_dead_letters_survive_a_crash_during_the_commits_exactly_once(spark, pipeline_config_factory, when):
    suffix = uuid.uuid4().hex[:6]
    topic, ns = f"dlcrash{suffix}", f"dlcrash_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": ns, "table": "events"}], name=f"dlcrash{suffix}"
    )
    produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": i})) for i in range(3)])
    first = Pipeline(config, spark)
    first.run_batch()  # the table exists, n is a bigint

    produce_records(
        config.kafka.bootstrap_servers,
        topic,
        [
            (None, json.dumps({"n": 3})),
            (None, "{not json"),
            (None, json.dumps({"n": "abc"})),
            (None, json.dumps({"n": 4})),
        ],
    )

    real_commit_tables = first.committer.commit_tables

    def commit_then_crash(report, ranges=None):
        if when == "before the tables commit":
            raise Crash(when)
        real_commit_tables(report, ranges)
        raise Crash(when)

    first.committer.commit_tables = commit_then_crash
    with pytest.raises(Crash):
        first.run_batch()
    # no close(): the process died; a new one starts from what the tables and the dead-letter table hold
    run_pipeline(config, spark=spark, stop_when_idle=True)

    rows = sorted(r[0] for r in spark.sql(f"SELECT n FROM lake.{ns}.events").collect())
    assert rows == [0, 1, 2, 3, 4]
    letters = spark.sql(
        f"SELECT `offset`, error FROM {DEAD_LETTER} WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()
    assert [r["offset"] for r in letters] == [4, 5], letters
    assert "JSON" in letters[0]["error"] and "column n" in letters[1]["error"], letters
