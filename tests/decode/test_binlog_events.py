"""What MariaDB's (and MySQL's) Debezium events bring that PostgreSQL's do not: TIME as a signed duration beyond
24 hours, and source positions from the binlog (file, position, row) for keyless mirrors. Values as recorded
from Debezium's MariaDB connector 3.5.0.Final on MariaDB 10.11 (tests/capture/test_mariadb_capture.py runs them
end to end)."""
from __future__ import annotations

import decimal

import pytest

from lakestream.decode.envelope import source_position
from lakestream.decode.types import field_type


@pytest.mark.parametrize("micros, text", [
    (-3_020_399_000_000, "-838:59:59.000000"),  # TIME's lower bound
    (3_020_399_000_000, "838:59:59.000000"),
    (45_296_789_012, "12:34:56.789012"),
    (-1, "-00:00:00.000001"),
    (0, "00:00:00.000000"),
])
def test_time_is_a_signed_duration(micros, text):
    assert field_type({"type": "int64", "name": "io.debezium.time.MicroTime"}).convert(micros) == text


def test_bigint_unsigned_above_2_63_is_exact():
    # bigint.unsigned.handling.mode=precise: Decimal(20, 0), 18446744073709551615 as base64 of 00 ff*8
    ftype = field_type({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "0", "connect.decimal.precision": "20"}})
    assert ftype.ddl == "decimal(20,0)"
    assert ftype.convert("AP//////////") == decimal.Decimal("18446744073709551615")


def test_year_and_wide_decimal():
    assert field_type({"type": "int32", "name": "io.debezium.time.Year"}).ddl == "int"
    wide = field_type({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                       "parameters": {"scale": "10", "connect.decimal.precision": "65"}})
    assert wide.ddl == "string"
    assert wide.convert("E6r1BOS8HmIXP4ekN4w3tJyMz/GWjATVFQ==") == \
        "12345678901234567890123456789012345678901234567890.0123456789"


def _binlog(file: str, pos: int, row: int, connector: str = "mariadb") -> dict:
    return {"source": {"connector": connector, "file": file, "pos": pos, "row": row, "gtid": "0-1-16"}}


def test_binlog_positions_rise_along_the_binlog():
    order = [_binlog("binlog.000001", 7194, 0), _binlog("binlog.000001", 7194, 1), _binlog("binlog.000001", 7701, 0),
             _binlog("binlog.000002", 4, 0, connector="mysql"), _binlog("binlog.000002", 350, 2)]
    positions = [source_position(e) for e in order]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[0] == (1 << 32 | 7194, 0)
    assert source_position(_binlog("binlog.000001", 7194, 1)) == positions[1]  # a re-sent event repeats it
    # PostgreSQL's events keep their (commit LSN, LSN)
    assert source_position({"source": {"connector": "postgresql", "lsn": 500, "sequence": '["400","500"]'}}) == (400, 500)
