"""A value that does not fit its column becomes a dead letter with the reason, never a NULL; the rest
of the batch lands."""

from __future__ import annotations

import json
import uuid

from conftest import produce_records

from lakestream.engine.loop import run_pipeline

FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "int32", "optional": True, "field": "small"},
    {"type": "int64", "optional": True, "field": "big"},
    {
        "type": "string",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price",
    },
    {"type": "double", "optional": True, "field": "ratio"},
]


def _envelope(after: dict, op: str = "c") -> str:
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
    # json.dumps writes NaN / Infinity literals, as Kafka Connect's JsonConverter does for doubles.
    return json.dumps({"schema": schema, "payload": {"before": None, "after": after, "op": op}})


def _key(value) -> str:
    schema = {"type": "struct", "name": "k", "fields": [{"type": "int64", "optional": False, "field": "id"}]}
    return json.dumps({"schema": schema, "payload": {"id": value}})


def test_values_that_do_not_fit_become_dead_letters(stack, spark, pipeline_config_factory):
    topic = f"strict{uuid.uuid4().hex[:6]}.public.items"
    good = [{"id": i, "small": i, "big": 2**40 + i, "price": f"{i}.25", "ratio": i / 2} for i in range(1, 6)]
    bad = [
        ({"id": 10, "small": 2**40, "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),  # int32 overflow
        ({"id": 11, "small": float("nan"), "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),  # NaN in an int
        ({"id": 12, "small": 1, "big": "not-a-number", "price": "1.00", "ratio": 1.0}, "'big'"),  # text in a number
        ({"id": 13, "small": 1, "big": 1, "price": "NaN", "ratio": 1.0}, "'price'"),  # NaN decimal
        ({"id": 14, "small": 1, "big": 1, "price": "Infinity", "ratio": 1.0}, "'price'"),  # infinite decimal
        ({"id": 15, "small": 1.5, "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),  # a fraction in an int
        ({"id": 16, "small": 1, "big": 2**70, "price": "1.00", "ratio": 1.0}, "'big'"),  # int64 overflow
        ({"id": 17, "small": 1, "big": 1, "price": "123456789.123", "ratio": 1.0}, "'price'"),  # too many digits
    ]
    records = [(_key(r["id"]), _envelope(r)) for r in good[:2]]
    records += [(_key(r["id"]), _envelope(r)) for r, _ in bad]
    records.append((_key("not-a-number"), _envelope({"id": "not-a-number", "small": 1})))  # wrong-typed key
    records.append((_key(None), _envelope({"id": None, "small": 1})))  # null key
    records += [(_key(r["id"]), _envelope(r)) for r in good[2:]]
    records.append((_key(1), _envelope({**good[0], "ratio": float("nan")}, op="u")))  # NaN fits a double
    produce_records(stack.bootstrap_servers, topic, records)
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "strict", "table": "items_" + topic[6:12]}], name=f"strict{topic[6:12]}"
    )
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    kinds: dict[str, int] = {}
    for result in results:
        for kind, n in result.dead_letter_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + n
    # A null key is a missing key; every other record carries a value that does not fit its column.
    assert kinds == {"bad_value": 9, "missing_key": 1}, kinds

    rows = {r["id"]: r.asDict() for r in spark.sql(f"SELECT * FROM lake.strict.items_{topic[6:12]}").collect()}
    assert sorted(rows) == [1, 2, 3, 4, 5]  # every good row, no row of a bad record
    assert rows[3] == {
        "id": 3,
        "small": 3,
        "big": 2**40 + 3,
        "price": __import__("decimal").Decimal("3.25"),
        "ratio": 1.5,
    }
    assert rows[1]["ratio"] != rows[1]["ratio"]  # NaN kept in a double column
    letters = spark.sql(
        f"SELECT `offset`, error, target_table FROM lake.lakestream.dead_letter "
        f"WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()
    assert [r["offset"] for r in letters] == list(range(2, 12))
    for letter, (_, column) in zip(letters[: len(bad)], bad, strict=True):  # then the two letters of keys
        assert column in letter["error"], letter["error"]
        assert letter["target_table"] == f"strict.items_{topic[6:12]}"
    assert "id" in letters[8]["error"] and "id" in letters[9]["error"]
    assert "missing or null" in letters[9]["error"]


def test_runs_into_a_new_table_keep_every_shape_and_every_dead_letter(stack, spark, pipeline_config_factory):
    """A new table's first batch: long runs of one shape are proven by a vectorized parse, and a run
    that holds a new column or a value that does not fit still reports that shape and that dead
    letter (schemas on and off, in one partition slice)."""
    suffix = uuid.uuid4().hex[:6]
    on_topic, off_topic = f"runs{suffix}.public.on_items", f"runs{suffix}.public.off_items"
    rows = [{"id": i, "small": i, "big": i * 10, "price": f"{i}.50", "ratio": i / 4} for i in range(1, 61)]
    on = [(_key(r["id"]), _envelope(r)) for r in rows[:30]]
    on.append((_key(99), _envelope({"id": 99, "small": 2**40, "big": 1, "price": "1.00", "ratio": 1.0})))
    on += [(_key(r["id"]), _envelope(r)) for r in rows[30:]]
    off = [
        (json.dumps({"id": r["id"]}), json.dumps({"before": None, "after": {**r, "price": r["ratio"]}, "op": "c"}))
        for r in rows
    ]
    off[40] = (off[40][0], json.dumps({"before": None, "after": {**rows[40], "price": 1.0, "extra": "x"}, "op": "c"}))
    produce_records(stack.bootstrap_servers, on_topic, on)
    produce_records(stack.bootstrap_servers, off_topic, off)
    config = pipeline_config_factory(
        [{"topics": [on_topic, off_topic], "namespace": "runs", "table": "{table}"}], name=f"runs{suffix}"
    )
    run_pipeline(config, spark=spark, stop_when_idle=True)

    got_on = {r["id"]: r.asDict() for r in spark.sql("SELECT * FROM lake.runs.on_items").collect()}
    assert sorted(got_on) == list(range(1, 61))
    assert got_on[45] == {
        "id": 45,
        "small": 45,
        "big": 450,
        "price": __import__("decimal").Decimal("45.50"),
        "ratio": 11.25,
    }
    letters = spark.sql(f"SELECT `offset`, error FROM lake.lakestream.dead_letter WHERE topic = '{on_topic}'").collect()
    assert [r["offset"] for r in letters] == [30] and "'small'" in letters[0]["error"]
    got_off = {r["id"]: r.asDict() for r in spark.sql("SELECT * FROM lake.runs.off_items").collect()}
    assert sorted(got_off) == list(range(1, 61))
    assert got_off[41]["extra"] == "x" and got_off[42]["extra"] is None and got_off[42]["ratio"] == 10.5
