"""`lakestream dead-letters`: summarise and list dead letters; replay them after the cause is fixed
(a widened column), exactly once even when a replay dies between sending and recording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import yaml
from conftest import catalog_settings, produce_records

from lakestream.config import load_config
from lakestream.engine.loop import run_pipeline
from lakestream.sink.deadletters import replay as replay_module
from lakestream.sink.deadletters.replay import (
    DeadLetterFilter,
    list_dead_letters,
    replay_dead_letters,
    summarize_dead_letters,
)

FIELDS = [{"type": "int64", "optional": False, "field": "id"}, {"type": "int32", "optional": True, "field": "small"}]


def _event(after: dict) -> str:
    row = {"type": "struct", "fields": FIELDS, "optional": True, "name": "v"}
    schema = {
        "type": "struct",
        "name": "env",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    return json.dumps({"schema": schema, "payload": {"before": None, "after": after, "op": "c"}})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lakestream", "dead-letters", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def test_summarise_list_and_replay_exactly_once(stack, spark, service_dir_factory, monkeypatch):
    suffix = uuid.uuid4().hex[:6]
    topic = f"dlr{suffix}.public.items"
    table = f"replay.items_{suffix}"
    work = service_dir_factory("replay")
    path = work / "pipeline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"dlr{suffix}",
                "kafka": {
                    "bootstrap_servers": stack.bootstrap_servers,
                    "group_id": f"dlr{suffix}",
                    "client": {"session.timeout.ms": 6000},
                },
                "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
                "streams": [{"topics": [topic], "namespace": "replay", "table": f"items_{suffix}"}],
                "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
                "spark": {"master": "local[2]", "driver_memory": "1g", "conf": {"spark.ui.enabled": "false"}},
                "state_dir": str(work / "state"),
            }
        )
    )
    config = load_config(path)
    records = [(json.dumps({"id": i}), _event({"id": i, "small": i})) for i in range(1, 6)]
    records += [(json.dumps({"id": i}), _event({"id": i, "small": 2**40 + i})) for i in (6, 7, 8)]  # too wide
    records.append((json.dumps({"id": 9}), b"\x8f\x00garbage"))  # undecodable
    produce_records(stack.bootstrap_servers, topic, records, partition=0)
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert spark.table(f"lake.{table}").count() == 5

    # Summary on the command line: JSON alone on stdout, grouped by table and reason.
    summary = _cli("summary", str(path), "--json")
    assert summary.returncode == 0, summary.stderr[-3000:]
    groups = {(g["table"], g["reason"]): g for g in json.loads(summary.stdout)}
    assert groups[(table, "column 'small': value … does not fit type int32")]["count"] == 3
    assert sum(g["count"] for g in groups.values()) == 4 and {t for t, _ in groups} == {table}
    assert sum(g["count"] for g in summarize_dead_letters(spark, config, DeadLetterFilter(reason="malformed"))) == 1
    listed = list_dead_letters(spark, config, DeadLetterFilter(table=table, reason="INT32"))
    assert sorted(r["offset"] for r in listed) == [5, 6, 7] and not any(r["replayed"] for r in listed)

    # The cause is fixed: the column is widened.
    spark.sql(f"ALTER TABLE lake.{table} ALTER COLUMN small TYPE bigint")
    # A replay that dies after sending, before recording what it sent ...
    wide = DeadLetterFilter(table=table, reason="does not fit type int32")

    def crash(*_args, **_kwargs):
        raise RuntimeError("killed between sending and recording (injected)")

    monkeypatch.setattr(replay_module, "record_replays", crash)
    with pytest.raises(RuntimeError, match="injected"):
        replay_dead_letters(spark, config, wide)
    monkeypatch.undo()
    # ... is finished by the next replay without sending anything twice.
    again = _cli("replay", str(path), "--table", table, "--reason", "does not fit type int32", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout) == {"selected": 3, "produced": 0, "already_sent": 3, "skipped": 0, "dry_run": False}
    assert replay_dead_letters(spark, config, wide).selected == 0  # replayed once, never again

    run_pipeline(config, spark=spark, stop_when_idle=True)
    rows = {r.id: r.small for r in spark.sql(f"SELECT id, small FROM lake.{table}").collect()}
    assert rows == {**{i: i for i in range(1, 6)}, **{i: 2**40 + i for i in (6, 7, 8)}}
    letters = spark.sql(f"SELECT `offset` FROM lake.lakestream.dead_letter WHERE topic = '{topic}'").collect()
    assert sorted(r.offset for r in letters) == [5, 6, 7, 8]  # the replayed copies landed, none failed again
    left = summarize_dead_letters(spark, config, DeadLetterFilter(table=table))
    assert [(g["count"], g["replayed"]) for g in left] == [(1, 0)]  # only the undecodable one is left
