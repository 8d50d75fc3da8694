"""Runs Iceberg's maintenance procedures (CALL <catalog>.system.*) and reports what each one did.

Every action returns a `MaintenanceResult` (files before → after, bytes, seconds) and logs it. A
commit that loses a race with ingestion is not an error: it is logged as a conflict and the work is
simply tried again on the next round.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from lakestream.beside import BACKGROUND_NICE
from lakestream.config import MaintenancePolicy
from lakestream.errors import conflict_cause, first_line
from lakestream.identifiers import quote, quote_column, quote_table, sql_string
from lakestream.read.inspection import (
    METADATA_DELETE_AFTER_COMMIT,
    METADATA_PREVIOUS_VERSIONS_MAX,
    PartitionMetrics,
    collect_partitions,
    file_length,
    format_bytes,
    split_table_name,
)
from lakestream.sink.index.store import own_location
from lakestream.storage import lists_through_file_io

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Partitions per rewrite_data_files call: keeps the WHERE clause and each commit small.
PARTITIONS_PER_CALL = 50

# Expiry and orphan scans in the JVM read on one thread of their own, working half of the time, at nice 10
# (`ThreadPriority`): beside the batches they never take more than a quarter of a 2-core machine, and under
# contention far less — the batches' commits come first.
BESIDE_THE_BATCHES = {"threads": 1, "duty": 0.5, "nice": BACKGROUND_NICE}


def _line_history(spark: SparkSession, method: str, catalog: str, name: str, request: dict) -> dict | None:
    """``LineHistory.<method>`` on table ``name`` beside the batches: its answer (timings in seconds), or None
    when the table's history is not one line (the caller falls back to Iceberg's procedure)."""
    from lakestream.runtime.spark import driver_jvm

    namespace, table = split_table_name(name)
    answer = json.loads(
        getattr(driver_jvm(spark).lakestream.LineHistory, method)(
            spark._jsparkSession, catalog, namespace, table, json.dumps({**request, **BESIDE_THE_BATCHES})
        )
    )
    if "fallback" in answer:
        log.info("%s: %s with Iceberg's procedure: %s", name, method, answer["fallback"])
        return None
    answer["timings_s"] = {step: round(ms / 1000, 3) for step, ms in answer.pop("timings_ms", {}).items()}
    return answer


@dataclass
class MaintenanceResult:
    """What one action did to one table."""

    table: str
    action: str  # compact | rewrite_deletes | rewrite_manifests | expire_snapshots | trim_metadata | remove_orphans
    status: str  # ok | partial | conflict | failed | planned | dry-run
    files_before: int | None = None
    files_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def describe(self) -> str:
        parts = [f"{self.action} {self.table}: {self.status}"]
        if self.files_before is not None or self.files_after is not None:
            parts.append(f"files {_n(self.files_before)} → {_n(self.files_after)}")
        if self.bytes_before is not None or self.bytes_after is not None:
            parts.append(f"bytes {format_bytes(self.bytes_before)} → {format_bytes(self.bytes_after)}")
        parts.append(f"{self.seconds:.1f}s")
        if self.error:
            parts.append(self.error)
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether a maintenance commit lost a race with another writer (classified by `errors.conflict_cause`)."""
    return conflict_cause(exc) is not None


def _procedure(catalog: str, name: str) -> str:
    return f"{quote(catalog, 'catalog')}.system.{name}"


def _table_arg(name: str) -> str:
    """A procedure's ``table`` argument: the quoted ``namespace.table`` as a string literal."""
    namespace, table = split_table_name(name)
    return sql_string(f"{quote(namespace, 'namespace')}.{quote(table, 'table')}")


def _timestamp(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return "TIMESTAMP " + sql_string(moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}")


def _options(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in options.items()) + ")"


def _run(result: MaintenanceResult, started: float, call, log_result: bool = True) -> MaintenanceResult:
    """Run ``call`` (which fills ``result``), turning failures into a status instead of an exception."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 — py4j wraps every JVM failure; classify rather than crash the round
        result.error = first_line(exc, 400)
        if is_commit_conflict(exc):
            result.status = "conflict"
            log.warning("%s %s lost a commit race; retrying next round: %s", result.action, result.table, result.error)
        else:
            result.status = "failed"
            log.error("%s %s failed: %s", result.action, result.table, result.error)
    result.seconds = time.monotonic() - started
    if log_result:
        log.info("%s", result.describe())
    return result


# --- compaction ---------------------------------------------------------------------------------


def _column_ref(name: str) -> str:
    return ".".join(quote_column(part) for part in name.split("."))


def _literal(value: Any, type_name: str) -> str | None:
    """A Spark SQL literal for a partition value of Iceberg type ``type_name``; None if unsupported."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) + "D"
    if isinstance(value, Decimal):
        return f"{value}BD"
    if isinstance(value, str):
        return sql_string(value)
    if isinstance(value, datetime):
        kind = "TIMESTAMP_NTZ" if type_name == "timestamp" else "TIMESTAMP"
        return f"{kind} {sql_string(value.isoformat(sep=' '))}"
    if isinstance(value, date):
        return f"DATE {sql_string(value.isoformat())}"
    return None


_TIME_FUNCTIONS = {"year": "years", "month": "months", "day": "days", "hour": "hours"}


def partition_predicate(catalog: str, jtable, partition: PartitionMetrics) -> str | None:
    """A WHERE clause over source columns selecting exactly ``partition``'s rows; None if not expressible.

    Transformed fields use Iceberg's own system functions (bucket, days, ...) so the predicate maps onto
    the partition exactly. ``truncate`` on strings is rewritten as equality / starts-with because the
    system function silently matched nothing in rewrite_data_files (Iceberg 1.10).
    """
    spec = jtable.specs().get(partition.spec_id)
    if spec is None:
        return None
    schema = jtable.schema()
    clauses: list[str] = []
    for jfield in spec.fields():
        transform = jfield.transform().toString()
        if transform == "void":
            continue
        source = schema.findColumnName(jfield.sourceId())
        type_name = schema.findType(jfield.sourceId()).toString()
        if source is None:
            return None
        column = _column_ref(source)
        value = partition.partition.get(jfield.name())
        if value is None:
            clauses.append(f"{column} IS NULL")
            continue
        if transform == "identity":
            literal = _literal(value, type_name)
            if literal is None:
                return None
            clauses.append(f"{column} = {literal}")
        elif transform in _TIME_FUNCTIONS:
            literal = _literal(value, "date" if transform == "day" else "int")
            if literal is None:
                return None
            clauses.append(f"{_procedure(catalog, _TIME_FUNCTIONS[transform])}({column}) = {literal}")
        elif transform.startswith("bucket["):
            width = int(transform[len("bucket[") : -1])
            clauses.append(f"{_procedure(catalog, 'bucket')}({width}, {column}) = {int(value)}")
        elif transform.startswith("truncate["):
            width = int(transform[len("truncate[") : -1])
            if isinstance(value, str):
                # A value shorter than the width is a whole string; one of full width is a prefix.
                if len(value) < width:
                    clauses.append(f"{column} = {sql_string(value)}")
                else:
                    clauses.append(f"startswith({column}, {sql_string(value)})")
            elif isinstance(value, int):
                clauses.append(f"{column} >= {value} AND {column} < {value + width}")
            else:
                return None
        else:
            return None
    return " AND ".join(f"({c})" for c in clauses) if clauses else "true"


def _partition_totals(spark: SparkSession, catalog: str, name: str, keys: set[tuple]) -> tuple[int, int]:
    namespace, table = split_table_name(name)
    files = size = 0
    for partition in collect_partitions(spark, quote_table(catalog, namespace, table)):
        if partition.key in keys:
            files += partition.data_files
            size += partition.data_bytes
    return files, size


def compact_cold_partitions(
    spark: SparkSession,
    catalog: str,
    name: str,
    jtable,
    partitions: list[PartitionMetrics],
    policy: MaintenancePolicy,
    sort: bool = False,
    dry_run: bool = False,
) -> MaintenanceResult:
    """rewrite_data_files (binpack, or sort when the table has a sort order) over the given cold partitions only."""
    started = time.monotonic()
    result = MaintenanceResult(
        table=name,
        action="compact",
        status="planned" if dry_run else "ok",
        files_before=sum(p.data_files for p in partitions),
        bytes_before=sum(p.data_bytes for p in partitions),
        detail={"partitions": [p.label() for p in partitions], "strategy": "sort" if sort else "binpack"},
    )
    predicates: list[str] = []
    for partition in partitions:
        predicate = partition_predicate(catalog, jtable, partition)
        if predicate is None:
            log.warning("%s: cannot express partition %s as a filter; not compacting it", name, partition.label())
            continue
        predicates.append(predicate)
    if dry_run or not predicates:
        result.seconds = time.monotonic() - started
        log.info("%s", result.describe())
        return result

    options = {
        "min-input-files": "2",
        "target-file-size-bytes": str(policy.compaction.target_file_size_bytes),
        # Commit file groups as they finish: a conflict with ingestion then costs one group, not the run.
        "partial-progress.enabled": "true",
        "partial-progress.max-commits": "10",
        # Each finished group is committed from its own rewrite thread, so concurrent groups race each
        # other for the table's metadata (retried, but noisy); two match a two-core executor anyway.
        "max-concurrent-file-group-rewrites": "2",
    }
    counts = {"rewritten_data_files": 0, "added_data_files": 0, "rewritten_bytes": 0, "failed_data_files": 0}

    def call() -> None:
        for start in range(0, len(predicates), PARTITIONS_PER_CALL):
            where = " OR ".join(f"({p})" for p in predicates[start : start + PARTITIONS_PER_CALL])
            row = spark.sql(
                f"CALL {_procedure(catalog, 'rewrite_data_files')}(table => {_table_arg(name)}, "
                f"strategy => {sql_string('sort' if sort else 'binpack')}, where => {sql_string(where)}, "
                f"options => {_options(options)})"
            ).collect()[0]
            counts["rewritten_data_files"] += int(row["rewritten_data_files_count"])
            counts["added_data_files"] += int(row["added_data_files_count"])
            counts["rewritten_bytes"] += int(row["rewritten_bytes_count"])
            counts["failed_data_files"] += int(row["failed_data_files_count"])
        if counts["failed_data_files"]:
            result.status = "partial"

    _run(result, started, call, log_result=False)
    result.detail.update(counts)
    try:
        result.files_after, result.bytes_after = _partition_totals(spark, catalog, name, {p.key for p in partitions})
    except Exception as exc:  # noqa: BLE001 — measuring after is best effort; the rewrite itself is done
        log.debug("could not measure %s after compaction: %s", name, exc)
    result.seconds = time.monotonic() - started
    log.info("%s", result.describe())
    return result


# --- deletes, manifests ---------------------------------------------------------------------------


def rewrite_position_deletes(
    spark: SparkSession, catalog: str, name: str, delete_files: int, dry_run: bool = False
) -> MaintenanceResult:
    """rewrite_position_delete_files: merges small position-delete files and drops dangling ones."""
    started = time.monotonic()
    result = MaintenanceResult(
        table=name, action="rewrite_deletes", status="planned" if dry_run else "ok", files_before=delete_files
    )
    if dry_run:
        return result

    def call() -> None:
        row = spark.sql(
            f"CALL {_procedure(catalog, 'rewrite_position_delete_files')}(table => {_table_arg(name)}, "
            f"options => {_options({'min-input-files': '2', 'partial-progress.enabled': 'true'})})"
        ).collect()[0]
        result.files_after = (
            delete_files - int(row["rewritten_delete_files_count"]) + int(row["added_delete_files_count"])
        )
        result.bytes_before = int(row["rewritten_bytes_count"])
        result.bytes_after = int(row["added_bytes_count"])

    return _run(result, started, call)


def rewrite_manifests(
    spark: SparkSession, catalog: str, name: str, manifests: int, dry_run: bool = False
) -> MaintenanceResult:
    """rewrite_manifests: regroups many small manifests so planning reads fewer files."""
    started = time.monotonic()
    result = MaintenanceResult(
        table=name, action="rewrite_manifests", status="planned" if dry_run else "ok", files_before=manifests
    )
    if dry_run:
        return result

    def call() -> None:
        row = spark.sql(f"CALL {_procedure(catalog, 'rewrite_manifests')}(table => {_table_arg(name)})").collect()[0]
        result.files_after = manifests - int(row["rewritten_manifests_count"]) + int(row["added_manifests_count"])

    return _run(result, started, call)


# --- snapshots, orphans ---------------------------------------------------------------------------


def expire_snapshots(
    spark: SparkSession,
    catalog: str,
    name: str,
    older_than_ms: int,
    retain_last: int,
    snapshots: int,
    protected_snapshot_id: int | None = None,
    dry_run: bool = False,
) -> MaintenanceResult:
    """Expire the snapshots older than ``older_than_ms`` beyond the newest ``retain_last``, never the offsets one.

    A table whose history is one line (a pipeline's tables) is expired by ``LineHistory`` in the JVM: it
    reads only the manifests that can hold a file to delete and the oldest kept snapshot's, where Iceberg's
    procedure reads every manifest of every snapshot (35-78 s of Spark jobs beside the batches on a 100M-row
    mirror). Branches, tags or snapshots off the line fall back to the procedure.
    """
    started = time.monotonic()
    result = MaintenanceResult(
        table=name,
        action="expire_snapshots",
        status="planned" if dry_run else "ok",
        files_before=snapshots,
        detail={
            "older_than_ms": older_than_ms,
            "retain_last": retain_last,
            "protected_snapshot_id": protected_snapshot_id,
        },
    )
    if dry_run:
        return result
    namespace, table = split_table_name(name)
    qualified = quote_table(catalog, namespace, table)

    def in_the_jvm() -> bool:
        answer = _line_history(
            spark,
            "expire",
            catalog,
            name,
            {
                "older_than_ms": int(older_than_ms),
                "retain_last": int(retain_last),
                "protected_snapshot_id": protected_snapshot_id,
            },
        )
        if answer is None:
            return False
        if "error" in answer:
            result.status, result.error = "failed", answer["error"]
            log.error("%s: %s", name, result.error)
        result.detail.update(answer, method="line")
        result.files_after = snapshots - int(answer.get("expired_snapshots", 0))
        return True

    def with_the_procedure() -> None:
        row = spark.sql(
            f"CALL {_procedure(catalog, 'expire_snapshots')}(table => {_table_arg(name)}, "
            f"older_than => {_timestamp(older_than_ms)}, retain_last => {int(retain_last)})"
        ).collect()[0]
        for key, value in row.asDict().items():
            result.detail[key.removesuffix("_count")] = int(value or 0)
        result.detail["method"] = "procedure"
        result.files_after = int(spark.sql(f"SELECT count(*) FROM {qualified}.snapshots").collect()[0][0])
        if protected_snapshot_id is not None:
            kept = spark.sql(
                f"SELECT count(*) FROM {qualified}.snapshots WHERE snapshot_id = {int(protected_snapshot_id)}"
            ).collect()[0][0]
            if not kept:
                # Should be impossible given older_than; shout, the engine would lose its resume point.
                result.status = "failed"
                result.error = f"offsets snapshot {protected_snapshot_id} was expired"
                log.error("%s: %s", name, result.error)

    def call() -> None:
        if not in_the_jvm():
            with_the_procedure()

    return _run(result, started, call)


def trim_metadata_log(
    spark: SparkSession, catalog: str, name: str, jtable, keep: int, dry_run: bool = False
) -> MaintenanceResult:
    """Delete the earlier metadata JSON files a round has made obsolete, and bound the log from then on.

    Iceberg deletes an earlier metadata file only at a commit that pushes it off the metadata log, and
    only with delete-after-commit on. The files written before snapshot expiry would otherwise stay
    for ``keep`` more commits. Two property commits flush them: previous-versions-max=1 deletes all but
    the newest, then the table's own bound (or ``keep``) comes back, with delete-after-commit left on.
    """
    started = time.monotonic()
    result = MaintenanceResult(table=name, action="trim_metadata", status="planned" if dry_run else "ok")

    def measure() -> tuple[int, int]:
        jtable.refresh()
        current = jtable.operations().current()
        paths = [entry.file() for entry in current.previousFiles()] + [current.metadataFileLocation()]
        return len(paths), sum(file_length(jtable.io(), p) for p in paths)

    def call() -> None:
        result.files_before, result.bytes_before = measure()
        if dry_run:
            return
        own = jtable.properties().get(METADATA_PREVIOUS_VERSIONS_MAX)
        bound = str(own) if own is not None and str(own).isdigit() and int(str(own)) > 1 else str(int(keep))
        jtable.updateProperties().set(METADATA_DELETE_AFTER_COMMIT, "true").set(
            METADATA_PREVIOUS_VERSIONS_MAX, "1"
        ).commit()
        jtable.refresh()
        jtable.updateProperties().set(METADATA_PREVIOUS_VERSIONS_MAX, bound).commit()
        result.detail["previous_versions_max"] = int(bound)
        result.files_after, result.bytes_after = measure()

    return _run(result, started, call)


def remove_orphan_files(
    spark: SparkSession, catalog: str, name: str, jtable, older_than_ms: int, dry_run: bool = False
) -> MaintenanceResult:
    """Files under the table location that no snapshot references, older than ``older_than_ms``: deleted
    unless ``dry_run``. Never the pipeline's key index (``<location>/_lakestream/``): no snapshot names it.

    A table whose history is one line is scanned by ``LineHistory`` in the JVM (the oldest snapshot's manifests
    and those with added files, on one paced thread); others by Iceberg's procedure, listing only, with the
    deletes done here so that ``_lakestream/`` is left out.
    """
    started = time.monotonic()
    result = MaintenanceResult(
        table=name,
        action="remove_orphans",
        status="dry-run" if dry_run else "ok",
        detail={"older_than_ms": older_than_ms},
    )
    own = own_location(jtable.location())

    def in_the_jvm() -> list[str] | None:
        answer = _line_history(
            spark,
            "removeOrphans",
            catalog,
            name,
            {"older_than_ms": int(older_than_ms), "dry_run": bool(dry_run), "keep_under": own},
        )
        if answer is None:
            return None
        result.detail.update(
            method="line",
            listed=answer["listed"],
            referenced=answer["referenced"],
            timings_s=answer["timings_s"],
            **({"delete_nice": answer["delete_nice"]} if "delete_nice" in answer else {}),
        )
        result.files_before = int(answer["orphan_count"])
        return list(answer["orphans"])

    def with_the_procedure() -> list[str]:
        # Object stores have no Hadoop FileSystem here (no s3a): list through the table's FileIO instead.
        prefix = ", prefix_listing => true" if lists_through_file_io(jtable.location()) else ""
        rows = spark.sql(
            f"CALL {_procedure(catalog, 'remove_orphan_files')}(table => {_table_arg(name)}, "
            f"older_than => {_timestamp(older_than_ms)}, dry_run => true{prefix})"
        ).collect()
        own_path = urlparse(own).path.rstrip("/") + "/"
        paths = [p for p in (r["orphan_file_location"] for r in rows) if not urlparse(p).path.startswith(own_path)]
        if not dry_run:
            io = jtable.io()
            for path in paths:
                io.deleteFile(path)
        result.detail["method"] = "procedure"
        result.files_before = len(paths)
        return paths

    def call() -> None:
        paths = in_the_jvm()
        if paths is None:
            paths = with_the_procedure()
        result.files_after = result.files_before if dry_run else 0
        if dry_run:
            result.bytes_before = sum(file_length(jtable.io(), p) for p in paths)
        result.detail["orphans"] = paths[:100]

    return _run(result, started, call)
