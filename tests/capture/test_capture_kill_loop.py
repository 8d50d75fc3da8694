"""``lakestream capture`` SIGKILLed again and again under a PostgreSQL or MariaDB write load of inserts, updates,
key changes and deletes, at random moments and at each of capture's pause points in turn
(`lakestream.faults.CAPTURE_POINTS`). After the last restart, the table's events in Kafka, applied in order, must
give the source table exactly: a delete that never reached Kafka shows as an extra key. Checked at the Kafka level
(no Spark), so a kill costs a capture restart only.

Marker ``chaos`` (`make chaos`); ``LAKESTREAM_CAPTURE_KILLS`` sets the number of kills per source (default 8).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid

import psycopg2
import pytest
import yaml
from capture_harness import start_captured_source, stop_captured_source
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from conftest import catalog_settings, mariadb_database

from lakestream.capture import CaptureProcess
from lakestream.faults import CAPTURE_POINTS, PAUSE_MARKER

pytestmark = pytest.mark.chaos
KILLS = int(os.environ.get("LAKESTREAM_CAPTURE_KILLS", 8))

SETUP = [
    "CREATE TABLE kl_acct (id int PRIMARY KEY, v int, note text)",
    "INSERT INTO kl_acct SELECT g, 0, 'seed' FROM generate_series(1, 300) g",
]


class Load(threading.Thread):
    """Small transactions of inserts, updates, primary-key changes and deletes, until stopped."""

    def __init__(self, connect, seed: int) -> None:
        super().__init__(daemon=True)
        self.connect, self.rng, self.stop_event = connect, random.Random(seed), threading.Event()
        self.changes, self.error = 0, None
        self.keys, self.next_key = list(range(1, 301)), 301

    def run(self) -> None:
        try:
            conn = self.connect()
            while not self.stop_event.is_set():
                with conn.cursor() as cur:
                    for _ in range(self.rng.randint(1, 4)):
                        self._one(cur)
                conn.commit()
                time.sleep(0.01)
            conn.close()
        except Exception as exc:  # noqa: BLE001 — reported by stop()
            self.error = exc

    def _one(self, cur) -> None:
        r, rng = self.rng.random(), self.rng
        self.changes += 1
        if r < 0.4 and self.keys:
            cur.execute(
                "UPDATE kl_acct SET v = v + 1, note = %s WHERE id = %s", (f"u{self.changes}", rng.choice(self.keys))
            )
        elif r < 0.65:
            cur.execute("INSERT INTO kl_acct VALUES (%s, 0, 'new')", (self.next_key,))
            self.keys.append(self.next_key)
            self.next_key += 1
        elif r < 0.72 and self.keys:
            old = self.keys.pop(rng.randrange(len(self.keys)))
            cur.execute("UPDATE kl_acct SET id = %s WHERE id = %s", (self.next_key, old))
            self.keys.append(self.next_key)
            self.next_key += 1
        elif len(self.keys) > 50:
            cur.execute("DELETE FROM kl_acct WHERE id = %s", (self.keys.pop(rng.randrange(len(self.keys))),))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert self.error is None, self.error


def _fold(bootstrap: str, topic: str, end: int) -> dict[int, tuple]:
    """The table as its events in Kafka give it, applied in order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"fold-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    rows: dict[int, tuple] = {}
    seen, deadline = 0, time.monotonic() + 120
    try:
        while seen < end and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen = msg.offset() + 1
            if msg.value() is None:
                continue
            value = json.loads(msg.value())
            payload = value.get("payload", value)
            if payload.get("op") in ("c", "r", "u"):
                after = payload["after"]
                rows[after["id"]] = (after["v"], after["note"])
            elif payload.get("op") == "d":
                rows.pop(payload["before"]["id"], None)
    finally:
        consumer.close()
    assert seen >= end, f"read {seen} of {end} events of {topic}"
    return rows


def _kill_loop(capture, sql, end_offset, wait_for_events, bootstrap: str, topic: str, load: Load, kills: int) -> None:
    """Kill ``capture`` ``kills`` times under ``load`` (at random, then at each pause point in turn), then fold the
    topic and compare it with the source table."""
    rotation = ["random", *CAPTURE_POINTS]
    done: list[str] = []
    try:
        load.start()
        for i in range(kills):
            how = rotation[i % len(rotation)]
            os.environ.pop("LAKESTREAM_PAUSE_AT", None)
            assert load.is_alive(), f"the write load stopped: {load.error!r}"
            if how == "random":
                time.sleep(random.uniform(0.5, 4))
            else:
                # a point pauses once per process: restart with it armed, then wait for it
                os.environ["LAKESTREAM_PAUSE_AT"] = f"{how}:60"
                capture.kill()
                capture.start()
                marker = f"{PAUSE_MARKER} {how}"
                deadline = time.monotonic() + 240
                while marker not in capture.log_text():
                    assert capture.running, capture.log_text()[-3000:]
                    assert time.monotonic() < deadline, f"{how} not reached:\n{capture.log_text()[-3000:]}"
                    time.sleep(0.2)
            capture.kill()
            done.append(how)
            os.environ.pop("LAKESTREAM_PAUSE_AT", None)
            capture.start()
            capture.wait_until_streaming(timeout=300)
        load.stop()
        sql("INSERT INTO kl_acct VALUES (-1, 0, 'marker')")
        wait_for_events(end_offset() + 1)
        deadline = time.monotonic() + 120
        while True:
            folded = _fold(bootstrap, topic, end_offset())
            if -1 in folded or time.monotonic() > deadline:
                break
            time.sleep(1)
        want = {r[0]: (r[1], r[2]) for r in sql("SELECT id, v, note FROM kl_acct")}
        extra, missing = sorted(set(folded) - set(want)), sorted(set(want) - set(folded))
        differing = sorted(k for k in set(want) & set(folded) if want[k] != folded[k])
        assert (extra, missing, differing) == ([], [], []), (
            f"after {len(done)} kills ({done}), {load.changes} changes: extra {extra[:20]}, missing {missing[:20]}, "
            f"differing {differing[:20]}\n{capture.log_text()[-3000:]}"
        )
    finally:
        os.environ.pop("LAKESTREAM_PAUSE_AT", None)
        load.stop_event.set()


def test_postgresql_capture_killed_again_and_again_loses_no_change(stack):
    source = start_captured_source(stack, SETUP, ["kl_acct"], "kl")

    def sql(statement: str) -> list[tuple]:
        with source.conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall()) if cur.description else []

    try:
        _kill_loop(
            source.capture,
            sql,
            lambda: source.end_offset("kl_acct"),
            lambda n: source.wait_for_events({"kl_acct": n}),
            stack.bootstrap_servers,
            source.topic("kl_acct"),
            Load(lambda: psycopg2.connect(stack.pg_dsn(source.dbname)), seed=KILLS),
            KILLS,
        )
    finally:
        stop_captured_source(source)


def test_mariadb_capture_killed_again_and_again_loses_no_change(stack, mariadb, service_dir_factory):
    uid = uuid.uuid4().hex[:6]
    dbname, prefix = f"kl_{uid}", f"kl{uid}"
    mariadb.run_as_root(f"CREATE DATABASE `{dbname}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn = mariadb.connect(dbname)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE kl_acct (id INT PRIMARY KEY, v INT, note VARCHAR(20))")
        cur.executemany("INSERT INTO kl_acct VALUES (%s, 0, 'seed')", [(i,) for i in range(1, 301)])
    workdir = service_dir_factory("mdbkill")
    data = {
        "name": prefix,
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "group_id": f"lakestream-{prefix}"},
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topic_pattern": rf"{prefix}\..*", "namespace": prefix, "table": "{table}"}],
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": mariadb_database(mariadb, dbname),
            "topic_prefix": prefix,
            "tables": [f"{dbname}.kl_acct"],
            "connector": {"heartbeat.interval.ms": "1000"},
        },
    }
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(data))
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    topic = f"{prefix}.{dbname}.kl_acct"

    def end_offset() -> int:
        consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": f"wm-{uuid.uuid4().hex}"})
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        except KafkaException:
            return 0
        finally:
            consumer.close()

    def wait_for_events(n: int) -> None:
        deadline = time.monotonic() + 240
        while end_offset() < n:
            assert time.monotonic() < deadline and capture.running, capture.log_text()[-3000:]
            time.sleep(0.3)

    def sql(statement: str) -> list[tuple]:
        with conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall())

    capture.start()
    try:
        capture.wait_until_streaming(timeout=300)
        wait_for_events(300)
        _kill_loop(
            capture,
            sql,
            end_offset,
            wait_for_events,
            stack.bootstrap_servers,
            topic,
            Load(lambda: mariadb.connect(dbname), seed=KILLS),
            KILLS,
        )
    finally:
        capture.stop()
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")
