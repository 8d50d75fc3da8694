"""Compaction of the pipeline's own upsert mirrors: written beside ingestion, committed by the pipeline.

Iceberg's ``rewrite_data_files`` cannot commit under a stream of random-key updates: while it rewrites a
group of files, the batches keep adding deletion vectors to those files, and its commit fails validation
(``Can't index multiple DVs for file``), round after round. Here the rewrite and its commit are split:

1. `prepare_rewrite` (the maintenance thread): pick the small files of the partitions the plan chose, and
   read, at the table's current snapshot S0, the positions already deleted in each.
2. `run_rewrite` (executors, beside the batches): one task per group reads its files in order, leaves out
   the rows deleted at S0 and writes their live rows as one data file, with the rows' index keys.
3. The pipeline, between two batches (`lakestream.sink.commit.rewrites`), reads the positions deleted in the
   inputs now, carries those deleted since S0 onto the new file (row ``p`` of input ``i`` is row
   ``offset(i) + p - |deleted at S0 before p|`` of the output), commits one ``replace`` snapshot, and
   moves the key index with the rows. Nothing races: the batches commit from the same thread.

Used only for the tables a pipeline writes as upsert mirrors with a key index (inline maintenance);
other tables, and ``lakestream maintain``, keep Iceberg's procedure. Hot partitions are compacted too:
the commit cannot conflict with the batches, which is what ``quiet_time_s`` protects the procedure from.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lakestream.beside import BACKGROUND_NICE, at_low_priority
from lakestream.identifiers import TableName
from lakestream.maintenance.actions import MaintenanceResult
from lakestream.read.inspection import PartitionMetrics, load_java_table, partition_key
from lakestream.sink.commit.rewrites import RewriteGroup

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakestream.config import CompactionPolicy
    from lakestream.sink.spec import TableSpec

log = logging.getLogger(__name__)

# Iceberg's binpack default: files under 0.75× the target are small.
SMALL_FILE_RATIO = 0.75
# Inputs of one output file (one task): bounds a task's open files and its time.
MAX_GROUP_FILES = 1000
# Size classes (`size_class`): a class spans a factor CLASS_RATIO, the first everything under CLASS_BASE_BYTES×4.
CLASS_BASE_BYTES = 64 * 1024
CLASS_RATIO = 4


@dataclass
class PreparedRewrite:
    """A compaction written and waiting for the pipeline's commit."""

    table: str  # namespace.table
    snapshot_id: int  # the start snapshot S0 its inputs were read at
    groups: list[RewriteGroup]
    result: MaintenanceResult
    started: float = field(default_factory=time.monotonic)

    def outputs(self) -> list[str]:
        return [g.output["path"] for g in self.groups if g.output is not None]


def size_class(size: int) -> int:
    """Files within 4× of each other in size share a class (0: under `CLASS_BASE_BYTES`×4)."""
    return int(np.floor(np.log(max(size, CLASS_BASE_BYTES) / CLASS_BASE_BYTES) / np.log(CLASS_RATIO)))


def plan_groups(files: list[dict[str, Any]], policy: CompactionPolicy) -> list[list[dict[str, Any]]]:
    """The groups one round rewrites, each the inputs of one new file (all of one partition). ``files``:
    ``{path, size, records, deleted, key}`` (key: the partition; deleted: rows its deletion vector holds).

    A file is rewritten when it is small — under 3/4 of the target size and of `max_rows_per_file` live rows — and
    its size class has `min_input_files` small files (so a file a round wrote waits for peers of its size instead
    of being rewritten with each new small file: each row is rewritten about once per class it climbs), or when its
    share of deleted rows reaches `delete_ratio_threshold` (alone if need be: the rewrite drops them; the small files
    no larger than it join it). Groups hold
    at most the target's bytes, `max_rows_per_file` live rows and `MAX_GROUP_FILES` files; a round takes the
    groups of the smallest files first, up to `max_bytes_per_round` input bytes (one group at least)."""
    target, max_rows = policy.target_file_size_bytes, policy.max_rows_per_file
    by_partition: dict[tuple, list[dict[str, Any]]] = {}
    for f in files:
        by_partition.setdefault(f["key"], []).append(f)
    groups: list[list[dict[str, Any]]] = []
    heavy_paths: set[str] = set()
    for members in by_partition.values():
        heavy: list[dict[str, Any]] = []
        classes: dict[int, list[dict[str, Any]]] = {}
        for f in members:
            live = f["records"] - f.get("deleted", 0)
            if f["records"] and f.get("deleted", 0) / f["records"] >= policy.delete_ratio_threshold:
                heavy.append(f)
                heavy_paths.add(f["path"])
            elif f["size"] < SMALL_FILE_RATIO * target and live < SMALL_FILE_RATIO * max_rows:
                classes.setdefault(size_class(f["size"]), []).append(f)
        # Beside a file rewritten for its deletes, the small files no larger than it ride along (it is rewritten
        # anyway), whatever their class's count.
        ride = max((f["size"] for f in heavy), default=-1)
        chosen = list(heavy) + [
            f for c in classes.values() for f in c if len(c) >= policy.min_input_files or f["size"] <= ride
        ]
        chosen.sort(key=lambda f: (f["size"], f["path"]))
        group: list[dict[str, Any]] = []
        size = rows = 0
        for f in chosen:
            live = f["records"] - f.get("deleted", 0)
            if group and (size + f["size"] > target or rows + live > max_rows or len(group) >= MAX_GROUP_FILES):
                groups.append(group)
                group, size, rows = [], 0, 0
            group.append(f)
            size += f["size"]
            rows += live
        if group:
            groups.append(group)
    worth = [g for g in groups if len(g) >= 2 or g[0]["path"] in heavy_paths]
    worth.sort(key=lambda g: sum(f["size"] for f in g) / len(g))
    taken: list[list[dict[str, Any]]] = []
    spent = 0
    for g in worth:
        size = sum(f["size"] for f in g)
        if taken and spent + size > policy.max_bytes_per_round:
            continue  # a smaller group further on may still fit
        taken.append(g)
        spent += size
    return taken


def live_data_files(
    spark: SparkSession, catalog: str, table: TableName, jtable: Any = None
) -> list[tuple[str, int, int, int, dict[str, Any], int]]:
    """(path, bytes, records, spec id, partition, rows deleted) of each live data file. A table never partitioned is
    listed from its manifests in the JVM at a lower priority (`TableStats.liveDataFiles`): no Spark job beside the
    batches; a partitioned one by Spark's ``data_files`` and ``delete_files`` tables, whose partition values are
    typed as the plan's are. ``jtable``: the table as just loaded by the caller (else it is loaded here)."""
    from lakestream.identifiers import quote_table
    from lakestream.runtime.spark import driver_jvm

    if jtable is None:
        jtable = load_java_table(spark, catalog, f"{table.namespace}.{table.table}")
    answer = json.loads(driver_jvm(spark).lakestream.TableStats.liveDataFiles(jtable, BACKGROUND_NICE))
    if answer["unpartitioned"]:
        return [
            (f["path"], int(f["size"]), int(f["records"]), int(f["spec_id"]), {}, int(f.get("deleted", 0)))
            for f in answer["files"]
        ]
    qualified = quote_table(catalog, table.namespace, table.table)
    listing = spark.table(f"{qualified}.data_files")
    partitioned = "partition" in listing.columns  # a table whose specs are all unpartitioned has no such column
    rows = listing.select(
        "file_path", "file_size_in_bytes", "record_count", "spec_id", *(["partition"] if partitioned else [])
    ).collect()
    deleted = {
        r[0]: int(r[1])
        for r in spark.sql(
            f"SELECT referenced_data_file, SUM(record_count) FROM {qualified}.delete_files "
            "WHERE content = 1 AND referenced_data_file IS NOT NULL GROUP BY referenced_data_file"
        ).collect()
    }
    return [
        (
            r["file_path"],
            int(r["file_size_in_bytes"]),
            int(r["record_count"]),
            int(r["spec_id"]),
            r["partition"].asDict() if partitioned and r["partition"] is not None else {},
            deleted.get(r["file_path"], 0),
        )
        for r in rows
    ]


def prepare_rewrite(
    spark: SparkSession,
    catalog: str,
    name: str,
    partitions: list[PartitionMetrics],
    policy: CompactionPolicy,
    jtable: Any = None,
) -> PreparedRewrite | None:
    """The groups to rewrite in ``partitions`` (`plan_groups`) and the rows deleted in their files at the current
    snapshot; None when there is nothing worth rewriting. ``jtable``: the table as the caller just loaded it."""
    from lakestream.sink.catalog.sink import deleted_positions
    from lakestream.sink.commit.lineage import file_lineage

    table = TableName.parse(name)
    started = time.monotonic()
    wanted = {p.key for p in partitions}
    files = []
    for path, size, records, spec_id, partition, deleted in live_data_files(spark, catalog, table, jtable):
        key = partition_key(spec_id, partition)
        if key in wanted:
            files.append({"path": path, "size": size, "records": records, "deleted": deleted, "key": key})
    groups = plan_groups(files, policy)
    result = MaintenanceResult(
        table=name,
        action="compact",
        status="ok",
        detail={"partitions": [p.label() for p in partitions], "strategy": "size classes", "committed_by": "pipeline"},
    )
    if not groups:
        return None
    now = deleted_positions(
        spark, catalog, table.namespace, table.table, [f["path"] for g in groups for f in g], nice=BACKGROUND_NICE
    )
    missing = set(now["missing"])
    prepared = []
    for g in groups:
        live = [f for f in g if f["path"] not in missing]  # listed, then removed by another writer
        if len(live) < 2:
            continue
        prepared.append(
            RewriteGroup(
                inputs=[f["path"] for f in live],
                records=[f["records"] for f in live],
                deleted=[np.asarray(now["files"][f["path"]]["positions"], np.int64) for f in live],
                bytes=sum(f["size"] for f in live),
                lineage=[file_lineage(now, f["path"]) for f in live],
            )
        )
    if not prepared or now["snapshot_id"] is None:
        return None
    result.files_before = sum(len(g.inputs) for g in prepared)
    result.bytes_before = sum(g.bytes for g in prepared)
    return PreparedRewrite(
        table=name, snapshot_id=int(now["snapshot_id"]), groups=prepared, result=result, started=started
    )


class NotRewritable(Exception):
    """An input file's columns do not map onto the table's schema by field id (left as it is)."""


def project_by_field_id(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (a data file's rows) with ``schema``'s columns, matched by Parquet field id (renames keep
    their id); a column the file lacks would need the column's default, so the file is not rewritten."""
    import pyarrow as pa

    def field_id(f: pa.Field) -> str | None:
        meta = f.metadata or {}
        value = meta.get(b"PARQUET:field_id")
        return value.decode() if value is not None else None

    by_id = {field_id(f): i for i, f in enumerate(table.schema) if field_id(f) is not None}
    columns = []
    for f in schema:
        i = by_id.get(field_id(f))
        if i is None:
            raise NotRewritable(f"column {f.name} (field id {field_id(f)}) is not in the file")
        columns.append(table.column(i).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _rewrite_group(
    group: RewriteGroup, data_location: str, schema: pa.Schema, key_columns: list[str], storage: Any
) -> tuple[dict[str, Any] | None, np.ndarray | None, str | None]:
    """One task: the group's live rows as one data file, and their index keys by position."""
    return at_low_priority(lambda: _write_group(group, data_location, schema, key_columns, storage))


def _write_group(
    group: RewriteGroup, data_location: str, schema: pa.Schema, key_columns: list[str], storage: Any
) -> tuple[dict[str, Any] | None, np.ndarray | None, str | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakestream.sink.commit.lineage import lineage_columns, lineage_fields
    from lakestream.sink.index.keys import index_keys
    from lakestream.sink.write.files import write_data_file
    from lakestream.storage import filesystem_path, use_options

    use_options(storage)
    parts = []
    lineage = group.lineage or [(None, None)] * len(group.inputs)
    row_ids, sequence_numbers = [], []
    try:
        for path, records, deleted, (first_row_id, sequence) in zip(
            group.inputs, group.records, group.deleted, lineage, strict=True
        ):
            fs, local = filesystem_path(path)
            rows = pq.read_table(local, filesystem=fs, use_threads=False)  # Arrow's pool runs at nice 0
            if rows.num_rows != records:
                raise NotRewritable(f"{path} has {rows.num_rows} rows, its manifest says {records}")
            # A moved row keeps its id and the sequence number of its last change: written explicitly, since the
            # output file gets its own first_row_id and sequence number.
            ids, seqs = file_row_lineage(rows, first_row_id, sequence)
            rows = project_by_field_id(rows, schema)
            if len(deleted):
                keep = np.ones(records, bool)
                keep[deleted] = False
                rows = rows.filter(pa.array(keep))
                ids, seqs = ids[keep], seqs[keep]
            parts.append(rows)
            row_ids.append(ids)
            sequence_numbers.append(seqs)
    except NotRewritable as exc:
        return None, None, str(exc)
    out = pa.concat_tables(parts)
    ids, seqs = np.concatenate(row_ids), np.concatenate(sequence_numbers)
    if (ids >= 0).any() or (seqs >= 0).any():
        written = write_data_file(
            lineage_columns(out, ids, seqs), data_location, pa.schema(list(schema) + lineage_fields()), "compact"
        )
    else:  # a table without row lineage (format < 3)
        written = write_data_file(out, data_location, schema, "compact")
    return written, index_keys(out, key_columns), None


def file_row_lineage(rows: pa.Table, first_row_id: int | None, sequence: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``_row_id`` and ``_last_updated_sequence_number`` in a data file (``rows``, all of it):
    the file's explicit value, else ``first_row_id`` + position and the file's data sequence number (-1 where
    neither is known)."""
    from lakestream.sink.commit.lineage import UNKNOWN, read_lineage

    n = rows.num_rows
    ids = np.full(n, UNKNOWN, np.int64) if first_row_id is None else first_row_id + np.arange(n, dtype=np.int64)
    seqs = np.full(n, UNKNOWN if sequence is None else sequence, np.int64)
    explicit_ids, explicit_seqs = read_lineage(rows)
    if explicit_ids is not None:
        ids = np.where(explicit_ids >= 0, explicit_ids, ids)
    if explicit_seqs is not None:
        seqs = np.where(explicit_seqs >= 0, explicit_seqs, seqs)
    return ids, seqs


def run_rewrite(spark: SparkSession, prepared: PreparedRewrite, spec: TableSpec) -> None:
    """Write each group's file on the executors, at most half the cluster's task slots at a time (the
    batches keep the rest); groups whose files cannot be rewritten are dropped with a log line."""
    from lakestream.storage import active_options

    sc = spark.sparkContext
    at_once = max(1, sc.defaultParallelism // 2)
    data_location, schema, key_columns, storage = (
        spec.data_location,
        spec.arrow_schema(),
        list(spec.key_columns),
        active_options(),
    )
    done: list[RewriteGroup] = []
    for start in range(0, len(prepared.groups), at_once):
        chunk = prepared.groups[start : start + at_once]
        outcomes = (
            sc.parallelize(chunk, len(chunk))
            .map(lambda g: _rewrite_group(g, data_location, schema, key_columns, storage))
            .collect()
        )
        for group, (written, keys, problem) in zip(chunk, outcomes, strict=True):
            if problem is not None:
                log.warning(
                    "%s: a compaction group of %d file(s) left as it is: %s", prepared.table, len(group.inputs), problem
                )
                continue
            group.output, group.keys = written, keys
            done.append(group)
    prepared.groups = done
