"""Fresh reads (`read_table(..., fresh=True)`, `lakestream query --fresh`): the committed snapshot plus
the Kafka tail beyond its stored offsets, against real Debezium capture of a real PostgreSQL.

With the pipeline stopped, a fresh read shows source changes a plain read does not; once the pipeline
commits them, both agree. The latency source commit → visible through a fresh read is measured."""

from __future__ import annotations

import decimal
import json
import statistics
import sys
import time
import uuid

import pytest
from capture_harness import start_captured_source, stop_captured_source
from conftest import produce_records, run_lakestream, write_pipeline_yaml

from lakestream.decode.types import UNAVAILABLE_VALUE
from lakestream.engine.loop import run_pipeline
from lakestream.errors import QueryError
from lakestream.read.query import read_table

# ~20 KB of md5 hex: stored out of line (TOAST), so an update that leaves it alone does not carry it
BIG_VALUE_SQL = "(SELECT string_agg(md5(i::text || random()::text), '') FROM generate_series(1, 640) AS i)"
SETUP = [
    "CREATE TABLE public.fresh_orders (id integer PRIMARY KEY, status text, amount numeric(10,2), note text)",
    "INSERT INTO public.fresh_orders VALUES (1, 'new', 1.50, 'a'), (2, 'new', 2.50, 'b'), (3, 'new', 3.50, 'c')",
    "CREATE TABLE public.fresh_toast (id integer PRIMARY KEY, body text, n integer)",
    f"INSERT INTO public.fresh_toast VALUES (1, {BIG_VALUE_SQL}, 1)",
]
D = decimal.Decimal


@pytest.fixture(scope="module")
def src(stack, spark):
    source = start_captured_source(stack, SETUP, ["fresh_orders", "fresh_toast"], "fresh")
    try:
        yield source
    finally:
        stop_captured_source(source)


def by_id(table) -> dict[int, tuple]:
    return {r["id"]: (r["status"], r["amount"]) for r in table.to_pylist()}


def test_fresh_read_shows_the_uncommitted_tail_until_the_pipeline_commits_it(src, spark, stack, tmp_path):
    name = f"{src.namespace}.fresh_orders"
    src.sync({"fresh_orders": 3})
    committed = {1: ("new", D("1.50")), 2: ("new", D("2.50")), 3: ("new", D("3.50"))}
    assert by_id(read_table(src.config, name, "duckdb")) == committed
    assert by_id(read_table(src.config, name, "duckdb", fresh=True)) == committed  # no tail yet

    # The pipeline is stopped: these changes are in Kafka only.
    src.sql(
        "UPDATE public.fresh_orders SET status = 'paid' WHERE id = 1",
        "DELETE FROM public.fresh_orders WHERE id = 2",
        "INSERT INTO public.fresh_orders VALUES (4, 'new', 4.50, 'd')",
        "UPDATE public.fresh_orders SET amount = 9.99 WHERE id = 4",
    )
    src.wait_for_events({"fresh_orders": 3 + 1 + 2 + 1 + 1})  # a delete is followed by a tombstone
    expected = {1: ("paid", D("1.50")), 3: ("new", D("3.50")), 4: ("new", D("9.99"))}
    assert by_id(read_table(src.config, name, "duckdb")) == committed  # a plain read does not see them
    for engine in ("pyiceberg", "duckdb", "spark"):
        assert by_id(read_table(src.config, name, engine, fresh=True, spark=spark)) == expected, engine
    # The filter applies to the merged rows: the update moves row 1 into it, the delete takes row 2 out.
    paid = read_table(src.config, name, fresh=True, where="status = 'paid' OR id = 2", columns=["id", "status"])
    assert paid.to_pylist() == [{"id": 1, "status": "paid"}]
    with pytest.raises(QueryError, match="time travel"):
        read_table(src.config, name, fresh=True, snapshot_id=1)

    pipeline = str(write_pipeline_yaml(src.config, stack, tmp_path / "pipeline.yaml"))
    out = run_lakestream("query", pipeline, name, "--fresh", "--format", "json", "--limit", "0")
    assert out.returncode == 0, out.stderr
    assert {r["id"]: (r["status"], D(r["amount"])) for r in json.loads(out.stdout)} == expected
    out = run_lakestream("query", pipeline, name, "--format", "json", "--limit", "0")
    assert {r["id"] for r in json.loads(out.stdout)} == {1, 2, 3}

    src.run()  # the pipeline commits the same records: both reads agree
    assert by_id(read_table(src.config, name, "duckdb")) == expected
    assert by_id(read_table(src.config, name, "duckdb", fresh=True)) == expected


def test_latency_from_source_commit_to_a_fresh_read(src):
    """Source commit in PostgreSQL → Debezium → Kafka → visible to a fresh read (pipeline stopped)."""
    name = f"{src.namespace}.fresh_orders"
    read_started = time.monotonic()
    read_table(src.config, name, fresh=True, where="id = 3", columns=["note"])
    one_read = time.monotonic() - read_started
    latencies = []
    for i in range(5):
        started = time.monotonic()
        src.sql(f"UPDATE public.fresh_orders SET note = 'latency {i}' WHERE id = 3")
        while True:
            rows = read_table(src.config, name, fresh=True, where="id = 3", columns=["note"]).to_pylist()
            if rows == [{"note": f"latency {i}"}]:
                break
            assert time.monotonic() - started < 30, f"change {i} not visible after 30s: {rows}"
        latencies.append(time.monotonic() - started)
    print(
        f"\nfresh read: one read {one_read:.3f}s; source commit → visible "
        f"median {statistics.median(latencies):.3f}s, max {max(latencies):.3f}s "
        f"({', '.join(f'{x:.3f}' for x in latencies)})",
        file=sys.stderr,
    )
    assert statistics.median(latencies) < 10


def test_fresh_append_table_adds_rows_and_skips_known_ids(stack, spark, pipeline_config_factory):
    topic = f"fresh-clicks-{uuid.uuid4().hex[:6]}"
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": "fresh_append",
                "table": f"clicks_{topic[-6:]}",
                "dedupe_field": "event_id",
            }
        ],
        name=f"freshapp{topic[-6:]}",
    )
    name = f"fresh_append.clicks_{topic[-6:]}"

    def event(i: int, page: str) -> tuple[str, str]:
        return str(i), json.dumps({"event_id": i, "page": page})

    produce_records(stack.bootstrap_servers, topic, [event(1, "home"), event(2, "cart")], partition=0)
    run_pipeline(config, spark=spark, stop_when_idle=True)
    produce_records(
        stack.bootstrap_servers,
        topic,
        [event(3, "pay"), event(1, "home again"), ("x", "not json"), event(4, "done"), event(3, "dup")],
        partition=0,
    )
    pages = lambda t: sorted((r["event_id"], r["page"]) for r in t.to_pylist())  # noqa: E731
    assert pages(read_table(config, name)) == [(1, "home"), (2, "cart")]
    expected = [(1, "home"), (2, "cart"), (3, "pay"), (4, "done")]  # the first of an id wins; no dead letter
    assert pages(read_table(config, name, fresh=True)) == expected
    run_pipeline(config, spark=spark, stop_when_idle=True)
    assert pages(read_table(config, name)) == expected
    assert pages(read_table(config, name, fresh=True)) == expected


def test_fresh_read_fills_withheld_toast_values(src):
    """An update that leaves a TOASTed value alone arrives without it: the fresh read takes it from the
    key's previous version, in the snapshot or earlier in the tail, as the pipeline does."""
    name = f"{src.namespace}.fresh_toast"
    src.sync({"fresh_toast": 1})
    start = src.end_offset("fresh_toast")
    src.sql(
        "UPDATE public.fresh_toast SET n = 2 WHERE id = 1",
        f"INSERT INTO public.fresh_toast VALUES (2, {BIG_VALUE_SQL}, 1)",
        "UPDATE public.fresh_toast SET n = 5 WHERE id = 2",
    )
    src.wait_for_events({"fresh_toast": start + 3})
    updates = [m["value"] for m in src.published("fresh_toast")[start:] if m["value"]["op"] == "u"]
    assert [u["after"]["body"] for u in updates] == [UNAVAILABLE_VALUE] * 2  # really withheld
    with src.conn.cursor() as cur:
        cur.execute("SELECT id, body, n FROM public.fresh_toast")
        source = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
    fresh = {r["id"]: (r["body"], r["n"]) for r in read_table(src.config, name, fresh=True).to_pylist()}
    assert fresh == source
    src.run()
    assert {r["id"]: (r["body"], r["n"]) for r in read_table(src.config, name).to_pylist()} == source
