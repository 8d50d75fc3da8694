"""The native payload parser against Arrow's JSON reader: the same columns for every payload either takes, and a
decline (the record path decides) for anything it does not take as it is."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from lakestream.decode import native
from lakestream.decode.vectorized import RunDecoder, _read_payloads
from lakestream.source.reader import RecordRun

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _common import DebeziumEvents, OrderRow  # noqa: E402
from test_vectorized import _schema  # noqa: E402

FIELDS = [
    ("id", pa.int64()),
    ("qty", pa.int64()),
    ("price", pa.float64()),
    ("express", pa.bool_()),
    ("status", pa.string()),
    ("note", pa.string()),
]
SCHEMA_PART = b'{"schema":{"type":"struct","name":"t.Envelope"},"payload":'


def _envelope(payload: bytes) -> bytes:
    return SCHEMA_PART + payload + b"}"


def _arrow(values: list[bytes], key_columns: list[str] = ["id"]) -> pa.Table | None:  # noqa: B006
    row = pa.struct(FIELDS)
    explicit = pa.schema(
        [
            ("before", pa.struct([(n, t) for n, t in FIELDS if n in key_columns])),
            ("after", row),
            ("op", pa.string()),
            ("source", pa.struct([("ts_ms", pa.int64())])),
            ("ts_ms", pa.int64()),
        ]
    )
    try:
        return _read_payloads(values, len(SCHEMA_PART), explicit, "ignore")
    except pa.ArrowException:
        return None


def _native(values: list[bytes], key_columns: list[str] = ["id"]) -> pa.Table | None:  # noqa: B006
    return native.parse_envelopes(values, len(SCHEMA_PART), FIELDS, key_columns)


def test_the_library_is_built_here():
    """`make setup` builds it; without it every schemas-on run would take Arrow's slower reader unnoticed."""
    assert native.available(), f"{native.library_path()} is missing: python -m lakestream.decode.native builds it"


def test_a_library_that_does_not_load_leaves_the_runs_to_arrows_reader(monkeypatch, tmp_path, caplog):
    """A cluster's copy built for another machine: a warning, and the run decoder still decodes (with Arrow's)."""
    bad = tmp_path / "lakestream-payloads.so"
    bad.write_bytes(b"not a shared library")
    records = RecordRun.of(_peers_records(20))
    monkeypatch.setenv("LAKESTREAM_NATIVE_LIB", str(bad))
    native._library.cache_clear()
    try:
        assert not native.available()
        assert RunDecoder().decode(records, _schema(True), ["id"]) is not None
    finally:
        monkeypatch.delenv("LAKESTREAM_NATIVE_LIB")
        native._library.cache_clear()
    assert "does not load" in caplog.text


PAYLOADS = [
    b'{"before":null,"after":{"id":1,"qty":2,"price":1.5,"express":true,"status":"new","note":null},"op":"c",'
    b'"source":{"version":"3.6","ts_ms":1700000000000,"snapshot":"false","sequence":"[\\"1\\",\\"2\\"]"},"ts_ms":17}',
    # escapes, \u escapes (a surrogate pair too), multi-byte UTF-8, an exponent, an integer where a double is
    b'{"before":{"id":2},"after":{"id":2,"qty":-9223372036854775808,"price":-2E-3,"express":false,'
    b'"status":"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t","note":"\\u00e9\\ud83d\\ude00 \xc3\xa9 \xe2\x82\xac"},"op":"u",'
    b'"source":null,"ts_ms":null}',
    b'{"before":null,"after":{"id":3,"qty":0,"price":7,"express":null,"status":"","note":""},"op":"r",'
    b'"source":{"ts_ms":null},"ts_ms":5}',
    # a delete: its key from before; before carries more than the key (REPLICA IDENTITY FULL)
    b'{"before":{"id":4,"qty":1,"price":0.1,"express":true,"status":"x","note":"gone"},"after":null,"op":"d",'
    b'"source":{"ts_ms":3},"ts_ms":4,"transaction":{"id":"571:53195832","total_order":1,"data_collection_order":1}}',
    # whitespace everywhere, fields in another order, missing fields, nested values the table does not read
    b' { "op" : "u" , "after" : { "note" : "n" , "extra" : {"a":[1,2,{"b":null}],"c":"\\u0041"} , "id" : 5 } ,'
    b' "before" : { "id" : 5 } , "ts_ms" : 6 } \n\t',
    b'{"op":"c","after":{"id":6,"price":1e308,"qty":123456789012}}',
    b'{"op":"u","after":{},"before":{}}',
]


def test_payloads_parse_as_arrows_reader_does():
    values = [_envelope(p) for p in PAYLOADS]
    want = _arrow(values)
    assert want is not None
    got = _native(values)
    assert got is not None
    assert got.schema == want.schema
    assert got.equals(want), (got.to_pylist(), want.to_pylist())
    # and one payload at a time (string offsets restart, validity of one row)
    for v in values:
        assert _native([v]).equals(_arrow([v])), v


def _random_value(rng: random.Random, wire: pa.DataType):
    if rng.random() < 0.15:
        return None
    if wire == pa.int64():
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-(10**12), 10**12)])
    if wire == pa.float64():
        return rng.choice([0.0, -0.5, 1e-300, 1.7976931348623157e308, rng.uniform(-1e6, 1e6), rng.randint(-99, 99)])
    if wire == pa.bool_():
        return rng.random() < 0.5
    alphabet = 'abc "\\/\b\f\n\r\t\u0001\u00e9\u20ac\U0001f600\u2028'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def test_random_payloads_parse_as_arrows_reader_does():
    rng = random.Random(7)
    values = []
    for i in range(600):
        row = {name: _random_value(rng, wire) for name, wire in FIELDS if rng.random() < 0.9}
        op = rng.choice("curd")
        payload = {
            "before": {"id": i, **{k: v for k, v in row.items() if k != "id"}} if op in "ud" else None,
            "after": None if op == "d" else row,
            "op": op,
            "source": {"ts_ms": rng.choice([None, i])} if rng.random() < 0.9 else None,
            "ts_ms": rng.choice([None, i]),
        }
        items = list(payload.items())
        rng.shuffle(items)
        text = json.dumps(
            dict(items), ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")])
        )
        values.append(_envelope(text.encode()))
    want, got = _arrow(values), _native(values)
    assert want is not None and got is not None
    assert got.equals(want)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"op":"u","after":{"id":1,"qty":1.0}}',  # a fraction where an integer is
        b'{"op":"u","after":{"id":1,"qty":9223372036854775808}}',  # past 64 bits
        b'{"op":"u","after":{"id":1,"qty":"1"}}',  # a string where an integer is
        b'{"op":"u","after":{"id":1,"price":"1.5"}}',
        b'{"op":"u","after":{"id":1,"express":1}}',
        b'{"op":"u","after":{"id":1,"status":5}}',
        b'{"op":"u","after":{"id":1,"id":2}}',  # a duplicate field
        b'{"op":"u","op":"c","after":{"id":1}}',
        b'{"op":"x","after":{"id":1}}',  # not an op of a row
        b'{"op":null,"after":{"id":1}}',
        b'{"after":{"id":1}}',  # no op
        b'{"op":"u","after":{"id":1,"note":"\\ud83d"}}',  # a lone surrogate
        b'{"op":"u","after":{"id":1,"note":"\\udc00x"}}',
        b'{"op":"u","after":{"id":1,"note":"\xff"}}',  # not UTF-8
        b'{"op":"u","after":{"id":1,"x":"\xc3"}}',  # not UTF-8, in a field not read
        b'{"op":"u","after":{"id":1,"note":"a\nb"}}',  # a raw control character in a string
        b'{"op":"u","after":{"id":01}}',  # not JSON's grammar
        b'{"op":"u","after":{"id":1,"price":.5}}',
        b'{"op":"u","after":{"id":1,"price":1e999}}',  # not finite
        b'{"op":"u","after":{"id":1}',  # truncated
        b'{"op":"u","after":{"id":1}} x',  # trailing bytes
        b'{"op":"u","after":{"id":1},}',
        b'{"op":"u","after":[1]}',
        b'{"op":"u","after":{"\\u0069d":1}}',  # an escaped field name
        b'{"op":"u","after":{"id":1,"x":' + b"[" * 70 + b"]" * 70 + b"}}",  # nested past 64
        b'{"op":"u","after":{"id":1},"source":{"ts_ms":1.5}}',
        b'{"op":"u","after":{"id":1},"ts_ms":"5"}',
    ],
)
def test_anything_not_taken_as_it_is_declines(payload):
    good = _envelope(b'{"op":"c","after":{"id":9}}')
    assert _native([good, good]) is not None
    assert _native([good, _envelope(payload)]) is None


@pytest.mark.parametrize(
    "value",
    [
        b'{"schema":{"type":"struct","name":"t.Other"},"payload":{"op":"c","after":{"id":9}}}',  # another schema part
        SCHEMA_PART + b'{"op":"c","after":{"id":9}}',  # not closed
        SCHEMA_PART + b'{"op":"c","after":{"id":9}}} ',  # trailing space after the envelope
        SCHEMA_PART[:-3],  # shorter than the schema part
    ],
)
def test_an_envelope_without_the_first_ones_schema_part_declines(value):
    good = _envelope(b'{"op":"c","after":{"id":9}}')
    assert _native([good, value]) is None


def _peers_records(n: int) -> list:
    """Debezium's envelopes with full before images (REPLICA IDENTITY FULL), updates, deletes and inserts."""
    events = DebeziumEvents("p", "orders", schemas=True)
    now = int(time.time() * 1000)
    out = []
    for i in range(1, n + 1):
        if i % 10 == 0:
            key, value = events.delete(i - 1, now)[0]
        else:
            key, value = events.upsert(OrderRow(i, i * 7, i % 19 + 1, i % 5 + 1), "u" if i % 3 else "c", now)
        envelope = json.loads(value)
        payload = envelope["payload"]
        if payload["op"] == "u":
            payload["before"] = {**payload["after"], "qty": 0, "note": "the old row"}
        elif payload["op"] == "d":
            payload["before"] = {**payload["before"], "customer_id": 1, "note": "deleted"}
        value = json.dumps(envelope, separators=(",", ":")).encode()
        out.append(
            SimpleNamespace(
                topic="p.public.orders", partition=0, offset=i, timestamp_ms=now, key=key, value=value, headers=None
            )
        )
    return out


def test_a_run_decodes_the_same_without_the_library(monkeypatch):
    records = RecordRun.of(_peers_records(300))
    with_library = RunDecoder().decode(records, _schema(True), ["id"])
    monkeypatch.setenv("LAKESTREAM_NATIVE", "0")
    native._library.cache_clear()
    try:
        assert not native.available()
        without = RunDecoder().decode(records, _schema(True), ["id"])
    finally:
        monkeypatch.delenv("LAKESTREAM_NATIVE")
        native._library.cache_clear()
    assert with_library is not None and without is not None
    assert with_library.table.equals(without.table)
    assert with_library.ops == without.ops
    assert (with_library.source_ts == without.source_ts).all()
