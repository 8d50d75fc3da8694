"""The next batch's write job runs while a batch commits (engine.overlap_commits): exact, and crash-safe.

A backlog of schemas-off Debezium changes (inserts, updates, deletes of the same keys, spread over many
batches) goes into an upsert table. Batches must overlap, and the table must equal the source's final
state. Then a process death inside a commit, while the next batch's job is in flight, must leave nothing
behind that a restart would apply twice or lose.
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
from conftest import produce_records, simulate_death

from lakestream.engine import commits as commits_module
from lakestream.engine.loop import run_pipeline
from lakestream.engine.pipeline import Pipeline


class SimulatedProcessDeath(BaseException):
    """The process dies inside a commit: nothing in it can catch that."""


def _changes(n: int, keys: int, seed: int) -> tuple[list[tuple[str, str | None]], dict[int, int]]:
    """Debezium (schemas off) changes of ``keys`` keys and the final state they leave (id → v)."""
    rng = random.Random(seed)
    state: dict[int, int] = {}
    out: list[tuple[str, str | None]] = []
    for i in range(n):
        key = rng.randrange(keys)
        if key in state and rng.random() < 0.2:
            before = {"id": key, "v": state.pop(key)}
            out.append(
                (
                    json.dumps({"id": key}),
                    json.dumps({"before": before, "after": None, "op": "d", "ts_ms": 1_700_000_000_000 + i}),
                )
            )
            out.append((json.dumps({"id": key}), None))  # the tombstone
        else:
            op = "u" if key in state else "c"
            state[key] = i
            out.append(
                (
                    json.dumps({"id": key}),
                    json.dumps(
                        {"before": None, "after": {"id": key, "v": i}, "op": op, "ts_ms": 1_700_000_000_000 + i}
                    ),
                )
            )
    return out, state


def _table_state(spark, table: str) -> dict[int, int]:
    rows = spark.sql(f"SELECT id, v FROM {table}").collect()
    assert len(rows) == len({r.id for r in rows}), f"{table}: duplicate keys"
    return {r.id: r.v for r in rows}


def test_batches_overlap_and_the_mirror_is_exact(spark, pipeline_config_factory):
    topic = f"overlap{uuid.uuid4().hex[:6]}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "upsert", "namespace": "overlap", "table": topic, "key_columns": ["id"]}],
        name=topic,
        engine={"max_records_per_batch": 400},
    )
    records, state = _changes(3000, 500, seed=1)
    produce_records(config.kafka.bootstrap_servers, topic, records)

    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert sum(r.overlapped for r in results) >= 2, [(r.batch_id, r.overlapped) for r in results]
    assert _table_state(spark, f"lake.overlap.{topic}") == state


def test_a_death_inside_a_commit_with_the_next_job_in_flight(spark, pipeline_config_factory, monkeypatch):
    topic = f"overdie{uuid.uuid4().hex[:6]}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "upsert", "namespace": "overlap", "table": topic, "key_columns": ["id"]}],
        name=topic,
        engine={"max_records_per_batch": 300},
    )
    records, state = _changes(2000, 300, seed=2)
    produce_records(config.kafka.bootstrap_servers, topic, records)

    real_write = commits_module.write_table
    commits: list[str] = []

    def die_in_the_third_commit(spark_, write, changes, properties):
        commits.append(write.ident)
        if len(commits) == 3:
            raise SimulatedProcessDeath("died inside the third commit")
        return real_write(spark_, write, changes, properties)

    monkeypatch.setattr(commits_module, "write_table", die_in_the_third_commit)
    first = Pipeline(config, spark)
    with pytest.raises(SimulatedProcessDeath):
        while True:
            first.run_batch()
    assert first.prefetch.pending is not None, "the next batch's job was not in flight when the commit died"
    simulate_death(first)  # what a dead process leaves: a job nobody commits (its files are orphans)
    monkeypatch.setattr(commits_module, "write_table", real_write)

    run_pipeline(config, spark=spark, stop_when_idle=True)  # the restart
    assert _table_state(spark, f"lake.overlap.{topic}") == state
