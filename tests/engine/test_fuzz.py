"""Fuzz: more than 10,000 malformed records of 20 kinds, interleaved with good changes in the same topics
(an upsert topic of schemas-on Debezium events, an append topic of JSON events, an append topic routed
by a record field), produced to the real broker and run through the real `lakestream run --until-idle`.

Asserts that the process exits 0; the good tables equal a reference model built here from the good
events alone (not through the decoder); every bad record is in the dead-letter table exactly once,
with a reason, matched by topic/partition/offset; and no table was created from a hostile name.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import yaml
from confluent_kafka import Producer
from conftest import catalog_settings

SEED = 8
GOOD_UPSERTS = 4000
GOOD_EVENTS = 1200
GOOD_ROUTED = 600
PER_KIND = 600

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
DAYS = (-719162, 2932896)  # 0001-01-01 .. 9999-12-31
MICROS = (-62135596800000000, 253402300799999999)

DECIMAL_SCHEMA = {
    "type": "bytes",
    "optional": True,
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2", "connect.decimal.precision": "12"},
}
FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "int32", "optional": True, "field": "small"},
    {"type": "int64", "optional": True, "field": "big"},
    {**DECIMAL_SCHEMA, "field": "price"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "ts"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "double", "optional": True, "field": "ratio"},
]
_ROW = {"type": "struct", "fields": FIELDS, "optional": True, "name": "fuzz.Value"}
VALUE_SCHEMA = {
    "type": "struct",
    "name": "fuzz.Envelope",
    "optional": False,
    "fields": [
        {**_ROW, "field": "before"},
        {**_ROW, "field": "after"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}
KEY_SCHEMA = {
    "type": "struct",
    "name": "fuzz.Key",
    "optional": False,
    "fields": [{"type": "int64", "optional": False, "field": "id"}],
}
HOSTILE_NAMES = [
    "a'b",
    "`x`",
    "a.b",
    "x" * 300,
    "",
    "x; DROP TABLE y",
    't"q',
    "../etc",
    "a b",
    "名前",
    "1abc",
    "robert');--",
    "x\x00y",
    42,
    {"t": "alpha"},
    ["alpha"],
    True,
    None,
]


# What the reason of each kind's dead letter must say.
REASONS = {
    "random_bytes": "malformed JSON|schema registry|not a JSON object",
    "truncated_json": "malformed JSON",
    "extreme_nesting": "nested too deeply",
    "not_an_envelope": "not a JSON object|missing 'op'|has no 'after'",
    "unknown_op": "unknown op",
    "create_without_after": "without an? 'after'",
    "after_not_object": "without an? 'after'",
    "wrong_type_key": "'id'",
    "wrong_type_column": "column '?(small|big|ratio|day|ts|price|n)\\b",
    "integer_overflow": "column '?(small|big|id|n)\\b",
    "nan_infinity": "column '(small|big|price|id)'",
    "invalid_base64_decimal": "column 'price'",
    "impossible_date": "column '(day|ts)'.*(outside 0001-01-01..9999-12-31|expected an integer)",
    "confluent_avro": "schema id \\d+.*no schema registry",
    "non_utf8_key": "message key",
    "malformed_key": "message key",
    "missing_key": "missing key",
    "hostile_route": "route field 'kind'",
    "hostile_column": "column",
    "huge_value": "malformed JSON|unknown op",
}


def _encode_decimal(value: decimal.Decimal, scale: int = 2) -> str:
    unscaled = int(value.scaleb(scale))
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def _envelope(op: str, before: dict | None, after: dict | None, **extra: Any) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000, **extra}
    # allow_nan: Kafka Connect's JsonConverter writes NaN/Infinity literals for doubles.
    return json.dumps({"schema": VALUE_SCHEMA, "payload": payload}, separators=(",", ":")).encode()


def _key(value: Any) -> bytes:
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": value}}, separators=(",", ":")).encode()


class Fuzz:
    """Generates the records and the reference model, independently of lakestream's decoder."""

    def __init__(self, rng: random.Random, upsert_topic: str, event_topic: str, routed_topic: str, ledger_topic: str):
        self.rng = rng
        self.upsert_topic, self.event_topic, self.routed_topic = upsert_topic, event_topic, routed_topic
        self.ledger_topic = ledger_topic
        self.items: dict[int, tuple] = {}  # id → (small, big, price, day, ts, name, ratio), Python values
        self.ledger: dict[int, tuple] = {}
        self.events: list[tuple] = []
        self.routed: dict[str, list[tuple]] = {"alpha": [], "beta": []}
        # (topic, partition, key, value, bad kind or None)
        self.good: list[tuple[str, int, bytes | None, bytes | None, None]] = []
        self.bad: list[tuple[str, int, bytes | None, bytes | None, str]] = []

    # -- good records --------------------------------------------------------------------------
    def _good_row(self, key: int) -> tuple[dict, tuple]:
        rng = self.rng
        small = rng.choice([rng.randint(*INT32), INT32[0], INT32[1], 0])
        big = rng.choice([rng.randint(*INT64), INT64[0], INT64[1], -1])
        price = decimal.Decimal(rng.randint(-(10**10) + 1, 10**10 - 1)).scaleb(-2)
        day = rng.choice([rng.randint(*DAYS), DAYS[0], DAYS[1], 0])
        ts = rng.choice([rng.randint(*MICROS), MICROS[0], MICROS[1], 0])
        name = rng.choice(
            ["plain", "quote ' \" `", "emoji 🦆", "tab\tnew\nline", "", "x" * 500, "__not_unavailable__", "ünïcödé"]
        ) + str(rng.randint(0, 999))
        ratio = rng.choice([rng.uniform(-1e300, 1e300), 0.1, -0.0, 1e-300, rng.random()])
        wire = {
            "id": key,
            "small": small,
            "big": big,
            "price": _encode_decimal(price),
            "day": day,
            "ts": ts,
            "name": name,
            "ratio": ratio,
        }
        if rng.random() < 0.1:
            wire["name"] = None
        model = (
            small,
            big,
            price,
            dt.date(1970, 1, 1) + dt.timedelta(days=day),
            dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=ts),
            wire["name"],
            ratio,
        )
        return wire, model

    def good_upsert(self, topic: str | None = None, partition: int | None = None) -> None:
        topic = topic or self.upsert_topic
        model = self.items if topic == self.upsert_topic else self.ledger
        key = self.rng.randint(1, 1500)
        if partition is not None:
            key += (key - partition) % 2
        partition = key % 2
        if key in model and self.rng.random() < 0.2:
            before = {f["field"]: None for f in FIELDS} | {"id": key, "small": 0, "name": ""}  # defaults, not the row
            self.good.append((topic, partition, _key(key), _envelope("d", before, None), None))
            self.good.append((topic, partition, _key(key), None, None))  # tombstone
            del model[key]
            return
        wire, row = self._good_row(key)
        op = "u" if key in model else self.rng.choice("cr")
        self.good.append((topic, partition, _key(key), _envelope(op, None, wire), None))
        model[key] = row

    def ledger_records(self) -> list[tuple]:
        """A topic of good changes (runs the vectorized decoder takes) with, in partition 1 only, bad
        records that parse as well-formed JSON: each must still be a dead letter."""
        rng = self.rng
        self.good.clear()
        for _ in range(300):
            self.good_upsert(self.ledger_topic, 0)
        subtle = [
            (b"\xff\xfe{}", {}),
            (None, {}),
            (b"[1]", {}),
            (b"{not json}", {}),
            (None, {"day": 10**9}),
            (None, {"day": DAYS[1] + 1}),
            (None, {"ts": 9 * 10**18}),
            (None, {"ts": MICROS[0] - 1}),
        ]
        for i in range(300):
            if i % 30 == 15:
                raw_key, extra = subtle[(i // 30) % len(subtle)]
                key = rng.randint(900_000, 999_999) * 2 + 1
                wire = self._good_row(key)[0] | extra
                if raw_key is None and not extra:
                    self.good.append((self.ledger_topic, 1, None, _envelope("c", None, wire), "missing_key"))
                else:
                    kind = "impossible_date" if extra else "malformed_key"
                    self.good.append(
                        (self.ledger_topic, 1, raw_key if raw_key else _key(key), _envelope("c", None, wire), kind)
                    )
            self.good_upsert(self.ledger_topic, 1)
        out = list(self.good)
        self.good.clear()
        return out

    def good_event(self) -> None:
        n = len(self.events)
        event = {
            "event_id": n,
            "user": f"u{self.rng.randint(0, 50)}",
            "amount": self.rng.randint(0, 10**6) + 0.5,
            "n": self.rng.randint(-(2**62), 2**62),
        }
        self.events.append((event["event_id"], event["user"], event["amount"], event["n"]))
        self.good.append((self.event_topic, n % 2, None, json.dumps(event).encode(), None))

    def good_routed(self) -> None:
        kind = self.rng.choice(["alpha", "beta"])
        n = sum(map(len, self.routed.values()))
        self.routed[kind].append((n, f"v{n}"))
        self.good.append(
            (self.routed_topic, 0, None, json.dumps({"kind": kind, "seq": n, "v": f"v{n}"}).encode(), None)
        )

    # -- bad records ---------------------------------------------------------------------------
    def _bad(self, kind: str, value: bytes | None, key: bytes | None = None, topic: str | None = None) -> None:
        topic = topic or self.upsert_topic
        partition = 0 if topic == self.routed_topic else self.rng.randint(0, 1)
        if key is None and topic == self.upsert_topic:
            key = _key(self.rng.randint(1, 1500))  # a well-formed key: the value alone is what is wrong
        self.bad.append((topic, partition, key, value, kind))

    def _valid_wire(self) -> dict:
        # Ids of good rows too: a bad update must not touch the row.
        return self._good_row(self.rng.randint(1, 1500))[0]

    def bad_records(self) -> None:
        rng = self.rng
        gen = {
            "random_bytes": lambda: self._bad(
                "random_bytes", rng.randbytes(rng.randint(8, 400)), _key(rng.randint(1, 1500))
            ),
            "truncated_json": lambda: self._bad(
                "truncated_json", (v := _envelope("c", None, self._valid_wire()))[: rng.randint(1, len(v) - 2)], _key(1)
            ),
            "extreme_nesting": lambda: self._bad(
                "extreme_nesting",
                rng.choice(
                    [
                        b"[" * 20000 + b"]" * 20000,
                        b'{"a":' * 5000 + b"1" + b"}" * 5000,
                        _envelope("c", None, self._valid_wire() | {"name": None}).replace(
                            b'"name":null', b'"name":' + b"[" * 3000 + b"]" * 3000
                        ),
                    ]
                ),
                _key(2),
            ),
            "not_an_envelope": lambda: self._bad(
                "not_an_envelope",
                rng.choice(
                    [
                        b"[1,2,3]",
                        b'"hello"',
                        b"42",
                        b"null",
                        b"true",
                        b'{"foo":"bar"}',
                        b"{}",
                        json.dumps({"schema": VALUE_SCHEMA, "payload": 5}).encode(),
                        json.dumps({"schema": VALUE_SCHEMA, "payload": [1]}).encode(),
                    ]
                ),
                _key(3),
            ),
            "unknown_op": lambda: self._bad(
                "unknown_op", _envelope(rng.choice(["x", "C", "", "delete", "z"]), None, self._valid_wire()), _key(4)
            ),
            "create_without_after": lambda: self._bad(
                "create_without_after",
                rng.choice(
                    [
                        _envelope("c", None, None),
                        _envelope("u", self._valid_wire(), None),
                        json.dumps({"schema": VALUE_SCHEMA, "payload": {"op": "c"}}).encode(),
                    ]
                ),
                _key(5),
            ),
            "after_not_object": lambda: self._bad(
                "after_not_object", _envelope("c", None, rng.choice([[1, 2], "row", 5, True]))[:], _key(6)
            ),
            "wrong_type_key": lambda: self._bad(
                "wrong_type_key",
                _envelope(
                    "c", None, self._valid_wire() | {"id": rng.choice(["not-a-number", None, 1.5, [1], {"a": 1}, True])}
                ),
                _key("x"),
            ),
            "wrong_type_column": lambda: self._bad(
                "wrong_type_column",
                _envelope(
                    "u",
                    None,
                    self._valid_wire()
                    | rng.choice(
                        [
                            {"small": "text"},
                            {"big": True},
                            {"ratio": "abc"},
                            {"small": {"a": 1}},
                            {"big": [1]},
                            {"ratio": False},
                            {"small": 1.5},
                            {"day": "2024-01-01"},
                            {"ts": "noon"},
                            {"price": 12.345},
                        ]
                    ),
                ),
            ),
            "integer_overflow": lambda: self._bad(
                "integer_overflow",
                _envelope(
                    "u",
                    None,
                    self._valid_wire()
                    | rng.choice(
                        [
                            {"small": 2**31},
                            {"small": -(2**31) - 1},
                            {"small": 2**40},
                            {"big": 2**63},
                            {"big": -(2**63) - 1},
                            {"big": 2**70},
                            {"id": 2**64},
                        ]
                    ),
                ),
            ),
            "nan_infinity": lambda: self._bad(
                "nan_infinity",
                _envelope(
                    "u",
                    None,
                    self._valid_wire()
                    | rng.choice(
                        [
                            {"small": math.nan},
                            {"big": math.inf},
                            {"small": -math.inf},
                            {"price": math.nan},
                            {"price": math.inf},
                            {"id": math.nan},
                        ]
                    ),
                ),
            ),
            "invalid_base64_decimal": lambda: self._bad(
                "invalid_base64_decimal",
                _envelope(
                    "u",
                    None,
                    self._valid_wire()
                    | {
                        "price": rng.choice(
                            ["!!!", "abc", "====", "AAAA*", "é", base64.b64encode(b"\x7f" * 20).decode()]
                        )
                    },
                ),
            ),
            "impossible_date": lambda: self._bad(
                "impossible_date",
                _envelope(
                    "u",
                    None,
                    self._valid_wire()
                    | rng.choice(
                        [
                            {"day": 10**9},
                            {"day": -(10**9)},
                            {"day": DAYS[1] + 1},
                            {"day": DAYS[0] - 1},
                            {"day": 2**40},
                            {"ts": MICROS[1] + 1},
                            {"ts": 9 * 10**18},
                            {"ts": -9 * 10**18},
                            {"ts": 10**20},
                        ]
                    ),
                ),
            ),
            "confluent_avro": lambda: self._bad(
                "confluent_avro",
                b"\x00" + struct.pack(">I", rng.randint(1, 1000)) + rng.randbytes(rng.randint(2, 60)),
                _key(7),
            ),
            "non_utf8_key": lambda: self._bad(
                "non_utf8_key",
                _envelope("c", None, self._good_row(rng.randint(900_000, 999_999))[0]),
                rng.choice([b"\xff\xfe\xfd", b'{"id":\xff}', b"\x80" * 10]),
            ),
        }
        for make in gen.values():
            for _ in range(PER_KIND):
                make()
        # A few 1-5 MB values.
        self._bad("huge_value", rng.randbytes(1_200_000), _key(8))
        self._bad("huge_value", _envelope("c", None, self._valid_wire() | {"name": "y" * 2_500_000})[:-3], _key(9))
        self._bad("huge_value", _envelope("z", None, self._valid_wire() | {"name": "z" * 4_500_000}), _key(10))
        # The append topic: plain JSON events.
        for _ in range(200):
            for kind, value in [
                ("random_bytes", rng.randbytes(rng.randint(8, 200))),
                ("truncated_json", json.dumps({"event_id": 1, "user": "u", "amount": 1.5, "n": 1})[:20].encode()),
                ("not_an_envelope", rng.choice([b"[1]", b"7", b'"s"', b"null"])),
                ("wrong_type_column", json.dumps({"event_id": 10**7, "user": "u", "amount": 1.5, "n": "abc"}).encode()),
                ("integer_overflow", json.dumps({"event_id": 10**7, "user": "u", "amount": 1.5, "n": 2**70}).encode()),
                (
                    "hostile_column",
                    json.dumps(
                        {"event_id": 10**7, "user": "u", "amount": 1.5, "n": 1}
                        | rng.choice(
                            [{"we`ird": 1}, {"": 1}, {"x" * 300: 1}, {"ctl\x01": 1}, {"N": 5}, {"nested": {"b`ad": 1}}]
                        )
                    ).encode(),
                ),
            ]:
                self._bad(kind, value, topic=self.event_topic)
        # The routed topic: hostile table names in the routing field.
        for _ in range(40):
            for name in HOSTILE_NAMES:
                body = {"seq": -1, "v": "hostile"} | ({} if name is None else {"kind": name})
                self._bad("hostile_route", json.dumps(body).encode(), topic=self.routed_topic)

    def records(self) -> list[tuple[str, int, bytes | None, bytes | None, str | None]]:
        """Good records in their order, bad ones interleaved at random positions; each topic starts
        with a few good records (the table's first shape comes from good data)."""
        for _ in range(20):
            self.good_upsert()
            self.good_event()
            self.good_routed()
        head = list(self.good)
        self.good.clear()
        makers = [self.good_upsert] * GOOD_UPSERTS + [self.good_event] * GOOD_EVENTS + [self.good_routed] * GOOD_ROUTED
        self.rng.shuffle(makers)
        for make in makers:
            make()
        self.bad_records()
        tail: list[Any] = [("good", r) for r in self.good]
        for r in self.bad:
            tail.insert(self.rng.randint(0, len(tail)), ("bad", r))
        return head + [r for _, r in tail] + self.ledger_records()


def _produce(bootstrap: str, records: list[tuple]) -> list[tuple[str, int, int, str | None]]:
    """Produce in order; (topic, partition, offset, bad kind) of each record."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "message.max.bytes": 8_000_000,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
        }
    )
    placed: list[tuple[str, int, int, str | None]] = []
    failures: list[str] = []

    def delivered(kind):
        def on_delivery(err, msg):
            if err is not None:
                failures.append(str(err))
            else:
                placed.append((msg.topic(), msg.partition(), msg.offset(), kind))

        return on_delivery

    for topic, partition, key, value, kind in records:
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=delivered(kind))
        producer.poll(0)
    producer.flush(60)
    assert not failures, failures[:5]
    assert len(placed) == len(records)
    return placed


def test_fuzzed_topics_dead_letter_every_bad_record_and_keep_every_good_one(stack, spark, service_dir_factory):
    suffix = uuid.uuid4().hex[:6]
    namespace = f"fuzz{suffix}"
    topics = (
        f"fuzz{suffix}.public.items",
        f"fuzz{suffix}.events",
        f"fuzz{suffix}.routed",
        f"fuzz{suffix}.public.ledger",
    )
    fuzz = Fuzz(random.Random(SEED), *topics)
    records = fuzz.records()
    kinds = Counter(r[4] for r in records if r[4] is not None)
    assert sum(kinds.values()) >= 10_000 and len(kinds) >= 15, kinds
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    # Brokers refuse messages over 1 MB by default; the topic's max.message.bytes admits the 1-5 MB values.
    for future in admin.create_topics(
        [
            NewTopic(
                t,
                num_partitions=2 if t != topics[2] else 1,
                replication_factor=1,
                config={"max.message.bytes": "8000000"},
            )
            for t in topics
        ]
    ).values():
        future.result(timeout=30)
    placed = _produce(stack.bootstrap_servers, records)

    work = service_dir_factory("fuzz")
    config = {
        "name": f"fuzz{suffix}",
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"fuzz{suffix}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [
            {"topics": [topics[0]], "mode": "upsert", "namespace": namespace, "table": "items"},
            {"topics": [topics[1]], "mode": "append", "namespace": namespace, "table": "events"},
            {
                "topics": [topics[2]],
                "mode": "append",
                "namespace": namespace,
                "table": "{field}",
                "route_field": "kind",
            },
            {"topics": [topics[3]], "mode": "upsert", "namespace": namespace, "table": "ledger"},
        ],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m", "conf": {"spark.ui.enabled": "false"}},
        "state_dir": str(work / "state"),
    }
    path = work / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-m", "lakestream", "run", str(path), "--until-idle"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr[-5000:]

    # No table from a hostile name: exactly the three good tables (+ the routed ones) exist.
    tables = {r.tableName for r in spark.sql(f"SHOW TABLES IN lake.{namespace}").collect()}
    assert tables == {"items", "events", "alpha", "beta", "ledger"}

    # Every bad record is a dead letter exactly once, with a reason; no good record is.
    letters = spark.sql(
        f"SELECT topic, `partition`, `offset`, error FROM lake.lakestream.dead_letter "
        f"WHERE topic IN ({', '.join(repr(t) for t in topics)})"
    ).collect()
    got = Counter((r.topic, r.partition, r.offset) for r in letters)
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1][:5]
    kind_of = {(t, p, o): kind for t, p, o, kind in placed}
    samples: dict[str, str] = {}
    for r in letters:
        samples.setdefault(str(kind_of.get((r.topic, r.partition, r.offset))), r.error[:200])
    print("dead-letter reasons by kind:", json.dumps(samples, indent=1, ensure_ascii=False), file=sys.stderr)
    want = {c for c, kind in kind_of.items() if kind is not None}
    missing = sorted(want - set(got))
    assert not missing, [(c, kind_of[c]) for c in missing[:10]] + [f"{len(missing)} missing"]
    unexpected = sorted(set(got) - want)
    assert not unexpected, [
        (c, next(r.error for r in letters if (r.topic, r.partition, r.offset) == c)) for c in unexpected[:5]
    ]
    wrong_reason = [
        (kind_of[(r.topic, r.partition, r.offset)], r.error[:200])
        for r in letters
        if not re.search(REASONS[kind_of[(r.topic, r.partition, r.offset)]], r.error)
    ]
    assert not wrong_reason, sorted({(kind, error[:90]) for kind, error in wrong_reason})[:20]

    # The good tables equal the reference model.
    for table, model in (("items", fuzz.items), ("ledger", fuzz.ledger)):
        rows = spark.sql(f"SELECT id, small, big, price, day, ts, name, ratio FROM lake.{namespace}.{table}").collect()
        assert len(rows) == len(model), table
        got_rows = {r.id: tuple(r)[1:] for r in rows}
        assert got_rows.keys() == model.keys(), table
        diff = [(k, got_rows[k], v) for k, v in model.items() if got_rows[k] != v]
        assert not diff, (table, diff[:3])
    events = sorted(
        tuple(r) for r in spark.sql(f"SELECT event_id, user, amount, n FROM lake.{namespace}.events").collect()
    )
    assert events == sorted(fuzz.events)
    for kind, expected in fuzz.routed.items():
        got_routed = sorted(tuple(r) for r in spark.sql(f"SELECT seq, v FROM lake.{namespace}.{kind}").collect())
        assert got_routed == sorted(expected)
