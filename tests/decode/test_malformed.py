"""Malformed values the fuzz test (tests/engine/test_fuzz.py) found slipping through, one by one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pytest

from lakestream.decode.envelope import SchemaCache, decode_debezium, decode_key
from lakestream.decode.vectorized import RunDecoder
from lakestream.errors import DecodeError
from lakestream.sink.write.convert import convert_rows
from lakestream.source.reader import RecordRun

ROW = {
    "type": "struct",
    "optional": True,
    "fields": [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "ts"},
    ],
}
SCHEMA = {
    "type": "struct",
    "fields": [
        {**ROW, "field": "before"},
        {**ROW, "field": "after"},
        {"type": "string", "optional": False, "field": "op"},
    ],
}
TABLE = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.date32()), ("ts", pa.timestamp("us"))])


def _value(after: dict) -> bytes:
    return json.dumps(
        {"schema": SCHEMA, "payload": {"before": None, "after": after, "op": "c"}}, separators=(",", ":")
    ).encode()


def test_confluent_framed_avro_names_the_missing_registry():
    with pytest.raises(DecodeError, match="schema id 7.*no schema registry"):
        decode_debezium(b'{"id":1}', b"\x00\x00\x00\x00\x07\x02\x06abc", SchemaCache())


def test_a_malformed_key_says_it_is_the_key():
    with pytest.raises(DecodeError, match="^message key: malformed JSON"):
        decode_key(b"\xff\xfe\xfd")


@pytest.mark.parametrize(
    "after, column",
    [
        ({"id": 1, "day": 10**9}, "day"),
        ({"id": 1, "day": 2_932_897}, "day"),
        ({"id": 1, "day": -719_163}, "day"),
        ({"id": 1, "ts": 9 * 10**18}, "ts"),
        ({"id": 1, "ts": 253_402_300_800_000_000}, "ts"),
    ],
)
def test_dates_and_timestamps_no_reader_can_represent_are_dead_letters(after, column):
    # Arrow stores them (date32 of 10^9 days prints "<value out of range>"); Spark and others cannot read them.
    with pytest.raises(DecodeError, match=f"column '{column}'.*outside 0001-01-01..9999-12-31"):
        decode_debezium(b'{"id":1}', _value(after), SchemaCache())
    edge = decode_debezium(
        b'{"id":1}', _value({"id": 1, "day": 2_932_896, "ts": -62_135_596_800_000_000}), SchemaCache()
    )
    assert convert_rows([edge.row], TABLE)[1] == {}


def test_an_integer_literal_below_int64_is_not_rounded_into_range():
    # orjson reads -2^63-1 as the float -9.223372036854776e18, which is exactly -2^63: a different number.
    change = decode_debezium(b'{"id":1}', _value({"id": -(2**63) - 1}), SchemaCache())
    _, bad = convert_rows([change.row], TABLE)
    assert "not exactly" in bad[0]
    assert convert_rows([{"id": 3.0}], TABLE)[1] == {}  # an integral float that is exact still fits


def _records(keys: list[bytes | None], days: list[int]) -> list:
    return [
        SimpleNamespace(
            topic="t", partition=0, offset=i, timestamp_ms=0, key=k, value=_value({"id": i, "day": d}), headers=None
        )
        for i, (k, d) in enumerate(zip(keys, days, strict=True))
    ]


def test_vectorized_runs_decline_what_the_record_path_dead_letters():
    good_keys = [json.dumps({"id": i}).encode() for i in range(20)]
    assert RunDecoder().decode(RecordRun.of(_records(good_keys, [1] * 20)), TABLE, ["id"]) is not None
    for bad_key in (None, b"\xff\xfe", b"[1]", b"{not json}"):
        assert (
            RunDecoder().decode(
                RecordRun.of(_records(good_keys[:10] + [bad_key] + good_keys[11:], [1] * 20)), TABLE, ["id"]
            )
            is None
        )
    assert RunDecoder().decode(RecordRun.of(_records(good_keys, [1] * 10 + [10**9] + [1] * 9)), TABLE, ["id"]) is None
