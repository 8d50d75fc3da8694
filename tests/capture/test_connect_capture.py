"""Debezium in Kafka Connect feeds the pipeline: a real Connect worker (distributed mode, from
``org.apache.kafka:connect-runtime``, Debezium's PostgreSQL connector as a plugin) runs the configuration that
`lakestream capture --print-connector-config` prints, posted as printed; the pipeline mirrors its topics
exactly through Debezium's snapshot, streaming changes, an added column, and a SIGKILL of the worker under a
write load (Debezium re-sends what came after its last offset flush). JSON with schemas on.

Real PostgreSQL, Kafka, Connect, Debezium, Spark and Iceberg. One worker for the module (`connect_worker`).
"""

from __future__ import annotations

import json
import os
import threading
import time

import psycopg2
import pytest
from capture_harness import (
    DEAD_LETTER,
    CapturedSource,
    ConnectCapture,
    prepare_captured_source,
    stop_captured_source,
    verify_ok,
)
from conftest import run_lakestream

from lakestream.config import parse_config
from lakestream.verify.compare import verify_tables

SETUP = [
    "CREATE TABLE public.orders (id integer PRIMARY KEY, amount numeric(10,2), note text, at timestamptz)",
    "INSERT INTO public.orders SELECT g, g * 1.25, 'order ' || g, timestamptz '2024-01-01 00:00+00' + g * interval "
    "'1 hour' FROM generate_series(1, 300) g",
    # Debezium names its topic <prefix>.public.a.b; the printed configuration renames it (RegexRouter) to the
    # topic lakestream reads, <prefix>.public.a_b
    'CREATE TABLE public."a.b" (id integer PRIMARY KEY, v text)',
    """INSERT INTO public."a.b" VALUES (1, 'dot'), (2, 'two')""",
    'CREATE TABLE public."Order Items" ("Id" integer PRIMARY KEY, "Qty" integer, nullable text DEFAULT \'dflt\')',
    """INSERT INTO public."Order Items" SELECT g, g, NULL FROM generate_series(1, 20) g""",
]
TABLES = ["orders", '"a.b"', '"Order Items"']
TOPICS = {"orders": 300, "a_b": 2, "Order_Items": 20}


@pytest.fixture(scope="module")
def src(stack, spark, connect_worker):
    """The pipeline's capture section, printed by the CLI as a Connect configuration, posted to the worker."""
    dbname, conn, prefix, namespace, data, workdir = prepare_captured_source(
        stack, SETUP, TABLES, "cx", extra={"capture": {"connector": {"heartbeat.interval.ms": "1000"}}}
    )
    secrets = workdir / "connect-secrets.properties"
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"database.password={stack.pg_password}\n")
    printed = run_lakestream(
        "capture",
        str(workdir / "pipeline.yaml"),
        "--print-connector-config",
        "--connect-secrets-file",
        str(secrets),
        timeout=120,
    )
    assert printed.returncode == 0, printed.stderr[-3000:]
    doc = json.loads(printed.stdout)
    assert doc["config"]["database.password"] == f"${{file:{secrets}:database.password}}"
    connect_worker.create_connector(doc)
    capture = ConnectCapture(connect_worker, doc["name"], stack.pg_dsn(dbname), data["capture"]["slot_name"])
    source = CapturedSource(
        stack, dbname, conn, prefix, namespace, parse_config(data, "<connect test>"), capture, workdir
    )
    source.connector = doc
    try:
        capture.wait_until_running()
        source.sync(TOPICS)
        # What the snapshot loaded, as each mirror's snapshot at this point: the other tests of the module change
        # the tables after it, in whatever order they run.
        source.loaded = {
            t: spark.sql(f"SELECT snapshot_id FROM {source.table(t)}.snapshots ORDER BY committed_at DESC LIMIT 1")
            .first()
            .snapshot_id
            for t in ("orders", "a_b", "order_items")
        }
        yield source
    finally:
        stop_captured_source(source)


def _no_dead_letters(spark, source) -> None:
    if spark.catalog.tableExists(DEAD_LETTER):
        rows = spark.sql(f"SELECT topic, error FROM {DEAD_LETTER} WHERE topic LIKE '{source.prefix}.%'").collect()
        assert not rows, rows[:5]


def test_the_printed_configuration_runs_and_the_snapshot_is_mirrored_exactly(src, spark, connect_worker):
    stored = connect_worker.request("GET", f"/connectors/{src.connector['name']}/config")
    # the worker stores the placeholder and resolves it only when it starts the task
    assert stored["database.password"] == src.connector["config"]["database.password"]
    assert stored["database.password"].startswith("${file:")
    loaded = {t: f"{src.table(t)} VERSION AS OF {snapshot}" for t, snapshot in src.loaded.items()}
    assert spark.sql(f"SELECT count(*) FROM {loaded['orders']}").first()[0] == 300
    assert spark.sql(f"SELECT count(*) FROM {loaded['a_b']}").first()[0] == 2
    # an explicit NULL stays NULL (replace.null.with.default=false), not the column's default
    nulls = spark.sql(f"SELECT count(*) FROM {loaded['order_items']} WHERE nullable IS NULL").first()[0]
    assert nulls == 20
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)


def test_streaming_inserts_updates_and_deletes(src, spark):
    ends = {t: src.end_offset(t) for t in TOPICS}
    src.sql(
        "INSERT INTO public.orders VALUES (1001, 10.01, 'new', now()), (1002, NULL, NULL, NULL)",
        "UPDATE public.orders SET note = 'changed', amount = amount + 1 WHERE id <= 10",
        "DELETE FROM public.orders WHERE id BETWEEN 100 AND 104",
        """UPDATE public."a.b" SET v = 'still a dot' WHERE id = 1""",
        """DELETE FROM public."a.b" WHERE id = 2""",
        """UPDATE public."Order Items" SET "Qty" = -1 WHERE "Id" <= 3""",
    )
    src.sync(
        {"orders": ends["orders"] + 2 + 10 + 5 * 2, "a_b": ends["a_b"] + 1 + 2, "Order_Items": ends["Order_Items"] + 3}
    )
    # this test's rows only: the other tests of the module add rows above 1000 too
    changed = spark.table(src.table("orders")).where("id <= 10 OR id IN (1001, 1002)")
    notes = {r["id"]: r["note"] for r in changed.collect()}
    assert notes == {**{i: "changed" for i in range(1, 11)}, 1001: "new", 1002: None}
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)


def test_add_column_reaches_the_mirror(src, spark):
    start = src.end_offset("orders")
    src.sql(
        "ALTER TABLE public.orders ADD COLUMN loyalty integer",
        "INSERT INTO public.orders (id, note, loyalty) VALUES (2001, 'new shape', 7)",
        "UPDATE public.orders SET loyalty = 1 WHERE id = 1",
    )
    src.sync({"orders": start + 2})
    rows = {r["id"]: r["loyalty"] for r in spark.table(src.table("orders")).where("id IN (1, 2, 2001)").collect()}
    assert rows == {1: 1, 2: None, 2001: 7}
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)


def _write_load(dsn: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Inserts, updates and deletes on `orders` in small transactions until ``stop``; counts the Kafka messages
    they make (a delete is followed by its tombstone)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    next_id = 10_000
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO public.orders (id, amount, note) VALUES (%s, 1.00, 'load')", (next_id,))
                cur.execute("UPDATE public.orders SET amount = amount + 1 WHERE id = %s", (next_id - 1,))
                counts["messages"] += 2
                if next_id % 5 == 0:
                    cur.execute("DELETE FROM public.orders WHERE id = %s", (next_id - 3,))
                    counts["messages"] += 2
                next_id += 1
                time.sleep(0.01)
    finally:
        conn.close()


def test_sigkill_of_the_worker_under_load_and_its_restart_keep_the_mirror_exact(src, spark, connect_worker):
    """The worker dies with changes in flight; restarted, its connector resumes from the offsets flushed before
    the kill and Debezium re-sends what came after them. Kafka holds at least every change (re-sent ones twice);
    the pipeline mirrors the source exactly."""
    start = src.end_offset("orders")
    counts = {"messages": 0}
    stop = threading.Event()
    writer = threading.Thread(target=_write_load, args=(src.stack.pg_dsn(src.dbname), stop, counts), daemon=True)
    writer.start()
    try:
        # Until the load's changes are flowing through the connector (its offsets flushed at least once after).
        src.wait_for_events({"orders": start + 200}, timeout=180)
        connect_worker.kill()
        time.sleep(1)  # changes keep coming while no worker runs: the slot holds them
        connect_worker.start()
        src.capture.wait_until_running()
        time.sleep(2)
    finally:
        stop.set()
        writer.join(30)
    # Kafka holds at least one message per change, plus what was re-sent; the count alone cannot tell that the
    # last changes arrived (re-sent ones count too), so the mirror is read until it equals the source
    src.wait_for_events({"orders": start + counts["messages"]}, timeout=180)
    deadline = time.monotonic() + 120
    while True:
        src.run()
        report = verify_tables(src.config, spark, tables=[f"public.{t}" for t in TABLES])
        if report.ok or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert report.ok, report.to_text()
    _no_dead_letters(spark, src)
    resent = src.end_offset("orders") - start - counts["messages"]
    print(f"{counts['messages']} messages written by the load, {resent} re-sent after the SIGKILL")


def test_a_worker_refuses_a_connector_it_cannot_run_with_the_reason(connect_worker):
    """What a user sees when the worker lacks a plugin the configuration names (the Avro converter of a
    `capture.format: avro` configuration on a worker without it): the worker's own refusal, naming the class."""
    from lakestream.stack.connect import ConnectError

    doc = {
        "name": "cx-refused",
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "value.converter": "io.confluent.connect.avro.AvroConverter",
        },
    }
    with pytest.raises(ConnectError) as refused:
        connect_worker.create_connector(doc)
    assert refused.value.status == 400 and "io.confluent.connect.avro.AvroConverter" in str(refused.value)
