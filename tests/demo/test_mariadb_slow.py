"""The long MariaDB scenarios (marker ``mariadb_slow``, `make test-mariadb`): the shop demo from MariaDB, and
`lakestream run` SIGKILLed twice while a write load streams from MariaDB through capture (the mirrors converge,
verify exact)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import uuid

import pytest
import yaml
from conftest import catalog_settings, mariadb_database

from lakestream.capture import CaptureProcess
from lakestream.config import parse_config
from lakestream.demo.runner import PipelineProcess
from lakestream.stack.process import free_port
from lakestream.verify.compare import PASS_MARKER, verify_tables

pytestmark = pytest.mark.mariadb_slow


def test_demo_from_mariadb_verifies(stack_factory):
    stack = stack_factory(source="mariadb", mariadb_port=free_port())
    s = stack.settings
    cmd = [
        sys.executable,
        "-m",
        "lakestream",
        "demo",
        "--source",
        "mariadb",
        "--duration",
        "15",
        "--catchup-timeout",
        "180",
        "--state-dir",
        str(s.state_dir),
        "--pg-port",
        str(s.pg_port),
        "--kafka-port",
        str(s.kafka_port),
        "--mariadb-port",
        str(s.mariadb_port),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert PASS_MARKER in run.stdout and "shop.order_items" in run.stdout, run.stdout[-6000:]


class Load(threading.Thread):
    """Inserts, updates and deletes of ``orders`` at about ``rate`` changes/s until stopped."""

    def __init__(self, mariadb, dbname: str, rate: float = 150.0):
        super().__init__(daemon=True)
        self.conn = mariadb.connect(dbname)
        self.rate, self.stop, self.changes, self.error = rate, threading.Event(), 0, None

    def run(self) -> None:
        rng, next_id = random.Random(7), 1001
        try:
            with self.conn.cursor() as cur:
                while not self.stop.is_set():
                    roll = rng.random()
                    if roll < 0.5:
                        cur.execute("INSERT INTO orders VALUES (%s, %s, %s)", (next_id, f"c{next_id}", next_id % 97))
                        next_id += 1
                    elif roll < 0.85:
                        cur.execute("UPDATE orders SET amount = amount + 1 WHERE id = %s", (rng.randrange(1, next_id),))
                    else:
                        cur.execute("DELETE FROM orders WHERE id = %s", (rng.randrange(1, next_id),))
                    self.changes += 1
                    time.sleep(1 / self.rate)
        except Exception as exc:  # noqa: BLE001 — reported by the test
            self.error = exc
        finally:
            self.conn.close()


def test_sigkill_of_lakestream_run_under_load_converges(stack, mariadb, spark, service_dir_factory):
    uid = uuid.uuid4().hex[:6]
    dbname, prefix = f"mdbrun_{uid}", f"mdbrun{uid}"
    mariadb.run_as_root(f"CREATE DATABASE `{dbname}`")
    conn = mariadb.connect(dbname)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(40), amount DECIMAL(10,2))")
        cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", [(i, f"c{i}", i % 97) for i in range(1, 1001)])
    conn.close()
    workdir = service_dir_factory("mdbrun")
    data = {
        "name": prefix,
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "group_id": f"lakestream-{prefix}"},
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topic_pattern": rf"{prefix}\..*", "namespace": prefix, "table": "{table}"}],
        "engine": {"commit_interval_s": 1, "idle_poll_s": 0.3},
        "spark": {"master": "local[2]", "driver_memory": "1g"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": mariadb_database(mariadb, dbname),
            "topic_prefix": prefix,
            "tables": [f"{dbname}.orders"],
        },
    }
    yaml_path = workdir / "pipeline.yaml"
    yaml_path.write_text(yaml.safe_dump(data))
    config = parse_config(data, "<test>")
    capture = CaptureProcess(yaml_path, log_path=workdir / "capture.log")
    pipeline = PipelineProcess(yaml_path, workdir / "run.log")
    load = Load(mariadb, dbname)
    try:
        capture.start()
        capture.wait_until_streaming(timeout=180)
        pipeline.start()
        load.start()
        for _ in range(2):
            time.sleep(20)
            pipeline.check()
            pipeline.proc.kill()  # SIGKILL: nothing closed, nothing flushed
            pipeline.proc.wait(10)
            pipeline.start()
        time.sleep(10)
        load.stop.set()
        load.join(30)
        assert load.error is None and load.changes > 1000
        deadline = time.monotonic() + 300
        while True:
            pipeline.check()
            report = verify_tables(config, spark)
            if report.ok or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert report.ok, report.to_text() + "\n" + pipeline.tail()
    finally:
        load.stop.set()
        pipeline.stop()
        capture.stop()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")
