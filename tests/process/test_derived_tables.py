"""Derived tables kept current by key: customer_360 over three mirrors stays equal to its SQL run from
scratch through a mixed CDC load (inserts, updates, deletes, subscriptions moving between customers)
over several batches, recomputing only touched keys; a crash between the mirrors' commits and its own
is repaired at restart; with a commit interval, touched keys wait (and are upserted when the pipeline stops)."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from conftest import produce_records, simulate_death

from lakestream.config import DerivedTableSettings
from lakestream.engine.pipeline import Pipeline
from lakestream.process.materialize import DerivedTable

SQL = """
WITH subs AS (SELECT user_id, count(*) AS subscriptions, sum(price) AS monthly
              FROM subscriptions WHERE active GROUP BY user_id),
     used AS (SELECT user_id, count(*) AS events, sum(units) AS units FROM usage_events GROUP BY user_id)
SELECT u.id AS customer_id, u.name, u.country, coalesce(s.subscriptions, 0) AS subscriptions,
       coalesce(s.monthly, 0) AS monthly, coalesce(e.events, 0) AS events, coalesce(e.units, 0) AS units
FROM users u LEFT JOIN subs s ON s.user_id = u.id LEFT JOIN used e ON e.user_id = u.id
"""


class ProcessDeath(BaseException):
    pass


class Workload:
    """Debezium-style changes (schemas off) to users, subscriptions and usage_events, with a model."""

    def __init__(self, prefix: str, seed: int):
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.rows: dict[str, dict[int, dict]] = {"users": {}, "subscriptions": {}, "usage_events": {}}
        self.next_id = {name: 1 for name in self.rows}

    def _change(self, table: str, op: str, after: dict | None, key: int) -> tuple[str, str]:
        # A delete's before image has the key and defaults elsewhere (REPLICA IDENTITY DEFAULT).
        before = {"id": key, "user_id": 0} if op == "d" else None
        return json.dumps({"id": key}), json.dumps({"before": before, "after": after, "op": op})

    def round(self, n: int) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {name: [] for name in self.rows}
        rng, users = self.rng, self.rows["users"]
        for _ in range(n):
            kind = rng.random()
            if kind < 0.25 or len(users) < 5:
                uid = self.next_id["users"]
                self.next_id["users"] += 1
                row = {"id": uid, "name": f"user{uid}", "country": rng.choice(["CH", "DE", "FR"])}
                users[uid] = row
                out["users"].append(self._change("users", "c", row, uid))
            elif kind < 0.35:
                uid = rng.choice(sorted(users))
                users[uid] = row = dict(users[uid], country=rng.choice(["CH", "DE", "FR", "IT"]))
                out["users"].append(self._change("users", "u", row, uid))
            elif kind < 0.42:
                uid = rng.choice(sorted(users))
                del users[uid]
                out["users"].append(self._change("users", "d", None, uid))
            elif kind < 0.62:
                self._subscription(out)
            else:
                eid = self.next_id["usage_events"]
                self.next_id["usage_events"] += 1
                row = {"id": eid, "user_id": rng.choice(sorted(users) + [999_999]), "units": rng.randint(1, 9)}
                self.rows["usage_events"][eid] = row
                out["usage_events"].append(self._change("usage_events", "c", row, eid))
        return out

    def _subscription(self, out: dict[str, list[tuple[str, str]]]) -> None:
        rng, subs, users = self.rng, self.rows["subscriptions"], self.rows["users"]
        choice = rng.random()
        if choice < 0.5 or not subs:
            sid = self.next_id["subscriptions"]
            self.next_id["subscriptions"] += 1
            subs[sid] = row = {
                "id": sid,
                "user_id": rng.choice(sorted(users)),
                "price": rng.randint(5, 50),
                "active": True,
            }
            out["subscriptions"].append(self._change("subscriptions", "c", row, sid))
        elif choice < 0.85:
            sid = rng.choice(sorted(subs))
            # moves to another customer, or changes its price / state
            subs[sid] = row = dict(
                subs[sid], user_id=rng.choice(sorted(users)), active=rng.random() < 0.8, price=rng.randint(5, 50)
            )
            out["subscriptions"].append(self._change("subscriptions", "u", row, sid))
        else:
            sid = rng.choice(sorted(subs))
            del subs[sid]
            out["subscriptions"].append(self._change("subscriptions", "d", None, sid))

    def send(self, bootstrap: str, n: int) -> None:
        for table, changes in self.round(n).items():
            if changes:
                produce_records(bootstrap, f"{self.prefix}.public.{table}", changes)


def _drain(pipeline: Pipeline) -> None:
    for _ in range(20):
        result = pipeline.run_batch()
        if result is None or (result.advanced == 0 and not result.tables):
            return
    raise AssertionError("the pipeline did not become idle")


def _rows(spark, sql: str) -> dict[int, tuple]:
    rows = [r.asDict() for r in spark.sql(sql).collect()]
    out = {r.pop("customer_id"): tuple(sorted(r.items())) for r in rows}
    assert len(out) == len(rows), "duplicate keys"
    return out


def _from_scratch(spark, ns: str) -> dict[int, tuple]:
    for name in ("users", "subscriptions", "usage_events"):
        spark.table(f"lake.{ns}.{name}").createOrReplaceTempView(name)
    return _rows(spark, SQL)


def test_customer_360_kept_current_by_key(stack, spark, pipeline_config_factory, monkeypatch):
    uid = uuid.uuid4().hex[:6]
    prefix, ns = f"c{uid}", f"c360_{uid}"
    derived = {
        "name": "customer_360",
        "table": f"{ns}.customer_360",
        "key": "customer_id",
        "sql": SQL,
        "inputs": [
            {"name": "users", "table": f"{ns}.users", "key": "id"},
            {"name": "subscriptions", "table": f"{ns}.subscriptions", "key": "user_id"},
            {"name": "usage_events", "table": f"{ns}.usage_events", "key": "user_id"},
        ],
    }
    config = pipeline_config_factory(
        [{"topic_pattern": f"{prefix}\\.public\\..*", "namespace": ns, "table": "{table}"}],
        name=f"c{uid}",
        derived_tables=[derived],
    )
    workload = Workload(prefix, seed=7)
    target = f"lake.{ns}.customer_360"

    pipeline = Pipeline(config, spark)
    stage = pipeline.materialize.tables[0]
    workload.send(stack.bootstrap_servers, 80)  # the first batch builds the table whole
    _drain(pipeline)
    assert stage.upserts == {"full": 1}
    workload.send(stack.bootstrap_servers, 12)
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {target}") == _from_scratch(spark, ns)
    assert stage.upserts["full"] == 1 and stage.upserts["keys"] >= 1
    # by key, not a full refresh: a change touches at most two keys (its row's old and new owner)
    assert 0 < stage.last_touched <= 2 * 12 and stage.last_touched < len(workload.rows["users"])

    # The process dies after the mirrors committed a batch, before customer_360 did.
    real_upsert = DerivedTable.upsert

    def die(self, keys):
        if keys is not None:
            raise ProcessDeath("before the derived commit")
        return real_upsert(self, keys)

    monkeypatch.setattr(DerivedTable, "upsert", die)
    workload.send(stack.bootstrap_servers, 40)
    with pytest.raises(ProcessDeath):
        _drain(pipeline)
    simulate_death(pipeline)  # a dead process closes and saves nothing
    monkeypatch.setattr(DerivedTable, "upsert", real_upsert)

    # Restarted with a commit cadence: touched keys wait for it, and are upserted when the pipeline stops.
    config.derived_tables[0].commit_interval_s = 3600
    restarted = Pipeline(config, spark)
    table = restarted.materialize.tables[0]
    try:
        workload.send(stack.bootstrap_servers, 30)
        _drain(restarted)
        assert table.upserts == {"full": 1}  # found behind its inputs
        workload.send(stack.bootstrap_servers, 30)
        _drain(restarted)
        assert table.upserts == {"full": 1} and table.pending
    finally:
        restarted.close()
    assert table.upserts == {"full": 1, "keys": 1} and not table.pending
    got = _rows(spark, f"SELECT * FROM {target}")
    assert got == _from_scratch(spark, ns)
    model_users = workload.rows["users"]
    assert sorted(got) == sorted(model_users)  # deleted customers are gone
    subs = [s for s in workload.rows["subscriptions"].values() if s["active"]]
    for cid, row in got.items():
        values = dict(row)
        mine = [s for s in subs if s["user_id"] == cid]
        assert (values["subscriptions"], values["monthly"]) == (len(mine), sum(s["price"] for s in mine))
        assert values["country"] == model_users[cid]["country"]


def test_derived_table_config_is_checked():
    base = {
        "name": "c",
        "table": "a.c",
        "key": ["k1", "k2"],
        "sql": "SELECT 1",
        "inputs": [{"name": "u", "table": "a.u", "key": ["id"]}],
    }
    with pytest.raises(ValueError, match=r"inputs\[0\]\.key has 1 column"):
        DerivedTableSettings.model_validate(base)
    bad_name = [{"name": "u;", "table": "a.u", "key": "id"}]
    with pytest.raises(ValueError, match="not a valid identifier"):
        DerivedTableSettings.model_validate(base | {"key": "k", "inputs": bad_name})
    itself = [{"name": "u", "table": "a.c", "key": "id"}]
    with pytest.raises(ValueError, match="must differ"):
        DerivedTableSettings.model_validate(base | {"key": "k", "inputs": itself})
