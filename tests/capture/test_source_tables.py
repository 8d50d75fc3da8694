"""Every kind of table a real PostgreSQL database holds, through real Debezium, Kafka, Spark and Iceberg:
quoted names, a partitioned table (partitions attached later, a row moving between partitions), tables
without a primary key (insert-only, and REPLICA IDENTITY FULL with duplicate rows), re-sent events, and
a pgbench TPC-B-like load with capture SIGKILLed in the middle. Each scenario ends with `verify`.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest
from capture_harness import DEAD_LETTER, start_captured_source, stop_captured_source, verify_ok
from confluent_kafka import Consumer, Producer, TopicPartition

ODD = ['"Order Items"', '"select"', '"a.b"']
SETUP = [
    'CREATE TABLE public."Order Items" ("Id" int PRIMARY KEY, "Qty Ordered" int, "naïve col" text)',
    """INSERT INTO public."Order Items" SELECT g, g * 2, 'é' || g FROM generate_series(1, 20) g""",
    'CREATE TABLE public."select" (id int PRIMARY KEY, "from" text, "Where" int)',
    """INSERT INTO public."select" VALUES (1, 'x', 1), (2, 'y', 2)""",
    'CREATE TABLE public."a.b" (id int PRIMARY KEY, v text)',
    """INSERT INTO public."a.b" VALUES (1, 'dot')""",
    "CREATE TABLE public.events (id int, ts date, v text, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)",
    "CREATE TABLE public.events_2020 PARTITION OF public.events FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')",
    "CREATE TABLE public.events_2021 PARTITION OF public.events FOR VALUES FROM ('2021-01-01') TO ('2022-01-01')",
    "INSERT INTO public.events SELECT g, date '2020-06-01' + (g % 400), 'v' || g FROM generate_series(1, 200) g",
    "CREATE TABLE public.log_plain (msg text, n int, at timestamptz)",
    "INSERT INTO public.log_plain SELECT 'm' || (g % 3), g % 2, timestamptz '2024-01-01 00:00+00' "
    "FROM generate_series(1, 12) g",
    "CREATE TABLE public.log_full (msg text, n int)",
    "ALTER TABLE public.log_full REPLICA IDENTITY FULL",
    "INSERT INTO public.log_full VALUES ('a', 1), ('a', 1), ('b', 2), ('c', 3), ('c', 3), ('c', 3)",
    # pgbench's own tables, as `pgbench -i` makes them (2 branches, 20 tellers, 5,000 accounts: small, so
    # the test stays short); the history table has no primary key
    "CREATE TABLE pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))",
    "CREATE TABLE pgbench_tellers (tid int NOT NULL PRIMARY KEY, bid int, tbalance int, filler char(84))",
    "CREATE TABLE pgbench_accounts (aid int NOT NULL PRIMARY KEY, bid int, abalance int, filler char(84))",
    "CREATE TABLE pgbench_branches (bid int NOT NULL PRIMARY KEY, bbalance int, filler char(88))",
    "INSERT INTO pgbench_branches SELECT g, 0 FROM generate_series(1, 2) g",
    "INSERT INTO pgbench_tellers SELECT g, (g - 1) / 10 + 1, 0 FROM generate_series(1, 20) g",
    "INSERT INTO pgbench_accounts SELECT g, (g - 1) / 2500 + 1, 0, '' FROM generate_series(1, 5000) g",
]
PGBENCH = ["pgbench_history", "pgbench_tellers", "pgbench_accounts", "pgbench_branches"]
TABLES = [*ODD, "events", "log_plain", "log_full", *PGBENCH]
TOPICS = {
    "Order_Items": 20,
    "select": 2,
    "a_b": 1,
    "events": 200,
    "log_plain": 12,
    "log_full": 6,
    "pgbench_tellers": 20,
    "pgbench_accounts": 5000,
    "pgbench_branches": 2,
}
PGBENCH_BIN = "/usr/lib/postgresql/15/bin/pgbench"  # from postgresql-15, which bootstrap.sh installs


@pytest.fixture(scope="module")
def src(stack, spark):
    source = start_captured_source(
        stack, SETUP, TABLES, "tbl", extra={"capture": {"connector": {"heartbeat.interval.ms": "1000"}}}
    )
    try:
        source.sync(TOPICS)
        # What the snapshot loaded, as each mirror's snapshot at this point: the other tests of the module change
        # the tables after it, in whatever order they run.
        source.loaded = {
            t: spark.sql(f"SELECT snapshot_id FROM {source.table(t)}.snapshots ORDER BY committed_at DESC LIMIT 1")
            .first()
            .snapshot_id
            for t in ("order_items", "a_b", "log_plain")
        }
        yield source
    finally:
        stop_captured_source(source)


def _no_dead_letters(spark, source) -> None:
    if spark.catalog.tableExists(DEAD_LETTER):
        rows = spark.sql(f"SELECT topic, error FROM {DEAD_LETTER} WHERE topic LIKE '{source.prefix}.%'").collect()
        assert not rows, rows[:5]


def _count(spark, source, table: str) -> int:
    return spark.table(source.table(table)).count()


def _loaded_count(spark, source, table: str) -> int:
    """Rows of ``table``'s mirror as the snapshot loaded them."""
    return spark.sql(f"SELECT * FROM {source.table(table)} VERSION AS OF {source.loaded[table]}").count()


def test_snapshot_of_every_kind_of_table(src, spark):
    # the names PostgreSQL has, through topics (one rule) to mirrors (lower-cased), then verify quotes them
    assert _loaded_count(spark, src, "order_items") == 20
    assert _loaded_count(spark, src, "a_b") == 1
    assert set(spark.table(src.table("order_items")).columns) == {"Id", "Qty Ordered", "naïve col"}
    assert _loaded_count(spark, src, "log_plain") == 12  # duplicates and all: a multiset
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)


def test_streaming_changes_of_every_kind_of_table(src, spark):
    ends = {t: src.end_offset(t) for t in TOPICS}
    src.sql(
        'UPDATE public."Order Items" SET "Qty Ordered" = -1, "naïve col" = NULL WHERE "Id" <= 5',
        'DELETE FROM public."Order Items" WHERE "Id" = 20',
        """INSERT INTO public."select" VALUES (3, 'z''"`', 3)""",
        """UPDATE public."a.b" SET v = 'still a dot'""",
        # partitioned: inserts into both partitions, a partition-key update (moves the row), a delete, and a
        # partition created after capture started
        "INSERT INTO public.events VALUES (1001, '2020-03-03', 'new'), (1002, '2021-03-03', 'new')",
        "UPDATE public.events SET ts = '2021-07-07', v = 'moved' WHERE id = 1 AND ts = '2020-06-02'",
        "DELETE FROM public.events WHERE id BETWEEN 10 AND 14",
        "CREATE TABLE public.events_2022 PARTITION OF public.events FOR VALUES FROM ('2022-01-01') TO ('2023-01-01')",
        "INSERT INTO public.events VALUES (2001, '2022-02-02', 'later partition')",
        "UPDATE public.events SET ts = '2022-05-05' WHERE id = 2",
        # keyless, insert-only: duplicates stay duplicates
        "INSERT INTO public.log_plain VALUES ('m0', 0, NULL), ('m0', 0, NULL), ('new', 1, now())",
        # keyless, REPLICA IDENTITY FULL: one of two equal rows changes, one of three is deleted
        "UPDATE public.log_full SET n = 10 WHERE ctid = (SELECT ctid FROM public.log_full WHERE msg = 'a' LIMIT 1)",
        "DELETE FROM public.log_full WHERE ctid = (SELECT ctid FROM public.log_full WHERE msg = 'c' LIMIT 1)",
        "UPDATE public.log_full SET msg = 'B' WHERE msg = 'b'",
    )
    expected = dict(ends)
    expected.update(
        {
            "Order_Items": ends["Order_Items"] + 5 + 2,
            "select": ends["select"] + 1,
            "a_b": ends["a_b"] + 1,
            "log_plain": ends["log_plain"] + 3,
            "log_full": ends["log_full"] + 3,
            "events": ends["events"] + 2 + 3 + 5 * 2 + 1 + 3,
        }
    )
    src.sync(expected)
    rows = {tuple(r) for r in spark.sql(f"SELECT msg, n FROM {src.table('log_full')}").collect()}
    with src.conn.cursor() as cur:
        cur.execute("SELECT msg, n FROM public.log_full")
        assert rows == {tuple(r) for r in cur.fetchall()}
    # ('B', n): n is 2, or 11 when the re-send test ran first
    assert {("a", 1), ("a", 10), ("c", 3)} < rows and {msg for msg, _ in rows} == {"a", "B", "c"}
    assert _count(spark, src, "log_full") == 5  # ('c', 3) twice
    moved = spark.sql(f"SELECT ts FROM {src.table('events')} WHERE id = 1").collect()
    assert [str(r[0]) for r in moved] == ["2021-07-07"]  # one row: the partition-key update is one update
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)


def test_resent_events_of_a_keyless_table_are_left_out(src, spark):
    """Debezium re-sends the events since its last offset flush after a crash: the same bytes again, at new
    Kafka offsets. Here the test re-sends the keyless tables' latest events itself, as Debezium would: its own
    streamed changes, whichever tests ran before (a snapshot event is re-sent only by a snapshot taken again)."""
    starts = {table: src.end_offset(table) for table in ("log_plain", "log_full")}
    src.sql(
        "INSERT INTO public.log_plain VALUES ('dup?', 7, NULL), ('dup?', 7, NULL)",
        "UPDATE public.log_full SET n = 11 WHERE msg IN ('b', 'B')",  # 'b' until the streaming test renames it
    )
    src.wait_for_events({"log_plain": starts["log_plain"] + 2, "log_full": starts["log_full"] + 1})
    time.sleep(2)
    for table in ("log_plain", "log_full"):
        topic = src.topic(table)
        end = src.end_offset(table)
        last = end - starts[table]
        consumer = Consumer(
            {
                "bootstrap.servers": src.stack.bootstrap_servers,
                "group.id": f"re-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, 0, starts[table])])
        records = []
        while len(records) < last:
            msg = consumer.poll(5)
            assert msg is not None, f"could not read back {topic}"
            if not msg.error():
                records.append((msg.key(), msg.value()))
        consumer.close()
        producer = Producer({"bootstrap.servers": src.stack.bootstrap_servers})
        for key, value in records:
            producer.produce(topic, key=key, value=value, partition=0)
        producer.flush(10)
    src.run()
    assert spark.sql(f"SELECT count(*) FROM {src.table('log_plain')} WHERE msg = 'dup?'").collect()[0][0] == 2
    verify_ok(src, spark, ["log_plain", "log_full"])
    _no_dead_letters(spark, src)


def test_pgbench_load_with_a_capture_kill_in_the_middle(src, spark):
    """A TPC-B-like load (pgbench's built-in script: three updates, a select and an insert into the keyless
    history table per transaction) while capture and the pipeline run; capture is SIGKILLed in the middle and
    started again, so Debezium re-sends what it had not flushed. The mirror must still be exact."""
    import threading

    from lakestream.engine.loop import run_pipeline

    assert os.path.exists(PGBENCH_BIN), "pgbench is part of postgresql-15 (scripts/bootstrap.sh installs it)"
    stack = src.stack
    env = {**os.environ, "PGPASSWORD": stack.pg_password}
    load = subprocess.Popen(
        [
            PGBENCH_BIN,
            "-n",
            "-c",
            "4",
            "-j",
            "2",
            "-T",
            "14",
            "-R",
            "250",
            "-h",
            stack.pg_host,
            "-p",
            str(stack.pg_port),
            "-U",
            stack.pg_user,
            src.dbname,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stop = threading.Event()
    runner = threading.Thread(
        target=run_pipeline, kwargs={"config": src.config, "stop": stop, "spark": spark}, daemon=True
    )
    runner.start()
    try:
        time.sleep(5)
        history_before = src.end_offset("pgbench_history")
        src.capture.kill()  # SIGKILL: events since the last offset flush come again after the restart
        time.sleep(2)
        src.capture.start()
        src.capture.wait_until_streaming(timeout=180)
        out, _ = load.communicate(timeout=120)
        assert load.returncode == 0, out
        with src.conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pgbench_history")
            transactions = cur.fetchone()[0]
        assert transactions > 1000 and history_before > 0, out
        # every history row has been published (some twice, after the kill); then the pipeline drains
        deadline = time.monotonic() + 180
        while src.end_offset("pgbench_history") < transactions and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        stop.set()
        runner.join(timeout=300)
        if load.poll() is None:
            load.kill()
    src.run()
    published = src.end_offset("pgbench_history")
    print(
        f"pgbench: {transactions} transactions, {published} history events published "
        f"({published - transactions} re-sent after the kill)"
    )
    verify_ok(src, spark, TABLES)
    _no_dead_letters(spark, src)
