"""The long object-storage scenarios (`make test-storage`; marker ``storage_slow``, left out of `make test`):
an S3-compatible store behind a REST catalog, loaded by the parallel snapshot, then streamed while the
pipeline process is SIGKILLed under load, then an outage of the store during a batch. `verify` must be
exact after each: no missing row, no extra row, no duplicate key.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import pytest
import yaml
from conftest import storage_env, storage_section

from lakestream.capture import CaptureProcess
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.runtime.spark import build_session
from lakestream.snapshot import run_snapshot
from lakestream.verify.compare import verify_tables

pytestmark = pytest.mark.storage_slow

ROWS = 20_000
TABLES = ["public.acc"]
CREDENTIAL_ENV = "LAKESTREAM_TEST_REST_CREDENTIAL"


class Writer(threading.Thread):
    """Inserts, updates and deletes on ``acc`` (one change per transaction) until stopped."""

    def __init__(self, dsn: str):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.stop_event = threading.Event()
        self.rng = random.Random(11)
        self.next_id = ROWS + 1
        self.changes = 0

    def run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.stop_event.is_set():
                r, key = self.rng.random(), self.rng.randint(1, ROWS)
                if r < 0.3:
                    cur.execute("INSERT INTO acc VALUES (%s, 0, 'new')", (self.next_id,))
                    self.next_id += 1
                elif r < 0.85:
                    cur.execute("UPDATE acc SET balance = balance + 1, note = 'u' WHERE id = %s", (key,))
                else:
                    cur.execute("DELETE FROM acc WHERE id = %s", (key,))
                self.changes += 1
                time.sleep(0.01)

    def stop(self) -> int:
        self.stop_event.set()
        if self.is_alive():
            self.join(30)
        self.conn.close()
        return self.changes


@pytest.fixture(scope="module")
def source(stack, spark, object_store, rest_catalog_factory, tmp_path_factory):
    credential = f"lakestream-test:{uuid.uuid4().hex}"
    os.environ.update(storage_env(object_store))
    os.environ[CREDENTIAL_ENV] = credential
    rest = rest_catalog_factory(
        f"{object_store.warehouse}/slow", store=object_store, credential=credential, backend="obj_slow"
    )
    uid = uuid.uuid4().hex[:6]
    dbname, prefix = f"src_objslow_{uid}", f"objslow{uid}"
    admin = psycopg2.connect(stack.pg_dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {dbname}")
    conn = psycopg2.connect(stack.pg_dsn(dbname))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE acc (id bigint PRIMARY KEY, balance bigint NOT NULL, note text)")
        cur.execute(f"INSERT INTO acc SELECT g, g % 1000, 'seed ' || g FROM generate_series(1, {ROWS}) g")
        cur.execute("ANALYZE")
    workdir = Path(tmp_path_factory.mktemp("objslow"))
    data = {
        "name": prefix,
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-{prefix}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": {
            "name": "slowlake",
            "type": "rest",
            "uri": rest.uri,
            "warehouse": rest.warehouse,
            "credential_env": CREDENTIAL_ENV,
        },
        "storage": storage_section(object_store),
        "streams": [{"topic_pattern": rf"{prefix}\.public\..*", "namespace": prefix, "table": "{table}"}],
        "engine": {"commit_interval_s": 1, "idle_poll_s": 0.2, "max_outage_s": 300},
        "spark": {"master": "local[2]", "driver_memory": "1g"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": dbname,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": TABLES,
            "topic_prefix": prefix,
            "slot_name": f"slot_{prefix}",
            "publication_name": f"pub_{prefix}",
            "snapshot": "parallel",
            "snapshot_chunk_rows": 4_000,
            "connector": {"heartbeat.interval.ms": "1000"},
        },
    }
    yaml_path = workdir / "pipeline.yaml"
    yaml_path.write_text(yaml.safe_dump(data))
    config = parse_config(data, "<objslow>")
    build_session(config.catalog, config.spark)
    capture = None
    ns = type("Source", (), {})()
    ns.config, ns.yaml, ns.workdir, ns.conn, ns.dsn, ns.store = (
        config,
        yaml_path,
        workdir,
        conn,
        stack.pg_dsn(dbname),
        object_store,
    )
    try:
        yield ns
    finally:
        capture = getattr(ns, "capture", None)
        if capture is not None:
            capture.stop()
        conn.close()
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (dbname,),
            )
            cur.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        admin.close()


def _wait_caught_up(source, timeout: float = 300.0) -> None:
    """Until the slot confirmed every change written so far (Debezium confirms once Kafka took them)."""
    with source.conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        target = cur.fetchone()[0]
    deadline = time.monotonic() + timeout
    while True:
        with source.conn.cursor() as cur:
            cur.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (target, source.config.capture.slot_name),
            )
            row = cur.fetchone()
        if row and row[0]:
            return
        assert time.monotonic() < deadline, source.capture.log_text()[-3000:]
        time.sleep(0.5)


def _verify_exact(source, spark) -> None:
    report = verify_tables(source.config, spark, tables=TABLES)
    assert report.ok, report.to_text()
    assert all(t.duplicate_keys == 0 for t in report.tables)


def _start_pipeline(source, log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "lakestream", "run", str(source.yaml)],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=source.workdir,
    )


def _wait_for_batch(log_path: Path, after: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while log_path.read_text(errors="replace")[after:].count("INFO lakestream.engine.loop: batch ") == 0:
        assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
        time.sleep(0.5)


def _snapshot_then_capture(source, spark):
    """The parallel snapshot into S3, then capture streaming from its handover point (once per module: each test
    that needs the mirror loaded calls it, so any of them runs alone)."""
    report = run_snapshot(source.config, spark=spark)
    source.capture = CaptureProcess(source.yaml, log_path=source.workdir / "capture.log").start()
    source.capture.wait_until_streaming(timeout=600)
    return report


def test_parallel_snapshot_then_sigkills_under_load(source, spark):
    report = _snapshot_then_capture(source, spark)
    assert report.tables[0].rows == ROWS and report.tables[0].chunks_done >= 5
    files = spark.sql(f"SELECT file_path FROM slowlake.{source.config.streams[0].namespace}.acc.files").collect()
    assert files and all(r[0].startswith("s3://") for r in files)
    writer = Writer(source.dsn)
    writer.start()
    log_path = source.workdir / "pipeline.log"
    rng = random.Random(5)
    kills = 0
    try:
        for _ in range(3):
            start = log_path.stat().st_size if log_path.exists() else 0
            proc = _start_pipeline(source, log_path)
            _wait_for_batch(log_path, start)
            time.sleep(rng.uniform(1.0, 6.0))
            os.killpg(proc.pid, signal.SIGKILL)  # driver and Spark JVM at once, as a machine crash would
            proc.wait(30)
            kills += 1
    finally:
        changes = writer.stop()
    assert kills == 3 and changes > 100
    _wait_caught_up(source)
    run_pipeline(source.config, spark=spark, stop_when_idle=True)
    _verify_exact(source, spark)


def test_object_store_outage_is_waited_out(source, spark, caplog):
    if getattr(source, "capture", None) is None:  # run alone: load the mirror first
        _snapshot_then_capture(source, spark)
    with source.conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO acc SELECT g, 1, 'during outage' FROM generate_series({ROWS * 10}, {ROWS * 10 + 99}) g"
        )
    _wait_caught_up(source)
    source.store.stop()
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.extend(run_pipeline(source.config, spark=spark, stop_when_idle=True))
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    try:
        with caplog.at_level(logging.ERROR, logger="lakestream.engine.loop"):
            runner.start()
            # A batch fails on the store (after the SDKs' own retries) and is retried as an outage: not
            # dead-lettered, not fatal.
            deadline = time.monotonic() + 600
            while "an outage" not in caplog.text and runner.is_alive() and time.monotonic() < deadline:
                time.sleep(1)
            assert runner.is_alive() and not errors, errors
            assert "an outage" in caplog.text, caplog.text
            time.sleep(5)
    finally:
        source.store.start()
    runner.join(300)
    assert not runner.is_alive() and not errors, errors
    assert sum(r.records for r in results) >= 100
    _verify_exact(source, spark)
    dead = "slowlake.lakestream.dead_letter"
    if spark.catalog.tableExists(dead):
        assert spark.table(dead).count() == 0
