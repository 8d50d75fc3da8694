"""Chunk planning and the chunk reader's parsing, against the shared PostgreSQL (no Spark)."""
from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pytest
from psycopg2 import sql as pgsql

from lakestream.config import parse_config
from lakestream.errors import ConfigError, LakestreamError
from lakestream.snapshot.reader import hex_to_binary, parse_chunk
from lakestream.snapshot.source import UnsupportedColumn, chunk_query, describe_table, plan_chunks


@pytest.fixture
def schema(pg_conn):
    name = f"chunks_{uuid.uuid4().hex[:6]}"
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {name}")
    yield name
    with pg_conn.cursor() as cur:
        cur.execute(f"DROP SCHEMA {name} CASCADE")


def _rows_per_chunk(conn, source, plan) -> list[int]:
    counts = []
    with conn.cursor() as cur:
        for chunk in plan.chunks:
            buf = io.BytesIO()
            cur.copy_expert(chunk_query(source, chunk).as_string(conn), buf)
            counts.append(buf.getvalue().count(b"\n"))
    return counts


@pytest.mark.parametrize("key_type,key_sql", [("bigint", "g * 3 - 7"), ("text", "'k' || g"),
                                              ("int, b text", "g % 7, 'x' || g")])
def test_chunks_cover_every_row_once(pg_conn, schema, key_type, key_sql):
    composite = "," in key_type
    cols = "a int, b text, v text, PRIMARY KEY (a, b)" if composite else f"k {key_type} PRIMARY KEY, v text"
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.t ({cols})")
        cur.execute(f"INSERT INTO {schema}.t SELECT {key_sql}, 'v' || g FROM generate_series(1, 5000) g")
        cur.execute(f"ANALYZE {schema}.t")
    source = describe_table(pg_conn, schema, "t")
    assert source.integer_key == (key_type == "bigint")
    plan = plan_chunks(pg_conn, source, 600)
    assert len(plan.chunks) >= 4
    counts = _rows_per_chunk(pg_conn, source, plan)
    assert sum(counts) == 5000  # bounds are half-open and adjacent: no row twice, none left out
    assert plan.chunks[0].lower is None and plan.chunks[-1].upper is None
    for a, b in zip(plan.chunks, plan.chunks[1:]):
        assert a.upper == b.lower


def test_empty_table_is_one_chunk(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.e (id int PRIMARY KEY)")
    source = describe_table(pg_conn, schema, "e")
    assert len(plan_chunks(pg_conn, source, 100).chunks) == 1


def test_no_primary_key_and_unsupported_types_are_refused(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.nokey (id int)")
        cur.execute(f"CREATE TABLE {schema}.arr (id int PRIMARY KEY, tags text[])")
    with pytest.raises(LakestreamError, match="no primary key"):
        describe_table(pg_conn, schema, "nokey")
    with pytest.raises(UnsupportedColumn, match="'tags'.*fix"):
        describe_table(pg_conn, schema, "arr")


def test_parse_keeps_null_apart_from_empty_and_fails_on_bad_values(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.p (id int PRIMARY KEY, s text, b bytea, f boolean)")
        cur.execute(f"INSERT INTO {schema}.p VALUES (1, '', '\\x00ff'::bytea, true), (2, NULL, NULL, NULL), "
                    "(3, 'a,\"b\"\nc', ''::bytea, false)")
    source = describe_table(pg_conn, schema, "p")
    plan = plan_chunks(pg_conn, source, 100)
    buf = io.BytesIO()
    with pg_conn.cursor() as cur:
        cur.copy_expert(chunk_query(source, plan.chunks[0]).as_string(pg_conn), buf)
    target = pa.schema([("id", pa.int32(), False), ("s", pa.string()), ("b", pa.binary()), ("f", pa.bool_())])
    table = parse_chunk(buf.getvalue(), source, target)
    assert sorted(table.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "s": "", "b": b"\x00\xff", "f": True},
        {"id": 2, "s": None, "b": None, "f": None},
        {"id": 3, "s": 'a,"b"\nc', "b": b"", "f": False},
    ]
    with pytest.raises(pa.ArrowInvalid):
        parse_chunk(b"x,1,,\n", source, target)
    assert hex_to_binary(pa.chunked_array([pa.array(["0a", None, "FF"])])).to_pylist() == [b"\n", None, b"\xff"]


def test_parallel_snapshot_needs_schemas():
    data = {"kafka": {"bootstrap_servers": "x:1"}, "catalog": {"warehouse": "file:///tmp/w", "type": "hadoop"},
            "streams": [{"topics": ["a"]}],
            "capture": {"database": {"dbname": "d", "user": "u"}, "tables": ["public.t"], "snapshot": "parallel",
                        "schemas_enabled": False}}
    with pytest.raises(ConfigError, match="capture: .*schemas_enabled: true"):
        parse_config(data)
