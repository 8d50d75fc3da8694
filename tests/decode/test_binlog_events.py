"""What MariaDB's (and MySQL's) Debezium events bring that PostgreSQL's do not: TIME as a signed duration beyond
24 hours, and source positions from the binlog (file, position, row) for keyless mirrors. Values as recorded
from Debezium's MariaDB connector 3.5.0.Final on MariaDB 10.11 (tests/capture/test_mariadb_capture.py runs them
end to end)."""

from __future__ import annotations

import decimal

import pytest

from lakestream.decode.envelope import source_position
from lakestream.decode.types import field_type


@pytest.mark.parametrize(
    "micros, text",
    [
        (-3_020_399_000_000, "-838:59:59.000000"),  # TIME's lower bound
        (3_020_399_000_000, "838:59:59.000000"),
        (45_296_789_012, "12:34:56.789012"),
        (-1, "-00:00:00.000001"),
        (0, "00:00:00.000000"),
    ],
)
def test_time_is_a_signed_duration(micros, text):
    assert field_type({"type": "int64", "name": "io.debezium.time.MicroTime"}).convert(micros) == text


def test_bigint_unsigned_above_2_63_is_exact():
    # bigint.unsigned.handling.mode=precise: Decimal(20, 0), 18446744073709551615 as base64 of 00 ff*8
    ftype = field_type(
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "0", "connect.decimal.precision": "20"},
        }
    )
    assert ftype.ddl == "decimal(20,0)"
    assert ftype.convert("AP//////////") == decimal.Decimal("18446744073709551615")


def test_year_and_wide_decimal():
    assert field_type({"type": "int32", "name": "io.debezium.time.Year"}).ddl == "int"
    wide = field_type(
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "10", "connect.decimal.precision": "65"},
        }
    )
    assert wide.ddl == "string"
    assert (
        wide.convert("E6r1BOS8HmIXP4ekN4w3tJyMz/GWjATVFQ==")
        == "12345678901234567890123456789012345678901234567890.0123456789"
    )


def _binlog(file: str, pos: int, row: int, connector: str = "mariadb") -> dict:
    return {"source": {"connector": connector, "file": file, "pos": pos, "row": row, "gtid": "0-1-16"}}


def test_binlog_positions_rise_along_the_binlog():
    order = [
        _binlog("binlog.000001", 7194, 0),
        _binlog("binlog.000001", 7194, 1),
        _binlog("binlog.000001", 7701, 0),
        _binlog("binlog.000002", 4, 0, connector="mysql"),
        _binlog("binlog.000002", 350, 2),
    ]
    positions = [source_position(e) for e in order]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[0] == (1 << 32 | 7194, 0)
    assert source_position(_binlog("binlog.000001", 7194, 1)) == positions[1]  # a re-sent event repeats it
    # PostgreSQL's events keep their (commit LSN, LSN)
    assert source_position({"source": {"connector": "postgresql", "lsn": 500, "sequence": '["400","500"]'}}) == (
        400,
        500,
    )


def _recorded(connector: str = "mariadb"):
    """tests/data/mariadb_events.jsonl: Debezium's MariaDB connector (3.5.0.Final, schemas on) on MariaDB 10.11 —
    the snapshot of a row of every type (id 1) and of an all-NULL row (id 2), and the same full row streamed from
    the binlog (id 3). With ``connector="mysql"``: as Debezium's MySQL connector would send them (the events differ
    only in ``source``)."""
    import json

    from conftest import load_debezium_fixture

    out = []
    for event in load_debezium_fixture("mariadb_events.jsonl"):
        value = json.loads(event["value"])
        if connector == "mysql":
            value["payload"]["source"].update(
                connector="mysql", file="mysql-bin.000003", gtid="3e11fa47-71ca-11e1-9e33-c80aa9429562:23"
            )
        out.append((event["key"].encode(), json.dumps(value).encode()))
    return out


@pytest.mark.parametrize("connector", ["mariadb", "mysql"])
def test_recorded_events_decode_into_the_documented_types(connector):
    import datetime as dt

    from lakestream.decode.envelope import SchemaCache, decode_debezium

    cache = SchemaCache()
    snapshot, nulls, streamed = (decode_debezium(k, v, cache) for k, v in _recorded(connector))
    assert [c.op for c in (snapshot, nulls, streamed)] == ["r", "r", "c"]
    types = dict(zip(snapshot.columns.names, (t.ddl for t in snapshot.columns.types), strict=True))
    assert {
        k: types[k]
        for k in (
            "b1",
            "bo",
            "tiu",
            "siu",
            "iu",
            "biu",
            "de",
            "de65",
            "dt",
            "dtm0",
            "dtm6",
            "ts",
            "tm",
            "y",
            "bit1",
            "bit5",
            "en",
            "st",
            "js",
            "g",
            "gen",
        )
    } == {
        "b1": "boolean",
        "bo": "boolean",
        "tiu": "int",
        "siu": "int",
        "iu": "bigint",
        "biu": "decimal(20,0)",
        "de": "decimal(12,3)",
        "de65": "string",
        "dt": "date",
        "dtm0": "timestamp_ntz",
        "dtm6": "timestamp_ntz",
        "ts": "timestamp",
        "tm": "string",
        "y": "int",
        "bit1": "boolean",
        "bit5": "binary",
        "en": "string",
        "st": "string",
        "js": "string",
        "g": "string",
        "gen": "bigint",
    }
    row = snapshot.row
    epoch = dt.datetime(1970, 1, 1)
    assert row["biu"] == decimal.Decimal("18446744073709551615") and row["iu"] == 4294967295
    assert row["dtm6"] == (dt.datetime(2024, 2, 29, 13, 14, 15, 123456) - epoch) // dt.timedelta(microseconds=1)
    assert row["ts6"] == (dt.datetime(2024, 2, 29, 13, 14, 15, 654321) - epoch) // dt.timedelta(microseconds=1)
    assert row["tm"] == "-838:59:59.000000" and row["vc"] == "héllo 🚀" and row["bit5"] == b"\x15"
    assert all(v is None for k, v in nulls.row.items() if k != "id")
    assert {k: v for k, v in streamed.row.items() if k != "id"} == {k: v for k, v in row.items() if k != "id"}
    assert source_position(streamed.payload) > source_position(snapshot.payload)


def test_zero_date_sentinels_refused_only_where_the_schema_says_so():
    from lakestream.errors import DecodeError

    marked = {"parameters": {"lakestream.zero_date": "dead_letter"}, "optional": True}
    for schema, zero, real, want in (
        ({"type": "int32", "name": "io.debezium.time.Date"}, -(2**31), 0, 0),
        ({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, -(2**63), 500_000, 500_000),
        (
            {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
            "0000-00-00T00:00:00Z",
            "2024-02-29T13:14:15Z",
            1709212455000000,
        ),
    ):
        ftype = field_type({**schema, **marked})
        assert ftype.ddl == field_type(schema).ddl
        with pytest.raises(DecodeError, match=r"zero date \(0000-00-00\) in a NOT NULL column .*zero_dates: null"):
            ftype.convert(zero)
        assert ftype.convert(real) == want
