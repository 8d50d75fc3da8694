"""The task-side decoder: a routed change or a DecodeError per record, deletes reduced to their key."""

from __future__ import annotations

import json
from types import SimpleNamespace

from lakestream.config import StreamSettings
from lakestream.decode.records import RecordDecoder
from lakestream.errors import DecodeError
from lakestream.routing import Router


def _rec(offset: int, key, value, topic: str = "p.public.orders"):
    enc = lambda x: None if x is None else (x if isinstance(x, bytes) else json.dumps(x).encode())  # noqa: E731
    return SimpleNamespace(
        topic=topic,
        partition=0,
        offset=offset,
        timestamp_ms=1000 + offset,
        key=enc(key),
        value=enc(value),
        headers=None,
    )


def _decode(records, **stream):
    decoder = RecordDecoder(Router([StreamSettings(**({"topic_pattern": r"p\..*"} | stream))]))
    out = []
    for rec in records:
        try:
            change = decoder.decode(rec)
        except DecodeError as exc:
            out.append({"kind": "error", "offset": rec.offset, "error": str(exc), "raw_value": rec.value})
            continue
        if change is not None:
            out.append(
                {
                    "kind": "change",
                    "offset": rec.offset,
                    "table": change.table,
                    "op": change.op,
                    "row": change.row,
                    "key": [change.row[k] for k in change.key_columns],
                    "unavailable": change.unavailable,
                    "shape": change.columns.schema_id,
                }
            )
    return out


def test_default_identity_delete_keeps_only_the_key():
    rows = _decode(
        [
            _rec(0, {"id": 1}, {"before": None, "after": {"id": 1, "status": "shipped", "qty": 3}, "op": "c"}),
            _rec(1, {"id": 1}, {"before": {"id": 1, "status": "dflt", "qty": 0}, "after": None, "op": "d"}),
            _rec(2, {"id": 1}, None),  # tombstone
        ]
    )
    changes = [r for r in rows if r["kind"] == "change"]
    assert [c["op"] for c in changes] == ["c", "d"]
    assert changes[1]["row"] == {"id": 1}  # the defaults never leave the decoder
    assert changes[0]["key"] == changes[1]["key"] == [1]
    assert {r["table"] for r in changes} == {"cdc.public_orders"}


def test_unavailable_columns_are_listed():
    rows = _decode([_rec(0, {"id": 1}, {"after": {"id": 1, "body": "__debezium_unavailable_value"}, "op": "u"})])
    change = next(r for r in rows if r["kind"] == "change")
    assert change["unavailable"] == ["body"]
    assert change["row"] == {"id": 1, "body": None}


def test_bad_records_become_error_rows_with_raw_bytes():
    rows = _decode(
        [
            # no key, no key_columns: a table without a primary key (a row multiset), unless an update lacks
            # its old row (REPLICA IDENTITY DEFAULT cannot say which row changed)
            _rec(0, None, {"after": {"id": 1}, "before": None, "op": "u"}),
            _rec(
                1,
                {"id": 2},
                {"after": {"id": None}, "op": "c"},
            ),
            _rec(2, {"id": 3}, b"{broken"),
            _rec(3, {"id": 4}, {"after": {"id": 4}, "op": "x"}),
        ]
    )
    errors = [r for r in rows if r["kind"] == "error"]
    assert [e["offset"] for e in errors] == [0, 1, 2, 3]
    assert "REPLICA IDENTITY FULL" in errors[0]["error"]
    assert "key column(s) ['id'] missing or null" in errors[1]["error"]
    assert "malformed JSON" in errors[2]["error"] and errors[2]["raw_value"] == b"{broken"
    assert "unknown op 'x'" in errors[3]["error"]


def test_a_change_without_a_key_is_a_keyless_row_with_its_source_position():
    rows = _decode(
        [
            _rec(
                0,
                None,
                {
                    "after": {"id": 1, "v": "b"},
                    "before": {"id": 1, "v": "a"},
                    "op": "u",
                    "source": {"lsn": 500, "sequence": '["400","500"]'},
                },
            )
        ]
    )
    change = next(r for r in rows if r["kind"] == "change")
    assert change["row"] == {"id": 1, "v": "b"}


def test_key_columns_from_config_override_the_message_key():
    rows = _decode(
        [_rec(0, None, {"after": {"tenant": "a", "id": 1, "v": 2}, "op": "c"})], key_columns=["tenant", "id"]
    )
    change = next(r for r in rows if r["kind"] == "change")
    assert change["key"] == ["a", 1]


def test_append_mode_route_field_errors():
    rows = _decode(
        [
            _rec(0, None, {"kind": "ok_table", "x": 1}),
            _rec(1, None, {"kind": "1bad", "x": 1}),
            _rec(2, None, {"x": 1}),
        ],
        mode="append",
        route_field="kind",
        table="{field}",
        namespace="ev",
    )
    assert [r["table"] for r in rows if r["kind"] == "change"] == ["ev.ok_table"]
    errors = [r["error"] for r in rows if r["kind"] == "error"]
    assert "'1bad' is not a valid table name" in errors[0]
    assert "missing or null" in errors[1]
