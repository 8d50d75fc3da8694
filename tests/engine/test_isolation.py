"""A record that makes a write job fail is isolated (the batch's offset ranges bisected), dead-lettered
with the reason and its coordinates, and everything else lands; infrastructure failures are not."""

from __future__ import annotations

import json
import uuid

from conftest import produce_records

from lakestream.engine.isolation import halves, without
from lakestream.engine.pipeline import Pipeline
from lakestream.errors import is_infrastructure_failure
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange


def test_a_record_that_fails_the_write_is_isolated_and_the_rest_lands(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic = f"iso{suffix}.public.items"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "isolation", "table": "items_" + suffix}], name=f"iso{suffix}"
    )
    events = [(json.dumps({"id": i}), json.dumps({"op": "c", "after": {"id": i, "n": i * 10}})) for i in range(20)]
    produce_records(config.kafka.bootstrap_servers, topic, events, partition=0)
    culprits = {5, 13}

    # The seam: the real write task calls this for every record it reads; it fails for two offsets,
    # as a record that breaks the writer would (the engine cannot tell the difference).
    def fail_on_culprits(rec, topic=topic, culprits=frozenset(culprits)):
        if rec.topic == topic and rec.offset in culprits:
            raise RuntimeError(f"injected write failure at offset {rec.offset}")

    pipeline = Pipeline(config, spark)
    pipeline.record_hook = fail_on_culprits
    results = []
    try:
        while (result := pipeline.run_batch()) is not None and (result.advanced or result.tables):
            results.append(result)
    finally:
        pipeline.close()
    assert sum(r.isolated for r in results) == 2 and pipeline.isolations == 2
    rows = {r.id: r.n for r in spark.sql(f"SELECT id, n FROM lake.isolation.items_{suffix}").collect()}
    assert rows == {i: i * 10 for i in range(20) if i not in culprits}
    letters = spark.sql(
        f"SELECT `partition`, `offset`, error, key, value, target_table FROM lake.lakestream.dead_letter "
        f"WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()
    assert [(r.partition, r.offset) for r in letters] == [(0, 5), (0, 13)]  # once each, though two jobs ran
    for letter in letters:
        assert "isolated" in letter.error and f"injected write failure at offset {letter.offset}" in letter.error
        assert json.loads(bytes(letter.key)) == {"id": letter.offset}  # the raw record, kept for a replay
        assert json.loads(bytes(letter.value))["after"]["id"] == letter.offset
        assert letter.target_table == f"isolation.items_{suffix}"


def test_splitting_and_classifying():
    ranges = [OffsetRange("t", 0, 0, 10, 100), OffsetRange("t", 1, 5, 6, 100)]
    left, right = halves(ranges)
    assert (left, right) == ([OffsetRange("t", 0, 0, 5, 100)], [OffsetRange("t", 0, 5, 10, 100), ranges[1]])
    assert without(ranges, {(TP("t", 0), 3), (TP("t", 1), 5)}) == [
        OffsetRange("t", 0, 0, 3, 100),
        OffsetRange("t", 0, 4, 10, 100),
    ]
    assert is_infrastructure_failure(RuntimeError("KafkaException: _TRANSPORT broker down"))
    assert is_infrastructure_failure(RuntimeError("org.postgresql.util.PSQLException: Connection refused"))
    assert not is_infrastructure_failure(RuntimeError("PythonException: ValueError: bad value"))


def test_a_record_that_fails_the_commit_is_isolated(spark, pipeline_config_factory, monkeypatch):
    import lakestream.engine.commits as engine

    suffix = uuid.uuid4().hex[:6]
    topic = f"isc{suffix}.public.items"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "isolation", "table": "commit_" + suffix}], name=f"isc{suffix}"
    )
    events = [(json.dumps({"id": i}), json.dumps({"op": "c", "after": {"id": i, "n": i}})) for i in range(12)]
    produce_records(config.kafka.bootstrap_servers, topic, events, partition=0)
    real_write_table = engine.write_table

    # The seam: the driver's commit of the table fails whenever it holds the change at offset 7.
    def failing_write_table(spark_, write, changes, props):
        offsets = {o for rl in changes.locations for o in rl.locations.column("offset").to_pylist()}
        if 7 in offsets:
            raise ValueError("injected commit failure: a value the commit cannot take")
        return real_write_table(spark_, write, changes, props)

    monkeypatch.setattr(engine, "write_table", failing_write_table)
    pipeline = Pipeline(config, spark)
    try:
        while (result := pipeline.run_batch()) is not None and (result.advanced or result.tables):
            pass
    finally:
        pipeline.close()
    assert pipeline.isolations == 1
    rows = {r.id for r in spark.sql(f"SELECT id FROM lake.isolation.commit_{suffix}").collect()}
    assert rows == set(range(12)) - {7}
    letters = spark.sql(f"SELECT `offset`, error FROM lake.lakestream.dead_letter WHERE topic = '{topic}'").collect()
    assert [r.offset for r in letters] == [7] and "injected commit failure" in letters[0].error
    offsets = (
        spark.sql(
            f"SELECT summary['lakestream.offsets'] AS o FROM lake.isolation.commit_{suffix}.snapshots "
            f"ORDER BY committed_at DESC LIMIT 1"
        )
        .collect()[0]
        .o
    )
    assert json.loads(offsets) == {topic: {"0": 12}}
