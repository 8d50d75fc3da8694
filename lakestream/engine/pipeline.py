"""The micro-batch engine: plan offset ranges → read and write them in one Spark job → commit each
table's files with its offsets in one snapshot → advance the consumer group.

One `Pipeline.run_batch()` call is one micro-batch; `lakestream.engine.loop` repeats it. The write
tasks do the data work (`lakestream.sink.task`); the driver only prepares tables and commits
(`lakestream.sink.committer`).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig, StreamSettings
from lakestream.engine.cadence import Cadence
from lakestream.engine.freshness import mixture_quantiles
from lakestream.errors import ConfigError, DecodeError, LakestreamError, is_infrastructure_failure
from lakestream.identifiers import validate_identifier
from lakestream.process.alerts import AlertStage
from lakestream.process.materialize import MaterializeStage
from lakestream.process.reference import ReferenceCache, ReferenceData
from lakestream.process.transform import Derived, empty_input, output_columns, reference_views, run_transform
from lakestream.process.windows import WindowStage
from lakestream.faults import pause_point
from lakestream.sink.offsets import (
    BATCH_PROPERTY, OFFSETS_PROPERTY, PIPELINE_PROPERTY, SOURCE_TS_PROPERTY, TableOffsets, encode_offsets,
)
from lakestream.sink.committer import StaleIndex, TableCommit, TableWrite, write_table
from lakestream.sink.deadletter import dead_letter_table, ensure_dead_letter_table
from lakestream.sink.index import KeyIndex, is_integer_key
from lakestream.sink.multiset import KeylessIndex
from lakestream.sink.report import BatchReport, DeadLetter, NewShape, RangeEnd, TableReport
from lakestream.sink.router import Router, TableName, topic_parts
from lakestream.sink.schema import (
    DEFAULT_TABLE_PROPERTIES, Shape, TableManager, dropped_column_statements, merged_columns, reconcile, unusable_shape,
    widen_to_string_statements,
)
from lakestream.sink.task import TableSpec, WriteContext, replay_from, run_write_task, topic_table
from lakestream.source.kafka import TP, KafkaCluster, consumer_lag
from lakestream.source.planner import OffsetRange, pack_ranges, plan_offset_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


log = logging.getLogger(__name__)

# Java exception classes that mean "the table moved under us" (maintenance, another writer): the
# write is re-planned against the table's new state.
_RETRYABLE = ("CommitFailedException", "ValidationException", "CommitStateUnknownException", "NotFoundException",
              "FileNotFoundException")
# The cause of a commit conflict as a bounded metrics label: "stale_index" or one of these.
_CONFLICT_CAUSES = {"CommitFailedException": "commit_failed", "ValidationException": "validation",
                    "CommitStateUnknownException": "state_unknown", "NotFoundException": "not_found",
                    "FileNotFoundException": "not_found"}


@dataclass
class BatchResult:
    batch_id: int
    records: int
    changes: int
    tables: dict[str, str]  # table → write kind
    dead_letters: int
    seconds: float
    read_seconds: float
    lag: int | None
    commit_ts_ms: int
    source_ts_quantiles: list[float] | None = None
    advanced: int = 0  # Kafka messages consumed, tombstones and skipped records included
    jobs: int = 1
    isolated: int = 0  # records dead-lettered because a write job failed with them alone
    table_records: dict[str, int] = field(default_factory=dict)  # Kafka records routed to each table
    table_changes: dict[str, int] = field(default_factory=dict)  # row changes each table's commit applied
    table_source_ts_ms: dict[str, int] = field(default_factory=dict)  # newest source change committed per table
    table_lag: dict[str, int] = field(default_factory=dict)  # records in Kafka beyond each table's offsets
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)  # DEAD_LETTER_KINDS → dead letters written
    commit_conflicts: list[tuple[str, str]] = field(default_factory=list)  # (table, cause) per conflict met
    commit_retries: dict[str, int] = field(default_factory=dict)  # table → commit attempts repeated
    skipped: dict[str, int] = field(default_factory=dict)  # reason → records skipped on purpose (no row change)
    truncated: list[str] = field(default_factory=list)  # tables a source TRUNCATE emptied in this batch
    overlapped: bool = False  # this batch's write job ran while the previous batch committed
    held: dict[str, int] = field(default_factory=dict)  # table → records written but held for its own cadence

    def progress_line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        return (f"batch {self.batch_id}: {self.records:,} records → {len(self.tables)} table(s), "
                f"{self.dead_letters:,} dead-letter{f' ({self.isolated} isolated)' if self.isolated else ''}, "
                f"{self.seconds:.2f}s (read+write {self.read_seconds:.2f}s, "
                f"{self.jobs} job(s){', overlapped' if self.overlapped else ''}), {rate:,.0f} rec/s, lag {lag}"
                + (f", truncated {', '.join(self.truncated)}" if self.truncated else "")
                + (f", skipped {sum(self.skipped.values()):,}" if self.skipped else "")
                + (f", held {sum(self.held.values()):,} for later commits" if self.held else ""))


class Pipeline:
    """A running pipeline: owns the positions, the tables' specs and indexes, the Kafka client."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None, last_batch_id: int = 0):
        from lakestream.spark import session_for

        self.config = config
        self.spark = spark or session_for(config)
        self.kafka = KafkaCluster(config.kafka)
        self.router = Router.from_config(config)
        registry = config.kafka.schema_registry
        # Resolved here (secrets from the environment): a missing variable fails the start, not a task.
        self.schema_registry = registry.client_config() if registry is not None else None
        self.tables = TableManager(self.spark, config.catalog.name)
        self.offsets = TableOffsets(self.spark)
        self.positions: dict[TP, int] = {}
        self.maybe_more: set[TP] = set()
        self.watermarks: dict[TP, tuple[int, int]] = {}
        # Batch ids continue from what the tables hold (and from the previous Pipeline after a failed
        # batch), so the snapshot property and the metrics log never repeat a number. Read at the first
        # batch, not here: a catalog that is down then fails that batch, which the loop retries.
        self.batch_id = last_batch_id
        self._batch_id_recovered = False
        self.specs: dict[str, TableSpec] = {}
        self.derived: dict[str, list[Derived]] = {}  # input table → its transforms (lakestream.process)
        self._derived_inputs: dict[str, tuple[str, StreamSettings]] = {}  # input table → (a topic, its stream)
        self.references = ReferenceCache(self.spark, config.catalog.name)
        self._reference_data: dict[str, ReferenceData] = {}  # reference key → this batch's data
        self.indexes: dict[str, KeyIndex] = {}
        self._last_discovery = 0.0
        self._last_read: dict[int, float] = {}  # stream index → when its topics were last read
        self.clock = time.monotonic  # when streams come due (replaceable in tests)
        self._dead_letter: TableSpec | None = None
        self.record_hook: Any = None  # passed to the write tasks (WriteContext.record_hook)
        self.isolations = 0  # records isolated since this Pipeline started
        self._culprits: set[tuple[TP, int]] = set()  # isolated in the batch in flight
        # Commit conflicts of the batch in flight, (table, cause), and the tables of the attempts they
        # made repeat; appended from the commit threads (list.append is atomic).
        self._conflicts: list[tuple[str, str]] = []
        self._retries: list[str] = []
        # The next batch's write job, started while this batch commits: (ranges, watermarks, its job).
        self._prefetch: tuple[list[OffsetRange], dict[TP, tuple[int, int]], Future[BatchReport]] | None = None
        self._prefetch_pool: ThreadPoolExecutor | None = None
        self.alerts: AlertStage | None = None
        if config.rules:
            self.alerts = AlertStage(self)
        self.windows: WindowStage | None = None
        if config.windows:
            self.windows = WindowStage(self)
        self.materialize: MaterializeStage | None = None
        if config.derived_tables:
            self.materialize = MaterializeStage(self)
        self.cadence = Cadence()  # output tables that commit less often than their stream is read
        self._in_batch = False  # a batch started and did not finish (then close() commits nothing held)

    def close(self) -> None:
        self._discard_prefetch()
        if self._prefetch_pool is not None:
            self._prefetch_pool.shutdown(wait=True)
        if self.cadence.held and not self._in_batch:
            try:
                self.commit_held(force=True)
            except Exception as exc:  # noqa: BLE001 — nothing is lost: a restart reads them again
                log.warning("could not commit the held files of %s at close (%s); the next start writes them "
                            "again", ", ".join(sorted(self.cadence.held)), _first_line(exc))
        if self.materialize is not None:
            self.materialize.flush()
        self.kafka.close()
        if self.alerts is not None:
            self.alerts.close()
        for name, index in self.indexes.items():
            if index.valid and index.snapshot_id is not None:
                try:
                    index.save(self._index_path(name))
                except OSError as exc:
                    log.warning("table %s: could not save its key index (%s); the next start rebuilds it", name, exc)

    def _index_path(self, name: str) -> Path:
        """Where the key index of ``name`` is kept between runs (driver-local state)."""
        safe = name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else hashlib.sha1(name.encode()).hexdigest()
        return Path(self.config.state_dir) / "indexes" / f"{safe}.npz"

    def recover_batch_id(self) -> int:
        """The highest ``lakestream.batch-id`` this pipeline committed to any table it writes (0 if none)."""
        from lakestream.spark import jvm_helper

        helper = jvm_helper(self.spark)
        namespaces = {s.namespace for s in self.config.streams} | {self.config.engine.dead_letter_table.split(".")[0]}
        found = [helper.maxSummaryLong(self.spark._jsparkSession, self.config.catalog.name, ns, BATCH_PROPERTY,
                                       PIPELINE_PROPERTY, self.config.name) for ns in sorted(namespaces)]
        return max([0, *found])

    # -- planning ---------------------------------------------------------------------------
    def discover_partitions(self) -> None:
        """Pick up topics and partitions (including ones created while running)."""
        now = time.monotonic()
        if self.positions and now - self._last_discovery < self.config.engine.topic_refresh_s:
            return
        self._last_discovery = now
        tps = self.kafka.partitions_of(lambda topic: self.config.stream_for(topic) is not None)
        new = [tp for tp in tps if tp not in self.positions]
        if not new:
            return
        committed = self.kafka.committed(new)
        marks = self.kafka.watermarks(new)
        for tp in new:
            low, high = marks[tp]
            start = self._start_from_tables(tp, low)
            if start is None:
                # Field/header routing: the tables are known only per record, so start from the
                # group's offset (a lower bound: it advances after every table of a batch committed)
                # and let each table skip what it already holds.
                start = committed.get(tp, low)
                if start > high:
                    log.warning("group offset %d of %s is past the end %d (topic re-created?); reading from "
                                "%d", start, tp, high, low)
                    start = low
            if start < low:
                log.warning("%s: offsets %d..%d were deleted by retention before being read", tp, start, low - 1)
            self.positions[tp] = max(start, low)
            self.maybe_more.add(tp)
        log.info("reading %d new partition(s): %s", len(new), ", ".join(str(tp) for tp in new[:10]))

    def due_streams(self, now: float) -> set[int]:
        """Streams whose commit interval has come: only their topics are read in this batch, so
        Kafka (not memory, not small files) buffers the records of slower streams."""
        return {i for i, stream in enumerate(self.config.streams)
                if now - self._last_read.get(i, float("-inf")) >= self.config.commit_interval(stream) - 0.05}

    def plan_batch(self) -> list[OffsetRange]:
        ranges, self.watermarks = self._plan(self.positions, self.maybe_more)
        return ranges

    def _plan(self, positions: dict[TP, int], maybe_more: set[TP]
              ) -> tuple[list[OffsetRange], dict[TP, tuple[int, int]]]:
        """The ranges to read from ``positions`` (for the streams that are due) and the watermarks seen."""
        self.discover_partitions()
        now = self.clock()
        due = self.due_streams(now)
        positions = {tp: positions.get(tp, pos) for tp, pos in self.positions.items()
                     if self.config.stream_index(tp.topic) in due}
        watermarks = self.kafka.watermarks(list(positions)) if positions else {}
        engine = self.config.engine
        ranges = plan_offset_ranges(positions, watermarks, maybe_more,
                                    engine.max_records_per_batch, engine.max_records_per_task,
                                    parallelism=self.spark.sparkContext.defaultParallelism)
        for i in {self.config.stream_index(r.topic) for r in ranges}:
            self._last_read[i] = now
        return ranges, watermarks

    # -- overlapping a batch's commit with the next batch's write job --------------------------
    def _start_prefetch(self, report: BatchReport, started: float) -> None:
        """Plan the next batch from where this one's job stopped and start its write job in the
        background, if it is due by now. Its files become visible only through its own commit, after
        this batch's: a crash leaves them unreferenced, and the restart reads from the tables' offsets."""
        if not self.config.engine.overlap_commits or time.monotonic() - started < self.config.fastest_commit_interval:
            return
        positions = dict(self.positions)
        maybe_more = set(self.maybe_more)
        for tp, end in report.ends.items():
            positions[tp] = max(positions.get(tp, 0), end.next_offset)
            (maybe_more.discard if end.at_end else maybe_more.add)(tp)
        ranges, watermarks = self._plan(positions, maybe_more)
        ranges = [r for r in ranges if r.end is None or r.end > r.start]
        if not ranges:
            return
        if self._prefetch_pool is None:
            self._prefetch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-write-job")
        # Built here, on this thread: this batch's commits go on changing the specs meanwhile, and the
        # references are refreshed only while no job is in flight (a refresh releases old broadcasts).
        self.refresh_references()
        self.prepare_new_tables(ranges)
        ctx = self.write_context(copy_specs=True)
        self._prefetch = (ranges, watermarks, self._prefetch_pool.submit(self.write_files, ranges, ctx=ctx))

    def _take_prefetch(self) -> tuple[list[OffsetRange], BatchReport | None] | None:
        """The prefetched batch: its ranges and report (None if its job failed for a record: the batch
        then runs its job again, isolating). An infrastructure failure is raised, as a batch's would be."""
        if self._prefetch is None:
            return None
        ranges, watermarks, job = self._prefetch
        self._prefetch = None
        self.watermarks = watermarks
        try:
            return ranges, job.result()
        except Exception as exc:  # noqa: BLE001 — classified just below
            if is_infrastructure_failure(exc):
                raise
            log.info("the write job started during the last commit failed (%s); running it again, isolating",
                     _first_line(exc))
            return ranges, None

    def _discard_prefetch(self) -> None:
        """Wait for a prefetched job nobody will commit and delete the files it wrote."""
        if self._prefetch is None:
            return
        _, _, job = self._prefetch
        self._prefetch = None
        try:
            report = job.result()
        except Exception:  # noqa: BLE001 — nothing of it is committed either way
            return
        _delete_quietly([f.path for tr in report.tables.values() for f in tr.files])

    def _start_from_tables(self, tp: TP, log_start: int) -> int | None:
        """Where a partition's table says to resume: its stored offset, or the log start when the
        table (or its entry for this partition) does not exist. None with field/header routing."""
        stream = self.config.stream_for(tp.topic)
        if stream is None or stream.route_field or stream.route_header:
            return None
        try:
            _, name = self.router.route(tp.topic)
        except DecodeError:
            return log_start  # unroutable: every record goes to the dead-letter table, which skips its own
        if not self.tables.exists(name.namespace, name.table):
            return log_start
        if str(name) not in self.specs:
            # Known before the first batch, so its tasks write it at once (shapes are checked in the task).
            self.prepare_table(str(name), [], stream, topic=tp.topic)
        start = self.offsets.load(self.tables.ident(name.namespace, name.table)).get(tp, log_start)
        # A held output may have committed less of this partition than its input: read from there, and the
        # input skips what it holds already.
        return replay_from(self.derived.get(str(name), ()), self.specs, self.cadence.intervals, tp, start, log_start)

    # -- reading and writing: one Spark job --------------------------------------------------
    def write_context(self, only_tables: frozenset[str] | None = None, copy_specs: bool = False) -> WriteContext:
        """What the write tasks get: specs (copies, for a job that runs while the originals change),
        transforms, reference data and the key columns derived tables need reported."""
        specs = {name: copy.copy(spec) for name, spec in self.specs.items()} if copy_specs else dict(self.specs)
        return WriteContext(self.config.kafka.consumer_config(), self.router, specs, only_tables, self.record_hook,
                            derived=dict(self.derived), schema_registry=self.schema_registry,
                            references=dict(self._reference_data), changed_keys=self._reported_columns(),
                            held_outputs=frozenset(self.cadence.intervals))

    def write_files(self, ranges: list[OffsetRange], only_tables: frozenset[str] | None = None,
                    into: BatchReport | None = None, ctx: WriteContext | None = None) -> BatchReport:
        """Run the write job over ``ranges``: tasks read, decode, convert and write data files.

        A plain RDD job: each partition is one task's group of ranges, and it returns its report as Arrow
        IPC bytes. (A DataFrame with ``mapInArrow`` cost about a second more per batch in query planning
        and Arrow conversion of the plan, for the same work.)"""
        import pyarrow as pa

        if ctx is None:
            ctx = self.write_context(only_tables)

        def task(groups: Any) -> Any:
            import pyarrow as pa

            rngs = [OffsetRange(*fields) for group in groups for fields in group]
            sink = pa.BufferOutputStream()
            writer = None
            for batch in run_write_task(rngs, ctx):
                if writer is None:
                    writer = pa.ipc.new_stream(sink, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
                yield sink.getvalue().to_pybytes()

        tasks = pack_ranges(ranges, self.spark.sparkContext.defaultParallelism)
        groups = [[(r.topic, r.partition, r.start, r.end, r.limit, r.known_end) for r in task] for task in tasks]
        # One Spark partition (one task) per group.
        payloads = self.spark.sparkContext.parallelize(groups, len(groups)).mapPartitions(task).collect()
        report = into if into is not None else BatchReport()
        batches = [batch for payload in payloads for batch in pa.ipc.open_stream(payload)]
        if batches:
            report.add(pa.Table.from_batches(batches))
        return report

    # -- isolating a record that makes a write fail --------------------------------------------
    def _write_part(self, ranges: list[OffsetRange], only_tables: frozenset[str] | None,
                    into: BatchReport) -> BatchReport:
        """A part of a batch being bisected: small parts run the write task right here in the driver
        (a Spark job per probe costs seconds), large ones as a Spark job."""
        import pyarrow as pa

        if sum(r.end - r.start for r in ranges) > _ISOLATE_IN_DRIVER_MAX:
            return self.write_files(ranges, only_tables, into=into)
        # Copies, as a Spark task gets: the task records shapes it found to fit on its spec.
        ctx = self.write_context(only_tables, copy_specs=True)
        parts: list[list[OffsetRange]] = []
        for r in ranges:  # one task reads distinct partitions
            part = next((p for p in parts if all(q.tp != r.tp for q in p)), None)
            if part is None:
                parts.append([r])
            else:
                part.append(r)
        batches = [batch for part in parts for batch in run_write_task(part, ctx)]
        into.add(pa.Table.from_batches(batches))
        return into

    def write_isolating(self, ranges: list[OffsetRange], only_tables: frozenset[str] | None = None) -> BatchReport:
        """`write_files`, but a job that fails for a reason other than infrastructure is split (the
        offset ranges bisected) until the record(s) that make it fail are alone; those become dead
        letters and everything else is written."""
        ranges = _without(ranges, self._culprits)
        try:
            return self.write_files(ranges, only_tables)
        except Exception as exc:  # noqa: BLE001 — classified just below
            if is_infrastructure_failure(exc):
                raise
            error = exc
        log.warning("write job failed, isolating the record(s) that make it fail: %s", _first_line(error))
        report = BatchReport()
        self._bisect(self._closed(ranges), only_tables, report, error)
        return report

    def _closed(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """Open-ended ranges closed at the partition's listed end (what lies beyond is read next batch)."""
        out = []
        for r in ranges:
            if r.end is None:
                high = self.watermarks.get(r.tp, (0, r.start + 1))[1]
                r = OffsetRange(r.topic, r.partition, r.start, r.start + max(1, min(r.limit, high - r.start)), r.limit)
            out.append(r)
        return out

    def _bisect(self, ranges: list[OffsetRange], only_tables: frozenset[str] | None, report: BatchReport,
                error: BaseException) -> None:
        ranges = [r for r in ranges if r.end > r.start]
        if sum(r.end - r.start for r in ranges) == 1:
            try:  # once more alone: a transient failure must not make a good record a dead letter
                self._write_part(ranges, only_tables, report)
                return
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc):
                    raise
                error = exc
            self._isolate(ranges[0], report, error)
            return
        for half in _halves(ranges):
            try:
                self._write_part(half, only_tables, report)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc):
                    raise
                self._bisect(half, only_tables, report, exc)

    def _isolate(self, rng: OffsetRange, report: BatchReport, error: BaseException) -> None:
        from lakestream.source.reader import read_offset_range

        if len(self._culprits) >= self.config.engine.max_isolations_per_batch:
            log.error("more than %d records of one batch fail the write alone: giving up on isolation",
                      self.config.engine.max_isolations_per_batch)
            raise error
        record = None
        for item in read_offset_range(self.config.kafka.consumer_config(), rng):
            if isinstance(item, list) and item:
                record = item[0]
        tp, offset = rng.tp, rng.start
        self._culprits.add((tp, offset))
        prev = report.ends.get(tp)
        if prev is None or prev.next_offset <= offset:
            report.ends[tp] = RangeEnd(tp, offset + 1, False)
        if record is None:
            return  # no record at this offset (a transaction marker): nothing to dead-letter
        self.isolations += 1
        reason = f"the write failed with this record alone (isolated): {_first_line(error)}"
        log.warning("isolated %s offset %d: %s", tp, offset, reason)
        report.dead_letters.append(DeadLetter(tp, offset, record.timestamp_ms, reason[:2000], record.key, record.value,
                                              topic_table(self.router, tp.topic), "write_failed"))

    # -- tables -----------------------------------------------------------------------------
    def _stream_for_table(self, shapes: list[NewShape]) -> StreamSettings:
        stream = self.config.stream_for(shapes[0].topic) if shapes else None
        return stream or self.config.streams[0]

    def prepare_table(self, name: str, shapes: list[NewShape], stream: StreamSettings | None = None,
                      topic: str | None = None) -> None:
        """Create or evolve ``name`` so every compatible shape can be written; reject the others.
        Then the same for the tables of its stream's transforms."""
        from lakestream.sink.files import create_table, table_info

        table_name = TableName.parse(name)
        ns, tbl = table_name.namespace, table_name.table
        ident = self.tables.ident(ns, tbl)
        stream = stream or self._stream_for_table(shapes)
        # A shape no table can take (a column name Spark cannot quote, names equal but for case, a
        # type that does not parse) is rejected here, so its records become dead letters: it must
        # neither fail the batch nor become part of a new table.
        unusable = {s.schema_id: reason for s in shapes if (reason := unusable_shape(s.columns)) is not None}
        shapes = [s for s in shapes if s.schema_id not in unusable]
        as_shapes = [Shape(s.schema_id, list(s.columns), s.key, s.inferred, s.defaults) for s in shapes]
        catalog = self.config.catalog.name
        info = table_info(self.spark, catalog, ns, tbl)
        if not info["exists"] and not shapes and unusable:
            # Only unusable shapes so far: no table yet; the tasks dead-letter these shapes' records.
            for sid, reason in unusable.items():
                log.warning("table %s: rejecting row shape %s: %s", name, sid, reason)
            previous = self.specs.get(name)
            rejected = dict(previous.rejected_shapes if previous else {}) | unusable
            self.specs[name] = TableSpec(name, stream.mode, [], {"type": "struct", "schema-id": 0, "fields": []},
                                         {"spec-id": 0, "fields": []}, "", frozenset(), rejected)
            return
        if not info["exists"]:
            first_key = next((s.key for s in as_shapes if s.key), stream.key_columns)
            key = (stream.key_columns or first_key) if stream.mode == "upsert" else []
            layout = self.config.layout_for(name, stream)
            properties = dict(DEFAULT_TABLE_PROPERTIES) | layout.properties  # format v3: deletion vectors
            key_lower = {k.lower() for k in key}
            defaults = {n: v for s in as_shapes for n, v in s.defaults.items()}
            columns = [{"name": n, "type": t, "required": n.lower() in key_lower,
                        **({"default": defaults[n]} if n in defaults else {})} for n, t in merged_columns(as_shapes)]
            info = create_table(self.spark, catalog, ns, tbl, {
                "columns": columns, "identifier_fields": key, "partition_by": layout.partition_by,
                "sort_by": layout.sort_by, "properties": properties})
            log.info("created table %s (%d columns, key %s, format v%s)", name, len(columns), key or "-",
                     info.get("format_version"))
        schema = self.tables.schema(ns, tbl, refresh=True)
        result = reconcile(ident, schema, as_shapes)
        if result.rejected and stream.on_incompatible_type == "widen_to_string":
            keys = {k.lower() for s in as_shapes for k in s.key}
            columns_to_widen = sorted({c for c in result.rejected_columns.values() if c.lower() not in keys})
            for column in columns_to_widen:
                log.warning("table %s: widening column %s to string (on_incompatible_type=widen_to_string)",
                            name, column)
                self.tables.apply(ns, tbl, widen_to_string_statements(ident, column, f"pre_string_{self.batch_id}"))
            if columns_to_widen:
                self.indexes.pop(name, None)
                result = reconcile(ident, self.tables.schema(ns, tbl, refresh=True), as_shapes)
        if stream.on_dropped_column == "drop" and stream.mode == "upsert":
            result.statements.extend(dropped_column_statements(ident, schema, as_shapes, stream.key_columns
                                                               or info.get("identifier_fields") or []))
        self.tables.apply(ns, tbl, result.statements)
        result.rejected.update(unusable)
        for sid, reason in result.rejected.items():
            log.warning("table %s: rejecting row shape %s: %s", name, sid, reason)
        if result.statements or info.get("schema") is None or name not in self.specs:
            info = table_info(self.spark, catalog, ns, tbl)
        previous = self.specs.get(name)
        accepted = set(previous.accepted_shapes if previous else ()) | {s.schema_id for s in shapes
                                                                         if s.schema_id not in result.rejected}
        rejected = dict(previous.rejected_shapes if previous else {}) | result.rejected
        if stream.mode == "upsert":
            key = stream.key_columns or info.get("identifier_fields") or next((s.key for s in as_shapes if s.key), [])
        else:
            key = [stream.dedupe_field] if stream.dedupe_field else []
        if key and int(info.get("format_version", 2)) < 3:
            raise LakestreamError(
                f"table {name} is an Iceberg format v{info.get('format_version')} table; upserts and de-duplication "
                f"write deletion vectors, which need format v3 — fix: run `lakestream upgrade-tables <pipeline.yaml>` "
                f"once (it compacts away the old delete files and sets format-version=3)")
        spec = TableSpec(name, stream.mode, list(key), info["schema"], info["spec"], info["data_location"],
                         frozenset(accepted), rejected, dict(self.offsets.load(ident)),
                         drop_missing=stream.on_dropped_column == "drop" and stream.mode == "upsert")
        self.specs[name] = spec
        if key:
            hashed = not is_integer_key(spec.arrow_schema(), key)
            index = self.indexes.get(name)
            if index is None or index.hashed != hashed or result.statements:
                self.indexes[name] = KeyIndex(hashed)
        elif stream.mode == "upsert" and (not isinstance(self.indexes.get(name), KeylessIndex) or result.statements):
            self.indexes[name] = KeylessIndex(spec.arrow_schema())  # no primary key: a row multiset
        topic = topic or next((s.topic for s in shapes), None)
        if stream.transforms and topic is not None:
            self.prepare_derived(name, topic, stream)

    def prepare_derived(self, name: str, topic: str, stream: StreamSettings) -> None:
        """Create or evolve the output table of each transform of input table ``name``: its schema is
        the transform's output over an empty input in the input table's current schema."""
        index = self.config.streams.index(stream)
        derived = []
        values = topic_parts(topic) | {"field": ""}
        for j, t in enumerate(stream.transforms):
            where = f"streams[{index}].transforms[{j}]"
            out = TableName(stream.namespace, t.table.format(**values))
            try:
                validate_identifier(out.table, what="table name")
            except LakestreamError as exc:
                raise ConfigError(f"{where}.table: {exc} — fix: use a valid table name or template") from None
            refs = []
            for k, ref in enumerate(t.references):
                data = self.references.get(ref, f"{where}.references[{k}]")
                self._reference_data[data.key] = data
                refs.append((ref.name, data.key))
            d = Derived(t.name, str(out), t.sql, t.python, where, tuple(refs))
            if t.commit_interval_s is not None and t.commit_interval_s > self.config.commit_interval(stream):
                self.cadence.set_interval(str(out), t.commit_interval_s)
            try:
                views = reference_views(d, self._reference_data)
                schema = run_transform(d, empty_input(self.specs[name].arrow_schema()), views).schema
                columns = output_columns(schema)
            except Exception as exc:  # noqa: BLE001 — any failure over an empty input is the config's
                body = "sql" if t.sql is not None else "python"
                raise ConfigError(f"{where}.{body} ({t.name}) fails over table {name}'s columns: "
                                  f"{type(exc).__name__}: {str(exc)[:500]} — fix: the view is `batch` with the table's "
                                  f"columns plus _op, _topic, _kafka_partition, _kafka_offset, _source_ts_ms, _kafka_ts_ms")
            if not columns:
                raise ConfigError(f"{where}: the transform {t.name} returns no columns — fix: select at least one")
            shape_id = "derived-" + hashlib.sha1(repr(columns).encode()).hexdigest()[:16]
            out_stream = StreamSettings(topics=[topic], mode="append", namespace=out.namespace, table=out.table,
                                        layout=t.layout)
            self.tables.ensure_namespace(out.namespace)
            self.prepare_table(str(out), [NewShape(str(out), topic, shape_id, columns, [], False)], out_stream)
            derived.append(d)
        self.derived[name] = derived
        self._derived_inputs[name] = (topic, stream)

    def _reported_columns(self) -> dict[str, list[str]]:
        return self.materialize.reported_columns() if self.materialize is not None else {}

    def refresh_references(self) -> None:
        """Before a batch: every reference table's current data, read again where its snapshot changed;
        the output tables of transforms whose reference changed shape are evolved."""
        self.references.release_retired()
        for i, stream in enumerate(self.config.streams):
            for j, t in enumerate(stream.transforms):
                for k, ref in enumerate(t.references):
                    data = self.references.get(ref, f"streams[{i}].transforms[{j}].references[{k}]")
                    self._reference_data[data.key] = data
        changed, self.references.changed = self.references.changed, set()
        for name, ds in list(self.derived.items()):
            if any(key in changed for d in ds for _, key in d.references):
                self.prepare_derived(name, *self._derived_inputs[name])

    def prepare_new_tables(self, ranges: list[OffsetRange]) -> None:
        """Create the tables ``ranges`` meet for the first time before their job runs, from the first
        records of each of their partitions, decoded here on the driver.

        Without this, the job would only report a new table's shape and a second job would read and
        decode all its records again (half the first batch's time for a large initial load). Only tables
        a topic routes to as a whole are probed; a probe that finds no usable shape (a first record that
        is a tombstone, a poison record, a routing by field) changes nothing: the job then reports the
        shape as before. Nothing is written or committed here."""
        import pyarrow as pa

        firsts: dict[TP, OffsetRange] = {}  # a partition split between tasks: its first range
        for r in ranges:
            if (r.end is None or r.end > r.start) and (r.tp not in firsts or r.start < firsts[r.tp].start):
                firsts[r.tp] = r
        probes: dict[str, list[OffsetRange]] = {}
        for r in firsts.values():
            table = topic_table(self.router, r.topic)
            if table is not None and table not in self.specs:
                probes.setdefault(table, []).append(
                    OffsetRange(r.topic, r.partition, r.start, r.end, min(r.limit, _PROBE_RECORDS), r.known_end))
        if not probes:
            return
        ctx = self.write_context(frozenset(probes), copy_specs=True)
        # A probe reads a few records: small fetches, not the job's 64 MB ones.
        ctx.consumer_conf = ctx.consumer_conf | {"fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 1 << 18,
                                               "queued.min.messages": _PROBE_RECORDS, "queued.max.messages.kbytes": 1024}
        started = time.monotonic()
        try:
            report = BatchReport()
            batches = list(run_write_task([r for rs in probes.values() for r in rs], ctx))
            if batches:
                report.add(pa.Table.from_batches(batches))
        except Exception as exc:  # noqa: BLE001 — the job reads these records again and reports what is wrong
            if is_infrastructure_failure(exc):
                raise
            log.info("probing new tables failed (%s); their job reports their shapes", _first_line(exc))
            return
        shapes = {name: list(tr.shapes.values()) for name, tr in report.tables.items() if tr.shapes}
        if shapes:
            self.prepare_tables(shapes)
            log.info("prepared %d new table(s) from their first records in %.2fs", len(shapes),
                     time.monotonic() - started)

    def prepare_tables(self, shapes_by_table: dict[str, list[NewShape]]) -> None:
        todo = sorted(shapes_by_table.items())
        for namespace in sorted({TableName.parse(n).namespace for n, _ in todo}):
            self.tables.ensure_namespace(namespace)  # once, before writers race to create it
        workers = min(self.config.engine.table_write_parallelism, len(todo))
        if workers <= 1:
            for name, shapes in todo:
                self.prepare_table(name, shapes)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="table-prep") as pool:
                list(pool.map(lambda item: self.prepare_table(*item), todo))

    # -- committing -------------------------------------------------------------------------
    def _fresh_index(self, name: str, ident: str) -> KeyIndex | None:
        """The table's key index: as it is while valid (the commit checks it still describes the table's
        current snapshot), else loaded as saved at the current snapshot, or rebuilt from a scan."""
        from lakestream.sink.files import table_info

        index = self.indexes.get(name)
        if index is None or index.valid:
            return index  # a valid index is checked by the commit itself (expect_snapshot_id)
        table = TableName.parse(name)
        current = table_info(self.spark, self.config.catalog.name, table.namespace, table.table).get("snapshot_id")
        saved = type(index).load(self._index_path(name), index.hashed, current)
        if saved is not None:
            log.info("table %s: key index loaded as saved at snapshot %s (%d keys)", name, current, len(saved))
            self.indexes[name] = saved
            return saved
        index.rebuild(self.spark, ident, self.specs[name].key_columns, current)
        return index

    def commit_table(self, name: str, changes: TableReport, ends: dict[TP, int]) -> TableCommit | None:
        spec = self.specs[name]
        table = TableName.parse(name)
        ident = self.tables.ident(table.namespace, table.table)
        consumed = {tp: ends[tp] for tp in changes.tp_offsets() if tp in ends}
        merged = self.offsets.merged_after_commit(ident, consumed)
        props = {OFFSETS_PROPERTY: encode_offsets(merged), PIPELINE_PROPERTY: self.config.name,
                 BATCH_PROPERTY: str(self.batch_id)}
        if changes.max_source_ts is not None:
            props[SOURCE_TS_PROPERTY] = str(changes.max_source_ts)
        if not changes.files and not changes.locations and not changes.truncates:
            return None  # nothing left to write (all dead letters): the offsets advance with the next commit
        attempts = 5
        for attempt in range(1, attempts + 1):
            write = TableWrite(ident, self.config.catalog.name, table, spec, self._fresh_index(name, ident))
            try:
                pause_point("commit.table.before")
                done = write_table(self.spark, write, changes, props)
                break
            except StaleIndex as exc:
                self._conflicts.append((name, "stale_index"))
                if attempt == attempts:
                    raise
                log.info("table %s: %s; refreshing the key index", name, exc)
                self._retries.append(name)
                continue
            except Exception as exc:  # noqa: BLE001 — classified by Java class below
                text = str(getattr(exc, "java_exception", "")) + str(exc)
                cause = next((_CONFLICT_CAUSES[m] for m in _RETRYABLE if m in text), None)
                if cause is None:
                    raise
                self._conflicts.append((name, cause))
                if attempt == attempts:
                    raise
                if self.offsets.load(ident, refresh=True) == merged:
                    log.info("table %s: commit had landed despite %s", name, text[:120])
                    if write.index is not None:
                        write.index.valid = False
                    done = TableCommit("upsert" if spec.mode == "upsert" else "append", changes.count)
                    break
                log.warning("table %s: commit conflict (attempt %d/%d), re-planning deletes: %s", name, attempt,
                            attempts, text[:200])
                if write.index is not None:
                    write.index.valid = False
                self._retries.append(name)
                time.sleep(0.2 * attempt)
        pause_point("commit.table.after")
        self.offsets.record(ident, merged)
        spec.committed = dict(merged)
        return dataclasses.replace(done, source_ts_ms=changes.max_source_ts)

    def commit_tables(self, report: BatchReport, ranges: list[OffsetRange] | None = None) -> dict[str, TableCommit]:
        """Commit every table of the batch; tables are independent, so several commit at once. With
        the batch's ``ranges``, a table whose commit fails for a reason other than infrastructure is
        written and committed again in halves of the ranges until the record that fails it is alone.
        A table with a cadence of its own (`lakestream.engine.cadence`) adds its part to what it holds,
        and commits all it holds when its interval is due."""
        ends = {tp: end.next_offset for tp, end in report.ends.items()}
        closed = None if ranges is None else [
            OffsetRange(r.topic, r.partition, r.start, min(ends[r.tp], r.end or ends[r.tp]), r.limit)
            for r in ranges if r.tp in ends]
        now = self.clock()
        todo: list[tuple[str, TableReport, dict[TP, int], list[OffsetRange] | None]] = []
        hold: list[tuple[str, TableReport]] = []
        for name, tr in sorted(report.tables.items()):
            if tr.count <= 0:
                continue
            if not self.cadence.holds(name):
                todo.append((name, tr, ends, closed))
            elif self.cadence.due(name, now):
                self.cadence.add(name, tr, ends, closed or [], now)
            else:
                hold.append((name, tr))
        todo += self._due_held(now, force=False)

        def commit(name: str, tr: TableReport, ends: dict[TP, int], closed: list[OffsetRange] | None
                   ) -> TableCommit | None:
            try:
                return self.commit_table(name, tr, ends)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if closed is None or is_infrastructure_failure(exc):
                    raise
                log.warning("table %s: commit failed, isolating the record(s) that make it fail: %s", name,
                            _first_line(exc))
                _delete_quietly([f.path for f in tr.files])
                fed = set(tr.tp_offsets())
                return self._bisect_commit(name, [r for r in _without(closed, self._culprits) if r.tp in fed],
                                           report, exc)

        # Alerts commit first, then transform outputs, then their input tables: a restart reads from the
        # input's offsets, which are then never past a derived table's (each skips what it already holds),
        # and a rule's source (its state) never holds records whose alerts were not committed.
        alerts = self.alerts.tables if self.alerts is not None else set()
        outputs = {d.table for ds in self.derived.values() for d in ds} - alerts
        phases = [[item for item in todo if item[0] in alerts], [item for item in todo if item[0] in outputs],
                  [item for item in todo if item[0] not in outputs and item[0] not in alerts]]
        done: dict[str, TableCommit] = {}
        for phase in phases:
            workers = min(self.config.engine.table_write_parallelism, len(phase))
            if workers <= 1:
                kinds = [commit(*item) for item in phase]
            else:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="table-commit") as pool:
                    kinds = list(pool.map(lambda item: commit(*item), phase))
            done.update({item[0]: kind for item, kind in zip(phase, kinds) if kind is not None})
        # Held only now that every commit before them succeeded: what a table holds is always safe to
        # commit (for a rule's source: the alerts of its records are committed).
        for name, tr in hold:
            self.cadence.add(name, tr, ends, closed or [], now)
        return done

    def _due_held(self, now: float, force: bool
                  ) -> list[tuple[str, TableReport, dict[TP, int], list[OffsetRange] | None]]:
        """The held tables whose interval is due (all of them with ``force``), taken for their commit."""
        out = []
        for name in sorted(self.cadence.held) if force else self.cadence.due_tables(now):
            held = self.cadence.take(name, now)
            if held is not None and held.report.count > 0:
                out.append((name, held.report, held.ends, held.ranges))
        return out

    def commit_held(self, force: bool = False) -> dict[str, TableCommit]:
        """Commit the held tables that are due (all with ``force``), outside a batch: while the stream is
        idle, and at close."""
        done: dict[str, TableCommit] = {}
        for name, tr, ends, _ in self._due_held(self.clock(), force):
            kind = self.commit_table(name, tr, ends)
            if kind is not None:
                done[name] = kind
        if done:
            log.info("committed held file(s) of %s", ", ".join(f"{n} ({c.changes:,} rows)" for n, c in done.items()))
        return done

    def _bisect_commit(self, name: str, ranges: list[OffsetRange], report: BatchReport,
                       error: BaseException) -> TableCommit | None:
        """Write and commit table ``name`` over ``ranges`` in halves (each half its own snapshot, in
        Kafka order, so the table's offsets only move forward); a lone failing record is a dead letter."""
        ranges = [r for r in _without(ranges, self._culprits) if r.end > r.start]
        if not ranges:
            return None
        if sum(r.end - r.start for r in ranges) == 1:
            self._isolate(ranges[0], report, error)
            return None
        done: TableCommit | None = None
        for half in _halves(ranges):
            try:
                sub = self._write_part(half, frozenset({name}), BatchReport())
                tr = sub.tables.get(name)
                if tr is not None and tr.shapes:
                    raise LakestreamError(f"table {name}: unprepared shapes while isolating: {sorted(tr.shapes)}")
                if tr is not None and tr.count > 0:
                    part = self.commit_table(name, tr, {tp: e.next_offset for tp, e in sub.ends.items()})
                    done = _sum_commits(done, part)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if is_infrastructure_failure(exc) or isinstance(exc, LakestreamError):
                    raise
                done = _sum_commits(done, self._bisect_commit(name, half, report, exc))
        return done

    def write_dead_letters(self, report: BatchReport, first: int = 0) -> dict[str, int]:
        """Commit the batch's dead letters from the ``first``-th on; their count per kind. The batch's first write
        (``first`` 0) leaves out those the dead-letter table holds already (its offsets are past them: a batch
        read again after a crash); later ones came up in this batch's commits and are all new."""
        from lakestream.sink.files import commit_files, table_info, write_data_file

        if len(report.dead_letters) <= first:
            return {}
        catalog = self.config.catalog.name
        ns, tbl = self.config.engine.dead_letter_table.split(".", 1)
        ident = self.tables.ident(ns, tbl)
        if self._dead_letter is None:
            ensure_dead_letter_table(self.spark, catalog, self.config.engine.dead_letter_table)
            info = table_info(self.spark, catalog, ns, tbl)
            self._dead_letter = TableSpec(self.config.engine.dead_letter_table, "append", [], info["schema"],
                                          info["spec"], info["data_location"])
        committed = self.offsets.load(ident) if first == 0 else {}
        letters = [d for d in report.dead_letters[first:] if d.offset >= committed.get(d.tp, -1)]
        if not letters:
            return {}
        spec = self._dead_letter
        table = dead_letter_table(letters, self.config.name, spec.arrow_schema())
        from lakestream.sink.files import partition_values

        data_files = []
        groups = partition_values(spec.partition_spec, spec.schema, table) if spec.partition_spec.get("fields") \
            else [([], list(range(table.num_rows)))]
        import pyarrow as pa

        for values, rows in groups:
            written = write_data_file(table.take(pa.array(rows, pa.int64())), spec.data_location, spec.arrow_schema(),
                                      "dead-letters")
            data_files.append({"path": written["path"], "file_size": written["file_size"],
                               "record_count": written["record_count"], "partition": list(values)})
        consumed = {tp: end.next_offset for tp, end in report.ends.items()}
        merged = self.offsets.merged_after_commit(ident, consumed)
        props = {OFFSETS_PROPERTY: encode_offsets(merged), PIPELINE_PROPERTY: self.config.name,
                 BATCH_PROPERTY: str(self.batch_id)}
        commit_files(self.spark, catalog, ns, tbl, {"base_snapshot_id": None, "data_files": data_files,
                                                    "deletes": [], "properties": props})
        self.offsets.record(ident, merged)
        log.warning("%d record(s) sent to the dead-letter table %s", len(letters), self.config.engine.dead_letter_table)
        kinds: dict[str, int] = {}
        for letter in letters:
            kinds[letter.reason_kind] = kinds.get(letter.reason_kind, 0) + 1
        return kinds

    # -- the batch --------------------------------------------------------------------------
    def run_batch(self) -> BatchResult | None:
        """Plan, read and write, commit, advance. None when there was nothing to read."""
        started = time.monotonic()
        self._in_batch = True
        report: BatchReport | None = None
        prefetched = self._take_prefetch()
        overlapped = prefetched is not None and prefetched[1] is not None
        if prefetched is not None:
            ranges, report = prefetched
        else:
            ranges = self.plan_batch()
        if not ranges:
            if self.cadence.held:
                self.commit_held()  # tables whose own interval passed while their stream was idle
            if self.materialize is not None:
                self.materialize.upsert_due()  # derived tables whose commit interval passed while idle
            self._in_batch = False
            return None
        if not self._batch_id_recovered:
            self.batch_id = max(self.batch_id, self.recover_batch_id())
            self._batch_id_recovered = True
        self.batch_id += 1
        self._culprits = set()
        isolations_before = self.isolations
        self._conflicts, self._retries = [], []
        if report is None:  # a prefetched job refreshed the references just before it started
            self.refresh_references()
            self.prepare_new_tables(ranges)
            report = self.write_isolating(ranges)
        jobs = 1
        new_shapes = {name: list(tr.shapes.values()) for name, tr in report.tables.items() if tr.shapes}
        if new_shapes:
            # Tables met with a shape they were not prepared for: create or evolve them, drop what
            # the first job wrote for them, and write them again over exactly the same records.
            self.prepare_tables(new_shapes)
            discarded = [f.path for name in new_shapes for f in report.tables[name].files]
            for name in new_shapes:
                report.tables.pop(name)
            _delete_quietly(discarded)
            # The same task split, every range closed where the first job stopped reading.
            closed = [OffsetRange(r.topic, r.partition, r.start,
                                  min(r.end, report.ends[r.tp].next_offset) if r.end is not None
                                  else report.ends[r.tp].next_offset, r.limit)
                      for r in ranges if r.tp in report.ends]
            outputs = {d.table for name in new_shapes for d in self.derived.get(name, ())}
            for name in outputs:
                _delete_quietly([f.path for f in report.tables.pop(name, TableReport(name)).files])
            second = self.write_isolating([r for r in closed if r.end > r.start], frozenset(new_shapes) | outputs)
            jobs = 2
            for name, tr in second.tables.items():
                if tr.shapes:
                    raise LakestreamError(f"table {name}: shapes still unprepared after preparing them: "
                                          f"{sorted(tr.shapes)}")
                report.tables[name] = tr
            report.dead_letters.extend(second.dead_letters)
        self._start_prefetch(report, started)  # plans without touching self.watermarks
        # The job's dead letters commit before any table: the restart reads from the tables' offsets, so after a
        # crash between a table's commit and theirs they would be lost. A crash before the tables commit reads
        # their records again, and the dead-letter table's own offsets leave the second copies out.
        early = len(report.dead_letters)
        dead = self.write_dead_letters(report)
        if self.alerts is not None:
            self.alerts.run(report)
        if self.windows is not None:
            self.windows.run(report)  # commits the windows tables (MERGE), before their sources
        read_seconds = time.monotonic() - started
        committed = self.commit_tables(report, ranges)
        if self.materialize is not None:
            self.materialize.run(report, isolated=bool(self._culprits))  # after its inputs: see the module
        # Dead letters that came up since (late window rows, records a failing commit isolated): new in this
        # batch, so not left out by the offsets the first write stored.
        for kind, n in self.write_dead_letters(report, first=early).items():
            dead[kind] = dead.get(kind, 0) + n
        commit_ts_ms = int(time.time() * 1000)
        advanced = sum(max(end.next_offset - self.positions.get(tp, 0), 0) for tp, end in report.ends.items())
        for tp, end in report.ends.items():
            self.positions[tp] = max(self.positions.get(tp, 0), end.next_offset)
            if end.at_end:
                self.maybe_more.discard(tp)
            else:
                self.maybe_more.add(tp)
        pause_point("commit.group.before")
        floor = self.cadence.floor({t: self.specs[t].committed for t in self.cadence.held}) if self.cadence.held else {}
        self.kafka.commit({tp: min(self.positions[tp], floor.get(tp, self.positions[tp])) for tp in report.ends})
        lag = consumer_lag({tp: high for tp, (_, high) in self.watermarks.items()}, self.positions)
        changes = sum(tr.count for tr in report.tables.values())
        groups = [(s.count, s.source_ts_q, s.source_ts_min, s.source_ts_max)
                  for tr in report.tables.values() for s in tr.stats if s.source_ts_q]
        retries: dict[str, int] = {}
        for name in self._retries:
            retries[name] = retries.get(name, 0) + 1
        self._in_batch = False
        return BatchResult(
            self.batch_id, changes + len(report.dead_letters), changes, {n: c.kind for n, c in committed.items()},
            sum(dead.values()), time.monotonic() - started, read_seconds, lag, commit_ts_ms,
            _combine_quantiles(groups), advanced, jobs,
            table_records={name: tr.count for name, tr in report.tables.items() if tr.count},
            table_changes={n: c.changes for n, c in committed.items()},
            table_source_ts_ms={n: c.source_ts_ms for n, c in committed.items() if c.source_ts_ms is not None},
            table_lag=self.table_lag(), dead_letter_kinds=dead, commit_conflicts=list(self._conflicts),
            commit_retries=retries, isolated=self.isolations - isolations_before, skipped=dict(report.skipped),
            truncated=sorted(n for n, tr in report.tables.items() if tr.truncates and n in committed),
            overlapped=overlapped, held=self.cadence.records())

    def table_lag(self) -> dict[str, int]:
        """Per table read in this batch: records in Kafka beyond the offsets the table stored."""
        highs = {tp: high for tp, (_, high) in self.watermarks.items()}
        out: dict[str, int] = {}
        for name, spec in self.specs.items():
            mine = {tp: high for tp, high in highs.items() if tp in spec.committed}
            if mine:
                out[name] = consumer_lag(mine, spec.committed)
        return out


# Parts of a batch up to this many offsets are written in the driver while isolating a record.
_ISOLATE_IN_DRIVER_MAX = 5000
_PROBE_RECORDS = 16  # first records of a new table's partition that the driver decodes to create it


def _first_line(exc: BaseException) -> str:
    """The informative line of an error (a Spark task failure's Python exception, else the first line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line) and "Traceback" not in line:
            return line[:500]
    lines = [line for line in lines if not line.startswith(("File ", "at ", "Traceback"))] or lines
    return (lines[0] if lines else type(exc).__name__)[:500]


def _without(ranges: list[OffsetRange], culprits: set[tuple[TP, int]]) -> list[OffsetRange]:
    """``ranges`` with the offsets of isolated records cut out (they are dead letters already)."""
    if not culprits:
        return ranges
    out = []
    for r in ranges:
        cuts = sorted(o for tp, o in culprits if tp == r.tp and o >= r.start and (r.end is None or o < r.end))
        start = r.start
        for o in cuts:
            if o > start:
                out.append(OffsetRange(r.topic, r.partition, start, o, r.limit))
            start = o + 1
        if r.end is None or r.end > start:
            out.append(OffsetRange(r.topic, r.partition, start, r.end, r.limit))
    return out


def _halves(ranges: list[OffsetRange]) -> list[list[OffsetRange]]:
    """Closed ``ranges`` split into two lists of about the same number of offsets."""
    total = sum(r.end - r.start for r in ranges)
    target = total // 2
    left: list[OffsetRange] = []
    right: list[OffsetRange] = []
    seen = 0
    for r in ranges:
        size = r.end - r.start
        if seen >= target:
            right.append(r)
        elif seen + size <= target:
            left.append(r)
        else:
            cut = r.start + (target - seen)
            left.append(OffsetRange(r.topic, r.partition, r.start, cut, r.limit))
            right.append(OffsetRange(r.topic, r.partition, cut, r.end, r.limit))
        seen += size
    return [h for h in (left, right) if h]


def _sum_commits(a: TableCommit | None, b: TableCommit | None) -> TableCommit | None:
    """One table's commits in parts, as one."""
    if a is None or b is None:
        return a or b
    newest = max((t for t in (a.source_ts_ms, b.source_ts_ms) if t is not None), default=None)
    return TableCommit(b.kind, a.changes + b.changes, newest)


def _delete_quietly(paths: list[str]) -> None:
    """Remove data files no snapshot references (written by a job whose output was discarded)."""
    from lakestream.sink.storage import filesystem_path

    for path in paths:
        try:
            fs, local = filesystem_path(path)
            fs.delete_file(local)
        except Exception as exc:  # noqa: BLE001 — an orphan left behind is harmless; orphan cleanup removes it
            log.debug("could not remove unreferenced file %s: %s", path, exc)


def _combine_quantiles(groups: list[tuple[int, list[float], int, int]]) -> list[float] | None:
    """[q01, q50, q99, min] of source times over all groups of (count, [q01, q50, q99], min, max)."""
    quantiles = mixture_quantiles(groups)
    return None if quantiles is None else quantiles + [float(min(g[2] for g in groups))]


def describe_batch(result: BatchResult) -> dict[str, Any]:
    """A JSON-able record of one batch (the metrics log line)."""
    return {"batch": result.batch_id, "records": result.records, "changes": result.changes, "tables": result.tables,
            "dead_letters": result.dead_letters, "seconds": round(result.seconds, 3),
            "read_seconds": round(result.read_seconds, 3), "lag": result.lag, "commit_ts_ms": result.commit_ts_ms,
            "source_ts_quantiles": result.source_ts_quantiles, "jobs": result.jobs, "isolated": result.isolated,
            "table_records": result.table_records, "table_changes": result.table_changes,
            "table_lag": result.table_lag, "dead_letter_kinds": result.dead_letter_kinds,
            "commit_conflicts": [list(c) for c in result.commit_conflicts], "commit_retries": result.commit_retries,
            "skipped": result.skipped, "truncated": result.truncated, "overlapped": result.overlapped,
            "held": result.held}
