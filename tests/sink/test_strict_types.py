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
    {"type": "string", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "double", "optional": True, "field": "ratio"},
]


def _envelope(after: dict, op: str = "c") -> str:
    row = {"type": "struct", "fields": FIELDS, "optional": True, "name": "v"}
    schema = {"type": "struct", "name": "env", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                                          {"type": "string", "optional": False, "field": "op"}]}
    # json.dumps writes NaN / Infinity literals, as Kafka Connect's JsonConverter does for doubles.
    return json.dumps({"schema": schema, "payload": {"before": None, "after": after, "op": op}})


def _key(value) -> str:
    schema = {"type": "struct", "name": "k", "fields": [{"type": "int64", "optional": False, "field": "id"}]}
    return json.dumps({"schema": schema, "payload": {"id": value}})


def test_values_that_do_not_fit_become_dead_letters(stack, spark, pipeline_config_factory):
    topic = f"strict{uuid.uuid4().hex[:6]}.public.items"
    good = [{"id": i, "small": i, "big": 2**40 + i, "price": f"{i}.25", "ratio": i / 2} for i in range(1, 6)]
    bad = [
        ({"id": 10, "small": 2**40, "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),     # int32 overflow
        ({"id": 11, "small": float("nan"), "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),  # NaN in an int
        ({"id": 12, "small": 1, "big": "not-a-number", "price": "1.00", "ratio": 1.0}, "'big'"),  # text in a number
        ({"id": 13, "small": 1, "big": 1, "price": "NaN", "ratio": 1.0}, "'price'"),           # NaN decimal
        ({"id": 14, "small": 1, "big": 1, "price": "Infinity", "ratio": 1.0}, "'price'"),      # infinite decimal
        ({"id": 15, "small": 1.5, "big": 1, "price": "1.00", "ratio": 1.0}, "'small'"),        # a fraction in an int
        ({"id": 16, "small": 1, "big": 2**70, "price": "1.00", "ratio": 1.0}, "'big'"),        # int64 overflow
        ({"id": 17, "small": 1, "big": 1, "price": "123456789.123", "ratio": 1.0}, "'price'"),  # too many digits
    ]
    records = [(_key(r["id"]), _envelope(r)) for r in good[:2]]
    records += [(_key(r["id"]), _envelope(r)) for r, _ in bad]
    records.append((_key("not-a-number"), _envelope({"id": "not-a-number", "small": 1})))  # wrong-typed key
    records.append((_key(None), _envelope({"id": None, "small": 1})))  # null key
    records += [(_key(r["id"]), _envelope(r)) for r in good[2:]]
    records.append((_key(1), _envelope({**good[0], "ratio": float("nan")}, op="u")))  # NaN fits a double
    produce_records(stack.bootstrap_servers, topic, records)
    config = pipeline_config_factory([{"topics": [topic], "namespace": "strict", "table": "items_" + topic[6:12]}],
                                     name=f"strict{topic[6:12]}")
    run_pipeline(config, spark=spark, stop_when_idle=True)

    rows = {r["id"]: r.asDict() for r in spark.sql(f"SELECT * FROM lake.strict.items_{topic[6:12]}").collect()}
    assert sorted(rows) == [1, 2, 3, 4, 5]  # every good row, no row of a bad record
    assert rows[3] == {"id": 3, "small": 3, "big": 2**40 + 3, "price": __import__("decimal").Decimal("3.25"),
                       "ratio": 1.5}
    assert rows[1]["ratio"] != rows[1]["ratio"]  # NaN kept in a double column
    letters = spark.sql(f"SELECT `offset`, error, target_table FROM lake.lakestream.dead_letter "
                        f"WHERE topic = '{topic}' ORDER BY `offset`").collect()
    assert [r["offset"] for r in letters] == list(range(2, 12))
    for letter, (_, column) in zip(letters, bad):
        assert column in letter["error"], letter["error"]
        assert letter["target_table"] == f"strict.items_{topic[6:12]}"
    assert "id" in letters[8]["error"] and "id" in letters[9]["error"]
    assert "missing or null" in letters[9]["error"]
