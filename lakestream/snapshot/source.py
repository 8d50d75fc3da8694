"""What the parallel snapshot reads from PostgreSQL: a table's columns as the types Debezium's
stream gives them, the SQL that renders each column for the fast reader, and the key-range chunks.

The types must match what `lakestream.decode.types` makes of Debezium's schemas (schemas on,
default ``time.precision.mode``, ``decimal.handling.mode=precise``, ``interval.handling.mode=numeric``):
the table the snapshot creates is the table the streamed changes then land in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from psycopg2 import sql as pgsql

from lakestream.errors import LakestreamError


class UnsupportedColumn(LakestreamError):
    """A column type the parallel snapshot cannot render exactly as Debezium would."""


@dataclass(frozen=True)
class SourceColumn:
    """One source column: its name, the table type (Spark DDL), how COPY renders it, how it is parsed."""

    name: str
    pg_type: str
    ddl: str
    expression: str  # SQL over the quoted column name, {c}
    read_type: pa.DataType  # what the CSV reader parses the rendered text as
    hex_bytes: bool = False  # rendered as hex text, decoded to bytes after parsing


@dataclass
class SourceTable:
    """A captured table: schema.table, its columns and primary key."""

    schema: str
    table: str
    columns: list[SourceColumn]
    key: list[str]
    estimated_rows: int = 0
    integer_key: bool = False

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    def ident(self) -> pgsql.Composable:
        return pgsql.Identifier(self.schema, self.table)


_INTS = {"smallint": ("int", pa.int32()), "integer": ("int", pa.int32()), "bigint": ("bigint", pa.int64())}
_TEXT = {"text", "character varying", "character", "json", "jsonb", "uuid", "xml", "inet", "cidr", "macaddr",
         "citext", "ltree"}


def _column(name: str, data_type: str, udt_type: str, precision: int | None, scale: int | None) -> SourceColumn:
    c = "{c}"
    if data_type in _INTS:
        ddl, arrow = _INTS[data_type]
        return SourceColumn(name, data_type, ddl, c, arrow)
    if data_type == "real":
        return SourceColumn(name, data_type, "float", c, pa.float32())
    if data_type == "double precision":
        return SourceColumn(name, data_type, "double", c, pa.float64())
    if data_type == "boolean":
        return SourceColumn(name, data_type, "boolean", c, pa.bool_())
    if data_type == "numeric":
        if precision is not None and scale is not None and precision <= 38:
            return SourceColumn(name, data_type, f"decimal({precision},{scale})", c, pa.decimal128(precision, scale))
        # Debezium's VariableScaleDecimal: the lake keeps every digit as text.
        return SourceColumn(name, data_type, "string", f"{c}::text", pa.string())
    if data_type == "date":
        return SourceColumn(name, data_type, "date", c, pa.date32())
    if data_type == "timestamp without time zone":
        return SourceColumn(name, data_type, "timestamp_ntz", c, pa.timestamp("us"))
    if data_type == "timestamp with time zone":
        # The session runs in UTC, so the text is "... +00", which the reader takes as UTC.
        return SourceColumn(name, data_type, "timestamp", c, pa.timestamp("us", tz="UTC"))
    if data_type == "time without time zone":
        # MicroTime → "HH:MM:SS.ffffff", as lakestream.decode.types renders it.
        return SourceColumn(name, data_type, "string", f"to_char('2000-01-01'::date + {c}, 'HH24:MI:SS.US')",
                            pa.string())
    if data_type == "interval":
        # MicroDuration counts a month as 30.4375 days, as extract(epoch) does.
        return SourceColumn(name, data_type, "bigint", f"(extract(epoch from {c}) * 1000000)::int8", pa.int64())
    if data_type == "bytea":
        return SourceColumn(name, data_type, "binary", f"encode({c}, 'hex')", pa.string(), hex_bytes=True)
    if data_type in _TEXT or (data_type == "USER-DEFINED" and udt_type == "e"):
        return SourceColumn(name, data_type, "string", f"{c}::text", pa.string())
    raise UnsupportedColumn(
        f"column {name!r} has type {data_type} ({udt_type}), which the parallel snapshot does not read yet — fix: "
        f"snapshot this table with Debezium (capture.snapshot: debezium), or leave it out of `lakestream snapshot`")


def describe_table(conn: Any, schema: str, table: str) -> SourceTable:
    """The columns, primary key and estimated size of ``schema.table``; LakestreamError if it has no
    primary key (the mirror is keyed by it) or does not exist."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT c.column_name, c.data_type, t.typtype, c.numeric_precision, c.numeric_scale
               FROM information_schema.columns c
               JOIN pg_type t ON t.typname = c.udt_name
               JOIN pg_namespace tn ON tn.oid = t.typnamespace AND tn.nspname = c.udt_schema
               WHERE c.table_schema = %s AND c.table_name = %s ORDER BY c.ordinal_position""",
            (schema, table))
        rows = cur.fetchall()
        if not rows:
            raise LakestreamError(f"source table {schema}.{table} does not exist (or has no columns)")
        cur.execute(
            """SELECT a.attname FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
               WHERE i.indisprimary AND n.nspname = %s AND c.relname = %s
               ORDER BY array_position(i.indkey::int2[], a.attnum)""", (schema, table))
        key = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT greatest(reltuples, 0)::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s", (schema, table))
        estimated = int(cur.fetchone()[0])
    if not key:
        raise LakestreamError(f"source table {schema}.{table} has no primary key; the parallel snapshot splits and the "
                              "mirror upserts by it — fix: add a primary key, or snapshot it with Debezium")
    columns = [_column(*r) for r in rows]
    by_name = {col.name: col for col in columns}
    integer_key = len(key) == 1 and by_name[key[0]].pg_type in _INTS
    return SourceTable(schema, table, columns, key, estimated, integer_key)


@dataclass(frozen=True)
class Chunk:
    """Rows of one table whose key lies in [lower, upper) (None: unbounded), read by one task."""

    table: str  # schema.table
    chunk_id: int
    lower: list[Any] | None
    upper: list[Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.chunk_id, "lower": self.lower, "upper": self.upper}


@dataclass
class ChunkPlan:
    table: str
    chunks: list[Chunk] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.chunks]

    @classmethod
    def from_json(cls, table: str, items: list[dict[str, Any]]) -> ChunkPlan:
        return cls(table, [Chunk(table, int(i["id"]), i["lower"], i["upper"]) for i in items])


def plan_chunks(conn: Any, source: SourceTable, chunk_rows: int) -> ChunkPlan:
    """Split the table's key range into chunks of about ``chunk_rows`` rows (run inside the exported
    snapshot, so the bounds see the rows the chunks will read).

    An integer key is split evenly between its min and max (dense keys give even chunks); any other
    key at boundaries sampled from the table (TABLESAMPLE BERNOULLI, ~50 rows per chunk), sorted as PostgreSQL sorts the key."""
    keys = pgsql.SQL(", ").join(pgsql.Identifier(k) for k in source.key)
    with conn.cursor() as cur:
        if source.integer_key:
            cur.execute(pgsql.SQL("SELECT min({k}), max({k}), count(*) FROM {t}").format(
                k=pgsql.Identifier(source.key[0]), t=source.ident()))
            low, high, count = cur.fetchone()
            if not count:
                return ChunkPlan(source.name, [Chunk(source.name, 0, None, None)])
            # Rounded, not up: a few rows over a multiple of chunk_rows (writes since the count) must not
            # add a chunk that then runs alone at the end, on one of the task slots.
            pieces = max(1, round(int(count) / chunk_rows))
            step = max(1, -(-(int(high) - int(low) + 1) // pieces))
            bounds = list(range(int(low) + step, int(high) + 1, step))
            values = [[b] for b in bounds]
        else:
            estimated = max(source.estimated_rows, 1)
            pieces = max(1, round(estimated / chunk_rows))
            if pieces == 1:
                return ChunkPlan(source.name, [Chunk(source.name, 0, None, None)])
            percent = min(100.0, max(0.01, 100.0 * pieces * 50 / estimated))
            cur.execute(pgsql.SQL("SELECT {k} FROM {t} TABLESAMPLE BERNOULLI (%s) ORDER BY {k}").format(
                k=keys, t=source.ident()), (percent,))
            sample = cur.fetchall()
            values = [list(sample[len(sample) * i // pieces]) for i in range(1, pieces)] if sample else []
            values = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
    edges: list[list[Any] | None] = [None, *values, None]
    chunks = [Chunk(source.name, i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    return ChunkPlan(source.name, chunks)


def chunk_query(source: SourceTable, chunk: Chunk) -> pgsql.Composable:
    """``COPY (SELECT <rendered columns> FROM t WHERE lower <= key < upper) TO STDOUT (FORMAT csv)``."""
    select = pgsql.SQL(", ").join(
        pgsql.SQL(col.expression.replace("{c}", "{}")).format(pgsql.Identifier(col.name)) for col in source.columns)
    keys = pgsql.SQL(", ").join(pgsql.Identifier(k) for k in source.key)
    conditions = []
    if chunk.lower is not None:
        conditions.append(pgsql.SQL("({}) >= ({})").format(keys, pgsql.SQL(", ").join(map(pgsql.Literal, chunk.lower))))
    if chunk.upper is not None:
        conditions.append(pgsql.SQL("({}) < ({})").format(keys, pgsql.SQL(", ").join(map(pgsql.Literal, chunk.upper))))
    where = pgsql.SQL(" WHERE ") + pgsql.SQL(" AND ").join(conditions) if conditions else pgsql.SQL("")
    return pgsql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT WITH (FORMAT csv)").format(select, source.ident(), where)
