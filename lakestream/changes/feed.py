"""What changed in a table between two snapshots: planned from the manifests, read from the touched files alone.

A range (since, until] is planned by `ChangeFeed.plan` (JVM side) from its snapshots' changes. Rows the range
wrote can only be in the data files it added; they are read as of ``until``, and those carrying a sequence number
above since's are the written rows (the others are rows a rewrite moved with their lineage). Rows the range
removed are named by its deletes: the positions each snapshot's deletion vectors added and the live rows of the
files it removed other than by a rewrite (a TRUNCATE), read on the driver from those files' ``_row_id`` column;
their images as of ``since`` are read from the touched files live at ``since``. Both sides are read by Spark
through staged scan task sets, with v3 row lineage (``_row_id``, ``_last_updated_sequence_number``). The two sides
are joined by key:

- a key only written is an ``insert``, only removed a ``delete``, on both sides with different values an
  ``update`` (a key deleted and inserted again inside the range too: net, one update); a key inserted and
  deleted inside the range does not appear;
- a table without a primary key (no identifier fields) is a multiset: rows are matched by ``_row_id`` instead
  (an update of one of several equal rows keeps the id of the row it replaced, as the sink writes it).

Each change names its commit: for an insert or update the snapshot whose sequence number the row carries, for a
delete the last snapshot of the range that deleted a row of its key. ``all_changes=True`` diffs every commit of
the range against its parent instead, so a key changed by several commits appears once per commit.

The cost of a range is its manifests, the files it added, and the files it deleted rows from (read once, as of
``since``), not the table. Rows come in the table's current schema (a column added inside the range reads as its
default in a before image). A range with equality deletes, or position delete files that name no data file,
reads every live file on both sides: still exact, no longer cheap.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from lakestream.errors import ChangeFeedError
from lakestream.identifiers import TableName, quote_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

# The columns every change row starts with; the table's columns (the row after) and ``_before`` follow.
CHANGE_COLUMNS = ("_change_type", "_commit_snapshot_id", "_commit_sequence_number", "_row_id")
LINEAGE = ("_row_id", "_last_updated_sequence_number")
# Staged task sets stay in the driver while a DataFrame may still read them; past this many ranges per process
# the oldest are released (a DataFrame that old can no longer be evaluated: read its changes again).
STAGED_RANGES = 64
_staged: OrderedDict[str, tuple[Any, str, str, str]] = OrderedDict()


@dataclass(frozen=True)
class Commit:
    """One snapshot of a range."""

    snapshot_id: int
    sequence_number: int
    operation: str
    compaction: bool


@dataclass(frozen=True)
class ChangeRange:
    """A planned range (since, until] of one table: its commits, and the staged reads of its touched files."""

    catalog: str
    table: TableName
    since: int
    until: int
    since_sequence_number: int
    commits: tuple[Commit, ...]
    full: bool
    before_set: str | None
    after_set: str | None
    before_files: int
    after_files: int
    before_records: int
    after_records: int
    events: tuple[dict[str, Any], ...]

    @property
    def ident(self) -> str:
        return quote_table(self.catalog, self.table.namespace, self.table.table)


def _feed(spark: SparkSession) -> Any:
    jvm: Any = spark.sparkContext._jvm
    return jvm.lakestream.ChangeFeed


def plan_range(
    spark: SparkSession, catalog: str, table: TableName | str, since: int, until: int | None = None
) -> ChangeRange:
    """Plan (``since``, ``until``] of ``table`` (``until`` None: the current snapshot) and stage its reads;
    ChangeFeedError when ``since`` is not in the history of ``until`` (naming the oldest ``since`` possible)."""
    ref = table if isinstance(table, TableName) else TableName.parse(table, catalog)
    prefix = f"lakestream-changes-{uuid.uuid4().hex}"
    raw = orjson.loads(
        _feed(spark).plan(
            spark._jsparkSession,
            catalog,
            ref.namespace,
            ref.table,
            int(since),
            -1 if until is None else int(until),
            prefix,
        )
    )
    if raw.get("until_missing"):
        where = "has no snapshot yet" if until is None else f"has no snapshot {until} (expired, or never its own)"
        raise ChangeFeedError(f"{ref} {where}: --until must be a snapshot of the table")
    if not raw["ancestor"]:
        raise ChangeFeedError(
            f"snapshot {since} is not in the history of {ref} up to snapshot {raw['until']} (expired, rolled back, "
            f"or another table's): the oldest --since still possible is {raw['oldest']}"
        )
    _remember(spark, catalog, ref, prefix)
    return ChangeRange(
        catalog=catalog,
        table=ref,
        since=int(raw["since"]),
        until=int(raw["until"]),
        since_sequence_number=int(raw["since_sequence_number"]),
        commits=tuple(
            Commit(int(c["snapshot_id"]), int(c["sequence_number"]), c["operation"] or "", bool(c["compaction"]))
            for c in raw["snapshots"]
        ),
        full=bool(raw["full"]),
        before_set=raw["before"]["set"],
        after_set=raw["after"]["set"],
        before_files=int(raw["before"]["files"]),
        after_files=int(raw["after"]["files"]),
        before_records=int(raw["before"]["records"]),
        after_records=int(raw["after"]["records"]),
        events=tuple(raw["events"]),
    )


def _remember(spark: SparkSession, catalog: str, ref: TableName, prefix: str) -> None:
    _staged[prefix] = (spark, catalog, ref.namespace, ref.table)
    while len(_staged) > STAGED_RANGES:
        old, (session, cat, ns, tbl) = _staged.popitem(last=False)
        try:
            _feed(session).release(session._jsparkSession, cat, ns, tbl, old)
        except Exception as exc:  # noqa: BLE001 — a stopped session holds no staged sets any more
            log.debug("releasing staged change-feed reads %s: %s", old, exc)


def read_changes(
    spark: SparkSession,
    catalog: str,
    table: TableName | str,
    since: int,
    until: int | None = None,
    *,
    all_changes: bool = False,
    key_columns: list[str] | None = None,
) -> DataFrame:
    """The changes of ``table`` in (``since``, ``until``] as a Spark DataFrame: `CHANGE_COLUMNS`, the table's
    columns (the row after; NULL for a delete) and ``_before`` (a struct of the table's columns as of ``since``, or
    as of the commit's parent with ``all_changes``; NULL for an insert). ``key_columns`` defaults to the table's
    identifier fields; none: the table is a multiset matched by ``_row_id``."""
    ref = table if isinstance(table, TableName) else TableName.parse(table, catalog)
    keys = _key_columns(spark, catalog, ref) if key_columns is None else list(key_columns)
    if not all_changes:
        return _range_changes(spark, plan_range(spark, catalog, ref, since, until), keys, attribute_to=None)
    whole = plan_range(spark, catalog, ref, since, until)
    parts: list[DataFrame] = []
    parent = whole.since
    for commit in whole.commits:
        step = plan_range(spark, catalog, ref, parent, commit.snapshot_id)
        parts.append(_range_changes(spark, step, keys, attribute_to=commit))
        parent = commit.snapshot_id
    if not parts:
        return _range_changes(spark, whole, keys, attribute_to=None)
    return reduce(lambda a, b: a.unionByName(b), parts)


def read_changes_arrow(
    spark: SparkSession,
    catalog: str,
    table: TableName | str,
    since: int,
    until: int | None = None,
    *,
    all_changes: bool = False,
    key_columns: list[str] | None = None,
) -> pa.Table:
    """`read_changes` collected into a pyarrow Table, in commit order (for results that fit the driver)."""
    from lakestream.read.query import spark_to_arrow

    df = read_changes(spark, catalog, table, since, until, all_changes=all_changes, key_columns=key_columns)
    return spark_to_arrow(df.orderBy("_commit_sequence_number", "_row_id"))


def _key_columns(spark: SparkSession, catalog: str, ref: TableName) -> list[str]:
    from lakestream.sink.catalog.sink import table_info

    info = table_info(spark, catalog, ref.namespace, ref.table)
    if not info.get("exists", True):
        raise ChangeFeedError(f"table {ref} does not exist in catalog {catalog!r}")
    if int(info.get("format_version") or 0) < 3:
        raise ChangeFeedError(
            f"{ref} is an Iceberg v{info.get('format_version')} table: the change feed needs v3 row lineage "
            "(mirrors are v3; `lakestream upgrade` upgrades older ones)"
        )
    return list(info.get("identifier_fields") or [])


def _staged_read(spark: SparkSession, change_range: ChangeRange, set_id: str | None) -> DataFrame:
    """The rows of one side's staged files (their deletes as of that side's snapshot), with row lineage."""
    if set_id is None:  # no file on this side
        return spark.sql(f"SELECT *, {', '.join(LINEAGE)} FROM {change_range.ident}").limit(0)
    return spark.read.format("iceberg").option("scan-task-set-id", set_id).load(change_range.ident)


def _range_changes(
    spark: SparkSession, change_range: ChangeRange, keys: list[str], attribute_to: Commit | None
) -> DataFrame:
    from pyspark.sql import functions as F

    before = _staged_read(spark, change_range, change_range.before_set)
    after = _staged_read(spark, change_range, change_range.after_set)
    missing = [c for c in LINEAGE if c not in after.columns]
    if missing:
        raise ChangeFeedError(f"{change_range.table}: the scan has no {', '.join(missing)} (row lineage, format v3)")
    columns = [c for c in after.columns if c not in LINEAGE]
    unknown = [k for k in keys if k not in columns]
    if unknown:
        raise ChangeFeedError(f"{change_range.table}: key columns {unknown} are not columns of the table {columns}")
    removed = None if change_range.full else removed_rows(change_range, keys)
    before, after = _changed_sides(spark, change_range, before, after, removed)
    diff = _net_diff(before, after, columns, keys)
    if attribute_to is not None:
        commit_id: Column = F.lit(attribute_to.snapshot_id).cast("bigint")
        commit_seq: Column = F.lit(attribute_to.sequence_number).cast("bigint")
    else:
        diff = _attribute(spark, change_range, diff, keys, removed)
        commit_id, commit_seq = F.col("_commit_snapshot_id"), F.col("_commit_sequence_number")
    return diff.select(
        F.col("_change_type"),
        commit_id.alias("_commit_snapshot_id"),
        commit_seq.alias("_commit_sequence_number"),
        F.col("_row_id"),
        *[F.col("_after")[c].alias(c) for c in columns],
        F.col("_before"),
    )


@dataclass(frozen=True)
class RemovedRows:
    """What the range's deletes removed: the row ids, and for each key (each row id, without keys) the last
    snapshot that deleted a row of it."""

    ids: np.ndarray
    last_deletion: list[tuple[Any, ...]]


def _changed_sides(
    spark: SparkSession, change_range: ChangeRange, before: DataFrame, after: DataFrame, removed: RemovedRows | None
) -> tuple[DataFrame, DataFrame]:
    """The rows the range removed (as of since) and the rows it wrote (as of until).

    A row the range wrote carries a sequence number above since's; one at or below it is a row since held, moved
    by a rewrite with its lineage. The rows the range removed are those whose ids its deletes name (`removed`),
    less those moved. With ``removed`` None (a range with equality deletes: both sides are every live file) a row
    on both sides with the same id and sequence number is dropped instead."""
    from pyspark.sql import functions as F

    if removed is None:
        lineage = list(LINEAGE)
        return (
            before.join(after.select(*lineage), on=lineage, how="left_anti"),
            after.join(before.select(*lineage), on=lineage, how="left_anti"),
        )
    seq = F.col("_last_updated_sequence_number")
    since_seq = change_range.since_sequence_number
    moved = after.where(seq <= since_seq).select("_row_id")
    ids = _long_frame(spark, "_row_id", removed.ids)
    return (
        before.join(ids, "_row_id", "left_semi").join(moved, "_row_id", "left_anti"),
        after.where(seq > since_seq),
    )


def _long_frame(spark: SparkSession, name: str, values: np.ndarray) -> DataFrame:
    """A one-column DataFrame of int64 ``values`` (through Arrow: millions of ids in seconds)."""
    import pandas as pd
    from pyspark.sql.types import LongType, StructField, StructType

    key = "spark.sql.execution.arrow.pyspark.enabled"
    was = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    try:
        frame = pd.DataFrame({name: np.asarray(values, np.int64)})
        return spark.createDataFrame(frame, StructType([StructField(name, LongType(), False)]))
    finally:
        spark.conf.set(key, str(was))


def _comparable(df: DataFrame, columns: list[str]) -> Column:
    """A struct of ``columns`` that Spark can compare (map columns compared as their JSON)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    types = {f.name: f.dataType for f in df.schema.fields}
    return F.struct(*[F.to_json(F.col(c)).alias(c) if isinstance(types[c], MapType) else F.col(c) for c in columns])


def _net_diff(before: DataFrame, after: DataFrame, columns: list[str], keys: list[str]) -> DataFrame:
    """``_change_type``, ``_row_id``, ``_after_seq``, ``_before_row_id``, ``_after`` and ``_before`` (structs) of
    every key (or, without keys, every row id) whose row differs between the rows the range removed and the rows it
    wrote (`_changed_sides`)."""
    from pyspark.sql import functions as F

    b, a = before, after
    # The join's columns, the same on both sides: the key, or without one the row id.
    match = [f"_k{i}" for i in range(len(keys))] if keys else ["_k0"]
    match_cols = [F.col(k).alias(m) for k, m in zip(keys or ["_row_id"], match, strict=True)]
    bs = b.select(
        *match_cols,
        F.struct(*[F.col(c) for c in columns]).alias("_before"),
        _comparable(b, columns).alias("_bcmp"),
        F.col("_row_id").alias("_before_row_id"),
    ).alias("b")
    as_ = a.select(
        *match_cols,
        F.struct(*[F.col(c) for c in columns]).alias("_after"),
        _comparable(a, columns).alias("_acmp"),
        F.col("_row_id").alias("_after_row_id"),
        F.col("_last_updated_sequence_number").alias("_after_seq"),
    ).alias("a")
    condition = reduce(lambda x, y: x & y, [F.col(f"b.{m}").eqNullSafe(F.col(f"a.{m}")) for m in match])
    joined = bs.join(as_, condition, "full_outer")
    change = (
        F.when(F.col("b._before_row_id").isNull(), F.lit("insert"))
        .when(F.col("a._after_row_id").isNull(), F.lit("delete"))
        .otherwise(F.lit("update"))
    )
    return joined.where(~F.col("_bcmp").eqNullSafe(F.col("_acmp"))).select(
        change.alias("_change_type"),
        F.coalesce(F.col("a._after_row_id"), F.col("b._before_row_id")).alias("_row_id"),
        F.col("_after_seq"),
        F.col("b._before_row_id").alias("_before_row_id"),
        F.col("_after"),
        F.col("_before"),
    )


def _attribute(
    spark: SparkSession, change_range: ChangeRange, diff: DataFrame, keys: list[str], removed: RemovedRows | None
) -> DataFrame:
    """``_commit_snapshot_id`` and ``_commit_sequence_number`` of each change: the sequence number an insert's
    or update's row carries; for a delete, the last snapshot of the range that deleted a row of its key (of its
    row id, without keys)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    commits = spark.createDataFrame(
        [(c.sequence_number, c.snapshot_id) for c in change_range.commits],
        StructType([StructField("_seq", LongType(), False), StructField("_sid", LongType(), False)]),
    )
    attributed = diff.join(F.broadcast(commits), F.col("_after_seq") == F.col("_seq"), "left")
    before_types = {f.name: f.dataType for f in diff.schema["_before"].dataType.fields}  # type: ignore[attr-defined]
    match = keys or ["_row_id"]
    deletions = (removed or removed_rows(change_range, keys)).last_deletion
    fields = [StructField(f"_d{i}", before_types[m] if keys else LongType(), True) for i, m in enumerate(match)] + [
        StructField("_del_sid", LongType(), False),
        StructField("_del_seq", LongType(), False),
    ]
    by_match = spark.createDataFrame(deletions, StructType(fields))
    mine = [F.col("_before")[m] if keys else F.col("_before_row_id") for m in match]
    condition = reduce(
        lambda x, y: x & y,
        [c.eqNullSafe(F.col(f"_d{i}")) for i, c in enumerate(mine)],
        F.col("_change_type") == "delete",
    )
    attributed = attributed.join(by_match, condition, "left")
    last = change_range.commits[-1] if change_range.commits else None
    fallback_id = F.lit(last.snapshot_id if last else change_range.until).cast("bigint")
    fallback_seq = F.lit(last.sequence_number if last else change_range.since_sequence_number).cast("bigint")
    is_delete = F.col("_change_type") == "delete"
    return attributed.select(
        "*",
        F.when(is_delete, F.coalesce(F.col("_del_sid"), fallback_id))
        .otherwise(F.coalesce(F.col("_sid"), fallback_id))
        .alias("_commit_snapshot_id"),
        F.when(is_delete, F.coalesce(F.col("_del_seq"), fallback_seq))
        .otherwise(F.coalesce(F.col("_after_seq"), fallback_seq))
        .alias("_commit_sequence_number"),
    )


def removed_rows(change_range: ChangeRange, keys: list[str]) -> RemovedRows:
    """The row ids the range's deletes removed, and the last deletion of each key (each row id, without keys): from
    the positions each snapshot's deletion vectors added and the live rows of the files it removed (not by a
    rewrite), read from those files' ``_row_id`` and key columns on the driver. An update deletes its key's old row
    too, so only a key's last deletion can be the one that ended it."""
    from lakestream.sink.index.diff import read_ahead

    seq_of = {c.snapshot_id: c.sequence_number for c in change_range.commits}
    events = change_range.events
    first: dict[str, int] = {}
    for e in events:
        if e.get("first_row_id") is None:
            raise ChangeFeedError(
                f"{change_range.table}: data file {e['data_file']} has no first row id (row lineage, format v3)"
            )
        first[e["data_file"]] = int(e["first_row_id"])
    columns = dict(read_ahead(list(first), lambda path: file_identity_columns(path, first[path], keys)))
    ids: list[np.ndarray] = []
    last: dict[tuple[Any, ...], tuple[int, int]] = {}
    for e in events:
        row_ids, key_values = columns[e["data_file"]]
        rows = len(row_ids)
        if e["kind"] == "deleted":
            positions = _positions(e.get("positions_le64"))
        else:
            live = np.ones(rows, bool)
            dead = _positions(e.get("dead_le64"))
            live[dead[dead < rows]] = False
            positions = np.flatnonzero(live)
        positions = positions[positions < rows]
        ids.append(row_ids[positions])
        sid = int(e["snapshot_id"])
        seq = seq_of.get(sid, 0)
        for pos in positions.tolist():
            match = tuple(v[pos] for v in key_values) if keys else (int(row_ids[pos]),)
            if match not in last or last[match][1] <= seq:
                last[match] = (sid, seq)
    all_ids = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    return RemovedRows(all_ids, [(*match, sid, seq) for match, (sid, seq) in last.items()])


def _positions(encoded: str | None) -> np.ndarray:
    if not encoded:
        return np.zeros(0, np.int64)
    return np.frombuffer(base64.b64decode(encoded), "<i8").astype(np.int64)


def file_identity_columns(path: str, first_row_id: int, keys: list[str]) -> tuple[np.ndarray, list[list[Any]]]:
    """The ``_row_id`` of every row of data file ``path`` by position: the id the file holds (a row rewritten with
    its lineage), else ``first_row_id`` + its position (v3 row id inheritance); and its key columns (read by name, as
    the sink writes them). One read of the file for both."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from lakestream.storage import filesystem_path

    fs, local = filesystem_path(path)
    pf = pq.ParquetFile(local, filesystem=fs)
    names = {n.lower(): n for n in pf.schema_arrow.names}
    held_ids = "_row_id" in pf.schema_arrow.names
    wanted = [names[k.lower()] for k in keys] + (["_row_id"] if held_ids else [])
    table = pf.read(columns=wanted) if wanted else None
    n = pf.metadata.num_rows
    row_ids = np.arange(first_row_id, first_row_id + n, dtype=np.int64)
    if table is not None and held_ids:
        held = table.column("_row_id")
        if held.null_count == 0:
            row_ids = held.to_numpy().astype(np.int64)
        else:
            missing = pc.is_null(held).to_numpy(zero_copy_only=False)
            row_ids = np.where(missing, row_ids, pc.fill_null(held, 0).to_numpy())
    key_values = [table.column(names[k.lower()]).to_pylist() for k in keys] if table is not None else []
    return row_ids, key_values
