"""The Customer 360 example end to end (PostgreSQL workload → Debezium → mirrors → the derived table
customer_360, upserted by key on its commit interval), its table checked against the same SQL run from
scratch over the mirrors, and the mirrors against the source tables."""

from __future__ import annotations

import uuid

import pytest

from lakestream.demo.customer360 import Customer360Settings, run_customer360_demo


def _by_key(rows: list[dict]) -> dict[int, tuple]:
    out = {r["customer_id"]: tuple(sorted((k, v) for k, v in r.items() if k != "customer_id")) for r in rows}
    assert len(out) == len(rows), "duplicate customers"
    return out


# `make test-examples`; derived tables are covered in `make test` by tests/process/test_derived_tables.py
@pytest.mark.examples
def test_customer360_example_matches_its_sql_from_scratch(stack, spark, service_dir_factory, capsys):
    uid = uuid.uuid4().hex[:6]
    settings = Customer360Settings(
        state_dir=service_dir_factory("c360"),
        duration_s=12,
        per_s=12,
        seed=11,
        dbname=f"c360_{uid}",
        namespace=f"c360_{uid}",
        catchup_timeout_s=120,
    )
    result = run_customer360_demo(settings, info=stack, spark=spark)
    stats = result.stats
    # the load the derived table must follow: moves between plans and customers, deletes cascading
    assert stats.plan_changes and stats.transfers and stats.cancellations and stats.users_deleted, stats

    derived = result.config.derived_tables[0]
    for source in derived.inputs:
        spark.table(f"lake.{source.table}").createOrReplaceTempView(source.name)
    expected = _by_key([r.asDict() for r in spark.sql(derived.sql).collect()])
    got = _by_key(result.customers)
    assert sorted(got) == sorted(expected)  # deleted customers are gone, new ones are there
    differ = [k for k in expected if got[k] != expected[k]]
    assert not differ, f"{len(differ)} customer(s) differ, e.g. {differ[0]}: {got[differ[0]]} != {expected[differ[0]]}"
    assert any(r["mrr"] > 0 for r in result.customers) and any(r["plans"] for r in result.customers)

    # kept current by key on its interval, after one whole computation when it was created
    log = result.pipeline_log.read_text(errors="replace")
    assert "touched key(s) upserted" in log, log[-3000:]
    captured = capsys.readouterr()
    out = captured.out
    assert "customers by MRR:" in out and f"{derived.table}: {len(got)} customers" in out
    assert "[1/7]" not in out  # progress goes to stderr
    print(captured.err.strip())
    print(out)
    print("\n".join(line for line in log.splitlines() if "derived table" in line))
    print(
        f"customer360 example: {stats.changes} changes, {len(got)} customers, "
        f"{log.count('touched key(s) upserted')} upserts by key"
    )
