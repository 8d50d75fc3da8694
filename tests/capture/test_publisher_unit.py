"""The packed batch layout shared by CaptureBatchConsumer.java and publisher.unpack_batch."""

from __future__ import annotations

import struct

import pytest

from lakestream.capture.publisher import unpack_batch


def _field(value: bytes | None) -> bytes:
    return struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value


def _pack(topics: list[str], records: list[tuple[int, bytes | None, bytes | None]]) -> bytes:
    out = struct.pack(">i", len(topics)) + b"".join(_field(t.encode()) for t in topics)
    return out + b"".join(struct.pack(">i", i) + _field(k) + _field(v) for i, k, v in records)


def test_unpack_keeps_nulls_empty_values_topics_and_utf8():
    value = '{"name":"Zoë ☃"}'.encode()
    packed = _pack(
        ["p.public.a", "p.public.b"],
        [
            (0, b'{"id":1}', value),
            (1, b'{"id":2}', None),  # a tombstone
            (0, None, b""),  # keyless, empty value
            (1, b"\x00\x00\x00\x00\x07\x02", b"\x00\x00\x00\x00\x08\x04\x06"),  # Avro bytes stay bytes
        ],
    )
    assert unpack_batch(packed) == [
        ("p.public.a", b'{"id":1}', value),
        ("p.public.b", b'{"id":2}', None),
        ("p.public.a", None, b""),
        ("p.public.b", b"\x00\x00\x00\x00\x07\x02", b"\x00\x00\x00\x00\x08\x04\x06"),
    ]


def test_unpack_of_a_truncated_batch_fails_loudly():
    packed = _pack(["t"], [(0, b"k", b"value")])
    with pytest.raises((struct.error, IndexError, ValueError)):
        unpack_batch(packed[:-3] + b"\xff\xff\xff\xff\xff")


def test_unpack_refuses_a_length_past_the_end():
    packed = _pack(["t"], [(0, b"k", b"value")])
    with pytest.raises(ValueError, match="ends inside a record"):
        unpack_batch(packed[:-2])
