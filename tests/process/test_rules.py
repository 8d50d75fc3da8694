"""Rules → alerts: velocity, spend, field change and predicate checks over each key's history,
evaluated across batches and a crash, against an independent evaluation of the same rules; alerts
land in the Iceberg alerts table exactly once and in Kafka keyed by their deterministic id."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import produce_records, simulate_death

from lakestream.engine import commits as commits_module
from lakestream.engine.loop import run_pipeline
from lakestream.engine.pipeline import Pipeline
from lakestream.process.rules import alert_id

CHECKS = [
    {"name": "velocity", "kind": "count", "window_s": 60, "above": 3},
    {"name": "spend", "kind": "sum", "field": "amount", "window_s": 300, "above": 2500},
    {"name": "geo", "kind": "change", "field": "country"},
    {"name": "large", "kind": "predicate", "sql": "amount >= 1900"},
]


class ProcessDeath(BaseException):
    pass


def _events(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    t = 1_700_000_000_000
    out = []
    for i in range(n):
        t += rng.randint(0, 15_000)
        account = rng.randint(1, 6)
        out.append(
            {
                "id": f"tx{i}",
                "account": account,
                "amount": round(rng.uniform(1, 2000), 2),
                "country": rng.choice(["CH", "CH", "CH", "DE"]) if account % 2 else "FR",
                "ts_ms": t,
            }
        )
    return out


def _reference(events: list[dict]) -> set[tuple[str, str]]:
    """(check, event id) of every alert, evaluated naively: per event, over all events of its key."""
    out = set()
    for e in events:
        mine = [x for x in events if x["account"] == e["account"]]
        recent = [x for x in mine if e["ts_ms"] - 60_000 <= x["ts_ms"] <= e["ts_ms"]]
        if len(recent) > 3:
            out.add(("velocity", e["id"]))
        if sum(x["amount"] for x in mine if e["ts_ms"] - 300_000 <= x["ts_ms"] <= e["ts_ms"]) > 2500:
            out.add(("spend", e["id"]))
        before = [x for x in mine if (x["ts_ms"], events.index(x)) < (e["ts_ms"], events.index(e))]
        if before and max(before, key=lambda x: (x["ts_ms"], events.index(x)))["country"] != e["country"]:
            out.add(("geo", e["id"]))
        if e["amount"] >= 1900:
            out.add(("large", e["id"]))
    return out


def _kafka_alerts(bootstrap: str, topic: str) -> list[tuple[str, dict]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"rd-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    try:
        while len(out) < high:
            msg = consumer.poll(5)
            assert msg is not None, f"read {len(out)} of {high} alerts"
            if not msg.error():
                out.append((msg.key().decode(), json.loads(msg.value())))
    finally:
        consumer.close()
    return out


def test_rules_raise_exact_alerts_across_batches_and_a_crash(stack, spark, pipeline_config_factory, monkeypatch):
    uid = uuid.uuid4().hex[:6]
    topic, ns, alerts_topic = f"tx_{uid}", f"fraud_{uid}", f"alerts_{uid}"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "transactions",
                "transforms": [
                    {
                        "name": "history",
                        "table": "tx_history",
                        "sql": "SELECT id, account, amount, country, ts_ms, _topic, _kafka_partition, _kafka_offset, "
                        "_kafka_ts_ms AS _source_ts_ms FROM batch",
                    }
                ],
            }
        ],
        name=f"rules{uid}",
        engine={"max_records_per_batch": 60, "table_write_parallelism": 1},
        rules=[
            {
                "name": "fraud",
                "source": f"{ns}.tx_history",
                "key": "account",
                "event_time": "ts_ms",
                "event_id": "id",
                "alerts_table": f"{ns}.alerts",
                "alerts_topic": alerts_topic,
                "checks": CHECKS,
            }
        ],
    )
    events = _events(200, seed=7)
    produce_records(stack.bootstrap_servers, topic, [(None, json.dumps(e)) for e in events[:100]])
    run_pipeline(config, spark=spark, stop_when_idle=True)

    # The process dies after the alerts of a batch committed, before its history did.
    produce_records(stack.bootstrap_servers, topic, [(None, json.dumps(e)) for e in events[100:]])
    real_write = commits_module.write_table
    calls: list[str] = []

    def die_after_alerts(spark_, write, changes, properties):
        calls.append(write.ident)
        if len(calls) == 2:
            raise ProcessDeath(write.ident)
        return real_write(spark_, write, changes, properties)

    monkeypatch.setattr(commits_module, "write_table", die_after_alerts)
    crashed = Pipeline(config, spark)
    with pytest.raises(ProcessDeath):
        crashed.run_batch()
    simulate_death(crashed)
    assert calls[0].endswith("`alerts`") and calls[1].endswith("`tx_history`"), calls
    monkeypatch.setattr(commits_module, "write_table", real_write)
    run_pipeline(config, spark=spark, stop_when_idle=True)

    expected = _reference(events)
    assert {c["name"] for c in CHECKS} == {check for check, _ in expected}  # every kind of check fires
    rows = spark.table(f"lake.{ns}.alerts").collect()
    got = [(r["check_name"], r["event_id"]) for r in rows]
    assert len(got) == len(set(got)), "an alert was committed twice"
    assert set(got) == expected
    by_id = {e["id"]: e for e in events}
    for r in rows:
        assert r["alert_id"] == alert_id("fraud", r["check_name"], r["event_id"])
        assert r["key"] == str(by_id[r["event_id"]]["account"]) and r["latency_ms"] is not None
    assert spark.table(f"lake.{ns}.tx_history").count() == len(events)

    sent = _kafka_alerts(stack.bootstrap_servers, alerts_topic)
    assert {key for key, _ in sent} == {r["alert_id"] for r in rows}  # at least once, de-duplicable by key
    assert all(value["alert_id"] == key for key, value in sent)
