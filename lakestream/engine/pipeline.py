"""The micro-batch engine: plan offset ranges, read and decode them on executors, write each table
with its offsets in the same snapshot, then advance the consumer group.

One `Pipeline.run_batch()` call is one micro-batch; `lakestream.engine.loop` repeats it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from lakestream.config import PipelineConfig, StreamSettings
from lakestream.engine.freshness import mixture_quantiles
from lakestream.errors import DecodeError
from lakestream.decode.records import DECODED_DDL, KIND_CHANGE, KIND_END, KIND_ERROR, KIND_SCHEMA, read_and_decode
from lakestream.sink.commit import (
    BATCH_PROPERTY, OFFSETS_PROPERTY, PIPELINE_PROPERTY, SOURCE_TS_PROPERTY, TableOffsets, current_summary,
    encode_offsets,
)
from lakestream.sink.deadletter import dead_letter_rows, ensure_dead_letter_table, reason_column, write_dead_letters
from lakestream.sink.router import Router, TableName
from lakestream.sink.schema import Shape, TableManager, merged_columns, reconcile, widen_to_string_statements
from lakestream.sink.writer import TableWrite, write_table
from lakestream.source.kafka import TP, KafkaCluster
from lakestream.source.planner import OffsetRange, pack_ranges, plan_offset_ranges

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

# Commit races with maintenance (compaction, delete rewrites) and reads of files that a concurrent
# snapshot expiry removed: re-planning the write against the table's new state resolves both.
_RETRYABLE = ("CommitFailedException", "ValidationException", "CommitStateUnknownException",
              "Found conflicting files", "Cannot commit", "NotFoundException", "FileNotFoundException",
              "Error reading file")


@dataclass
class TableBatch:
    """What the decode tasks reported about one table."""

    name: TableName
    shapes: dict[str, Shape] = field(default_factory=dict)
    count: int = 0
    tp_offsets: dict[TP, tuple[int, int]] = field(default_factory=dict)  # min, max offset
    max_source_ts: int | None = None
    unavailable: set[str] = field(default_factory=set)


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

    def progress_line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        return (f"batch {self.batch_id}: {self.records:,} records → {len(self.tables)} table(s), "
                f"{self.dead_letters:,} dead-letter, {self.seconds:.2f}s (read {self.read_seconds:.2f}s), "
                f"{rate:,.0f} rec/s, lag {lag}")


class Pipeline:
    """A running pipeline: owns the positions, the table caches and the Kafka metadata client."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None):
        from lakestream.spark import session_for

        self.config = config
        self.spark = spark or session_for(config)
        self.kafka = KafkaCluster(config.kafka)
        self.router = Router.from_config(config)
        self.tables = TableManager(self.spark, config.catalog.name)
        self.offsets = TableOffsets(self.spark)
        self.positions: dict[TP, int] = {}
        self.maybe_more: set[TP] = set()
        self.watermarks: dict[TP, tuple[int, int]] = {}
        self.batch_id = 0
        self._last_discovery = 0.0
        self._dead_letter_ident: str | None = None
        self._non_empty: set[str] = set()

    def close(self) -> None:
        self.kafka.close()

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

    def plan_batch(self) -> list[OffsetRange]:
        self.discover_partitions()
        self.watermarks = self.kafka.watermarks(list(self.positions))
        engine = self.config.engine
        return plan_offset_ranges(self.positions, self.watermarks, self.maybe_more,
                                  engine.max_records_per_batch, engine.max_records_per_task,
                                  parallelism=self.spark.sparkContext.defaultParallelism)

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
        return self.offsets.load(self.tables.ident(name.namespace, name.table)).get(tp, log_start)

    # -- reading ----------------------------------------------------------------------------
    def read_batch(self, ranges: list[OffsetRange]) -> DataFrame:
        """A persisted DataFrame of decoded rows for ``ranges`` (one Spark task per range)."""
        from pyspark import StorageLevel

        consumer_conf = self.config.kafka.consumer_config()
        router = self.router

        def task(batches: Any) -> Any:
            for batch in batches:
                cols = batch.to_pydict()
                rngs = [OffsetRange(t, p, s, e, lim) for t, p, s, e, lim in
                        zip(cols["topic"], cols["partition"], cols["start"], cols["end"], cols["limit"])]
                yield from read_and_decode(rngs, consumer_conf, router)

        tasks = pack_ranges(ranges, self.spark.sparkContext.defaultParallelism)
        groups = [[(r.topic, r.partition, r.start, r.end, r.limit) for r in task] for task in tasks]
        # One Spark partition per task group: parallelize the groups, then flatten within partitions.
        rdd = self.spark.sparkContext.parallelize(groups, len(groups)).flatMap(lambda group: group)
        plan = self.spark.createDataFrame(rdd, "topic string, partition int, start bigint, `end` bigint, `limit` bigint")
        decoded = plan.mapInArrow(task, DECODED_DDL)
        return decoded.persist(StorageLevel.MEMORY_AND_DISK)

    def summarize(self, decoded: DataFrame) -> tuple[dict[TP, tuple[int, bool]], dict[str, TableBatch], int, int, list[float] | None]:
        """One small aggregate over the batch: range ends, per-table shapes/ops/offsets, error count."""
        from pyspark.sql import functions as F

        rows = (decoded.groupBy("kind", "table", "topic", "partition", "schema_id", "op")
                .agg(F.count(F.lit(1)).alias("n"), F.min("offset").alias("min_off"), F.max("offset").alias("max_off"),
                     F.max("source_ts_ms").alias("max_ts"), F.first("row").alias("shape"),
                     F.collect_set("unavailable").alias("unavail"),
                     F.percentile_approx("source_ts_ms", [0.01, 0.5, 0.99], 500).alias("q"),
                     F.min("source_ts_ms").alias("min_ts"))
                .collect())
        ends: dict[TP, tuple[int, bool]] = {}
        tables: dict[str, TableBatch] = {}
        errors = records = 0
        for r in rows:
            tp = TP(r["topic"], r["partition"])
            if r["kind"] == KIND_END:
                prev = ends.get(tp)
                if prev is None or r["max_off"] > prev[0]:
                    ends[tp] = (r["max_off"], r["op"] == "eof")
                continue
            if r["kind"] == KIND_ERROR:
                errors += r["n"]
                records += r["n"]
                continue
            tb = tables.setdefault(r["table"], TableBatch(TableName.parse(r["table"])))
            if r["kind"] == KIND_SCHEMA:
                desc = orjson.loads(r["shape"])
                tb.shapes.setdefault(r["schema_id"], Shape(r["schema_id"], [tuple(c) for c in desc["columns"]],
                                                           desc["key"], desc["inferred"]))
            elif r["kind"] == KIND_CHANGE:
                records += r["n"]
                tb.count += r["n"]
                lo, hi = tb.tp_offsets.get(tp, (r["min_off"], r["max_off"]))
                tb.tp_offsets[tp] = (min(lo, r["min_off"]), max(hi, r["max_off"]))
                if r["max_ts"] is not None:
                    tb.max_source_ts = max(tb.max_source_ts or 0, r["max_ts"])
                for item in r["unavail"] or []:
                    tb.unavailable.update(orjson.loads(item))
        quantiles = _combine_quantiles([(r["n"], r["q"], r["min_ts"], r["max_ts"]) for r in rows
                                        if r["kind"] == KIND_CHANGE and r["q"] and r["q"][0] is not None])
        return ends, tables, errors, records, quantiles

    # -- writing ----------------------------------------------------------------------------
    def _stream_for(self, tb: TableBatch) -> StreamSettings:
        topic = next(iter(tb.tp_offsets)).topic if tb.tp_offsets else None
        stream = self.config.stream_for(topic) if topic else None
        return stream or self.config.streams[0]

    @staticmethod
    def _offset_filter(committed: dict[TP, int], tps: list[TP]) -> Column | None:
        """Rows at or past the table's committed offset for their partition (None when all are)."""
        return _per_partition({tp: committed[tp] for tp in tps if tp in committed}, lambda off, bound: off >= bound)

    def _prepare_table(self, tb: TableBatch, stream: StreamSettings) -> tuple[str, dict[str, str]]:
        """Create or evolve the table for this batch's shapes; return (ident, rejected reasons)."""
        ns, name = tb.name.namespace, tb.name.table
        ident = self.tables.ident(ns, name)
        shapes = list(tb.shapes.values())
        schema = self.tables.schema(ns, name)
        if schema is None:
            first_key = next((s.key for s in shapes if s.key), stream.key_columns)
            layout = self.config.layout_for(str(tb.name), stream)
            self.tables.create(ns, name, merged_columns(shapes), first_key if stream.mode == "upsert" else [], layout)
            schema = self.tables.schema(ns, name)
        result = reconcile(ident, schema, shapes)
        if result.rejected and stream.on_incompatible_type == "widen_to_string":
            keys = {k.lower() for s in shapes for k in s.key}
            columns = sorted({c for c in result.rejected_columns.values() if c.lower() not in keys})
            for column in columns:
                log.warning("table %s: widening column %s to string (on_incompatible_type=widen_to_string)",
                            tb.name, column)
                self.tables.apply(ns, name, widen_to_string_statements(ident, column, f"pre_string_{self.batch_id}"))
            if columns:
                result = reconcile(ident, self.tables.schema(ns, name, refresh=True), shapes)
        self.tables.apply(ns, name, result.statements)
        for sid, reason in result.rejected.items():
            log.warning("table %s: rejecting row shape %s: %s", tb.name, sid, reason)
        return ident, result.rejected

    def write_tables(self, decoded: DataFrame, ends: dict[TP, tuple[int, bool]],
                     tables: dict[str, TableBatch]) -> tuple[dict[str, str], list[tuple[DataFrame, str]]]:
        """Write every table of the batch; tables are independent, so several are written at once."""
        from concurrent.futures import ThreadPoolExecutor

        written: dict[str, str] = {}
        rejected_parts: list[tuple[DataFrame, str]] = []
        todo = [(name, tb) for name, tb in sorted(tables.items()) if tb.count > 0]
        workers = min(self.config.engine.table_write_parallelism, len(todo))
        for namespace in sorted({tb.name.namespace for _, tb in todo}):
            self.tables.ensure_namespace(namespace)  # once, before writers race to create it
        if workers <= 1:
            outcomes = [self._write_one_table(name, tb, decoded, ends) for name, tb in todo]
        else:
            # Each Python thread is pinned to its own JVM thread, which Iceberg's per-thread commit
            # properties rely on.
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="table-writer") as pool:
                outcomes = list(pool.map(lambda item: self._write_one_table(item[0], item[1], decoded, ends), todo))
        for (name, _), (kind, rejected) in zip(todo, outcomes):
            if kind is not None:
                written[name] = kind
            if rejected is not None:
                rejected_parts.append((rejected, name))
        return written, rejected_parts

    def _write_one_table(self, table_name: str, tb: TableBatch, decoded: DataFrame,
                         ends: dict[TP, tuple[int, bool]]) -> tuple[str | None, DataFrame | None]:
        """Prepare, filter and write one table; returns (write kind or None, rejected rows or None)."""
        from pyspark.sql import functions as F

        stream = self._stream_for(tb)
        ident, rejected = self._prepare_table(tb, stream)
        committed = self.offsets.load(ident)
        tps = sorted(tb.tp_offsets)
        pending = [tp for tp in tps if committed.get(tp, -1) <= tb.tp_offsets[tp][1]]
        if not pending:
            log.info("table %s already holds this batch's changes (restart replay); skipping", table_name)
            return None, None
        rows = decoded.where((F.col("kind") == KIND_CHANGE) & (F.col("table") == table_name))
        offset_filter = self._offset_filter(committed, tps)
        if offset_filter is not None:
            rows = rows.where(offset_filter)
        rejected_rows = None
        if rejected:
            bad = F.col("schema_id").isin(list(rejected))
            rejected_rows = rows.where(bad).withColumn("error", reason_column(rejected))
            rows = rows.where(~bad)
        consumed = {tp: ends[tp][0] for tp in tps if tp in ends}
        merged = self.offsets.merged_after_commit(ident, consumed)
        props = {OFFSETS_PROPERTY: encode_offsets(merged), PIPELINE_PROPERTY: self.config.name,
                 BATCH_PROPERTY: str(self.batch_id)}
        if tb.max_source_ts is not None:
            props[SOURCE_TS_PROPERTY] = str(tb.max_source_ts)
        partial_replay = any(tp in committed and committed[tp] > tb.tp_offsets[tp][0] for tp in tps)
        if (rejected or partial_replay) and rows.limit(1).count() == 0:
            # Nothing left to write: no empty commits. The offsets advance with the next real commit.
            return None, rejected_rows
        schema = self.tables.schema(tb.name.namespace, tb.name.table)
        empty = ident not in self._non_empty and current_summary(self.spark, ident).get("total-records", "0") == "0"
        incoming = sorted({c for s in tb.shapes.values() if s.schema_id not in rejected for c, _ in s.columns})
        write = TableWrite(
            ident=ident, mode=stream.mode, schema=schema,
            key_columns=(stream.key_columns or next((s.key for s in tb.shapes.values() if s.key), []))
            if stream.mode == "upsert" else ([stream.dedupe_field] if stream.dedupe_field else []),
            incoming_columns=incoming, unavailable_columns=tb.unavailable,
            table_empty=empty,
            dedupe=stream.mode == "append" and bool(stream.dedupe_field))
        kind = self._write_with_retry(write, rows, props, ident, merged)
        self._non_empty.add(ident)
        return kind, rejected_rows

    def _write_with_retry(self, write: TableWrite, rows: DataFrame, props: dict[str, str], ident: str,
                          merged: dict[TP, int], attempts: int = 5) -> str:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors.exceptions.captured import CapturedException

        for attempt in range(1, attempts + 1):
            try:
                kind = write_table(self.spark, write, rows, props)
                self.offsets.record(ident, merged)
                return kind
            except (Py4JJavaError, CapturedException) as exc:
                text = str(getattr(exc, "java_exception", exc)) + str(exc)
                if not any(marker in text for marker in _RETRYABLE) or attempt == attempts:
                    raise
                # The commit may have landed (state unknown) or lost a race with maintenance.
                if self.offsets.load(ident, refresh=True) == merged:
                    log.info("table %s: commit had landed despite %s", ident, text[:120])
                    self.offsets.record(ident, merged)
                    return "merge"
                log.warning("table %s: commit conflict (attempt %d/%d), retrying: %s", ident, attempt, attempts,
                            text[:200])
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")

    def write_dead_letters(self, decoded: DataFrame, ends: dict[TP, tuple[int, bool]], errors: int,
                           rejected_parts: list[tuple[DataFrame, str]]) -> int:
        from pyspark.sql import functions as F

        if errors == 0 and not rejected_parts:
            return 0
        if self._dead_letter_ident is None:
            self._dead_letter_ident = ensure_dead_letter_table(self.spark, self.config.catalog.name,
                                                               self.config.engine.dead_letter_table)
        ident = self._dead_letter_ident
        committed = self.offsets.load(ident)
        errs = decoded.where(F.col("kind") == KIND_ERROR)
        rejected = None
        for part, _ in rejected_parts:
            rejected = part if rejected is None else rejected.unionByName(part)
        rows = dead_letter_rows(errs, rejected, self.config.name)
        tps = sorted(ends)
        offset_filter = self._offset_filter(committed, tps)
        if offset_filter is not None:
            rows = rows.where(offset_filter)
        count = rows.count()
        if count == 0:
            return 0
        consumed = {tp: off for tp, (off, _) in ends.items()}
        merged = self.offsets.merged_after_commit(ident, consumed)
        props = {OFFSETS_PROPERTY: encode_offsets(merged), PIPELINE_PROPERTY: self.config.name,
                 BATCH_PROPERTY: str(self.batch_id)}
        write_dead_letters(self.spark, ident, rows, props, f"__ls_dead_letters_{self.batch_id}")
        self.offsets.record(ident, merged)
        log.warning("%d record(s) sent to the dead-letter table %s", count, self.config.engine.dead_letter_table)
        return count

    # -- the batch --------------------------------------------------------------------------
    def run_batch(self) -> BatchResult | None:
        """Plan, read, write, commit. None when there was nothing to read."""
        started = time.monotonic()
        ranges = self.plan_batch()
        if not ranges:
            return None
        self.batch_id += 1
        decoded = self.read_batch(ranges)
        try:
            ends, tables, errors, records, quantiles = self.summarize(decoded)
            read_seconds = time.monotonic() - started
            # Records past the observed end can only appear if a task is recomputed after more data
            # arrived; keep the batch exactly what the summary saw.
            decoded = decoded.where(self._within_ends(ends))
            written, rejected_parts = self.write_tables(decoded, ends, tables)
            dead = self.write_dead_letters(decoded, ends, errors, rejected_parts)
        finally:
            decoded.unpersist()
        commit_ts_ms = int(time.time() * 1000)
        advanced = sum(max(next_offset - self.positions.get(tp, 0), 0) for tp, (next_offset, _) in ends.items())
        for tp, (next_offset, at_end) in ends.items():
            self.positions[tp] = max(self.positions.get(tp, 0), next_offset)
            if at_end:
                self.maybe_more.discard(tp)
            else:
                self.maybe_more.add(tp)
        self.kafka.commit({tp: self.positions[tp] for tp in ends})
        lag = sum(max(high - self.positions.get(tp, high), 0) for tp, (_, high) in self.watermarks.items())
        return BatchResult(self.batch_id, records, sum(t.count for t in tables.values()), written, dead,
                           time.monotonic() - started, read_seconds, lag, commit_ts_ms, quantiles, advanced)

    @staticmethod
    def _within_ends(ends: dict[TP, tuple[int, bool]]) -> Column:
        from pyspark.sql import functions as F

        expr = _per_partition({tp: end for tp, (end, _) in ends.items()}, lambda off, bound: off < bound)
        return F.lit(True) if expr is None else expr | F.col("kind").isin(KIND_END, KIND_SCHEMA)



def _per_partition(bounds: dict[TP, int], keep: Callable[[Column, int], Column]) -> Column | None:
    """``keep(offset, bound)`` for rows of a partition in ``bounds``, true for other rows (None: no bounds)."""
    from pyspark.sql import functions as F

    expr = None
    for tp, bound in bounds.items():
        cond = (F.col("topic") == tp.topic) & (F.col("partition") == tp.partition)
        test = keep(F.col("offset"), bound)
        expr = F.when(cond, test) if expr is None else expr.when(cond, test)
    return None if expr is None else expr.otherwise(F.lit(True))


def _combine_quantiles(groups: list[tuple[int, list[float], int, int]]) -> list[float] | None:
    """[q01, q50, q99, min] of source times over all groups of (count, [q01, q50, q99], min, max)."""
    quantiles = mixture_quantiles(groups)
    return None if quantiles is None else quantiles + [float(min(g[2] for g in groups))]


def describe_batch(result: BatchResult) -> dict[str, Any]:
    """A JSON-able record of one batch (the metrics log line)."""
    return {"batch": result.batch_id, "records": result.records, "changes": result.changes, "tables": result.tables,
            "dead_letters": result.dead_letters, "seconds": round(result.seconds, 3),
            "read_seconds": round(result.read_seconds, 3), "lag": result.lag, "commit_ts_ms": result.commit_ts_ms,
            "source_ts_quantiles": result.source_ts_quantiles}
