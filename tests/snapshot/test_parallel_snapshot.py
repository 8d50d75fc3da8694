"""The parallel snapshot (`lakestream snapshot`) against real PostgreSQL, Spark, Iceberg and Debezium:
tables loaded in chunks while writes go on, handed over to Debezium's stream at the slot's
consistent point, then `verify` — including a snapshot killed midway and resumed."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import pytest
import yaml
from conftest import catalog_settings

from lakestream.capture import CaptureProcess
from lakestream.capture.handover import handover_properties
from lakestream.capture.process import LAKESTREAM_COMMAND
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.errors import CaptureError
from lakestream.snapshot import SnapshotError, run_snapshot
from lakestream.snapshot.chunks import KILL_AFTER_CHUNKS_ENV, read_snapshot_state
from lakestream.verify.compare import verify_tables

ROWS = 12_000
SETUP = [
    """CREATE TABLE items (id bigint PRIMARY KEY, qty int, price numeric(10,2), name text, created timestamptz,
       day date, ts timestamp, flag boolean, ratio double precision, t time, payload jsonb, raw bytea, u uuid,
       big numeric, iv interval)""",
    f"""INSERT INTO items SELECT g, g % 100, (g % 1000) / 7.0, 'name ' || g, now() - g * interval '1 second',
       current_date - (g % 300), timestamp '2024-01-01' + g * interval '1 ms', g % 2 = 0, g / 3.0,
       time '10:00' + g * interval '1 s', jsonb_build_object('g', g), decode(lpad(to_hex(g), 8, '0'), 'hex'),
       gen_random_uuid(), g * 1.5, make_interval(days => g % 40, secs => g % 60) FROM generate_series(1, {ROWS}) g""",
    "CREATE TABLE tags (code text PRIMARY KEY, label text)",
    f"INSERT INTO tags SELECT 'c' || g, 'label ' || g FROM generate_series(1, {ROWS // 4}) g",
    "ANALYZE",
]
TABLES = ["public.items", "public.tags"]


class Source:
    """A fresh source database with a pipeline config whose capture uses the parallel snapshot."""

    def __init__(self, stack, label: str, setup: list[str] = SETUP, tables: list[str] = TABLES):
        uid = uuid.uuid4().hex[:6]
        self.stack, self.dbname, self.prefix = stack, f"src_{label}_{uid}", f"{label}{uid}"
        admin = psycopg2.connect(stack.pg_dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.dbname}")
        admin.close()
        self.conn = psycopg2.connect(stack.pg_dsn(self.dbname))
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            for stmt in setup:
                cur.execute(stmt)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"lakestream-{label}-"))
        self.data = {
            "name": self.prefix,
            "kafka": {
                "bootstrap_servers": stack.bootstrap_servers,
                "group_id": f"lakestream-{self.prefix}",
                "client": {"session.timeout.ms": 6000},
            },
            "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
            "streams": [{"topic_pattern": rf"{self.prefix}\.public\..*", "namespace": self.prefix, "table": "{table}"}],
            "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
            "spark": {"master": "local[2]", "driver_memory": "1500m"},
            "state_dir": str(self.workdir / "state"),
            "capture": {
                "database": {
                    "host": stack.pg_host,
                    "port": stack.pg_port,
                    "dbname": self.dbname,
                    "user": stack.pg_user,
                    "password": stack.pg_password,
                },
                "tables": tables,
                "topic_prefix": self.prefix,
                "slot_name": f"slot_{self.prefix}",
                "publication_name": f"pub_{self.prefix}",
                "snapshot": "parallel",
                "snapshot_chunk_rows": 2_000,
                "connector": {"heartbeat.interval.ms": "1000"},
            },
        }
        self.config = parse_config(self.data, "<snapshot test>")
        self.yaml = self.workdir / "pipeline.yaml"
        self.yaml.write_text(yaml.safe_dump(self.data))
        self.capture: CaptureProcess | None = None

    def close(self) -> None:
        if self.capture is not None:
            self.capture.stop()
        self.conn.close()
        admin = psycopg2.connect(self.stack.pg_dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (self.dbname,),
            )
            cur.execute(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")
        admin.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def current_lsn(self) -> str:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return cur.fetchone()[0]

    def start_capture(self) -> None:
        """Start Debezium (parallel mode: streaming from the snapshot's handover point)."""
        self.capture = CaptureProcess(self.yaml, log_path=self.workdir / "capture.log").start()
        self.capture.wait_until_streaming(timeout=600)

    def wait_caught_up(self, timeout: float = 240.0) -> None:
        """Wait until the slot confirmed every change written so far: Debezium confirms a position only
        once Kafka took its events."""
        target = self.current_lsn()
        deadline = time.monotonic() + timeout
        while True:
            with self.conn.cursor() as cur:
                cur.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (target, self.config.capture.slot_name),
                )
                row = cur.fetchone()
            if row and row[0]:
                return
            assert time.monotonic() < deadline, f"Debezium did not catch up:\n{self.capture.log_text()[-3000:]}"
            assert self.capture.running, self.capture.log_text()[-3000:]
            time.sleep(0.5)


class Writer(threading.Thread):
    """Inserts, updates and deletes on both tables until stopped (one change per transaction)."""

    def __init__(self, stack, dbname: str):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(stack.pg_dsn(dbname))
        self.conn.autocommit = True
        self.stop_event = threading.Event()
        self.changes = 0
        self.rng = random.Random(7)
        self.next_id = ROWS + 1

    def step(self, cur) -> None:
        r = self.rng.random()
        key = self.rng.randint(1, ROWS)
        if r < 0.35:
            cur.execute(
                "INSERT INTO items (id, qty, name, created, payload) VALUES (%s, 1, 'new', now(), '{}')",
                (self.next_id,),
            )
            self.next_id += 1
        elif r < 0.75:
            cur.execute("UPDATE items SET qty = qty + 1, name = name || '+', price = price + 1 WHERE id = %s", (key,))
        elif r < 0.85:
            cur.execute("DELETE FROM items WHERE id = %s", (key,))
        elif r < 0.95:
            cur.execute("UPDATE tags SET label = label || '!' WHERE code = %s", (f"c{key % (ROWS // 4) + 1}",))
        else:
            cur.execute(
                "INSERT INTO tags VALUES (%s, 'fresh') ON CONFLICT (code) DO UPDATE SET label = 'again'",
                (f"n{self.rng.randint(1, 500)}",),
            )

    def run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.stop_event.is_set():
                self.step(cur)
                self.changes += 1
                time.sleep(0.002)

    def burst(self, n: int) -> None:
        with self.conn.cursor() as cur:
            for _ in range(n):
                self.step(cur)
                self.changes += 1

    def stop(self) -> int:
        self.stop_event.set()
        if self.is_alive():
            self.join(30)
        self.conn.close()
        return self.changes


def _assert_mirror_exact(source: Source, spark) -> None:
    results = run_pipeline(source.config, spark=spark, stop_when_idle=True)
    assert sum(r.records for r in results) > 0, "the stream carried no change: the handover was not exercised"
    report = verify_tables(source.config, spark, tables=TABLES)
    assert report.ok, report.to_text()
    assert all(t.duplicate_keys == 0 for t in report.tables)


def test_snapshot_while_writing_hands_over_exactly(stack, spark):
    source = Source(stack, "snapw")
    writer = Writer(stack, source.dbname)
    try:
        writer.start()
        progress_seen: list[int] = []
        report = run_snapshot(
            source.config,
            spark=spark,
            progress_interval_s=0.5,
            on_progress=lambda tables: progress_seen.append(sum(t.chunks_done for t in tables)),
        )
        during = writer.changes
        assert during > 0, "no write happened during the snapshot"
        assert report.tables[1].rows >= ROWS // 4  # plus the tags the writer inserted before the slot
        assert report.tables[0].chunks_total >= 5 and report.tables[0].chunks_done == report.tables[0].chunks_total
        assert progress_seen and progress_seen[-1] == sum(t.chunks_total for t in report.tables)
        state = read_snapshot_state(spark, f"lake.{source.prefix}.items")
        assert state["complete"] and state["slot"] == source.config.capture.slot_name
        # A second run has nothing to do.
        assert run_snapshot(source.config, spark=spark).already_complete
        time.sleep(1.0)  # writes after the snapshot, before Debezium starts: the stream must carry them
        source.start_capture()
        time.sleep(1.0)  # and writes while it streams
        writer.stop()
        source.wait_caught_up()
        _assert_mirror_exact(source, spark)
    finally:
        writer.stop()
        source.close()


def test_snapshot_killed_midway_resumes(stack, spark):
    source = Source(stack, "snapk")
    writer = Writer(stack, source.dbname)
    try:
        env = {**os.environ, KILL_AFTER_CHUNKS_ENV: "2"}
        killed = subprocess.run(
            [*LAKESTREAM_COMMAND, "snapshot", str(source.yaml)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        state = read_snapshot_state(spark, f"lake.{source.prefix}.items")
        done = sum(b - a + 1 for a, b in state["done"])
        assert 0 < done < len(state["chunks"]) and not state["complete"]
        # Changes after the crash: the resumed chunks see them, and so does the stream from the
        # original handover point (applied again on top: the latest change per key wins).
        writer.burst(300)
        with pytest.raises(CaptureError, match="no snapshot finished"):
            handover_properties(source.config, {})  # Debezium must not stream the slot before the snapshot is done
        report = run_snapshot(source.config, spark=spark)
        assert report.resumed and report.tables[0].resumed_chunks == done
        assert report.tables[0].chunks_done == report.tables[0].chunks_total and report.tables[0].rows > 0
        state = read_snapshot_state(spark, f"lake.{source.prefix}.items")
        assert state["complete"] and sum(b - a + 1 for a, b in state["done"]) == len(state["chunks"])
        writer.burst(300)
        source.start_capture()
        source.wait_caught_up()
        _assert_mirror_exact(source, spark)
    finally:
        writer.stop()
        source.close()


def test_a_value_that_does_not_fit_stops_with_the_table_and_key_range(stack, spark):
    source = Source(
        stack,
        "snapbad",
        [
            "CREATE TABLE days (id int PRIMARY KEY, d date)",
            "INSERT INTO days VALUES (1, '2024-01-01'), (2, 'infinity'), (3, NULL)",
        ],
        ["public.days"],
    )
    try:
        with pytest.raises(SnapshotError, match=r"public\.days rows with key in \[None, None\).*fix"):
            run_snapshot(source.config, spark=spark)
        state = read_snapshot_state(spark, f"lake.{source.prefix}.days")
        assert state is None  # nothing of the failed chunk was committed
    finally:
        source.close()


def test_interrupted_snapshot_of_a_keyless_table_is_refused_with_the_fix(stack, spark, monkeypatch):
    """A table without a key is committed in one piece (all its chunks at the handover point, or none): a
    resumed run could only read it later, and the stream would then add the rows inserted in between twice."""
    from lakestream.snapshot import chunks

    setup = [
        *SETUP,
        "CREATE TABLE log (msg text, n int)",
        "INSERT INTO log SELECT 'm' || (g % 10), g % 3 FROM generate_series(1, 6000) g",
        "ANALYZE",
    ]
    source = Source(stack, "snapkl", setup, ["public.items", "public.log"])
    monkeypatch.setattr(chunks, "COMMIT_EVERY_S", 0.0)  # every finished chunk commits at once

    def interrupt(tables) -> None:
        if any(t.source == "public.items" and t.rows for t in tables):
            raise KeyboardInterrupt("interrupted snapshot")

    try:
        with pytest.raises(KeyboardInterrupt):
            run_snapshot(source.config, spark=spark, progress_interval_s=0.2, on_progress=interrupt, parallelism=1)
        assert read_snapshot_state(spark, f"lake.{source.prefix}.items")["done"]
        assert read_snapshot_state(spark, f"lake.{source.prefix}.log") is None  # nothing of it committed
        with pytest.raises(SnapshotError, match=r"had not finished \['public.log'\], without a primary key.*fix"):
            run_snapshot(source.config, spark=spark)
    finally:
        source.close()


KINDS_SETUP = [
    # a partitioned parent: a range partition, a sub-partitioned one (by hash) and a DEFAULT partition
    "CREATE TABLE events (id int, ts date, v text, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)",
    "CREATE TABLE events_2020 PARTITION OF events FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')",
    "CREATE TABLE events_2021 PARTITION OF events FOR VALUES FROM ('2021-01-01') TO ('2022-01-01') "
    "PARTITION BY HASH (id)",
    "CREATE TABLE events_2021_h0 PARTITION OF events_2021 FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
    "CREATE TABLE events_2021_h1 PARTITION OF events_2021 FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
    "CREATE TABLE events_other PARTITION OF events DEFAULT",
    "INSERT INTO events SELECT g, date '2020-01-01' + (g % 1000), 'v' || g FROM generate_series(1, 3000) g",
    # without a primary key: insert-only, and REPLICA IDENTITY FULL; many rows are equal
    "CREATE TABLE log_plain (msg text, n int)",
    "INSERT INTO log_plain SELECT 'm' || (g % 40), g % 7 FROM generate_series(1, 2000) g",
    "CREATE TABLE log_full (msg text, n int, at date)",
    "ALTER TABLE log_full REPLICA IDENTITY FULL",
    "INSERT INTO log_full SELECT 'f' || (g % 60), g % 3, date '2024-01-01' + g % 5 FROM generate_series(1, 2000) g",
    "ANALYZE",
]
KINDS = ["public.events", "public.log_plain", "public.log_full"]


class KindsWriter(Writer):
    """Changes of every kind on the partitioned and keyless tables, one per transaction: rows moved between
    partitions, deleted, inserted into each partition; equal rows inserted; one of several equal rows updated."""

    def __init__(self, stack, dbname: str, first_id: int = 10_000, seed: int = 7):
        super().__init__(stack, dbname)
        self.next_id = first_id
        self.rng = random.Random(seed)

    def step(self, cur) -> None:
        r = self.rng.random()
        key = self.rng.randint(1, 3000)
        if r < 0.2:
            cur.execute(
                "INSERT INTO events VALUES (%s, date '2020-01-01' + %s, 'new')",
                (self.next_id, self.rng.randint(0, 1200)),
            )
            self.next_id += 1
        elif r < 0.35:  # the partition key changes: the row moves to another partition
            cur.execute("UPDATE events SET ts = ts + 400, v = v || '>' WHERE id = %s", (key,))
        elif r < 0.45:
            cur.execute("DELETE FROM events WHERE id = %s", (key,))
        elif r < 0.7:
            cur.execute("INSERT INTO log_plain VALUES ('w', %s)", (self.rng.randint(0, 2),))
        elif r < 0.9:
            cur.execute(
                "UPDATE log_full SET n = n + 10 WHERE ctid = (SELECT ctid FROM log_full WHERE msg = %s LIMIT 1)",
                (f"f{self.rng.randint(1, 5)}",),
            )
        else:
            cur.execute("DELETE FROM log_full WHERE ctid = (SELECT ctid FROM log_full WHERE msg = 'f6' LIMIT 1)")


def kinds_source(stack) -> Source:
    """A source with a partitioned parent and two tables without a primary key, in small chunks."""
    source = Source(stack, "kinds", KINDS_SETUP, KINDS)
    source.data["capture"]["snapshot_chunk_rows"] = 400
    source.config = parse_config(source.data, "<kinds test>")
    source.yaml.write_text(yaml.safe_dump(source.data))
    return source


def load_kinds(source: Source, spark) -> int:
    """The parallel snapshot of `KINDS` while `KindsWriter` writes, handed over to capture, streamed by the
    pipeline: `verify` exact. Leaves capture running; returns the writer's next id."""
    writer = KindsWriter(source.stack, source.dbname)
    lake = {t: f"lake.{source.prefix}.{t.split('.')[1]}" for t in KINDS}
    try:
        writer.start()  # writes go on during the snapshot and its handover
        report = run_snapshot(source.config, spark=spark)
        assert writer.changes > 0, "no write happened during the snapshot"
        by_name = {t.source: t for t in report.tables}
        state = read_snapshot_state(spark, lake["public.events"])
        leaves = {tuple(c["relation"]) for c in state["chunks"]}
        assert leaves == {
            ("public", "events_2020"),
            ("public", "events_2021_h0"),
            ("public", "events_2021_h1"),
            ("public", "events_other"),
        }, state["chunks"]
        assert by_name["public.events"].chunks_total > len(leaves)
        for keyless in ("public.log_plain", "public.log_full"):
            assert by_name[keyless].chunks_total >= 3, by_name[keyless]  # block ranges, read in parallel
        # One commit for a table without a key (a crash cannot leave part of it to a later snapshot).
        assert len(spark.sql(f"SELECT * FROM {lake['public.log_plain']}.snapshots").collect()) == 1
        assert spark.sql(f"SELECT count(*) FROM {lake['public.log_plain']} WHERE msg = 'm1'").first()[0] >= 50
        source.start_capture()
        time.sleep(1.0)  # writes while it streams
    finally:
        writer.stop()
    source.wait_caught_up()
    results = run_pipeline(source.config, spark=spark, stop_when_idle=True)
    assert sum(r.records for r in results) > 0, "the stream carried no change: the handover was not exercised"
    report = verify_tables(source.config, spark, tables=KINDS)
    assert report.ok, report.to_text()
    return writer.next_id


def test_partitioned_and_keyless_tables_snapshot_exactly(stack, spark):
    """The parallel snapshot of a partitioned parent (read leaf by leaf, a sub-partitioned and a DEFAULT partition
    too, into its one mirror) and of tables without a primary key (block ranges, equal rows kept, one commit),
    handed over to the stream while writes go on (rows moving between partitions, equal rows inserted, one of
    several equal rows updated or deleted): `verify` exact."""
    source = kinds_source(stack)
    try:
        load_kinds(source, spark)
    finally:
        source.close()
