"""A crash between the commits of two tables fed by the same partition loses and duplicates nothing.

One topic routes events to two append tables by a field. The process "crashes" (an exception from
the second table's write, after the first table's commit landed and before the consumer group was
advanced); a fresh Pipeline, as after a restart, must give each table every event exactly once.
Append tables make any duplicate visible as an extra row.
"""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import produce_records, simulate_death

from lakestream.engine import commits as commits_module
from lakestream.engine.loop import run_pipeline
from lakestream.engine.pipeline import Pipeline


class SimulatedCrash(RuntimeError):
    pass


class SimulatedProcessDeath(BaseException):
    """The process dies: nothing in it can catch that (an ordinary exception from a commit is now
    handled by isolating the record that causes it, see tests/engine/test_isolation.py)."""


def test_crash_between_table_commits(spark, pipeline_config_factory, monkeypatch):
    topic = f"crash{uuid.uuid4().hex[:6]}"
    events = [{"kind": "alpha" if i % 3 else "beta", "n": i, "event_id": f"e{i}"} for i in range(300)]
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": "crash",
                "table": "{field}_" + topic[-6:],
                "route_field": "kind",
            }
        ],
        name=topic,
        engine={"table_write_parallelism": 1},
    )
    produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps(e)) for e in events])

    real_write = commits_module.write_table
    calls: list[str] = []

    def crash_on_second_table(spark_, write, changes, properties):
        calls.append(write.ident)
        if len(calls) == 2:
            raise SimulatedProcessDeath(f"process died before committing {write.ident}")
        return real_write(spark_, write, changes, properties)

    monkeypatch.setattr(commits_module, "write_table", crash_on_second_table)
    first = Pipeline(config, spark)
    with pytest.raises(SimulatedProcessDeath):
        first.run_batch()
    simulate_death(first)
    alpha, beta = f"lake.crash.alpha_{topic[-6:]}", f"lake.crash.beta_{topic[-6:]}"
    committed_first = calls[0]
    assert spark.table(committed_first.replace("`", "")).count() in (200, 100)  # one table landed
    monkeypatch.setattr(commits_module, "write_table", real_write)

    # More events arrive while the process is down, so the replayed batch only partly overlaps what
    # the first table holds: its records below the table's stored offset must be skipped one by one.
    more = [{"kind": "alpha" if i % 3 else "beta", "n": i, "event_id": f"e{i}"} for i in range(300, 390)]
    produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps(e)) for e in more])
    events += more

    # "Restart": a new Pipeline with no memory; the group offsets were never advanced.
    run_pipeline(config, spark=spark, stop_when_idle=True)
    for table, want in (
        (alpha, [e["n"] for e in events if e["kind"] == "alpha"]),
        (beta, [e["n"] for e in events if e["kind"] == "beta"]),
    ):
        got = sorted(r.n for r in spark.sql(f"SELECT n FROM {table}").collect())
        assert got == want, f"{table}: {len(got)} rows, want {len(want)}"


def test_loop_recovers_from_a_failed_batch(spark, pipeline_config_factory, monkeypatch):
    """A failing batch is retried from the tables' offsets by the loop itself; nothing lost or doubled."""
    topic = f"recover{uuid.uuid4().hex[:6]}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": "crash", "table": "r_" + topic[-6:]}],
        name=topic,
        engine={"max_records_per_batch": 100},
    )
    produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": i})) for i in range(250)])
    real_write = commits_module.write_table
    calls: list[int] = []

    def fail_third_write(spark_, write, changes, properties):
        calls.append(1)
        if len(calls) == 3:
            raise SimulatedCrash("transient failure")
        return real_write(spark_, write, changes, properties)

    monkeypatch.setattr(commits_module, "write_table", fail_third_write)
    run_pipeline(config, spark=spark, stop_when_idle=True)
    got = sorted(r.n for r in spark.sql(f"SELECT n FROM lake.crash.r_{topic[-6:]}").collect())
    assert got == list(range(250))
    assert len(calls) >= 4  # the failed batch was written again
