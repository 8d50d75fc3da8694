"""Derived tables kept current by key: Spark SQL over several input tables (mirrors), maintained
incrementally (``customer_360`` over users, subscriptions and usage events).

Each input declares the column(s) of its rows that hold the derived key. The write tasks report,
for every change of an input, its primary key, those columns and its op (`ChangedKeys`). After the
inputs committed, the driver turns the changes into the derived keys they touch: the key the row
has after the change, and the key it had before, kept in memory per input (primary key → derived
key, built from a scan when the stage starts), so a row that moves to another key or is deleted
touches its old key too. The SQL then runs over the inputs restricted to the touched keys (a
semi-join on each input's key columns) and its rows are MERGEd into the table by key: updated or
inserted, and deleted where the SQL no longer returns the key.

Exactly once: a derived table is a function of its inputs' state, not of the records, so it commits
after them and records in its snapshot the inputs' offsets it reflects. A start that finds it behind
an input (a crash between the commits, keys still waiting for the table's commit interval) recomputes
it whole, as on its first start; so does a batch that isolated a failing record or met a TRUNCATE.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from lakestream.config import DerivedInputSettings, DerivedTableSettings
from lakestream.errors import ConfigError, first_line
from lakestream.identifiers import quote_column, quote_table
from lakestream.sink.catalog.schema import DEFAULT_TABLE_PROPERTIES
from lakestream.sink.report import BatchReport

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakestream.process.stage import StageContext

log = logging.getLogger(__name__)

_PRESENT = "__lakestream_present"


@dataclass
class _Input:
    """One input of a derived table, as the stage tracks it."""

    settings: DerivedInputSettings
    ident: str  # quoted catalog.namespace.table
    primary_key: list[str]  # the input's own key ([] for an append table: its rows never change)
    # primary key → derived key of the live row; None where the derived key is the primary key itself
    # (or the table has no primary key), which needs no memory.
    owners: dict[tuple, tuple] | None = None

    @property
    def identity(self) -> bool:
        return self.primary_key == self.settings.key


def touched_keys(source: _Input, changes: pa.Table) -> set[tuple]:
    """The derived keys ``changes`` (an input's `ChangedKeys`, any order) touch, before and after each
    change; ``source.owners`` is brought up to date."""
    changes = changes.sort_by([("_topic", "ascending"), ("_partition", "ascending"), ("_offset", "ascending")])
    # A primary key's values per change (a tuple each), or None for each change of a table without one.
    pk_values: list[Any] = (
        list(zip(*[changes.column(c).to_pylist() for c in source.primary_key], strict=True))
        if source.primary_key
        else [None] * changes.num_rows
    )
    new_values = list(zip(*[changes.column(c).to_pylist() for c in source.settings.key], strict=True))
    ops = changes.column("_op").to_pylist()
    withheld = changes.column("_withheld").to_pylist()
    owners = source.owners
    out: set[tuple] = set()
    new: tuple | None
    for pk, new, op, hidden in zip(pk_values, new_values, ops, withheld, strict=True):
        if owners is not None:
            old = owners.get(pk)
        else:
            old = pk if source.identity else None
        if old is not None:
            out.add(old)
        if op == "d":
            if owners is not None:
                owners.pop(pk, None)
            continue
        if hidden:
            new = old  # an unchanged TOASTed value Debezium did not send: the row keeps its key
        if new is not None and None in new:
            new = None  # a row with no derived key contributes to none
        if new is not None:
            out.add(new)
        if owners is not None:
            if new is None:
                owners.pop(pk, None)
            else:
                owners[pk] = new
    return out


def merge_sql(target: str, keys_view: str, rows_view: str, key_cols: list[str], values: list[str]) -> str:
    """MERGE the recomputed ``rows_view`` into ``target`` for every key of ``keys_view``: keys with a row
    are updated or inserted, keys without one deleted."""
    q = quote_column
    join = " AND ".join(f"k.{q(k)} <=> r.{q(k)}" for k in key_cols)
    source = (
        f"SELECT {', '.join(f'k.{q(k)}' for k in key_cols)}{''.join(f', r.{q(c)}' for c in values)}, "
        f"r.{_PRESENT} FROM {keys_view} k "
        f"LEFT JOIN (SELECT *, true AS {_PRESENT} FROM {rows_view}) r ON {join}"
    )
    on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key_cols)
    columns = [*key_cols, *values]
    update = f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{q(c)} = s.{q(c)}' for c in values)} " if values else ""
    return (
        f"MERGE INTO {target} t USING ({source}) s ON {on} "
        f"WHEN MATCHED AND s.{_PRESENT} IS NULL THEN DELETE {update}"
        f"WHEN NOT MATCHED AND s.{_PRESENT} IS NOT NULL THEN INSERT ({', '.join(q(c) for c in columns)}) "
        f"VALUES ({', '.join(f's.{q(c)}' for c in columns)})"
    )


class DerivedTable:
    """One derived table: its inputs, the keys touched since its last upsert, its commit cadence."""

    def __init__(self, settings: DerivedTableSettings, ctx: StageContext, where: str):
        self.settings = settings
        self.ctx = ctx
        self.where = where
        ns, tbl = settings.table.split(".")
        self.namespace, self.name = ns, tbl
        self.ident = quote_table(ctx.config.catalog.name, ns, tbl)
        self.inputs: list[_Input] = []
        self.ready = False
        self.pending: set[tuple] = set()
        self.last_upsert = float("-inf")
        self.upserts: Counter[str] = Counter()  # "full" | "keys" → how many (read by tests and logs)
        self.last_touched = 0  # keys recomputed by the last upsert by key

    # -- the batch ----------------------------------------------------------------------------------
    def advance(self, report: BatchReport, isolated: bool) -> None:
        """After the batch's commits: fold its changes into the touched keys, upsert them when due."""
        ctx = self.ctx
        missing = [i.table for i in self.settings.inputs if not ctx.tables.exists(*i.table.split("."))]
        if missing:
            log.info("derived table %s waits for its input table(s) %s", self.settings.table, missing)
            return
        if not self.ready:
            self.start()  # reads the inputs as this batch left them
            return
        inputs_report = [report.tables.get(i.settings.table) for i in self.inputs]
        if isolated or any(tr is not None and tr.truncates for tr in inputs_report):
            # A record isolated by bisection may be in the changes without being in the table; a
            # TRUNCATE changes every key: recompute everything rather than reason about it.
            self.start(force=True)
            return
        for source, tr in zip(self.inputs, inputs_report, strict=True):
            if tr is not None and tr.changed_keys:
                changes = pa.concat_tables(tr.changed_keys, promote_options="permissive")
                if not {*source.primary_key, *source.settings.key} <= set(changes.column_names):
                    self.start(force=True)  # the input's key changed under us: start over
                    return
                self.pending |= touched_keys(source, changes)
        self.upsert_if_due()

    def upsert_if_due(self) -> None:
        """Upsert the touched keys once the table's commit interval has passed since its last upsert."""
        interval = self.settings.commit_interval_s or 0.0
        if self.ready and self.pending and time.monotonic() - self.last_upsert >= interval - 0.05:
            self.upsert(self.pending)
            self.pending = set()

    def start(self, force: bool = False) -> None:
        """Create the table if needed, learn the inputs' keys, and recompute the whole table when it is
        new or behind an input (or ``force``)."""
        from lakestream.sink.catalog.sink import table_info

        ctx = self.ctx
        catalog = ctx.config.catalog.name
        self.inputs = []
        for settings in self.settings.inputs:
            ns, tbl = settings.table.split(".")
            spec = ctx.registry.specs.get(settings.table)
            if spec is not None:
                primary = list(spec.key_columns) if spec.mode == "upsert" else []
            else:  # not written by this process yet: a mirror's key is its identifier fields
                primary = list(table_info(ctx.spark, catalog, ns, tbl).get("identifier_fields") or [])
            source = _Input(settings, quote_table(catalog, ns, tbl), primary)
            if primary and not source.identity:
                source.owners = self._scan_owners(source)
            self.inputs.append(source)
        created = self._ensure_table()
        behind = self._behind()
        if force or created or behind:
            log.info(
                "derived table %s: recomputing it whole (%s)",
                self.settings.table,
                "forced" if force else "new" if created else f"behind its inputs on {behind}",
            )
            self.upsert(None)
        self.pending = set()
        self.ready = True

    def _scan_owners(self, source: _Input) -> dict[tuple, tuple]:
        columns = list(dict.fromkeys([*source.primary_key, *source.settings.key]))
        df = self.ctx.spark.table(source.ident).select(*[quote_column(c) for c in columns])
        batches = df._collect_as_arrow()
        if not batches:
            return {}
        rows = pa.Table.from_batches(batches)
        pks = zip(*[rows.column(c).to_pylist() for c in source.primary_key], strict=True)
        keys = zip(*[rows.column(c).to_pylist() for c in source.settings.key], strict=True)
        return {pk: key for pk, key in zip(pks, keys, strict=True) if None not in key}

    def _behind(self) -> list[str]:
        """The input partitions whose offsets are past the ones this table's snapshot reflects."""
        offsets = self.ctx.offsets
        mine = offsets.load(self.ident, refresh=True)
        behind = []
        for source in self.inputs:
            for tp, offset in offsets.load(source.ident, refresh=True).items():
                if offset > mine.get(tp, -1):
                    behind.append(f"{tp.topic}[{tp.partition}]")
        return behind

    # -- SQL ----------------------------------------------------------------------------------------
    def _result(self, keys: DataFrame | None) -> DataFrame:
        """The SQL's rows, over the inputs restricted to ``keys`` (all rows when None)."""
        from pyspark.sql import functions as F

        spark = self.ctx.spark
        for source in self.inputs:
            df = spark.table(source.ident)
            if keys is not None:
                renamed = keys.toDF(*[f"__k{i}" for i in range(len(self.settings.key))])
                on = [df[quote_column(c)] == renamed[f"__k{i}"] for i, c in enumerate(source.settings.key)]
                df = df.join(F.broadcast(renamed), on, "left_semi")
            df.createOrReplaceTempView(source.settings.name)  # a validated identifier
        result = spark.sql(self.settings.sql)
        missing = [k for k in self.settings.key if k not in result.columns]
        if missing:
            raise ConfigError(
                f"{self.where}.sql returns no column(s) {missing} of key {self.settings.key} — fix: select them"
            )
        return result.where(" AND ".join(f"{quote_column(k)} IS NOT NULL" for k in self.settings.key))

    def _ensure_table(self) -> bool:
        """Create the table from the SQL's schema when missing; True when it was created."""
        ctx = self.ctx
        if ctx.tables.exists(self.namespace, self.name):
            return False
        ctx.tables.ensure_namespace(self.namespace)
        empty = self._result(None).limit(0)
        writer = empty.writeTo(self.ident).using("iceberg")
        for key, value in DEFAULT_TABLE_PROPERTIES.items():
            writer = writer.tableProperty(key, value)
        writer.create()
        ctx.tables.schema(self.namespace, self.name, refresh=True)
        log.info("created derived table %s", self.settings.table)
        return True

    def _evolve(self, result: DataFrame) -> None:
        """Columns the SQL returns that the table lacks are added (a new source column under SELECT *)."""
        spark = self.ctx.spark
        current = {c.lower() for c in spark.table(self.ident).columns}
        for f in result.schema.fields:
            if f.name.lower() not in current:
                spark.sql(f"ALTER TABLE {self.ident} ADD COLUMN {quote_column(f.name)} {f.dataType.simpleString()}")
                log.info("derived table %s: added column %s", self.settings.table, f.name)

    def upsert(self, keys: set[tuple] | None) -> None:
        """Recompute the rows of ``keys`` (every key when None) and MERGE them into the table, with
        the inputs' offsets in the snapshot."""
        from lakestream.runtime.spark import jvm_helper
        from lakestream.sink.catalog.sink import commit_files, table_info

        started = time.monotonic()
        ctx, spark = self.ctx, self.ctx.spark
        key_cols = self.settings.key
        key_list = ", ".join(quote_column(k) for k in key_cols)
        target_schema = spark.table(self.ident).schema  # the key columns' types, for the touched keys
        keys_df = None
        if keys is not None:
            from pyspark.sql import functions as F

            # Types inferred from the values (an input's key column may be an int where the derived key is
            # a string or a wider number), then cast to the table's key types.
            inferred = spark.createDataFrame(list(keys))
            keys_df = inferred.select(
                *[
                    F.col(c).cast(target_schema[k].dataType).alias(k)
                    for c, k in zip(inferred.columns, key_cols, strict=True)
                ]
            )
        result = self._result(keys_df)
        self._evolve(result)
        prefix = f"lakestream_derived_{self.settings.name}"
        result.createOrReplaceTempView(f"{prefix}_rows")
        if keys_df is None:
            keys_df = spark.sql(f"SELECT {key_list} FROM {prefix}_rows UNION SELECT {key_list} FROM {self.ident}")
        keys_df.createOrReplaceTempView(f"{prefix}_keys")
        values = [c for c in result.columns if c not in key_cols]
        merge = merge_sql(self.ident, f"{prefix}_keys", f"{prefix}_rows", key_cols, values)
        consumed: dict[Any, int] = {}
        for source_input in self.inputs:
            consumed.update(ctx.offsets.load(source_input.ident))
        merged = ctx.offsets.merged_after_commit(self.ident, consumed)
        props = ctx.commit_properties(merged)
        catalog = ctx.config.catalog.name
        before = table_info(spark, catalog, self.namespace, self.name).get("snapshot_id")
        jvm_helper(spark).sqlWithCommitProperties(spark._jsparkSession, merge, props)
        if table_info(spark, catalog, self.namespace, self.name).get("snapshot_id") == before:
            # The MERGE changed nothing and made no snapshot: record the offsets in an empty one, or a
            # restart would find the table behind and recompute it whole.
            commit_files(
                spark,
                catalog,
                self.namespace,
                self.name,
                {"base_snapshot_id": None, "data_files": [], "deletes": [], "properties": props},
            )
        ctx.offsets.record(self.ident, merged)
        self.last_upsert = time.monotonic()
        kind = "full" if keys is None else "keys"
        if keys is not None:
            self.last_touched = len(keys)
        self.upserts[kind] += 1
        log.info(
            "derived table %s: %s upserted in %.1fs (batch %d)",
            self.settings.table,
            "every key" if keys is None else f"{len(keys)} touched key(s)",
            time.monotonic() - started,
            ctx.batch_id,
        )


class MaterializeStage:
    """Every derived table of a pipeline."""

    # reads its inputs as the batch committed them
    when: Literal["before_commits", "after_commits"] = "after_commits"

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.tables = [DerivedTable(s, ctx, f"derived_tables[{i}]") for i, s in enumerate(ctx.config.derived_tables)]

    def reads(self) -> dict[str, set[str]]:
        return {t.settings.table: {i.table for i in t.settings.inputs} for t in self.tables}

    def idle(self) -> None:
        self.upsert_due()

    def close(self) -> None:
        self.flush()

    def reported_columns(self) -> dict[str, list[str]]:
        """Input table → the columns the write tasks report of each of its changes (`ChangedKeys`):
        its primary key and the derived key columns of every derived table reading it."""
        out: dict[str, list[str]] = {}
        for table in self.tables:
            for source in table.settings.inputs:
                spec = self.ctx.registry.specs.get(source.table)
                primary = list(spec.key_columns) if spec is not None and spec.mode == "upsert" else []
                out[source.table] = list(dict.fromkeys([*out.get(source.table, []), *primary, *source.key]))
        return out

    def flush(self) -> None:
        """Upsert the keys still waiting for their table's commit interval (when the pipeline stops)."""
        for table in self.tables:
            if table.ready and table.pending:
                try:
                    table.upsert(table.pending)
                    table.pending = set()
                except Exception as exc:  # noqa: BLE001 — the next start finds the table behind and recomputes it
                    log.warning(
                        "derived table %s: could not upsert its waiting keys on stop: %s",
                        table.settings.table,
                        first_line(exc, 300),
                    )

    def run(self, report: BatchReport, isolated: bool) -> None:
        """After the batch's commits: bring every derived table up to date (or wait for its interval)."""
        for table in self.tables:
            self._guarded(table, lambda t: t.advance(report, isolated))

    def upsert_due(self) -> None:
        """Between batches (nothing to read): upsert the keys whose commit interval has passed."""
        for table in self.tables:
            self._guarded(table, DerivedTable.upsert_if_due)

    @staticmethod
    def _guarded(table: DerivedTable, step: Callable[[DerivedTable], None]) -> None:
        try:
            step(table)
        except BaseException:
            table.ready = False  # the next batch (or restart) finds it behind and recomputes it whole
            raise
