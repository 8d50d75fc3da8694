"""Transforms per stream: SQL and Python outputs written in the same batch, exactly once, with the
records a transform fails on as dead letters and a crash between output and input commits replayed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from conftest import produce_records, simulate_death

from lakestream.engine import commits as commits_module
from lakestream.engine.loop import run_pipeline
from lakestream.engine.pipeline import Pipeline
from lakestream.errors import ConfigError

DEAD_LETTER = "lake.lakestream.dead_letter"


class ProcessDeath(BaseException):
    pass


@pytest.fixture(scope="module")
def py_transforms(spark):
    spark.sparkContext.addPyFile(str(Path(__file__).with_name("transform_fns.py")))


def _payments(start: int, stop: int) -> list[dict]:
    # amount 13 breaks the Python transform, code "x" breaks the SQL cast
    return [
        {
            "id": i,
            "amount": 13 if i == 7 else i * 5,
            "code": "x" if i == 11 else str(i),
            "region": "eu" if i % 2 else "us",
        }
        for i in range(start, stop)
    ]


def test_sql_and_python_transforms_exactly_once(stack, spark, py_transforms, pipeline_config_factory, monkeypatch):
    uid = uuid.uuid4().hex[:6]
    topic, ns = f"pay_{uid}", f"tx_{uid}"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "payments",
                "transforms": [
                    {
                        "name": "big",
                        "table": "big_payments",
                        "sql": "SELECT id, amount * 100 AS cents, region AS zone, _kafka_offset AS src_offset "
                        "FROM batch WHERE amount >= 100",
                    },
                    {"name": "codes", "table": "codes", "sql": "SELECT id, CAST(code AS INTEGER) AS code_n FROM batch"},
                    {"name": "rounds", "table": "{table}_round", "python": "transform_fns:flag_round_amounts"},
                ],
            }
        ],
        name=f"tr{uid}",
        engine={"table_write_parallelism": 1},
    )
    events = _payments(0, 60)
    produce_records(stack.bootstrap_servers, topic, [(None, json.dumps(e)) for e in events])

    # The process dies after the first output committed, before the input table did.
    real_write = commits_module.write_table
    calls: list[str] = []

    def die_on_second(spark_, write, changes, properties):
        calls.append(write.ident)
        if len(calls) == 2:
            raise ProcessDeath(write.ident)
        return real_write(spark_, write, changes, properties)

    monkeypatch.setattr(commits_module, "write_table", die_on_second)
    first = Pipeline(config, spark)
    with pytest.raises(ProcessDeath):
        first.run_batch()
    simulate_death(first)
    assert not calls[0].endswith("`payments`")  # outputs commit before their input
    monkeypatch.setattr(commits_module, "write_table", real_write)
    more = _payments(60, 90)
    produce_records(stack.bootstrap_servers, topic, [(None, json.dumps(e)) for e in more])
    run_pipeline(config, spark=spark, stop_when_idle=True)

    events += more
    assert spark.table(f"lake.{ns}.payments").count() == len(events)
    big = {r["id"]: r["cents"] for r in spark.table(f"lake.{ns}.big_payments").collect()}
    assert big == {e["id"]: e["amount"] * 100 for e in events if e["amount"] >= 100}
    zones = {r["id"]: (r["zone"], r["src_offset"]) for r in spark.table(f"lake.{ns}.big_payments").collect()}
    assert all(zones[e["id"]] == (e["region"], e["id"]) for e in events if e["amount"] >= 100)
    codes = spark.table(f"lake.{ns}.codes").collect()
    assert sorted(r["id"] for r in codes) == [e["id"] for e in events if e["code"] != "x"]  # no duplicates
    assert all(r["code_n"] == r["id"] for r in codes)
    rounds = spark.table(f"lake.{ns}.{topic}_round").collect()
    assert sorted(r["id"] for r in rounds) == [e["id"] for e in events if e["amount"] % 10 == 0 and e["amount"] != 13]
    assert all(r["round"] for r in rounds)

    dead = spark.sql(
        f"SELECT `offset`, error, target_table, value FROM {DEAD_LETTER} WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()
    assert [(r["offset"], r["target_table"]) for r in dead] == [(7, f"{ns}.{topic}_round"), (11, f"{ns}.codes")]
    assert "transform rounds (streams[0].transforms[2])" in dead[0]["error"] and "unlucky" in dead[0]["error"]
    assert "transform codes" in dead[1]["error"] and json.loads(bytes(dead[1]["value"]))["code"] == "x"


def test_bad_transform_config_names_the_field(stack, spark, pipeline_config_factory):
    with pytest.raises(ConfigError, match=r"streams\[0\]\.transforms\[0\].*exactly one of"):
        pipeline_config_factory([{"topics": ["t"], "mode": "append", "transforms": [{"name": "a", "table": "b"}]}])
    uid = uuid.uuid4().hex[:6]
    topic = f"badsql_{uid}"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": f"bad_{uid}",
                "table": "ev",
                "transforms": [{"name": "t", "table": "out", "sql": "SELECT no_such_column FROM batch"}],
            }
        ],
        name=f"b{uid}",
    )
    produce_records(stack.bootstrap_servers, topic, [(None, json.dumps({"id": 1}))])
    with pytest.raises(ConfigError, match=r"streams\[0\]\.transforms\[0\]\.sql \(t\).*no_such_column"):
        run_pipeline(config, spark=spark, stop_when_idle=True)
