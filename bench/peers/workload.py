"""The input every system reads: Debezium change events of one `orders` table, generated from a seed so that each
system's topic holds the same records in the same order (only the produce times differ).

The events are what Debezium's PostgreSQL connector writes with the JSON converter (schemas on), for a table with
``REPLICA IDENTITY FULL`` (updates and deletes carry ``before``: Flink's ``debezium-json`` format refuses updates
without it) and ``decimal.handling.mode=double`` (Flink SQL cannot decode Connect's base64 decimals). The same
records go to all three writers.

- the base: ids 1..rows as snapshot reads (``op: r``), version 1, qty ``id % 19 + 1`` (what `MirrorModel` expects);
- the changes: updates of random live keys (85%), deletes (10%, each with its tombstone) and inserts of new keys
  (5%), from a seeded RNG and applied to the model as they are sent; a phase's ``add_column_at`` switches the events
  to the schema with one more column (``channel``), as an ``ALTER TABLE orders ADD COLUMN channel text`` at the source.

Two choices make the inputs (`INPUTS`): the events with Kafka Connect's schemas (``schemas.enable=true``, the
JsonConverter's default) or without them (the payload alone), and the keys an update or delete picks: uniform over the
live keys, or Zipf-distributed (``ZIPF_S``: the lowest ids are the hot keys; a hot key drawn after its delete comes
back as an insert, as a row created again at the source).

`Generator` runs all of it in a process of its own (`ChangeStream` is the part that sends the changes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
import os
import random
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import orjson
from _common import _VALUE_FIELDS, STATUSES, FastProducer, OrderRow  # noqa: F401 — OrderRow is the caller's too
from sustained import DELETE_SHARE, INSERT_SHARE, MirrorModel

PARTITIONS = 2
ZIPF_S = 0.99  # YCSB's zipfian constant: over 10M keys the hottest 1,000 take ~40% of the changes, the hottest 1% ~70%

# The inputs the comparison runs: (schemas on, key distribution).
INPUTS = {
    "json-schemas": (True, "uniform"),
    "json-plain": (False, "uniform"),
    "json-schemas-zipf": (True, "zipf"),
}
ADDED_COLUMN = "channel"
CHANNELS = ("web", "app", "store")

# bench/_common.py's order row, with the amount as a double (decimal.handling.mode=double: every peer reads it).
_FIELDS = [
    {"type": "double", "optional": True, "field": "amount"} if f["field"] == "amount" else f for f in _VALUE_FIELDS
]
_SOURCE = [
    {"type": t, "optional": o, "field": f}
    for t, o, f in (
        ("string", False, "version"),
        ("string", False, "connector"),
        ("string", False, "name"),
        ("int64", False, "ts_ms"),
        ("string", True, "snapshot"),
        ("string", False, "db"),
        ("string", True, "sequence"),
        ("string", False, "schema"),
        ("string", False, "table"),
        ("int64", True, "txId"),
        ("int64", True, "lsn"),
    )
]


class OrderEvents:
    """Debezium JSON (key, value) for ``<prefix>.public.orders``, before and after the ADD COLUMN: with Kafka
    Connect's schemas (``schemas``) or the payload alone."""

    def __init__(self, prefix: str, schemas: bool = True):
        self.prefix = prefix
        self.schemas = schemas
        self.topic = f"{prefix}.public.orders"
        self.heads = {added: self._value_head(added) for added in (False, True)}
        key_schema = {
            "type": "struct",
            "optional": False,
            "name": f"{self.topic}.Key",
            "fields": [{"type": "int32", "optional": False, "field": "id"}],
        }
        self._key_head = b'{"schema":' + orjson.dumps(key_schema) + b',"payload":'
        self._lsn = 30_000_000

    def _value_head(self, added: bool) -> bytes:
        fields = _FIELDS + ([{"type": "string", "optional": True, "field": ADDED_COLUMN}] if added else [])
        row = {"type": "struct", "fields": fields, "optional": True, "name": f"{self.topic}.Value"}
        envelope = {
            "type": "struct",
            "optional": False,
            "name": f"{self.topic}.Envelope",
            "version": 2,
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                {
                    "type": "struct",
                    "fields": _SOURCE,
                    "optional": False,
                    "name": "io.debezium.connector.postgresql.Source",
                    "field": "source",
                },
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
            ],
        }
        return b'{"schema":' + orjson.dumps(envelope) + b',"payload":'

    def key(self, row_id: int) -> bytes:
        if not self.schemas:
            return b'{"id":' + str(row_id).encode() + b"}"
        return self._key_head + b'{"id":' + str(row_id).encode() + b"}}"

    @staticmethod
    def row(r: OrderRow, ts_ms: int, added: bool) -> dict[str, Any]:
        row = {
            "id": r.id,
            "customer_id": r.customer_id,
            "status": STATUSES[r.version % len(STATUSES)],
            "amount": round(r.qty * 19.99 + r.version / 100, 2),
            "qty": r.qty,
            "price": r.qty * 19.99,
            "express": r.id % 3 == 0,
            "version": r.version,
            "created_day": 19_800 + r.id % 365,
            "created_at": (1_795_000_000_000 - r.id % 86_400_000) * 1000,
            # The produce time: the freshness probe reads it back from the files each snapshot adds.
            "updated_at": _timestamp(ts_ms),
            "note": f"order {r.id} v{r.version} " + "x" * (r.id % 40),
        }
        if added:
            row[ADDED_COLUMN] = CHANNELS[(r.id + r.version) % len(CHANNELS)]
        return row

    def value(self, op: str, before: dict | None, after: dict | None, ts_ms: int, added: bool) -> bytes:
        self._lsn += 232
        payload = {
            "before": before,
            "after": after,
            "op": op,
            "ts_ms": ts_ms + 40,
            "source": {
                "version": "3.6.3.Final",
                "connector": "postgresql",
                "name": self.prefix,
                "ts_ms": ts_ms,
                "snapshot": "true" if op == "r" else "false",
                "db": "shop",
                "sequence": f'["{self._lsn - 40}","{self._lsn}"]',
                "schema": "public",
                "table": "orders",
                "txId": self._lsn // 232,
                "lsn": self._lsn,
            },
        }
        if not self.schemas:
            return orjson.dumps(payload)
        return self.heads[added] + orjson.dumps(payload) + b"}"


@functools.lru_cache(maxsize=8)
def _timestamp(ts_ms: int) -> str:
    """ISO-8601 with microseconds; cached: a load's 10 ms slice stamps all its changes with one time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms / 1000)) + f".{ts_ms % 1000:03d}000Z"


# The generator's threads (its own and librdkafka's) run ahead of the writers it feeds (a lower nice value), so that a
# writer that takes every core cannot slow the input it is measured on. Needs CAP_SYS_NICE (root); without it the
# load runs at the nice value it was started with, and the results say which.
GENERATOR_NICE = -10


def prioritize_this_thread() -> int:
    """Set the calling thread's nice value to `GENERATOR_NICE` where permitted; returns the value it runs at. Threads
    it starts from then on inherit it."""
    tid = threading.get_native_id()
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, tid, GENERATOR_NICE)
    return os.getpriority(os.PRIO_PROCESS, tid)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(timeout=30)


def produce_base(bootstrap: str, events: OrderEvents, rows: int) -> float:
    """Ids 1..rows as snapshot reads; returns the seconds it took."""
    started = time.monotonic()
    producer = FastProducer(bootstrap)
    now = int(time.time() * 1000)
    for row_id in range(1, rows + 1):
        if row_id % 200_000 == 0:
            now = int(time.time() * 1000)
        after = events.row(OrderRow(row_id, row_id % 50000, MirrorModel.base_qty(row_id), 1), now, False)
        producer.send(events.topic, events.key(row_id), events.value("r", None, after, now, False), now)
    producer.flush()
    return time.monotonic() - started


class ChangeStream:
    """Changes of the mirror from ``rng`` (one seeded stream across a system's phases, so that every system gets the
    same records), applied to ``model`` as they are sent: updates of random live keys, deletes with their tombstones,
    inserts of new keys; the events switch to the added column's schema once ``added_column`` is set."""

    def __init__(
        self, bootstrap: str, events: OrderEvents, model: MirrorModel, rng: random.Random, keys: str = "uniform"
    ):
        self.events, self.model, self.rng, self.keys = events, model, rng, keys
        self.producer = FastProducer(bootstrap)
        self.added_column = False
        self.counts = {"u": 0, "d": 0, "c": 0}

    def send_change(self, now: int, force_update: bool = False) -> None:
        """One change; ``force_update``: an update (the marker the harness waits to see)."""
        model, events, rng, added = self.model, self.events, self.rng, self.added_column
        draw = rng.random()
        if force_update:
            draw = 1.0
        if draw < INSERT_SHARE:
            row_id = model.next_id
            model.next_id += 1
            qty = rng.randrange(1, 20)
            after = events.row(OrderRow(row_id, row_id % 50000, qty, 1), now, added)
            self.producer.send(events.topic, events.key(row_id), events.value("c", None, after, now, added), now)
            model.overlay[row_id] = (1, qty)
            self.counts["c"] += 1
            return
        if self.keys == "zipf":
            row_id = zipf_key(rng.random(), model.next_id - 1)
            current = model.current(row_id)
            if current is None:  # a hot key deleted before: created again
                qty = rng.randrange(1, 20)
                after = events.row(OrderRow(row_id, row_id % 50000, qty, 1), now, added)
                self.producer.send(events.topic, events.key(row_id), events.value("c", None, after, now, added), now)
                model.overlay[row_id] = (1, qty)
                self.counts["c"] += 1
                return
        else:
            while True:  # a random live key
                row_id = rng.randrange(1, model.next_id)
                current = model.current(row_id)
                if current is not None:
                    break
        before = events.row(OrderRow(row_id, row_id % 50000, current[1], current[0]), now, added)
        key = events.key(row_id)
        if draw < INSERT_SHARE + DELETE_SHARE:
            self.producer.send(events.topic, key, events.value("d", before, None, now, added), now)
            self.producer.send(events.topic, key, None, now)  # the tombstone
            model.overlay[row_id] = None
            self.counts["d"] += 1
        else:
            version, qty = current[0] + 1, rng.randrange(1, 20)
            after = events.row(OrderRow(row_id, row_id % 50000, qty, version), now, added)
            self.producer.send(events.topic, key, events.value("u", before, after, now, added), now)
            model.overlay[row_id] = (version, qty)
            self.counts["u"] += 1

    def marker(self) -> int:
        """One update, flushed: the change the harness waits to see; returns its produce time (ms)."""
        now = int(time.time() * 1000)
        self.send_change(now, force_update=True)
        self.producer.flush()
        return now

    def load(self, rate: float, duration: float, add_column_at: float | None = None) -> dict[str, Any]:
        """``rate`` × ``duration`` changes at ``rate``/s in 10 ms slices, flushed; the ADD COLUMN after
        ``add_column_at`` s worth of them. Returns the phase's counts per op and the seconds it took (more than
        ``duration`` when the generator fell behind: the rate it really offered is changes / seconds)."""
        before = dict(self.counts)
        started = time.monotonic()
        sent, total = 0, round(rate * duration)  # exactly: every system's phase gets the same records
        while sent < total:
            elapsed = time.monotonic() - started
            if add_column_at is not None and not self.added_column and sent >= add_column_at * rate:
                self.added_column = True
            due = min(total, int(elapsed * rate))
            now = int(time.time() * 1000)
            while sent < due:
                self.send_change(now)
                sent += 1
            self.producer.poll()
            if int((time.monotonic() - started) * rate) <= sent:
                time.sleep(0.01)  # on time: the next slice; behind: no sleep until caught up
        seconds = time.monotonic() - started
        self.producer.flush()
        return {
            "counts": {op: n - before[op] for op, n in self.counts.items()},
            "seconds": seconds,
        }


def zipf_key(u: float, n: int, s: float = ZIPF_S) -> int:
    """The key of rank ``1..n`` for a uniform draw ``u`` under a Zipf law of exponent ``s`` (the inverse of its
    continuous approximation, P(rank ≤ k) ≈ (k^(1−s) − 1) / (n^(1−s) − 1))."""
    top = n ** (1 - s)
    return max(1, min(n, int((1 + u * (top - 1)) ** (1 / (1 - s)))))


@dataclasses.dataclass
class LoadResult:
    """What one phase's load sent: changes per op, the seconds it took, the nice value it ran at."""

    counts: dict[str, int]
    seconds: float
    nice: int

    @property
    def changes(self) -> int:
        return sum(self.counts.values())


class Generator:
    """A system's input in a process of its own: the base, then each phase's changes and markers, from one seeded
    stream and one model of what the mirror must hold (both live in the process; `totals` and `last_live_key` ask it).

    A process, not a thread: the harness's own work (the freshness probe reads every snapshot's rows, the reads and
    checks drive Spark) would otherwise share one interpreter lock with it. It is still the ramp's ceiling on 2 cores
    (about a core at 13,000 changes/s; `run.py --backlog` measures a writer without it). It and librdkafka's threads
    run at `GENERATOR_NICE` where permitted. A phase's load runs in the
    background (`start_load`, then `load_done` until it is, then `load_result`); the other calls wait for their answer.
    """

    def __init__(self, bootstrap: str, prefix: str, rows: int, seed: int, schemas: bool = True, keys: str = "uniform"):
        context = multiprocessing.get_context("spawn")  # the harness runs a JVM gateway's threads: no fork
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve,
            args=(child, bootstrap, prefix, rows, seed, schemas, keys),
            name=f"generator-{prefix}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.topic = OrderEvents(prefix).topic
        self._loading = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def _answer(self) -> Any:
        try:
            ok, value = self._conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the load generator exited ({self.process.exitcode})") from None
        if not ok:
            raise RuntimeError(f"the load generator failed: {value}")
        return value

    def _call(self, command: str, *args: Any) -> Any:
        if self._loading:
            raise RuntimeError(f"the load generator is still loading (asked to {command})")
        self._conn.send((command, args))
        return self._answer()

    def produce_base(self) -> float:
        """Ids 1..rows as snapshot reads; returns the seconds it took."""
        return self._call("base")

    def marker(self) -> int:
        """One update, flushed; returns its produce time (ms)."""
        return self._call("marker")

    def start_load(self, rate: float, duration: float, add_column_at: float | None = None) -> None:
        self._call("noop")  # fails here, not later, if the process is gone
        self._conn.send(("load", (rate, duration, add_column_at)))
        self._loading = True

    def load_done(self) -> bool:
        return not self._loading or self._conn.poll() or not self.process.is_alive()

    def load_result(self) -> LoadResult:
        self._loading = False
        return LoadResult(**self._answer())

    def totals(self) -> dict[str, int]:
        """count, sum(version), sum(qty) of the rows the mirror must hold."""
        return self._call("totals")

    def last_live_key(self) -> int:
        """The highest key the mirror must hold."""
        return self._call("last_live_key")

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self._conn.close()


def _serve(
    conn: Connection, bootstrap: str, prefix: str, rows: int, seed: int, schemas: bool = True, keys: str = "uniform"
) -> None:
    """`Generator`'s process: answers each command with (True, value) or (False, the error)."""
    nice = prioritize_this_thread()  # before the producer: librdkafka's threads inherit it
    events = OrderEvents(prefix, schemas)
    model = MirrorModel(rows, rows + 1)
    stream = ChangeStream(bootstrap, events, model, random.Random(seed), keys)
    commands = {
        "noop": lambda: None,
        "base": lambda: produce_base(bootstrap, events, rows),
        "marker": stream.marker,
        "load": lambda rate, duration, add_column_at: {**stream.load(rate, duration, add_column_at), "nice": nice},
        "totals": model.totals,
        "last_live_key": lambda: next(i for i in range(model.next_id - 1, 0, -1) if model.current(i) is not None),
    }
    while True:
        try:
            command, args = conn.recv()
        except EOFError:
            return
        try:
            answer = (True, commands[command](*args))
        except Exception as exc:  # noqa: BLE001 — the harness raises it
            answer = (False, f"{type(exc).__name__}: {exc}")
        conn.send(answer)
