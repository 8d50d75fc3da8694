"""Transforms declared per stream: SQL (DuckDB, in the write task) or a Python callable, Arrow in and
Arrow out, over the typed changes of one input table in one task.

The input is the table's typed rows (every change, in Kafka order, before the latest-per-key
reduction) plus the meta columns `META_COLUMNS`. The output is appended to the transform's own
table in the same micro-batch; that table's commit carries the offsets of the input it consumed.
A transform that fails is re-run on halves of its input until the failing rows are alone: those
records become dead letters, the rest are written.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from lakestream.transform.reference import ReferenceData, reference_rows

# Added to the input view; a table column of the same name wins.
META_COLUMNS = {
    "_op": pa.string(),  # c | u | d | r (a plain event: c)
    "_topic": pa.string(),
    "_kafka_partition": pa.int32(),
    "_kafka_offset": pa.int64(),
    "_source_ts_ms": pa.int64(),  # the source's commit time (Debezium source.ts_ms), null if unknown
    "_kafka_ts_ms": pa.int64(),  # the Kafka record's timestamp
}


@dataclass(frozen=True)
class Derived:
    """One transform of an input table and the table its output goes to (namespace.table)."""

    name: str
    table: str
    sql: str | None
    python: str | None
    where: str  # the config field, for messages: streams[0].transforms[1]
    # (view name, reference key) of each reference table the SQL joins (lakestream.transform.reference)
    references: tuple[tuple[str, str], ...] = ()


def with_meta(rows: pa.Table, meta: dict[str, list[Any] | Any]) -> pa.Table:
    """``rows`` plus the meta columns (``meta``: column → values, one per row)."""
    out = rows
    for name, arrow_type in META_COLUMNS.items():
        if name in out.column_names:
            continue
        out = out.append_column(pa.field(name, arrow_type), pa.array(meta[name], arrow_type))
    return out


def empty_input(schema: pa.Schema) -> pa.Table:
    """An input with no rows: what the driver runs a transform on to learn its output schema."""
    table = schema.empty_table()
    return with_meta(table, {name: [] for name in META_COLUMNS})


_local = threading.local()


def duckdb_connection() -> Any:
    """One DuckDB connection per thread (tasks of one Python worker run one at a time)."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb

        con = duckdb.connect(
            config={"threads": "1", "autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
        )
        _local.con = con
    return con


def run_sql(sql: str, batch: pa.Table, views: Mapping[str, pa.Table] | None = None) -> pa.Table:
    """``sql`` over the view ``batch`` and the reference ``views`` (name → rows)."""
    con = duckdb_connection()
    views = dict(views or {})
    # DuckDB takes the name as given (no SQL is built from it); names are validated identifiers.
    registered = ["batch", *views]
    con.register("batch", batch)
    for name, rows in views.items():
        con.register(name, rows)
    try:
        return con.execute(sql).to_arrow_table()
    finally:
        for name in registered:
            con.unregister(name)


def load_callable(path: str) -> Callable[[pa.Table], Any]:
    """``package.module:function`` (or ``package.module.function``) imported."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TypeError(f"{path!r}: {attr!r} is not a callable in module {module_name}")
    return cast("Callable[[pa.Table], Any]", fn)


def reference_views(derived: Derived, references: Mapping[str, ReferenceData]) -> dict[str, pa.Table]:
    """The reference views of ``derived`` (name → rows) from the batch's ``references`` (key → data)."""
    views = {}
    for name, key in derived.references:
        data = references.get(key)
        if data is None:
            raise LookupError(f"reference {name} ({key}) was not shipped with the batch")
        views[name] = reference_rows(data)
    return views


def run_transform(derived: Derived, batch: pa.Table, views: Mapping[str, pa.Table] | None = None) -> pa.Table:
    """The transform's output for ``batch`` (an Arrow table or record batch from Python, made a table);
    ``views``: the reference tables a SQL transform joins (`reference_views`)."""
    if derived.sql is not None:
        return run_sql(derived.sql, batch, views)
    out = load_callable(derived.python)(batch)  # type: ignore[arg-type]
    if isinstance(out, pa.RecordBatch):
        out = pa.Table.from_batches([out])
    if not isinstance(out, pa.Table):
        raise TypeError(f"the transform returned {type(out).__name__}, not a pyarrow.Table")
    return out


def fit_output(out: pa.Table, schema: pa.Schema) -> pa.Table:
    """``out`` in the output table's schema: columns matched by name, cast safely; a column the table
    lacks or a value that does not fit raises."""
    extra = [c for c in out.column_names if c not in schema.names]
    if extra:
        raise ValueError(f"the transform output has column(s) {extra} that its table does not have")
    columns = []
    for f in schema:
        if f.name in out.column_names:
            columns.append(out.column(f.name).cast(f.type, safe=True))
        else:
            columns.append(pa.nulls(out.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def apply_isolating(fn: Callable[[pa.Table], pa.Table], batch: pa.Table) -> tuple[list[pa.Table], dict[int, str]]:
    """``fn`` over ``batch``; on an error, over halves until the failing rows are alone.
    Returns the outputs of the parts that worked and {row of ``batch``: error} for the others."""
    outputs: list[pa.Table] = []
    failed: dict[int, str] = {}

    def run(start: int, stop: int) -> None:
        try:
            outputs.append(fn(batch.slice(start, stop - start)))
            return
        except Exception as exc:  # noqa: BLE001 — a transform's error is its input's fault
            if stop - start == 1:
                failed[start] = f"{type(exc).__name__}: {exc}"
                return
        middle = (start + stop) // 2
        run(start, middle)
        run(middle, stop)

    if batch.num_rows:
        run(0, batch.num_rows)
    return outputs, failed


def output_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """(name, Spark DDL type) of a transform's output, for creating or evolving its table."""
    out = []
    for f in schema:
        try:
            out.append((f.name, arrow_ddl(f.type)))
        except ValueError as exc:
            raise ValueError(f"output column {f.name!r}: {exc}") from None
    return out


def arrow_ddl(t: pa.DataType) -> str:
    """The Spark DDL type of a flat Arrow type."""
    if pa.types.is_boolean(t):
        return "boolean"
    if (
        pa.types.is_int8(t)
        or pa.types.is_int16(t)
        or pa.types.is_int32(t)
        or pa.types.is_uint8(t)
        or pa.types.is_uint16(t)
    ):
        return "int"
    if pa.types.is_integer(t):
        return "bigint"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({min(t.precision, 38)},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    raise ValueError(f"type {t} is not supported in a transform's output; cast it (e.g. to a string)")
