"""The engine on genuine Debezium events: types, upsert/delete/dedup, offsets in the snapshot, replay."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from conftest import load_debezium_fixture, produce_records

from lakestream.engine.loop import run_pipeline
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, decode_offsets
from lakestream.source.kafka import TP


@pytest.mark.parametrize("fixture", ["debezium_events.jsonl", "debezium_events_noschema.jsonl"])
def test_genuine_debezium_events_land_typed(stack, spark, pipeline_config_factory, fixture):
    events = load_debezium_fixture(fixture)
    topic = f"t{uuid.uuid4().hex[:6]}.public.all_types"
    produce_records(stack.bootstrap_servers, topic, [(e["key"], e["value"]) for e in events])
    ns = "basic_" + ("s" if "noschema" not in fixture else "n")
    dead = f"dl_{topic[1:7]}.dead_letter"  # a dead-letter table of its own: no other test writes to it
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": ns, "table": "{table}_" + topic[:7]}],
        name=f"basic{topic[:7]}",
        engine={"dead_letter_table": dead},
    )
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    assert sum(r.records for r in results) == 7  # 8 messages, one tombstone
    # No record failed, and yet the dead-letter table exists: a monitoring query on it works from the start.
    assert spark.sql(f"SELECT count(*) FROM lake.{dead}").collect()[0][0] == 0
    table = f"lake.{ns}.all_types_{topic[:7]}"
    rows = {r["id"]: r for r in spark.sql(f"SELECT * FROM {table}").collect()}
    assert sorted(rows) == [1, 3, 4, 5]  # 2 deleted
    assert rows[1]["note"] == "changed"
    if "noschema" in fixture:
        return  # without schemas, types are inferred from JSON (ints, strings): checked above
    schema = {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}
    assert schema["amount"] == "decimal(10,2)"
    assert schema["day"] == "date" and schema["ts"] == "timestamp_ntz" and schema["tstz"] == "timestamp"
    assert schema["raw"] == "binary" and schema["tags"] == "array<int>"
    r = rows[3]
    assert r["amount"] == decimal.Decimal("1234.56")
    assert r["day"] == dt.date(2024, 2, 29)
    assert r["ts"] == dt.datetime(2024, 2, 29, 12, 34, 56, 789000)
    assert r["raw"] == bytes.fromhex("deadbeef")
    assert r["tags"] == [1, 2, 3]
    assert rows[1]["amount"] == decimal.Decimal("1.50")
    # offsets of the consumed partition are in the table's newest snapshot summary
    summary = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    assert decode_offsets(summary[OFFSETS_PROPERTY]) == {TP(topic, 0): 8}
