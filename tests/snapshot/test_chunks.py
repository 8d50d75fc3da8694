"""Chunk planning and the chunk reader's parsing, against the shared PostgreSQL (no Spark)."""

from __future__ import annotations

import io
import itertools
import uuid

import pyarrow as pa
import pytest

from lakestream.capture.source_columns import UnsupportedColumn
from lakestream.config import parse_config
from lakestream.errors import ConfigError, LakestreamError
from lakestream.snapshot.reader import hex_to_binary, parse_chunk
from lakestream.snapshot.source import ChunkPlan, chunk_query, describe_table, plan_chunks


@pytest.fixture
def schema(pg_conn):
    name = f"chunks_{uuid.uuid4().hex[:6]}"
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {name}")
    yield name
    with pg_conn.cursor() as cur:
        cur.execute(f"DROP SCHEMA {name} CASCADE")


def _chunk_outputs(conn, source, plan) -> list[bytes]:
    """What each chunk's query reads (COPY text), in plan order."""
    outputs = []
    with conn.cursor() as cur:
        for chunk in plan.chunks:
            buf = io.BytesIO()
            cur.copy_expert(chunk_query(source, chunk).as_string(conn), buf)
            outputs.append(buf.getvalue())
    return outputs


def _rows_per_chunk(conn, source, plan) -> list[int]:
    return [out.count(b"\n") for out in _chunk_outputs(conn, source, plan)]


@pytest.mark.parametrize(
    "key_type,key_sql", [("bigint", "g * 3 - 7"), ("text", "'k' || g"), ("int, b text", "g % 7, 'x' || g")]
)
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
    for a, b in itertools.pairwise(plan.chunks):
        assert a.upper == b.lower


def test_empty_table_is_one_chunk(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.e (id int PRIMARY KEY)")
    source = describe_table(pg_conn, schema, "e")
    assert len(plan_chunks(pg_conn, source, 100).chunks) == 1


def test_unsupported_types_and_missing_tables_are_refused(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.arr (id int PRIMARY KEY, tags text[])")
    with pytest.raises(UnsupportedColumn, match="'tags'.*fix"):
        describe_table(pg_conn, schema, "arr")
    with pytest.raises(LakestreamError, match="does not exist"):
        describe_table(pg_conn, schema, "nope")


def _rows_read(conn, source, plan) -> list[tuple]:
    return [tuple(line.split(",")) for out in _chunk_outputs(conn, source, plan) for line in out.decode().splitlines()]


def _rows_of(conn, sql_text: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql_text)
        return [tuple("" if v is None else str(v) for v in r) for r in cur.fetchall()]


def test_a_table_without_a_key_is_split_into_block_ranges(pg_conn, schema):
    """Equal rows stay as many as they are: every row is read once, by one block range."""
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.log (msg text, n int)")
        cur.execute(f"INSERT INTO {schema}.log SELECT 'm' || (g % 9), g % 4 FROM generate_series(1, 6000) g")
        cur.execute(f"DELETE FROM {schema}.log WHERE n = 3 AND msg = 'm1'")  # holes in the blocks
        cur.execute(f"ANALYZE {schema}.log")
        cur.execute(f"CREATE TABLE {schema}.ident (id int NOT NULL, v text)")
        cur.execute(f"CREATE UNIQUE INDEX ident_id ON {schema}.ident (id)")
        cur.execute(f"ALTER TABLE {schema}.ident REPLICA IDENTITY USING INDEX ident_id")
    source = describe_table(pg_conn, schema, "log")
    assert source.keyless and not source.partitioned
    plan = plan_chunks(pg_conn, source, 800)
    assert len(plan.chunks) >= 4 and all(c.relation is None for c in plan.chunks)
    assert plan.chunks[0].lower is None and plan.chunks[-1].upper is None
    assert sorted(_rows_read(pg_conn, source, plan)) == sorted(_rows_of(pg_conn, f"SELECT * FROM {schema}.log"))
    assert "in blocks" in plan.chunks[1].describe(source)
    # A unique index as the replica identity is the key Debezium gives the events: the snapshot's too.
    assert describe_table(pg_conn, schema, "ident").key == ["id"]


@pytest.mark.parametrize("keyed", [True, False])
def test_a_partitioned_parent_is_planned_leaf_by_leaf(pg_conn, schema, keyed):
    """Chunks of each leaf partition (a sub-partitioned partition's leaves and the DEFAULT partition too), every
    row of the parent read exactly once."""
    key = ", PRIMARY KEY (id, ts)" if keyed else ""
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.ev (id int, ts date, v text{key}) PARTITION BY RANGE (ts)")
        cur.execute(
            f"CREATE TABLE {schema}.ev_a PARTITION OF {schema}.ev FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')"
        )
        cur.execute(
            f"CREATE TABLE {schema}.ev_b PARTITION OF {schema}.ev FOR VALUES FROM ('2021-01-01') TO "
            "('2022-01-01') PARTITION BY HASH (id)"
        )
        for r in (0, 1):
            cur.execute(
                f"CREATE TABLE {schema}.ev_b{r} PARTITION OF {schema}.ev_b FOR VALUES WITH (MODULUS 2, REMAINDER {r})"
            )
        cur.execute(f"CREATE TABLE {schema}.ev_other PARTITION OF {schema}.ev DEFAULT")
        cur.execute(
            f"CREATE TABLE {schema}.ev_empty PARTITION OF {schema}.ev FOR VALUES FROM ('1990-01-01') TO ('1991-01-01')"
        )
        cur.execute(
            f"INSERT INTO {schema}.ev SELECT g, date '2020-01-01' + (g % 1100), 'v' || (g % 5) "
            "FROM generate_series(1, 6000) g"
        )
        cur.execute(f"ANALYZE {schema}.ev")
    source = describe_table(pg_conn, schema, "ev")
    assert source.partitioned and source.keyless != keyed
    plan = plan_chunks(pg_conn, source, 700)
    leaves = {c.relation for c in plan.chunks}
    assert leaves == {
        (schema, "ev_a"),
        (schema, "ev_b0"),
        (schema, "ev_b1"),
        (schema, "ev_other"),
        (schema, "ev_empty"),
    }
    assert len(plan.chunks) > len(leaves)
    assert sorted(_rows_read(pg_conn, source, plan)) == sorted(_rows_of(pg_conn, f"SELECT * FROM {schema}.ev"))
    again = ChunkPlan.from_json(source.name, plan.to_json())  # the plan as a resumed run reads it
    assert again.chunks == plan.chunks


def test_parse_keeps_null_apart_from_empty_and_fails_on_bad_values(pg_conn, schema):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {schema}.p (id int PRIMARY KEY, s text, b bytea, f boolean)")
        cur.execute(
            f"INSERT INTO {schema}.p VALUES (1, '', '\\x00ff'::bytea, true), (2, NULL, NULL, NULL), "
            "(3, 'a,\"b\"\nc', ''::bytea, false)"
        )
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
    data = {
        "kafka": {"bootstrap_servers": "x:1"},
        "catalog": {"warehouse": "file:///tmp/w", "type": "hadoop"},
        "streams": [{"topics": ["a"]}],
        "capture": {
            "database": {"dbname": "d", "user": "u"},
            "tables": ["public.t"],
            "snapshot": "parallel",
            "schemas_enabled": False,
        },
    }
    with pytest.raises(ConfigError, match="capture: .*schemas_enabled: true"):
        parse_config(data)
