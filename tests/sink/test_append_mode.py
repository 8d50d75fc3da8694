"""Append mode on plain JSON event topics: inferred and unioned schemas, nested fields, event-time
partitioning, de-duplication by event id, dead letters for bad types and unroutable records."""

from __future__ import annotations

import datetime as dt
import json
import uuid

from conftest import produce_records

from lakestream.engine.loop import run_pipeline

DEAD_LETTER = "lake.lakestream.dead_letter"


def _events(*objs: dict) -> list[tuple[None, str]]:
    return [(None, json.dumps(o)) for o in objs]


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _dead_letters(spark, topic: str) -> list:
    if not spark.catalog.tableExists(DEAD_LETTER):
        return []
    return spark.sql(
        f"SELECT `offset`, error, target_table, value, value_is_raw FROM {DEAD_LETTER} "
        f"WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()


def _types(spark, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}


def test_schema_is_inferred_unioned_and_nested_fields_are_added(stack, spark, pipeline_config_factory):
    uid = _uid()
    topic, ns = f"clicks_{uid}", f"app_{uid}"
    table = f"lake.{ns}.events"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": ns, "table": "events"}], name=f"append{uid}"
    )
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"id": "e1", "user": "u1", "n": 1, "meta": {"ua": "firefox"}},
            {"id": "e2", "user": "u2", "n": 2, "page": "/home"},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    types = _types(spark, table)
    assert types == {"id": "string", "user": "string", "n": "bigint", "meta": "struct<ua:string>", "page": "string"}
    rows = {r["id"]: r for r in spark.table(table).collect()}
    assert rows["e1"]["page"] is None and rows["e2"]["page"] == "/home"
    assert rows["e1"]["meta"]["ua"] == "firefox" and rows["e2"]["meta"] is None

    # later: a new nested field, a new top-level field, and a string where the table has a number
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"id": "e3", "n": 3, "meta": {"ua": "curl", "lang": "de"}},
            {"id": "e4", "n": "abc"},
            {"id": "e5", "n": 5, "score": 0.5},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    types = _types(spark, table)
    assert types["meta"] == "struct<ua:string,lang:string>"
    assert types["score"] == "double" and types["n"] == "bigint"
    rows = {r["id"]: r for r in spark.table(table).collect()}
    assert sorted(rows) == ["e1", "e2", "e3", "e5"]  # e4 went to the dead-letter table
    assert rows["e3"]["meta"]["lang"] == "de" and rows["e1"]["meta"]["lang"] is None
    assert rows["e5"]["score"] == 0.5 and rows["e1"]["score"] is None
    dead = _dead_letters(spark, topic)
    assert len(dead) == 1, dead
    assert dead[0]["offset"] == 3
    assert "column n" in dead[0]["error"] and "string" in dead[0]["error"] and "bigint" in dead[0]["error"], dead[0]
    assert dead[0]["target_table"] == f"{ns}.events"
    assert json.loads(bytes(dead[0]["value"]))["n"] == "abc"


def test_route_field_invalid_table_name_goes_to_dead_letter(stack, spark, pipeline_config_factory):
    uid = _uid()
    topic, ns = f"mixed_{uid}", f"route_{uid}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": ns, "table": "ev_{field}", "route_field": "kind"}],
        name=f"route{uid}",
    )
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"kind": "click", "x": 1},
            {"kind": "view", "y": "a"},
            {"kind": "bad name; drop", "x": 2},
            {"kind": "click", "x": 3},
            {"x": 4},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert sorted(r["x"] for r in spark.table(f"lake.{ns}.ev_click").collect()) == [1, 3]
    assert [r["y"] for r in spark.table(f"lake.{ns}.ev_view").collect()] == ["a"]
    dead = _dead_letters(spark, topic)
    assert [d["offset"] for d in dead] == [2, 4], dead
    assert "not a valid table name" in dead[0]["error"] and "bad name; drop" in dead[0]["error"]
    assert dead[0]["value_is_raw"] is True
    assert "missing" in dead[1]["error"]


def test_event_time_partitioning_by_day(stack, spark, pipeline_config_factory):
    uid = _uid()
    topic, ns = f"iot_{uid}", f"iot_{uid}"
    table = f"lake.{ns}.readings"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "readings",
                "event_time_field": "event_time",
                "layout": {"partition_by": ["days(event_time)"]},
            }
        ],
        name=f"iot{uid}",
    )
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"device": "a", "v": 1.5, "event_time": "2024-03-01T10:00:00Z"},
            {"device": "b", "v": 2.5, "event_time": "2024-03-01T23:59:59.5+00:00"},
            {"device": "a", "v": 3.5, "event_time": "2024-03-02T00:00:01Z"},
            {"device": "c", "v": 4.5, "event_time": "2024-03-03T01:00:00+02:00"},  # 2024-03-02 in UTC
            {"device": "c", "v": 5.5, "event_time": "2024-03-05T12:00:00Z"},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert _types(spark, table)["event_time"] == "timestamp"
    spec = spark.sql(f"SELECT * FROM {table}.partitions").collect()
    counts = {r["partition"][0]: r["record_count"] for r in spec}
    assert counts == {dt.date(2024, 3, 1): 2, dt.date(2024, 3, 2): 2, dt.date(2024, 3, 5): 1}, counts
    ts = {
        r["v"]: r["event_time"]
        for r in spark.sql(
            f"SELECT v, date_format(event_time, 'yyyy-MM-dd HH:mm:ss') AS event_time FROM {table}"
        ).collect()
    }
    assert ts[4.5] == "2024-03-02 23:00:00"  # session time zone is UTC
    # a filter on event time prunes to one partition's files
    files = spark.sql(f"SELECT count(*) FROM {table}.files").collect()[0][0]
    assert files >= 3


def test_dedupe_field_inserts_replayed_events_once(stack, spark, pipeline_config_factory):
    uid = _uid()
    topic, ns = f"orders_{uid}", f"dd_{uid}"
    table = f"lake.{ns}.events"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": ns, "table": "events", "dedupe_field": "event_id"}],
        name=f"dedupe{uid}",
    )
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"event_id": "a", "v": 1},
            {"event_id": "b", "v": 2},
            {"event_id": "b", "v": 2},
            {"event_id": "c", "v": 3},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    # a producer retry replays old events in a later batch, plus new ones
    produce_records(
        stack.bootstrap_servers,
        topic,
        _events(
            {"event_id": "a", "v": 1},
            {"event_id": "c", "v": 3},
            {"event_id": "d", "v": 4},
            {"event_id": "d", "v": 4},
        ),
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)
    rows = sorted((r["event_id"], r["v"]) for r in spark.table(table).collect())
    assert rows == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]


def test_runs_of_events_decode_in_one_pass_and_odd_ones_still_go_the_careful_way(stack, spark, pipeline_config_factory):
    """Runs of 16+ events are decoded as one (Arrow's JSON reader), and the first batch creates the table from
    its first records before the job (one job, not two). A run with anything unusual in it — a value of the
    wrong type, a new field — is decoded record by record: the same dead letters and schema changes."""
    uid = _uid()
    topic, ns = f"runs_{uid}", f"runs_{uid}"
    table = f"lake.{ns}.events"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "events",
                "dedupe_field": "event_id",
                "event_time_field": "at",
                "layout": {"partition_by": ["days(at)"]},
            }
        ],
        name=f"runs{uid}",
    )

    def event(i: int) -> dict:
        return {"event_id": i, "n": i * 10, "kind": "k" + str(i % 3), "at": 1_709_287_200_000 + i * 3_600_000}

    produce_records(stack.bootstrap_servers, topic, _events(*(event(i) for i in range(40))))
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert [r.jobs for r in results] == [1], results
    assert _types(spark, table) == {"event_id": "bigint", "n": "bigint", "kind": "string", "at": "timestamp"}
    rows = spark.sql(f"SELECT event_id, n, unix_millis(at) AS at FROM {table}").collect()
    assert sorted((r["event_id"], r["n"], r["at"]) for r in rows) == [(i, i * 10, event(i)["at"]) for i in range(40)]
    counts = {r["partition"][0]: r["record_count"] for r in spark.sql(f"SELECT * FROM {table}.partitions").collect()}
    assert counts == {dt.date(2024, 3, 1): 14, dt.date(2024, 3, 2): 24, dt.date(2024, 3, 3): 2}, counts

    later = [event(i) for i in range(40, 80)]
    later[5]["n"] = "abc"  # offset 45: a string where the table has a number
    later[10]["score"] = 0.5  # offset 50: a new field
    later[20] = event(3)  # offset 60: a replayed event id
    produce_records(stack.bootstrap_servers, topic, _events(*later))
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert _types(spark, table)["score"] == "double"
    rows = {r["event_id"]: r for r in spark.table(table).collect()}
    assert sorted(rows) == sorted(set(range(80)) - {45, 60}), sorted(set(range(80)) - set(rows))
    assert rows[50]["score"] == 0.5 and rows[51]["score"] is None and rows[3]["n"] == 30
    dead = _dead_letters(spark, topic)
    assert [d["offset"] for d in dead] == [45], dead
    assert "column n" in dead[0]["error"] and "string" in dead[0]["error"], dead[0]
