"""Pure units of the processing stages (no services): rule evaluation across batches, partial windows,
transform isolation and output fitting."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from lakestream.config import RuleSet, WindowSettings
from lakestream.errors import ConfigError
from lakestream.process.rules import RuleEvaluator
from lakestream.process.windows import partial_windows
from lakestream.transform.apply import apply_isolating, arrow_ddl, fit_output

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _events(rows: list[tuple], first_offset: int) -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "account_id": [r[1] for r in rows],
            "amount": [r[2] for r in rows],
            "country": [r[3] for r in rows],
            "created_at": [T0 + dt.timedelta(seconds=r[4]) for r in rows],
            "_topic": ["t"] * len(rows),
            "_kafka_partition": pa.array([0] * len(rows), pa.int32()),
            "_kafka_offset": list(range(first_offset, first_offset + len(rows))),
        }
    )


def test_rules_use_history_from_earlier_batches():
    rules = RuleSet.model_validate(
        {
            "name": "fraud",
            "source": "f.h",
            "key": "account_id",
            "event_time": "created_at",
            "event_id": "id",
            "alerts_table": "f.alerts",
            "checks": [
                {"name": "velocity", "kind": "count", "window_s": 60, "above": 2},
                {"name": "spend", "kind": "sum", "field": "amount", "window_s": 300, "above": 1000},
                {"name": "geo", "kind": "change", "field": "country"},
                {"name": "big", "kind": "predicate", "sql": "amount > 900"},
            ],
        }
    )
    evaluator = RuleEvaluator(rules)
    first = evaluator.evaluate(_events([(1, 1, 10.0, "CH", 0), (2, 1, 20.0, "CH", 10), (3, 2, 950.0, "DE", 10)], 0))
    assert [(a["check_name"], a["event_id"]) for a in first.to_pylist()] == [("big", "3")]
    second = evaluator.evaluate(_events([(4, 1, 10.0, "US", 20), (5, 1, 990.0, "US", 100)], 3))
    got = {(a["check_name"], a["event_id"]): a for a in second.to_pylist()}
    assert set(got) == {("geo", "4"), ("velocity", "4"), ("big", "5"), ("spend", "5")}
    assert got[("velocity", "4")]["value"] == 3 and got[("spend", "5")]["value"] == 1030
    assert got[("geo", "4")]["detail"] == "country: CH → US"
    with pytest.raises(ConfigError, match="no column"):
        evaluator.evaluate(_events([(6, 1, 1.0, "US", 200)], 5).drop_columns(["_kafka_offset"]))


def test_partial_windows_tumbling_hopping_and_late():
    rows = pa.table(
        {"eq": ["a", "a", "b"], "ts": pa.array([1_000, 61_000, 5_000], pa.int64()), "temp": [1.0, 3.0, None]}
    )
    hopping = WindowSettings(
        name="h",
        source="a.b",
        key="eq",
        event_time="ts",
        fields=["temp"],
        size_s=60,
        slide_s=30,
        allowed_lateness_s=60,
        table="a.c",
    )
    partials, late = partial_windows(rows, hopping, None)
    assert late == []
    starts = [(r["eq"], int(r["window_start"].timestamp())) for r in partials.to_pylist()]
    assert starts == [("a", -30), ("a", 0), ("a", 30), ("a", 60), ("b", -30), ("b", 0)]
    b = partials.to_pylist()[-1]
    assert b["count"] == 1 and b["temp_count"] == 0 and b["temp_avg"] is None
    tumbling = WindowSettings(
        name="t",
        source="a.b",
        key="eq",
        event_time="ts",
        fields=["temp"],
        size_s=60,
        allowed_lateness_s=60,
        table="a.c",
    )
    # watermark 179 s: [0, 60) closed at 60 + 60 s lateness = 120 s; [60, 120) stays open until 180 s
    partials, late = partial_windows(rows, tumbling, 179_000)
    assert late == [0, 2] and [(r["eq"], r["count"]) for r in partials.to_pylist()] == [("a", 1)]


def test_transform_isolation_and_output_fitting():
    batch = pa.table({"x": [1, 2, 3, 4]})

    def fn(part: pa.Table) -> pa.Table:
        if 3 in part.column("x").to_pylist():
            raise ValueError("three")
        return part

    outputs, failed = apply_isolating(fn, batch)
    assert sum(o.num_rows for o in outputs) == 3 and failed == {2: "ValueError: three"}
    schema = pa.schema([("x", pa.int32()), ("y", pa.string())])
    fitted = fit_output(pa.table({"x": [1, 2]}), schema)
    assert fitted.schema == schema and fitted.column("y").null_count == 2
    with pytest.raises(ValueError, match="does not have"):
        fit_output(pa.table({"z": [1]}), schema)
    with pytest.raises(pa.ArrowInvalid):
        fit_output(pa.table({"x": [2**40]}), schema)
    assert arrow_ddl(pa.timestamp("us", tz="UTC")) == "timestamp" and arrow_ddl(pa.decimal128(38, 0)) == "decimal(38,0)"


def test_touched_keys_follow_rows_between_derived_keys():
    from lakestream.config import DerivedInputSettings
    from lakestream.process.materialize import _Input, touched_keys

    def changes(rows: list[tuple]) -> pa.Table:  # (id, user_id, op, offset, withheld)
        return pa.table(
            {
                "id": [r[0] for r in rows],
                "user_id": [r[1] for r in rows],
                "_op": [r[2] for r in rows],
                "_topic": ["t"] * len(rows),
                "_partition": [0] * len(rows),
                "_offset": [r[3] for r in rows],
                "_withheld": [r[4] for r in rows],
            }
        )

    subs = _Input(DerivedInputSettings(name="s", table="a.s", key="user_id"), "x", ["id"], owners={(1,): (10,)})
    # subscription 1 moves from 10 to 20 then is deleted (its delete image has a default user_id 0);
    # 2 is created for 30 then updated with its user_id withheld (TOAST); given out of Kafka order
    got = touched_keys(
        subs, changes([(1, 0, "d", 5, False), (1, 20, "u", 3, False), (2, 30, "c", 4, False), (2, None, "u", 6, True)])
    )
    assert got == {(10,), (20,), (30,)} and subs.owners == {(2,): (30,)}
    users = _Input(DerivedInputSettings(name="u", table="a.u", key="id"), "x", ["id"])
    assert touched_keys(users, changes([(7, 0, "d", 1, False)])) == {(7,)}
    events = _Input(DerivedInputSettings(name="e", table="a.e", key="user_id"), "x", [])
    assert touched_keys(events, changes([(1, 40, "c", 1, False), (2, None, "c", 2, False)])) == {(40,)}
