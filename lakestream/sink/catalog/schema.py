"""Creating Iceberg tables from the first batch and evolving them mid-stream.

Incoming row shapes (column name → type) are reconciled with the table: new columns are added
as nullable (metadata only), types are widened where Iceberg allows it (int→bigint,
float→double, decimal precision up), new nested fields are added. A shape that cannot be
reconciled (a narrowing, a string where a number was) is reported so its records go to the
dead-letter table; the table is left as it is.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from lakestream.errors import first_line
from lakestream.identifiers import quote, quote_column, quote_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

DEFAULT_TABLE_PROPERTIES = {
    "format-version": "3",
    "write.upsert.enabled": "false",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.distribution-mode": "hash",
    "write.target-file-size-bytes": str(128 * 1024 * 1024),
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
    "commit.retry.num-retries": "10",
}


@dataclass
class Shape:
    """One incoming row shape for a table, as collected from the decode tasks."""

    schema_id: str
    columns: list[tuple[str, str]]
    key: list[str]
    inferred: bool
    defaults: dict[str, Any] = field(default_factory=dict)  # column → source default (Iceberg single-value JSON)


@dataclass(frozen=True)
class AddColumnWithDefault:
    """A new top-level column whose existing rows read ``default`` (Iceberg v3 initial-default),
    as PostgreSQL's ``ADD COLUMN ... DEFAULT`` gives them. Not expressible in Spark 3.5 SQL: the
    JVM helper adds it."""

    table_ident: str
    column: str
    ddl: str
    default_json: str

    def __str__(self) -> str:
        return (
            f"ALTER TABLE {self.table_ident} ADD COLUMN {quote_column(self.column)} {self.ddl} "
            f"(initial default {self.default_json})"
        )


@dataclass
class Reconciliation:
    """The outcome of matching shapes with a table: DDL to run, shapes to reject (with reasons)."""

    statements: list[str | AddColumnWithDefault] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    rejected_columns: dict[str, str] = field(default_factory=dict)  # schema id → top-level column


_DECIMAL_DDL = re.compile(r"\s*decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def parse_type(ddl: str) -> DataType:
    """A Spark DataType from DDL: the primitive types here, the others by Spark's parser (cached: each
    parse there is a round trip to the JVM, and the first ones cost about 0.1 s each)."""
    from pyspark.sql import types as T

    simple = {
        "int": T.IntegerType,
        "integer": T.IntegerType,
        "bigint": T.LongType,
        "long": T.LongType,
        "smallint": T.ShortType,
        "short": T.ShortType,
        "tinyint": T.ByteType,
        "byte": T.ByteType,
        "string": T.StringType,
        "boolean": T.BooleanType,
        "double": T.DoubleType,
        "float": T.FloatType,
        "real": T.FloatType,
        "date": T.DateType,
        "timestamp": T.TimestampType,
        "timestamp_ntz": T.TimestampNTZType,
        "binary": T.BinaryType,
    }.get(ddl.strip().lower())
    if simple is not None:
        return simple()
    if (m := _DECIMAL_DDL.fullmatch(ddl)) is not None and int(m.group(1)) <= 38 and int(m.group(2)) <= int(m.group(1)):
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    return T._parse_datatype_string(ddl)


def _decimal(dt: DataType) -> tuple[int, int] | None:
    from pyspark.sql.types import DecimalType

    return (dt.precision, dt.scale) if isinstance(dt, DecimalType) else None


def _fits(existing: DataType, incoming: DataType) -> bool:
    """Values of ``incoming`` can be written to a column of type ``existing`` without loss."""
    from pyspark.sql.types import DoubleType, FloatType, IntegerType, LongType, StringType

    if existing == incoming or isinstance(existing, StringType):
        return True
    if isinstance(existing, LongType) and isinstance(incoming, IntegerType):
        return True
    if isinstance(existing, DoubleType) and isinstance(incoming, (FloatType, IntegerType, LongType)):
        return True
    d_old, d_new = _decimal(existing), _decimal(incoming)
    if d_old and d_new and d_old[1] == d_new[1] and d_new[0] <= d_old[0]:
        return True
    return False


def _promotion(existing: DataType, incoming: DataType) -> str | None:
    """The type Iceberg can widen ``existing`` to so ``incoming`` fits, or None."""
    from pyspark.sql.types import DoubleType, FloatType, IntegerType, LongType

    if isinstance(existing, IntegerType) and isinstance(incoming, LongType):
        return "bigint"
    if isinstance(existing, FloatType) and isinstance(incoming, DoubleType):
        return "double"
    d_old, d_new = _decimal(existing), _decimal(incoming)
    if d_old and d_new and d_old[1] == d_new[1] and d_new[0] > d_old[0]:
        return f"decimal({d_new[0]},{d_new[1]})"
    return None


def _reconcile_field(
    path: list[str], existing: DataType, incoming: DataType, out: list[str | AddColumnWithDefault], table: str
) -> str | None:
    """Append DDL making ``incoming`` fit ``existing`` at ``path``; return a reason when impossible."""
    from pyspark.sql.types import ArrayType, StructType

    if _fits(existing, incoming):
        return None
    column = ".".join(quote_column(p) for p in path)
    if isinstance(existing, StructType) and isinstance(incoming, StructType):
        have = {f.name.lower(): f for f in existing.fields}
        for f in incoming.fields:
            current = have.get(f.name.lower())
            if current is None:
                out.append(
                    f"ALTER TABLE {table} ADD COLUMN {column}.{quote_column(f.name)} {f.dataType.simpleString()}"
                )
            else:
                reason = _reconcile_field(path + [current.name], current.dataType, f.dataType, out, table)
                if reason:
                    return reason
        return None
    if isinstance(existing, ArrayType) and isinstance(incoming, ArrayType):
        if _fits(existing.elementType, incoming.elementType):
            return None
        return (
            f"column {'.'.join(path)}: array<{existing.elementType.simpleString()}> cannot hold "
            f"array<{incoming.elementType.simpleString()}>"
        )
    promoted = _promotion(existing, incoming)
    if promoted:
        out.append(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {promoted}")
        return None
    return (
        f"column {'.'.join(path)}: incoming type {incoming.simpleString()} is incompatible with the table's "
        f"{existing.simpleString()} (Iceberg only widens int→bigint, float→double, decimal precision)"
    )


def reconcile(table_ident: str, schema: StructType, shapes: list[Shape]) -> Reconciliation:
    """DDL that lets every compatible shape be written to a table with ``schema``."""
    result = Reconciliation()
    have = {f.name.lower(): f for f in schema.fields}
    added: dict[str, str] = {}
    for shape in shapes:
        statements: list[str | AddColumnWithDefault] = []
        local_added: dict[str, str] = {}
        reason = None
        for name, ddl in shape.columns:
            incoming = parse_type(ddl)
            current = have.get(name.lower())
            if current is None:
                earlier = added.get(name.lower()) or local_added.get(name.lower())
                if earlier is not None:
                    if earlier != incoming.simpleString() and not _fits(parse_type(earlier), incoming):
                        reason = (
                            f"column {name}: {incoming.simpleString()} here but {earlier} in another record "
                            f"of this batch"
                        )
                        break
                    continue
                local_added[name.lower()] = incoming.simpleString()
                if shape.defaults.get(name) is not None:
                    statements.append(
                        AddColumnWithDefault(
                            table_ident, name, incoming.simpleString(), orjson.dumps(shape.defaults[name]).decode()
                        )
                    )
                else:
                    statements.append(
                        f"ALTER TABLE {table_ident} ADD COLUMN {quote_column(name)} {incoming.simpleString()}"
                    )
                continue
            reason = _reconcile_field([current.name], current.dataType, incoming, statements, table_ident)
            if reason:
                result.rejected_columns[shape.schema_id] = current.name
                break
        if reason:
            result.rejected[shape.schema_id] = reason
            continue
        added.update(local_added)
        for stmt in statements:
            if stmt not in result.statements:
                result.statements.append(stmt)
    return result


def dropped_column_statements(table_ident: str, schema: StructType, shapes: list[Shape], key: list[str]) -> list[str]:
    """``on_dropped_column: drop``: DDL dropping the table columns that no complete (schemas-on) shape of
    the batch has any more. A column any shape of the batch still carries stays: records from before
    the drop may share the batch with records after it."""
    complete = [s for s in shapes if not s.inferred]
    if not complete:
        return []
    carried = {name.lower() for s in shapes for name, _ in s.columns}
    protected = carried | {k.lower() for k in key}
    return [
        f"ALTER TABLE {table_ident} DROP COLUMN {quote_column(f.name)}"
        for f in schema.fields
        if f.name.lower() not in protected
    ]


def unusable_shape(columns: list[tuple[str, str]]) -> str | None:
    """Why no table can take a row shape of ``columns`` ((name, DDL type) pairs), or None."""
    from lakestream.errors import InvalidIdentifierError

    seen: dict[str, str] = {}
    for name, ddl in columns:
        try:
            quote_column(name)
        except InvalidIdentifierError as exc:
            return str(exc)
        if name.lower() in seen:
            return (
                f"columns {seen[name.lower()]!r} and {name!r} differ only by case (Spark's names are case-insensitive)"
            )
        seen[name.lower()] = name
        try:
            parse_type(ddl)
        except Exception as exc:  # noqa: BLE001 — Spark's parser raises its own exception types
            return f"column {name!r}: type {ddl[:200]!r} cannot be used: {first_line(exc, 200)}"
    return None


def merged_columns(shapes: list[Shape]) -> list[tuple[str, str]]:
    """Union of the shapes' columns in first-seen order (for a new table); later widenings win."""
    order: list[str] = []
    types: dict[str, DataType] = {}
    for shape in shapes:
        for name, ddl in shape.columns:
            incoming = parse_type(ddl)
            if name not in types:
                order.append(name)
                types[name] = incoming
            elif not _fits(types[name], incoming):
                promoted = _promotion(types[name], incoming)
                if promoted:
                    types[name] = parse_type(promoted)
    return [(n, types[n].simpleString()) for n in order]


class TableManager:
    """Reconciles shapes through Spark SQL DDL and caches schemas (refreshed after each change)."""

    def __init__(self, spark: SparkSession, catalog: str):
        self.spark = spark
        self.catalog = catalog
        self._schemas: dict[str, StructType] = {}
        self._namespaces: set[str] = set()

    def ident(self, namespace: str, table: str) -> str:
        return quote_table(self.catalog, namespace, table)

    def exists(self, namespace: str, table: str) -> bool:
        return self.schema(namespace, table) is not None

    def schema(self, namespace: str, table: str, refresh: bool = False) -> StructType | None:
        ident = self.ident(namespace, table)
        if refresh or ident not in self._schemas:
            if not self.spark.catalog.tableExists(f"{self.catalog}.{namespace}.{table}"):
                return None
            self._schemas[ident] = self.spark.table(ident).schema
        return self._schemas[ident]

    def ensure_namespace(self, namespace: str) -> None:
        if namespace not in self._namespaces:
            name = f"{quote(self.catalog, 'catalog')}.{quote(namespace, 'namespace')}"
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}")
            self._namespaces.add(namespace)

    def apply(self, namespace: str, table: str, statements: Sequence[str | AddColumnWithDefault]) -> None:
        from lakestream.sink.catalog.sink import add_column_with_default

        for stmt in statements:
            log.info("schema change: %s", stmt)
            if isinstance(stmt, AddColumnWithDefault):
                add_column_with_default(
                    self.spark, self.catalog, namespace, table, stmt.column, stmt.ddl, stmt.default_json
                )
                self.spark.sql(f"REFRESH TABLE {self.ident(namespace, table)}")
            else:
                self.spark.sql(stmt)
        if statements:
            self.schema(namespace, table, refresh=True)


def widen_to_string_statements(table_ident: str, column: str, suffix: str) -> list[str]:
    """Replace ``column`` by a string column holding the old values as text.

    Iceberg cannot change a column's type to string, so the column is renamed, a string column of
    the same name added and back-filled, and the old one dropped (old snapshots keep the old type).
    """
    old = f"{column}__{suffix}"
    qc, qo = quote_column(column), quote_column(old)
    return [
        f"ALTER TABLE {table_ident} RENAME COLUMN {qc} TO {qo}",
        f"ALTER TABLE {table_ident} ADD COLUMN {qc} string",
        f"UPDATE {table_ident} SET {qc} = CAST({qo} AS string) WHERE {qo} IS NOT NULL",
        f"ALTER TABLE {table_ident} DROP COLUMN {qo}",
    ]
