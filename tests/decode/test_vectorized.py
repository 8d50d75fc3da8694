"""The vectorized run decoder gives exactly what the record-by-record path gives, or declines."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from lakestream.config import StreamSettings
from lakestream.decode.records import RecordDecoder
from lakestream.decode.vectorized import RunDecoder, decode_events
from lakestream.routing import Router
from lakestream.sink.write.convert import convert_rows
from lakestream.source.reader import RecordRun

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _common import DebeziumEvents, OrderRow  # noqa: E402

FIELD_ID = b"PARQUET:field_id"


def _schema(schemas: bool) -> pa.Schema:
    def f(i, name, t, nullable=True):
        return pa.field(name, t, nullable=nullable, metadata={FIELD_ID: str(i)})

    if schemas:
        return pa.schema(
            [
                f(1, "id", pa.int32(), False),
                f(2, "customer_id", pa.int64()),
                f(3, "status", pa.string()),
                f(4, "amount", pa.decimal128(12, 2)),
                f(5, "qty", pa.int32()),
                f(6, "price", pa.float64()),
                f(7, "express", pa.bool_()),
                f(8, "version", pa.int32()),
                f(9, "created_day", pa.date32()),
                f(10, "created_at", pa.timestamp("us")),
                f(11, "updated_at", pa.timestamp("us", tz="UTC")),
                f(12, "note", pa.string()),
            ]
        )
    return pa.schema(
        [
            f(1, "id", pa.int64(), False),
            f(2, "customer_id", pa.int64()),
            f(3, "status", pa.string()),
            f(4, "amount", pa.string()),
            f(5, "qty", pa.int64()),
            f(6, "price", pa.float64()),
            f(7, "express", pa.bool_()),
            f(8, "version", pa.int64()),
            f(9, "created_day", pa.int64()),
            f(10, "created_at", pa.int64()),
            f(11, "updated_at", pa.string()),
            f(12, "note", pa.string()),
        ]
    )


def _records(events: DebeziumEvents, n: int = 200) -> list:
    now = int(time.time() * 1000)
    out = []
    for i in range(1, n + 1):
        if i % 10 == 0:
            pairs = [events.delete(i - 1, now)[0]]
        else:
            pairs = [events.upsert(OrderRow(i, i * 7, i % 19 + 1, i % 5 + 1), "u" if i % 3 else "c", now)]
        for key, value in pairs:
            out.append(
                SimpleNamespace(
                    topic=events.topic,
                    partition=0,
                    offset=len(out),
                    timestamp_ms=now,
                    key=key,
                    value=value,
                    headers=None,
                )
            )
    return out


def _one_by_one(records, schema):
    decoder = RecordDecoder(Router([StreamSettings(topic_pattern=r"p\..*")]))
    rows, ops = [], []
    for rec in records:
        change = decoder.decode(rec)
        rows.append(change.row)
        ops.append(change.op)
    table, bad = convert_rows(rows, schema)
    assert not bad
    return table, ops


@pytest.mark.parametrize("schemas", [True, False])
def test_run_equals_record_by_record(schemas):
    records = _records(DebeziumEvents("p", "orders", schemas=schemas))
    schema = _schema(schemas)
    run = RunDecoder().decode(RecordRun.of(records), schema, ["id"])
    assert run is not None
    want, ops = _one_by_one(records, schema)
    assert run.table.equals(want), (run.table.slice(0, 3).to_pylist(), want.slice(0, 3).to_pylist())
    assert run.ops == ops and run.offsets.tolist() == [r.offset for r in records]
    assert all(run.source_ts == records[0].timestamp_ms)


def test_full_before_images_equal_record_by_record():
    """REPLICA IDENTITY FULL: updates and deletes carry every column in ``before``. Schemas on, the run parses only
    the key out of a before image; the rows are those of the record-by-record path, deletes keyed by it."""
    records = []
    for rec in _records(DebeziumEvents("p", "orders", schemas=True)):
        value = json.loads(rec.value)
        payload = value["payload"]
        if payload["op"] == "u":
            payload["before"] = {**payload["after"], "qty": 0, "note": "the old row"}
        elif payload["op"] == "d":
            payload["before"] = {**payload["before"], "customer_id": 1, "note": "deleted"}
        records.append(SimpleNamespace(**{**vars(rec), "value": json.dumps(value, separators=(",", ":")).encode()}))
    schema = _schema(True)
    run = RunDecoder().decode(RecordRun.of(records), schema, ["id"])
    assert run is not None
    want, ops = _one_by_one(records, schema)
    assert run.table.equals(want), (run.table.slice(0, 3).to_pylist(), want.slice(0, 3).to_pylist())
    assert "d" in ops and run.ops == ops
    assert [r["id"] for r, op in zip(run.table.to_pylist(), ops, strict=True) if op == "d"] == list(range(9, 200, 10))


def _with_value(records, index, value: bytes):
    changed = list(records)
    changed[index] = SimpleNamespace(**{**vars(records[index]), "value": value})
    return changed


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.replace(b'"op":"u"', b'"op":"t"', 1),  # unknown op
        lambda p: p.replace(b'"qty":', b'"qty":1.5,"x":', 1),  # fraction where an integer is
        lambda p: p.replace(b'"qty":', b'"new_column":1,"qty":', 1),  # a column the table lacks
        lambda p: p.replace(b'"note":"', b'"note":"__debezium_unavailable_value","n":"', 1),  # withheld TOAST
        lambda p: p[:-5],  # truncated JSON
        lambda p: p.replace(b'"id":', b'"id":null,"i":', 1),  # null key
    ],
)
def test_anything_unusual_declines_the_run(mutate):
    records = _records(DebeziumEvents("p", "orders", schemas=False), 40)
    schema = _schema(False)
    assert RunDecoder().decode(RecordRun.of(records), schema, ["id"]) is not None
    assert RunDecoder().decode(RecordRun.of(_with_value(records, 7, mutate(records[7].value))), schema, ["id"]) is None


def test_a_different_schema_in_the_run_declines():
    records = _records(DebeziumEvents("p", "orders", schemas=True), 40)
    other = json.loads(records[7].value)
    other["schema"]["name"] = "changed"
    changed = _with_value(records, 7, json.dumps(other, separators=(",", ":")).encode())
    assert RunDecoder().decode(RecordRun.of(changed), _schema(True), ["id"]) is None
    assert RunDecoder().decode(RecordRun.of(records), _schema(True), ["id"], expected_like=changed[7].value) is None


def _with_key(records, index, key: bytes | None):
    changed = list(records)
    changed[index] = SimpleNamespace(**{**vars(records[index]), "key": key})
    return changed


def test_schemas_on_keys_are_held_to_the_first_keys_schema_part():
    """The record path parses a schemas-on key once per key schema and takes later keys by their schema part: a run
    declines every key that path would not take by the first key's schema part (none, schemas off, another key
    schema, no envelope), and takes one it would, with the same rows."""
    records = _records(DebeziumEvents("p", "orders", schemas=True), 40)
    schema = _schema(True)
    first = records[0].key
    head = first[: first.find(b',"payload":') + len(b',"payload":')]
    for bad in (
        None,
        b'{"id":8}',  # schemas off
        first.replace(b'"optional":false', b'"optional":true', 1),  # another key schema
        head + b'{"id":8',  # no closing brace: not an envelope
        b"\xff" + first,
    ):
        assert RunDecoder().decode(RecordRun.of(_with_key(records, 7, bad)), schema, ["id"]) is None, bad
    # the same schema part with any payload: the record path takes the key's names from the first key and the
    # values from the row, and so does the run
    taken = _with_key(records, 7, head + b'{"id":"not the row\'s id"}}')
    run = RunDecoder().decode(RecordRun.of(taken), schema, ["id"])
    assert run is not None
    want, ops = _one_by_one(taken, schema)
    assert run.table.equals(want) and run.ops == ops
    # a first key the record path cannot read declines the run
    assert RunDecoder().decode(RecordRun.of(_with_key(records, 0, head + b"[1]}")), schema, ["id"]) is None


def test_base64_decimals_in_numpy_equal_the_per_value_path():
    """Kafka Connect Decimal bytes decoded in numpy: equal to the per-value converter for every size
    up to 8 bytes, negatives, boundaries and nulls; anything else is left to the per-value path."""
    import base64
    import random

    import pyarrow as pa

    from lakestream.decode.types import _decimal_from_bytes
    from lakestream.decode.vectorized import decimals_from_base64

    rng = random.Random(5)
    unscaled = [0, 1, -1, 127, 128, -128, -129, 255, 256, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**17, -(10**17)]
    unscaled += [rng.randrange(-(2 ** (8 * k - 1)), 2 ** (8 * k - 1)) for k in range(1, 9) for _ in range(50)]

    def b64(v: int) -> str:
        size = max(1, (v + (v < 0)).bit_length() // 8 + 1)
        return base64.b64encode(v.to_bytes(size, "big", signed=True)).decode()

    texts = [b64(v) for v in unscaled] + [None]
    convert = _decimal_from_bytes(3)
    target = pa.decimal128(38, 3)
    got = decimals_from_base64(pa.array(texts, pa.string()), target)
    assert got is not None
    assert got.to_pylist() == [None if t is None else convert(t) for t in texts]
    # a sliced array (offset into its buffers) decodes the same
    assert decimals_from_base64(pa.array(texts, pa.string()).slice(3, 20), target).to_pylist() == got.to_pylist()[3:23]
    # declined: invalid base64, a value over 8 bytes, more digits than the column holds
    assert decimals_from_base64(pa.array(["AB*="]), target) is None
    assert decimals_from_base64(pa.array([b64(2**70)]), target) is None
    assert decimals_from_base64(pa.array([b64(10**6)]), pa.decimal128(6, 3)) is None
    assert decimals_from_base64(pa.array([b64(10**6 - 1)]), pa.decimal128(6, 3)).to_pylist() == [
        convert(b64(10**6 - 1))
    ]


# -- plain JSON events (append streams) ------------------------------------------------------------


def _event_schema() -> pa.Schema:
    def f(i, name, t, nullable=True):
        return pa.field(name, t, nullable=nullable, metadata={FIELD_ID: str(i)})

    return pa.schema(
        [
            f(1, "event_id", pa.int64()),
            f(2, "user_id", pa.int32()),
            f(3, "kind", pa.string()),
            f(4, "amount", pa.float64()),
            f(5, "mobile", pa.bool_()),
            f(6, "ts", pa.timestamp("us", tz="UTC")),
        ]
    )


def _events(n: int = 40, ts=lambda i: 1_732_540_000_000 + i) -> list:
    out = []
    for i in range(n):
        value = json.dumps(
            {
                "event_id": i,
                "user_id": i % 7,
                "kind": "view" if i % 2 else "click",
                "amount": i * 0.25,
                "mobile": i % 3 == 0,
                "ts": ts(i),
            }
        ).encode()
        out.append(
            SimpleNamespace(topic="ev", partition=0, offset=i, timestamp_ms=1, key=None, value=value, headers=None)
        )
    return out


def _events_one_by_one(records, schema):
    decoder = RecordDecoder(
        Router([StreamSettings(topics=["ev"], mode="append", namespace="n", table="events", event_time_field="ts")])
    )
    changes = [decoder.decode(rec) for rec in records]
    table, bad = convert_rows([c.row for c in changes], schema)
    assert not bad
    return table, [c.source_ts_ms for c in changes]


@pytest.mark.parametrize(
    "ts",
    [
        lambda i: 1_732_540_000_000 + i,  # epoch milliseconds
        lambda i: 1_732_540_000 + i / 8,  # epoch seconds with fractions
        lambda i: f"2026-11-25T10:{i % 60:02d}:00.{i:03d}+01:00",  # ISO with an offset
        lambda i: f"2026-11-25 10:00:{i % 60:02d}",  # ISO without one (UTC)
    ],
)
def test_event_run_equals_record_by_record(ts):
    records = _events(ts=ts)
    schema = _event_schema()
    run = decode_events(RecordRun.of(records), schema, [], "ts")
    assert run is not None
    want, source_ts = _events_one_by_one(records, schema)
    assert run.table.equals(want), (run.table.slice(0, 2).to_pylist(), want.slice(0, 2).to_pylist())
    assert run.ops == ["c"] * len(records) and run.source_ts.tolist() == source_ts


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.replace(b'"user_id": ', b'"user_id": "x', 1).replace(
            b', "kind"', b'", "kind"', 1
        ),  # text in a number
        lambda p: p.replace(b'"user_id": ', b'"user_id": 1.5, "u": ', 1),  # a fraction in an integer
        lambda p: p.replace(b'"user_id": ', b'"user_id": 4294967296, "u": ', 1),  # beyond int32
        lambda p: p.replace(b'"kind": ', b'"new_field": 1, "kind": ', 1),  # a field the table lacks
        lambda p: p.replace(b'"ts": ', b'"ts": null, "t": ', 1),  # no event time
        lambda p: p.replace(b'"kind": "', b'"kind": "\xff', 1),  # invalid UTF-8
        lambda p: p + b'{"event_id": 1}',  # two objects in one message
        lambda p: b"[" + p + b"]",  # not an object
        lambda p: p.replace(b'"kind": ', b'"kind": {"a": 1}, "k": ', 1),  # an object in a flat column
        lambda p: p.replace(b'"event_id": ', b'"event_id": NaN, "e": ', 1),  # NaN in an integer
        lambda p: p.replace(b'"event_id": ', b'"event_id": 1, "event_id": ', 1),  # a field given twice
        lambda p: p[:-3],  # truncated
        lambda p: p.replace(b'"amount": ', b'"amount": 9007199254740993, "a": ', 1),  # no double holds it exactly
    ],
)
def test_anything_unusual_declines_the_event_run(mutate):
    records = _events()
    schema = _event_schema()
    assert decode_events(RecordRun.of(records), schema, ["event_id"], "ts") is not None
    changed = _with_value(records, 7, mutate(records[7].value))
    assert changed[7].value != records[7].value
    assert decode_events(RecordRun.of(changed), schema, ["event_id"], "ts") is None


def test_a_null_dedupe_key_declines_the_event_run():
    records = _events()
    changed = _with_value(records, 3, records[3].value.replace(b'"event_id": 3', b'"event_id": null'))
    assert decode_events(RecordRun.of(changed), _event_schema(), ["event_id"], "ts") is None
    assert decode_events(RecordRun.of(changed), _event_schema(), [], "ts") is not None  # no key: a null is a value
