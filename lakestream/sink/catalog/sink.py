"""Every call into `LakestreamSink` (Java, driver only) and its typed result: table metadata, table creation,
commits of data files and deletion vectors, compaction commits, deleted positions, snapshot diffs and row
lineage. The JVM reads each file's footer for column metrics and writes the deletion vectors."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import orjson

from lakestream.storage import remember_vended

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# -- the JVM side (driver only) ----------------------------------------------------------------


class TableInfo(TypedDict, total=False):
    """What `LakestreamSink.tableInfo` answers about a table (always its latest metadata)."""

    exists: bool
    location: str
    data_location: str
    format_version: int
    snapshot_id: int | None
    schema: dict[str, Any]  # Iceberg schema JSON
    spec: dict[str, Any]  # Iceberg partition spec JSON
    identifier_fields: list[str]
    uuid: str
    properties: dict[str, str]


class DataFileEntry(TypedDict, total=False):
    """A data file to commit: where it is, its size, its rows, its partition values (`partition_values`)."""

    path: str
    file_size: int
    record_count: int
    partition: list[Any]
    spec_id: int


class CommitRequest(TypedDict, total=False):
    """One `commit_files` call: data files and deletion vectors with snapshot properties, in one snapshot."""

    base_snapshot_id: int | None
    expect_snapshot_id: int | None  # the commit is refused (``stale``) unless the table is still there
    data_files: list[DataFileEntry]
    deletes: list[dict[str, Any]]  # {data_file, positions}
    properties: dict[str, str]
    truncate: bool  # every data file the table had before goes (a TRUNCATE in the batch)
    hold_owner: str  # the run holding the table's commits (`lakestream.commit-hold`): its own commit goes through


class CommitResult(TypedDict, total=False):
    """What `commit_files` committed (``stale`` instead when ``expect_snapshot_id`` no longer held)."""

    snapshot_id: int | None
    parent_snapshot_id: int | None
    sequence_number: int
    data_files: int
    delete_files: int
    removed_delete_files: int
    previous_deletes_loaded: int  # data files whose earlier deletes the new DVs merged
    timings_ms: dict[str, float]  # the commit's steps in order (load_table, ..., iceberg_commit, ...)
    stale: bool
    first_row_ids: dict[str, int]  # data file added → the `_row_id` of its first row (format v3)


def _sink(spark: SparkSession) -> Any:
    jvm: Any = spark.sparkContext._jvm
    return jvm.lakestream.LakestreamSink


def table_info(spark: SparkSession, catalog: str, namespace: str, table: str) -> TableInfo:
    """``{"exists": false}`` or ``{"exists": true, location, data_location, format_version,
    snapshot_id, schema, spec, identifier_fields, properties}`` (always the latest metadata)."""
    raw: dict[str, Any] = orjson.loads(_sink(spark).tableInfo(spark._jsparkSession, catalog, namespace, table))
    vended = raw.pop("io", None)  # storage credentials a REST catalog vended: for the writers, never shown
    if vended:
        remember_vended(raw["location"], vended)
    return cast(TableInfo, raw)


def create_table(spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]) -> TableInfo:
    """Create a table (and its namespace) in one catalog commit, no-op if it exists; returns its
    `table_info`. ``request``: ``{columns: [{name, type (Spark DDL), required?, comment?}],
    identifier_fields?, partition_by?, sort_by?, properties?}``."""
    answer = _sink(spark).createTable(spark._jsparkSession, catalog, namespace, table, orjson.dumps(request).decode())
    return cast("TableInfo", orjson.loads(answer))


def add_column_with_default(
    spark: SparkSession, catalog: str, namespace: str, table: str, column: str, ddl: str, default_json: str
) -> TableInfo:
    """Add ``column`` (Spark DDL type) whose existing rows read ``default_json`` (Iceberg v3
    initial-default and write-default, single-value JSON); returns `table_info`."""
    answer = _sink(spark).addColumnWithDefault(
        spark._jsparkSession, catalog, namespace, table, column, ddl, default_json
    )
    return cast("TableInfo", orjson.loads(answer))


def commit_files(spark: SparkSession, catalog: str, namespace: str, table: str, request: CommitRequest) -> CommitResult:
    """Commit data files and deletion vectors with snapshot properties in one snapshot.

    ``request``: ``{base_snapshot_id, data_files: [{path, file_size, record_count, spec_id?,
    partition: [...]}], deletes: [{data_file, positions}], properties: {k: v}}``; returns
    ``{snapshot_id, parent_snapshot_id, sequence_number, data_files, delete_files,
    removed_delete_files}``. Iceberg's exceptions surface as py4j errors carrying the Java class."""
    answer = _sink(spark).commitFiles(
        spark._jsparkSession,
        catalog,
        namespace,
        table,
        orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY).decode(),
    )
    return cast("CommitResult", orjson.loads(answer))


def deleted_positions(
    spark: SparkSession, catalog: str, namespace: str, table: str, paths: list[str], nice: int = 0
) -> dict[str, Any]:
    """The positions deleted in each of the data files ``paths`` at the table's current snapshot:
    ``{snapshot_id, files: {path: {records, positions}}, missing: [paths not live]}``. With ``nice`` the deletion
    vectors are read on a JVM thread at that nice value (work beside the batches)."""
    answer = _sink(spark).deletedPositions(
        spark._jsparkSession, catalog, namespace, table, orjson.dumps(paths).decode(), nice
    )
    return cast("dict[str, Any]", orjson.loads(answer))


def commit_rewrite_groups(
    spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]
) -> dict[str, Any]:
    """Replace data files by files holding their live rows, in one ``replace`` snapshot
    (`LakestreamSink.commitRewrite`): ``{expect_snapshot_id, groups: [{inputs, output: {path, file_size,
    record_count}, deletes}], properties}``; ``{stale: true}`` when the table moved on."""
    answer = _sink(spark).commitRewrite(
        spark._jsparkSession,
        catalog,
        namespace,
        table,
        orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY).decode(),
    )
    return cast("dict[str, Any]", orjson.loads(answer))


def snapshot_changes(
    spark: SparkSession, catalog: str, namespace: str, table: str, from_snapshot: int, max_positions: int | None = None
) -> dict[str, Any]:
    """`LakestreamSink.snapshotChanges`: the snapshots after ``from_snapshot`` with their added and removed
    data files and the positions each newly deleted (``positions``, int64 arrays); ``positions_over`` when more
    than ``max_positions`` (default `lakestream.sink.index.diff.DIFF_MAX`) were deleted (then the listing is
    incomplete)."""
    from lakestream.sink.index import diff

    limit = diff.DIFF_MAX if max_positions is None else max_positions
    changes: dict[str, Any] = orjson.loads(
        _sink(spark).snapshotChanges(spark._jsparkSession, catalog, namespace, table, int(from_snapshot), int(limit))
    )
    for snap in changes.get("snapshots", []):
        for d in snap["deleted"]:
            d["positions"] = np.frombuffer(base64.b64decode(d.pop("positions_le64")), "<i8").astype(np.int64)
    return changes
