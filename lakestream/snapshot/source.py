"""What the parallel snapshot reads from PostgreSQL: a table's columns as the types Debezium's
stream gives them and the SQL that renders each column for the fast reader
(`lakestream.capture.source_columns`), its key, and the chunks.

A table is split by its key (primary key, else its replica identity index: the key Debezium gives its
events); a table without one by physical block ranges (``ctid``). A partitioned parent has no storage of
its own: its chunks are planned and read per leaf partition (`pg_partition_tree`: a DEFAULT partition and
the leaves of sub-partitioned partitions included), and every chunk's rows go to the parent's one mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg2 import sql as pgsql

from lakestream.capture.source_columns import POSTGRESQL_INTEGER_TYPES, SourceColumn, postgresql_source_column
from lakestream.errors import LakestreamError


@dataclass
class SourceTable:
    """A captured table: schema.table, its columns and key (empty: a table without a key, a row multiset)."""

    schema: str
    table: str
    columns: list[SourceColumn]
    key: list[str]
    estimated_rows: int = 0
    integer_key: bool = False
    partitioned: bool = False  # a partitioned parent: read through its leaf partitions

    @property
    def keyless(self) -> bool:
        return not self.key

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    def ident(self) -> pgsql.Composable:
        return pgsql.Identifier(self.schema, self.table)


def describe_table(conn: Any, schema: str, table: str) -> SourceTable:
    """The columns, key and estimated size of ``schema.table``; LakestreamError if it does not exist.

    The key is the one Debezium keys the table's events by: the primary key, else the replica identity
    index; none (a keyless table, mirrored as a row multiset) otherwise."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT c.column_name, c.data_type, t.typtype, c.numeric_precision, c.numeric_scale
               FROM information_schema.columns c
               JOIN pg_type t ON t.typname = c.udt_name
               JOIN pg_namespace tn ON tn.oid = t.typnamespace AND tn.nspname = c.udt_schema
               WHERE c.table_schema = %s AND c.table_name = %s ORDER BY c.ordinal_position""",
            (schema, table),
        )
        rows = cur.fetchall()
        if not rows:
            raise LakestreamError(f"source table {schema}.{table} does not exist (or has no columns)")
        cur.execute(
            """SELECT a.attname FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
               WHERE n.nspname = %s AND c.relname = %s
                 AND i.indexrelid = coalesce(
                     (SELECT p.indexrelid FROM pg_index p WHERE p.indrelid = c.oid AND p.indisprimary),
                     (SELECT r.indexrelid FROM pg_index r WHERE r.indrelid = c.oid AND r.indisreplident))
               ORDER BY array_position(i.indkey::int2[], a.attnum)""",
            (schema, table),
        )
        key = [r[0] for r in cur.fetchall()]
        cur.execute(
            "SELECT greatest(reltuples, 0)::int8, relkind = 'p' FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (schema, table),
        )
        estimated, partitioned = cur.fetchone()
    columns = [postgresql_source_column(*r) for r in rows]
    by_name = {col.name: col for col in columns}
    integer_key = len(key) == 1 and by_name[key[0]].pg_type in POSTGRESQL_INTEGER_TYPES
    return SourceTable(schema, table, columns, key, int(estimated), integer_key, bool(partitioned))


@dataclass(frozen=True)
class Chunk:
    """Rows of one table read by one task: those whose key lies in [lower, upper), or for a table without a
    key those in blocks [lower, upper) (None: unbounded); of ``relation`` (a leaf partition of a partitioned
    parent, as [schema, table]) when given, else of the table itself."""

    table: str  # schema.table
    chunk_id: int
    lower: list[Any] | None
    upper: list[Any] | None
    relation: tuple[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.chunk_id, "lower": self.lower, "upper": self.upper}
        if self.relation is not None:
            out["relation"] = list(self.relation)
        return out

    def describe(self, source: SourceTable) -> str:
        """What the chunk holds, for messages: ``rows with key in [1, 500)`` or ``rows in blocks [0, 64) of p1``."""
        where = f" of {self.relation[0]}.{self.relation[1]}" if self.relation is not None else ""
        kind = "in blocks" if source.keyless else "with key in"
        return f"rows {kind} [{self.lower}, {self.upper}){where}"


@dataclass
class ChunkPlan:
    table: str
    chunks: list[Chunk] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.chunks]

    @classmethod
    def from_json(cls, table: str, items: list[dict[str, Any]]) -> ChunkPlan:
        return cls(
            table,
            [
                Chunk(table, int(i["id"]), i["lower"], i["upper"], tuple(i["relation"]) if i.get("relation") else None)
                for i in items
            ],
        )


@dataclass(frozen=True)
class _Relation:
    """A relation with storage that chunks read: the table itself, or one leaf partition of it."""

    schema: str
    table: str
    estimated_rows: int
    blocks: int  # its size now, in blocks
    rows_per_block: float  # from the last ANALYZE; 0 when unknown
    leaf: bool  # a leaf partition (chunks name it)
    heap: bool  # an ordinary table (ctid ranges work); a foreign partition is read whole

    def ident(self) -> pgsql.Composable:
        return pgsql.Identifier(self.schema, self.table)


def _relations(conn: Any, source: SourceTable) -> list[_Relation]:
    """The table itself, or for a partitioned parent its leaf partitions (a DEFAULT partition and the leaves of
    sub-partitioned partitions included), with their sizes."""
    with conn.cursor() as cur:
        cur.execute(
            """WITH p AS (SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = %s AND c.relname = %s),
                    leaves AS (SELECT p.oid AS relid FROM p WHERE p.relkind <> 'p'
                               UNION ALL
                               SELECT t.relid FROM p, pg_partition_tree(p.oid) t WHERE p.relkind = 'p' AND t.isleaf)
               SELECT n.nspname, c.relname, greatest(c.reltuples, 0)::int8,
                      CASE WHEN c.relkind = 'r' THEN pg_relation_size(c.oid) / current_setting('block_size')::int8
                           ELSE 0 END,
                      CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 0 END,
                      c.relkind = 'r'
               FROM leaves JOIN pg_class c ON c.oid = leaves.relid JOIN pg_namespace n ON n.oid = c.relnamespace
               ORDER BY n.nspname, c.relname""",
            (source.schema, source.table),
        )
        rows = cur.fetchall()
    return [
        _Relation(schema, table, int(est), int(blocks), float(rpb), source.partitioned, bool(heap))
        for schema, table, est, blocks, rpb, heap in rows
    ]


def plan_chunks(conn: Any, source: SourceTable, chunk_rows: int) -> ChunkPlan:
    """Split the table into chunks of about ``chunk_rows`` rows (run inside the exported snapshot, so the
    bounds see the rows the chunks will read). A partitioned parent is planned leaf by leaf.

    An integer key is split evenly between its min and max (dense keys give even chunks); any other
    key at boundaries sampled from the table (TABLESAMPLE BERNOULLI, ~50 rows per chunk), sorted as
    PostgreSQL sorts the key. A table without a key is split into block ranges (``ctid``, a TID range
    scan each), the last one open-ended."""
    edges: list[tuple[list[Any] | None, list[Any] | None, tuple[str, str] | None]] = []
    relations = _relations(conn, source) if source.partitioned or source.keyless else []
    if not source.partitioned and not relations:
        relations = [_Relation(source.schema, source.table, source.estimated_rows, 0, 0.0, False, True)]
    for rel in relations:
        bounds = _plan_relation(conn, source, rel, chunk_rows)
        cuts: list[list[Any] | None] = [None, *bounds, None]
        name = (rel.schema, rel.table) if rel.leaf else None
        edges.extend((cuts[i], cuts[i + 1], name) for i in range(len(cuts) - 1))
    if not edges:  # a partitioned parent without partitions holds no row; one chunk reads it (empty)
        edges = [(None, None, None)]
    return ChunkPlan(source.name, [Chunk(source.name, i, lo, up, rel) for i, (lo, up, rel) in enumerate(edges)])


def _plan_relation(conn: Any, source: SourceTable, rel: _Relation, chunk_rows: int) -> list[list[Any]]:
    """The inner bounds of one relation's chunks (none: one chunk)."""
    if source.keyless:
        if not rel.heap or rel.blocks <= 1:
            return []
        per_block = rel.rows_per_block or 50.0
        pieces = max(1, round(rel.blocks * per_block / chunk_rows))
        step = max(1, -(-rel.blocks // pieces))
        return [[b] for b in range(step, rel.blocks, step)]
    keys = pgsql.SQL(", ").join(pgsql.Identifier(k) for k in source.key)
    with conn.cursor() as cur:
        if source.integer_key:
            cur.execute(
                pgsql.SQL("SELECT min({k}), max({k}), count(*) FROM {t}").format(
                    k=pgsql.Identifier(source.key[0]), t=rel.ident()
                )
            )
            low, high, count = cur.fetchone()
            if not count:
                return []
            # Rounded, not up: a few rows over a multiple of chunk_rows (writes since the count) must not
            # add a chunk that then runs alone at the end, on one of the task slots.
            pieces = max(1, round(int(count) / chunk_rows))
            step = max(1, -(-(int(high) - int(low) + 1) // pieces))
            return [[b] for b in range(int(low) + step, int(high) + 1, step)]
        estimated = max(rel.estimated_rows, 1)
        pieces = max(1, round(estimated / chunk_rows))
        if pieces == 1:
            return []
        percent = min(100.0, max(0.01, 100.0 * pieces * 50 / estimated))
        cur.execute(
            pgsql.SQL("SELECT {k} FROM {t} TABLESAMPLE BERNOULLI (%s) ORDER BY {k}").format(k=keys, t=rel.ident()),
            (percent,),
        )
        sample = cur.fetchall()
    values = [list(sample[len(sample) * i // pieces]) for i in range(1, pieces)] if sample else []
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def chunk_query(source: SourceTable, chunk: Chunk) -> pgsql.Composable:
    """``COPY (SELECT <rendered columns> FROM t WHERE lower <= key < upper) TO STDOUT (FORMAT csv)``; for a
    table without a key the range is one of blocks (``ctid``); ``t`` is the chunk's leaf partition if it has one."""
    select = pgsql.SQL(", ").join(
        pgsql.SQL(col.expression.replace("{c}", "{}")).format(pgsql.Identifier(col.name)) for col in source.columns
    )
    if source.keyless:
        keys: pgsql.Composable = pgsql.SQL("ctid")

        def bound(values: list[Any]) -> pgsql.Composable:
            return pgsql.SQL("{}::tid").format(pgsql.Literal(f"({int(values[0])},0)"))
    else:
        keys = pgsql.SQL(", ").join(pgsql.Identifier(k) for k in source.key)

        def bound(values: list[Any]) -> pgsql.Composable:
            return pgsql.SQL(", ").join(map(pgsql.Literal, values))

    conditions = []
    if chunk.lower is not None:
        conditions.append(pgsql.SQL("({}) >= ({})").format(keys, bound(chunk.lower)))
    if chunk.upper is not None:
        conditions.append(pgsql.SQL("({}) < ({})").format(keys, bound(chunk.upper)))
    where = pgsql.SQL(" WHERE ") + pgsql.SQL(" AND ").join(conditions) if conditions else pgsql.SQL("")
    relation = pgsql.Identifier(*chunk.relation) if chunk.relation is not None else source.ident()
    return pgsql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT WITH (FORMAT csv)").format(select, relation, where)
