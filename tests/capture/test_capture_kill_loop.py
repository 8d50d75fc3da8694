"""``lakestream capture`` SIGKILLed again and again under a PostgreSQL write load of inserts, updates, key changes and
deletes, at random moments and at each of capture's pause points in turn (`lakestream.faults.CAPTURE_POINTS`).
After the last restart, the table's events in Kafka, applied in order, must give the source table exactly: a delete
that never reached Kafka shows as an extra key. Checked at the Kafka level (no Spark), so a kill costs a capture
restart only.

Marker ``chaos`` (`make chaos`); ``LAKESTREAM_CAPTURE_KILLS`` sets the number of kills (default 8).
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
from capture_harness import start_captured_source, stop_captured_source
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from lakestream.faults import CAPTURE_POINTS, PAUSE_MARKER

pytestmark = pytest.mark.chaos

SETUP = [
    "CREATE TABLE kl_acct (id int PRIMARY KEY, v int, note text)",
    "INSERT INTO kl_acct SELECT g, 0, 'seed' FROM generate_series(1, 300) g",
]


class Load(threading.Thread):
    """Small transactions of inserts, updates, primary-key changes and deletes, until stopped."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng, self.stop_event, self.changes, self.error = (
            dsn,
            random.Random(seed),
            threading.Event(),
            0,
            None,
        )
        self.keys, self.next_key = list(range(1, 301)), 301

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            while not self.stop_event.is_set():
                with conn, conn.cursor() as cur:
                    for _ in range(self.rng.randint(1, 4)):
                        self._one(cur)
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


def test_capture_killed_again_and_again_loses_no_change(stack):
    kills = int(os.environ.get("LAKESTREAM_CAPTURE_KILLS", 8))
    source = start_captured_source(stack, SETUP, ["kl_acct"], "kl")
    load = Load(stack.pg_dsn(source.dbname), seed=kills)
    rotation = ["random", *CAPTURE_POINTS]
    done: list[str] = []
    try:
        load.start()
        for i in range(kills):
            how = rotation[i % len(rotation)]
            os.environ.pop("LAKESTREAM_PAUSE_AT", None)
            if how == "random":
                time.sleep(random.uniform(0.5, 4))
            else:
                # the point is armed for the next start (a point passed once per process): restart, then wait for it
                os.environ["LAKESTREAM_PAUSE_AT"] = f"{how}:60"
                source.capture.kill()
                source.capture.start()
                marker = f"{PAUSE_MARKER} {how}"
                deadline = time.monotonic() + 240
                while marker not in source.capture.log_text():
                    assert source.capture.running, source.capture.log_text()[-3000:]
                    assert time.monotonic() < deadline, f"{how} not reached:\n{source.capture.log_text()[-3000:]}"
                    time.sleep(0.2)
            source.capture.kill()
            done.append(how)
            os.environ.pop("LAKESTREAM_PAUSE_AT", None)
            source.capture.start()
            source.capture.wait_until_streaming(timeout=300)
        load.stop()
        source.sql("INSERT INTO kl_acct VALUES (-1, 0, 'marker')")
        source.wait_for_events({"kl_acct": source.end_offset("kl_acct") + 1})
        deadline = time.monotonic() + 120
        while True:
            end = source.end_offset("kl_acct")
            folded = _fold(stack.bootstrap_servers, source.topic("kl_acct"), end)
            if -1 in folded or time.monotonic() > deadline:
                break
            time.sleep(1)
        with source.conn.cursor() as cur:
            cur.execute("SELECT id, v, note FROM kl_acct")
            want = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
        extra, missing = sorted(set(folded) - set(want)), sorted(set(want) - set(folded))
        differing = sorted(k for k in set(want) & set(folded) if want[k] != folded[k])
        assert (extra, missing, differing) == ([], [], []), (
            f"after {len(done)} kills ({done}), {load.changes} changes: extra {extra[:20]}, missing {missing[:20]}, "
            f"differing {differing[:20]}\n{source.capture.log_text()[-3000:]}"
        )
    finally:
        os.environ.pop("LAKESTREAM_PAUSE_AT", None)
        if load.is_alive():
            load.stop_event.set()
        stop_captured_source(source)
