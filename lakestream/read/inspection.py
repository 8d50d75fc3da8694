"""Table inspection: what an Iceberg table holds, read from its metadata tables (files, partitions,
snapshots, metadata size, freshness, and the Kafka lag behind its stored offsets).

The one home for it: maintenance plans from it and health checks it. One `collect_table_metrics`
call answers everything both need about a table, from a handful of small metadata-table queries
(`partitions`, `data_files`, `snapshots` + `history`, `all_manifests`, `metadata_log_entries`)
plus the sizes of metadata files.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from lakestream.beside import BACKGROUND_NICE
from lakestream.identifiers import quote_table, sql_string
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, SOURCE_TS_PROPERTY, ancestry, decode_offsets
from lakestream.source.kafka import TP, kafka_lag

# Table properties that bound the metadata log: Iceberg keeps at most previous-versions-max earlier
# metadata files on the log and, with delete-after-commit, deletes each one that falls off at a commit.
METADATA_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
METADATA_PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

    from lakestream.config import KafkaSettings, MaintenancePolicy


def partition_key(spec_id: int, partition: dict[str, Any]) -> tuple:
    """A hashable identity of one partition of one spec (values compared as text)."""
    return (spec_id, tuple(sorted((k, str(v)) for k, v in partition.items())))


@dataclass
class PartitionMetrics:
    """One partition of one spec, as the `partitions` metadata table sees it."""

    partition: dict[str, Any]
    spec_id: int
    data_files: int
    data_bytes: int
    delete_files: int
    last_updated_ms: int | None
    records: int = 0  # rows in its data files
    deleted_records: int = 0  # of those, rows deleted by position (deletion vectors)

    @property
    def deleted_ratio(self) -> float:
        return self.deleted_records / self.records if self.records else 0.0

    @property
    def avg_file_bytes(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0

    @property
    def key(self) -> tuple:
        return partition_key(self.spec_id, self.partition)

    def label(self) -> str:
        """A short human/Prometheus label such as ``ts_day=2024-01-01/region=eu``."""
        if not self.partition:
            return "<unpartitioned>"
        return "/".join(f"{k}={_render(v)}" for k, v in self.partition.items())


# Write amplification is reported over this window (`TableMetrics.write_amplification`).
AMPLIFICATION_WINDOW_S = 3600


@dataclass
class SnapshotInfo:
    """One snapshot on the current snapshot's ancestry (newest first in `TableMetrics.ancestry`)."""

    snapshot_id: int
    committed_ms: int
    operation: str | None
    offsets: dict[TP, int] | None
    source_ts_max_ms: int | None
    rewrote_data: bool = False  # a compaction: a `replace` that removed data files (not a manifest rewrite)
    added_bytes: int = 0  # of the data and delete files it added (its summary's added-files-size)


@dataclass
class TableMetrics:
    """Everything known about one table's health at ``collected_ms``."""

    table: str  # namespace.table
    collected_ms: int
    partitions: list[PartitionMetrics] = field(default_factory=list)
    data_files: int = 0
    data_bytes: int = 0
    rows: int | None = None  # live rows of the current snapshot; None when equality deletes make it unknown
    small_files: int = 0
    small_file_bytes_threshold: int = 0
    delete_files: int = 0
    # Of delete_files, deletion vectors (Puffin): one per data file, merged at every write, so never rewritten.
    deletion_vectors: int = 0
    snapshots: int = 0
    manifests: int = 0
    metadata_bytes: int = 0
    metadata_files: int = 0  # metadata JSON files: the current one and those on its metadata log
    metadata_delete_after_commit: bool = False  # Iceberg deletes files that fall off the log (table property)
    last_compaction_ms: int | None = None
    oldest_snapshot_ms: int | None = None
    freshness_s: float | None = None
    kafka_lag: int | None = None
    ancestry: list[SnapshotInfo] = field(default_factory=list)
    has_sort_order: bool = False
    error: str | None = None

    @property
    def files_per_partition_max(self) -> int:
        return max((p.data_files for p in self.partitions), default=0)

    @property
    def files_per_partition_p95(self) -> float:
        return percentile([p.data_files for p in self.partitions], 95)

    @property
    def avg_file_bytes(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0

    @property
    def small_file_share(self) -> float:
        return self.small_files / self.data_files if self.data_files else 0.0

    def write_amplification(self, window_s: float = AMPLIFICATION_WINDOW_S) -> dict[str, Any]:
        """Bytes compactions wrote against bytes the writers added, over the snapshots of the last ``window_s``
        still in the table's history (``window_s`` in the answer: the span covered, shorter once expiry has removed
        older snapshots); ``ratio`` None when nothing was added."""
        since = self.collected_ms - window_s * 1000
        recent = [s for s in self.ancestry if s.committed_ms >= since]
        rewritten = sum(s.added_bytes for s in recent if s.rewrote_data)
        ingested = sum(s.added_bytes for s in recent if s.operation != "replace")
        span = (self.collected_ms - min(s.committed_ms for s in recent)) / 1000 if recent else 0.0
        return {
            "rewritten_bytes": rewritten,
            "ingested_bytes": ingested,
            "window_s": round(span, 1),
            "ratio": round(rewritten / ingested, 2) if ingested else None,
        }

    @property
    def seconds_since_compaction(self) -> float | None:
        if self.last_compaction_ms is None:
            return None
        return max(0.0, (self.collected_ms - self.last_compaction_ms) / 1000)

    def newest_offsets_snapshot(self) -> SnapshotInfo | None:
        """The newest ancestor carrying `lakestream.offsets`: the engine resumes from it, so it must survive expiry."""
        return next((s for s in self.ancestry if s.offsets is not None), None)

    def summary(self) -> dict[str, Any]:
        """A flat, JSON-ready view (partitions summarised, ancestry left out)."""
        return {
            "table": self.table,
            "rows": self.rows,
            "data_files": self.data_files,
            "partitions": len(self.partitions),
            "files_per_partition_max": self.files_per_partition_max,
            "files_per_partition_p95": round(self.files_per_partition_p95, 1),
            "avg_file_bytes": round(self.avg_file_bytes),
            "small_file_share": round(self.small_file_share, 4),
            "delete_files": self.delete_files,
            "snapshots": self.snapshots,
            "manifests": self.manifests,
            "metadata_bytes": self.metadata_bytes,
            "metadata_files": self.metadata_files,
            "seconds_since_compaction": _round(self.seconds_since_compaction),
            "write_amplification": self.write_amplification(),
            "freshness_s": _round(self.freshness_s),
            "kafka_lag": self.kafka_lag,
            "error": self.error,
        }

    def to_json(self) -> dict[str, Any]:
        out = self.summary()
        out["partition_detail"] = [
            {
                "partition": p.label(),
                "data_files": p.data_files,
                "data_bytes": p.data_bytes,
                "delete_files": p.delete_files,
                "last_updated_ms": p.last_updated_ms,
            }
            for p in self.partitions
        ]
        return out


def percentile(values: list[int], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return float(ordered[rank - 1])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _render(value: Any) -> str:
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    return "null" if value is None else str(value)


def _to_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        # Spark returns naive datetimes in the session time zone, which lakestream pins to UTC.
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    return int(value)


def list_tables(spark: SparkSession, catalog: str) -> list[str]:
    """All ``namespace.table`` names in ``catalog`` (single-level namespaces)."""
    from lakestream.identifiers import quote

    names: list[str] = []
    for row in spark.sql(f"SHOW NAMESPACES IN {quote(catalog, 'catalog')}").collect():
        namespace = row[0]
        if "." in namespace:
            continue
        for trow in spark.sql(f"SHOW TABLES IN {quote(catalog, 'catalog')}.{quote(namespace, 'namespace')}").collect():
            if not trow["isTemporary"]:
                names.append(f"{namespace}.{trow['tableName']}")
    return sorted(names)


def split_table_name(name: str) -> tuple[str, str]:
    """(namespace, table) of a ``namespace.table`` name (`identifiers.TableName`); ConfigError when malformed."""
    from lakestream.errors import ConfigError, InvalidIdentifierError
    from lakestream.identifiers import TableName

    try:
        parsed = TableName.parse(name)
    except InvalidIdentifierError as exc:
        raise ConfigError(str(exc)) from None
    return parsed.namespace, parsed.table


def load_java_table(spark: SparkSession, catalog: str, name: str):
    """The Iceberg `Table` object (via py4j) for ``namespace.table``; refreshed."""
    from lakestream.runtime.spark import driver_jvm

    namespace, table = split_table_name(name)
    ident = quote_table(catalog, namespace, table).replace("`", "")
    jtable = driver_jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, ident)
    jtable.refresh()
    return jtable


# The snapshot summary values a maintenance plan reads, in `_SnapshotRow`'s order.
_PLAN_SUMMARY_KEYS = (OFFSETS_PROPERTY, SOURCE_TS_PROPERTY, "deleted-data-files", "added-files-size")


class _SnapshotRow(NamedTuple):
    """A row of the snapshots metadata table, as `collect_table_metrics` reads it."""

    snapshot_id: int
    parent_id: int | None
    committed_at: Any  # epoch ms, or Spark's datetime
    operation: str | None
    manifest_list: str | None
    offsets: str | None
    source_ts: str | None
    deleted_data_files: str | None
    added_files_size: str | None


def collect_table_metrics(
    spark: SparkSession,
    catalog: str,
    name: str,
    policy: MaintenancePolicy | None = None,
    kafka: KafkaSettings | None = None,
    now_ms: int | None = None,
    for_plan: bool = False,
) -> TableMetrics:
    """Measure one table. ``policy`` sets the small-file size; ``kafka`` enables lag measurement.

    ``for_plan``: only what a maintenance plan reads (`lakestream.maintenance.policy`) — no table-wide data file
    totals and no metadata byte count (0), whose reading of every snapshot's manifest list took half of the
    time: a round beside ingestion reads these metrics every interval, and they share the batches' JVM. Its counts,
    snapshots and metadata log come from the JVM's loaded metadata (`java/TableStats.java`, at a lower priority):
    no Spark job for a table never partitioned (a partitioned one's partitions table still is one)."""
    from lakestream.config import MaintenancePolicy

    policy = policy or MaintenancePolicy()
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    namespace, table = split_table_name(name)
    qualified = quote_table(catalog, namespace, table)
    metrics = TableMetrics(table=name, collected_ms=now_ms)
    jtable = load_java_table(spark, catalog, name)
    metrics.has_sort_order = bool(jtable.sortOrder().isSorted())
    metrics.rows = live_rows(jtable)
    # for_plan: beside the batches, read in the JVM at a lower priority, no Spark job
    current_files = _loaded_metadata(spark, jtable) if for_plan else None
    metrics.partitions = _partitions(spark, qualified, current_files)
    metrics.delete_files = sum(p.delete_files for p in metrics.partitions)
    if metrics.delete_files > policy.max_delete_files:  # only asked when the rewrite would be planned
        metrics.deletion_vectors = _deletion_vectors(spark, qualified, current_files)
    compaction = policy.compaction
    metrics.small_file_bytes_threshold = int(compaction.target_file_size_bytes * compaction.min_avg_file_size_ratio)
    if not for_plan:
        _count_data_files(spark, qualified, metrics)
    snapshot_rows = _snapshot_rows(spark, qualified, current_files)
    _read_history(metrics, jtable, snapshot_rows, now_ms)
    _count_metadata(spark, qualified, jtable, current_files, snapshot_rows, metrics)
    if kafka is not None:
        offsets_snapshot = metrics.newest_offsets_snapshot()
        if offsets_snapshot is not None and offsets_snapshot.offsets:
            metrics.kafka_lag = kafka_lag(kafka, offsets_snapshot.offsets)
    return metrics


def _loaded_metadata(spark: SparkSession, jtable: Any) -> dict[str, Any]:
    """The table's current files, snapshots and metadata log as the JVM has them loaded (`java/TableStats.java`,
    at a lower priority): the counts a maintenance plan reads, without a Spark job."""
    from lakestream.runtime.spark import driver_jvm

    loaded: dict[str, Any] = json.loads(
        driver_jvm(spark).lakestream.TableStats.currentFiles(jtable, BACKGROUND_NICE, ",".join(_PLAN_SUMMARY_KEYS))
    )
    return loaded


def _partitions(spark: SparkSession, qualified: str, current_files: dict[str, Any] | None) -> list[PartitionMetrics]:
    """Each partition's files; from the loaded metadata for a table never partitioned, else a Spark job."""
    if current_files is None or "partition" not in current_files:
        return collect_partitions(spark, qualified)
    one = current_files["partition"]
    if one is None:
        return []
    return [
        PartitionMetrics(
            partition={},
            spec_id=int(one["spec_id"]),
            data_files=int(one["data_files"]),
            data_bytes=int(one["data_bytes"]),
            delete_files=int(one["delete_files"]),
            last_updated_ms=one["last_updated_ms"],
            records=int(one.get("records", 0)),
            deleted_records=int(one.get("deleted_records", 0)),
        )
    ]


def _deletion_vectors(spark: SparkSession, qualified: str, current_files: dict[str, Any] | None) -> int:
    """How many of the table's delete files are deletion vectors (Puffin)."""
    if current_files:
        return int(current_files["deletion_vectors"])
    return int(spark.sql(f"SELECT count_if(file_format = 'PUFFIN') FROM {qualified}.delete_files").collect()[0][0])


def _count_data_files(spark: SparkSession, qualified: str, metrics: TableMetrics) -> None:
    """The table-wide data file totals: files, bytes, and files under the small-file threshold."""
    row = spark.sql(
        f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS bytes, "
        f"count_if(file_size_in_bytes < {metrics.small_file_bytes_threshold}) AS small FROM {qualified}.data_files"
    ).collect()[0]
    metrics.data_files, metrics.data_bytes, metrics.small_files = int(row.n), int(row.bytes), int(row.small)


def _snapshot_rows(
    spark: SparkSession, qualified: str, current_files: dict[str, Any] | None
) -> list[_SnapshotRow] | list[Row]:
    """Every snapshot of the table with the summary values `_read_history` reads: from the loaded metadata, as the
    snapshots table would give them, or from the snapshots table."""
    if current_files is not None:
        return [
            _SnapshotRow(
                s["snapshot_id"],
                s["parent_id"],
                s["committed_ms"],
                s["operation"],
                None,
                *(s["summary"].get(k) for k in _PLAN_SUMMARY_KEYS),
            )
            for s in current_files["snapshots"]
        ]
    return spark.sql(
        f"SELECT s.snapshot_id, s.parent_id, s.committed_at, s.operation, s.manifest_list, "
        f"s.summary[{sql_string(OFFSETS_PROPERTY)}] AS offsets, "
        f"s.summary[{sql_string(SOURCE_TS_PROPERTY)}] AS source_ts, "
        f"s.summary['deleted-data-files'] AS deleted_data_files, s.summary['added-files-size'] AS added_files_size "
        f"FROM {qualified}.snapshots s"
    ).collect()


def _read_history(
    metrics: TableMetrics, jtable: Any, snapshot_rows: list[_SnapshotRow] | list[Row], now_ms: int
) -> None:
    """The snapshot count, the current snapshot's ancestry, and what it tells: the oldest snapshot, the last
    compaction, the freshness of the newest source change."""
    metrics.snapshots = len(snapshot_rows)
    by_id = {int(r.snapshot_id): r for r in snapshot_rows}
    current = jtable.currentSnapshot()
    chain = ancestry(
        int(current.snapshotId()) if current is not None else None,
        {sid: (int(r.parent_id) if r.parent_id is not None else None) for sid, r in by_id.items()},
    )
    metrics.ancestry = [
        SnapshotInfo(
            snapshot_id=int(r.snapshot_id),
            committed_ms=_to_ms(r.committed_at) or 0,
            operation=r.operation,
            offsets=None if r.offsets is None else decode_offsets(r.offsets, strict=False),
            source_ts_max_ms=int(r.source_ts) if r.source_ts and r.source_ts.lstrip("-").isdigit() else None,
            rewrote_data=r.operation == "replace" and int(r.deleted_data_files or 0) > 0,
            added_bytes=int(r.added_files_size) if r.added_files_size and r.added_files_size.isdigit() else 0,
        )
        for r in (by_id[sid] for sid in chain)
    ]
    if snapshot_rows:
        metrics.oldest_snapshot_ms = min(_to_ms(r.committed_at) or 0 for r in snapshot_rows)
    replaces = [s.committed_ms for s in metrics.ancestry if s.rewrote_data]
    metrics.last_compaction_ms = max(replaces) if replaces else None
    source_ts = [s.source_ts_max_ms for s in metrics.ancestry if s.source_ts_max_ms is not None]
    if source_ts:
        metrics.freshness_s = max(0.0, (now_ms - max(source_ts)) / 1000)


def _count_metadata(
    spark: SparkSession,
    qualified: str,
    jtable: Any,
    current_files: dict[str, Any] | None,
    snapshot_rows: list[_SnapshotRow] | list[Row],
    metrics: TableMetrics,
) -> None:
    """The manifests, the metadata files (and, outside a plan, their bytes), and whether old metadata files are
    deleted after a commit."""
    metrics.manifests = (
        int(current_files["manifests"])
        if current_files
        else int(spark.sql(f"SELECT count(*) FROM {qualified}.manifests").collect()[0][0])
    )
    if current_files is not None:  # for_plan
        metrics.metadata_files = len(set(current_files["metadata_files"]))
    else:
        metrics.metadata_bytes, metrics.metadata_files = _metadata_size(
            spark, qualified, jtable, [r.manifest_list for r in snapshot_rows]
        )
    metrics.metadata_delete_after_commit = str(jtable.properties().get(METADATA_DELETE_AFTER_COMMIT)).lower() == "true"


def live_rows(jtable) -> int | None:
    """Live rows of the current snapshot from its summary (no scan): data records minus deleted
    positions. Deletion vectors and position deletes name deleted rows one by one; an equality delete
    may match any number of rows, so with one the count is unknown (None)."""
    snapshot = jtable.currentSnapshot()
    if snapshot is None:
        return 0
    summary = snapshot.summary()

    def total(key: str) -> int:
        value = summary.get(key)
        return int(value) if value is not None else 0

    if total("total-equality-deletes") > 0 or summary.get("total-records") is None:
        return None
    return total("total-records") - total("total-position-deletes")


def collect_partitions(spark: SparkSession, qualified: str) -> list[PartitionMetrics]:
    """Every partition of the quoted table ``qualified``, from its `partitions` metadata table."""
    frame = spark.sql(f"SELECT * FROM {qualified}.partitions")
    columns = set(frame.columns)
    result = []
    for row in frame.collect():
        partition = row["partition"].asDict() if "partition" in columns and row["partition"] is not None else {}
        deletes = int(row["position_delete_file_count"] or 0) + int(row["equality_delete_file_count"] or 0)
        result.append(
            PartitionMetrics(
                partition=partition,
                spec_id=int(row["spec_id"]) if "spec_id" in columns else 0,
                data_files=int(row["file_count"]),
                data_bytes=int(row["total_data_file_size_in_bytes"] or 0),
                delete_files=deletes,
                last_updated_ms=_to_ms(row["last_updated_at"]),
                records=int(row["record_count"] or 0),
                deleted_records=int(row["position_delete_record_count"] or 0)
                if "position_delete_record_count" in columns
                else 0,
            )
        )
    return result


def _metadata_files(spark: SparkSession, qualified: str, jtable) -> set[str]:
    """The metadata JSON files: those on the current one's log, and itself."""
    files = {r[0] for r in spark.sql(f"SELECT file FROM {qualified}.metadata_log_entries").collect()}
    files.add(jtable.operations().current().metadataFileLocation())
    return files


def _metadata_size(spark: SparkSession, qualified: str, jtable, manifest_lists: list[str | None]) -> tuple[int, int]:
    """(bytes, metadata JSON files) of table metadata: metadata JSON files (current + logged), all
    manifests, all manifest lists."""
    total = int(
        spark.sql(
            f"SELECT coalesce(sum(length), 0) FROM (SELECT DISTINCT path, length FROM {qualified}.all_manifests)"
        ).collect()[0][0]
    )
    metadata_files = _metadata_files(spark, qualified, jtable)
    io = jtable.io()
    for path in metadata_files | {p for p in manifest_lists if p}:
        total += file_length(io, path)
    return total, len(metadata_files)


def file_length(io, path: str) -> int:
    """Size of a table file: a stat on the local FS for file:// paths, else the table's FileIO; 0 when gone."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        try:
            return os.stat(parsed.path).st_size
        except OSError:
            return 0
    try:
        return int(io.newInputFile(path).getLength())
    except Exception:  # noqa: BLE001 — a file already deleted by expiry, or an unreachable store: count nothing
        return 0


@dataclass
class TableFiles:
    """Snapshots and live files of one table: the short view the demo prints."""

    table: str
    snapshots: int
    data_files: int
    delete_files: int
    data_bytes: int


def count_table_files(spark: SparkSession, catalog: str, name: str) -> TableFiles:
    """Snapshots and live data/delete files of ``namespace.table``, from its metadata tables."""
    namespace, table = split_table_name(name)
    base = quote_table(catalog, namespace, table)
    snapshots = spark.sql(f"SELECT count(*) FROM {base}.snapshots").collect()[0][0]
    files = spark.sql(
        f"""SELECT coalesce(sum(CASE WHEN content = 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content <> 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content = 0 THEN file_size_in_bytes ELSE 0 END), 0)
            FROM {base}.files"""
    ).collect()[0]
    return TableFiles(name, int(snapshots), int(files[0]), int(files[1]), int(files[2]))


def format_bytes(value: float | None) -> str:
    """``1.5 MB``-style size for people (binary units); ``?`` when unknown."""
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)
