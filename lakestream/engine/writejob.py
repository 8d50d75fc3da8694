"""The write job of a micro-batch: one Spark job whose tasks read their offset ranges, decode, convert
and write data files (`lakestream.sink.write.task`), returning small typed facts (`lakestream.sink.report`).

Also the driver-side runs of the same task: small parts of a batch being bisected, and the probe that
creates a batch's new tables from their first records before the job runs.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakestream.engine.registry import TableRegistry
from lakestream.errors import first_line, is_infrastructure_failure
from lakestream.routing import Router
from lakestream.sink.report import BatchReport
from lakestream.sink.write.task import WriteContext, run_write_task, topic_table
from lakestream.source.planner import OffsetRange, pack_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.config import PipelineConfig
    from lakestream.source.kafka import TP

log = logging.getLogger(__name__)

# Parts of a batch up to this many offsets are written in the driver while isolating a record.
ISOLATE_IN_DRIVER_MAX = 5000
PROBE_RECORDS = 16  # first records of a new table's partition that the driver decodes to create it


class WriteJob:
    """Runs the write task over offset ranges: as a Spark job, or in the driver for small parts."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: SparkSession,
        router: Router,
        registry: TableRegistry,
        schema_registry: dict[str, Any] | None,
        changed_keys: Callable[[], dict[str, list[str]]],
    ):
        self.config = config
        self.spark = spark
        self.router = router
        self.registry = registry
        self.schema_registry = schema_registry
        self.changed_keys = changed_keys  # input table → columns the tasks report per change (derived tables)
        self.record_hook: Any = None  # passed to the write tasks (WriteContext.record_hook)

    def write_context(self, only_tables: frozenset[str] | None = None, copy_specs: bool = False) -> WriteContext:
        """What the write tasks get: specs (copies, for a job that runs while the originals change),
        transforms, reference data and the key columns derived tables need reported."""
        specs = (
            {name: copy.copy(spec) for name, spec in self.registry.specs.items()}
            if copy_specs
            else dict(self.registry.specs)
        )
        return WriteContext(
            self.config.kafka.consumer_config(),
            self.router,
            specs,
            only_tables,
            self.record_hook,
            derived=dict(self.registry.derived),
            schema_registry=self.schema_registry,
            references=dict(self.registry.reference_data),
            changed_keys=self.changed_keys(),
            held_outputs=frozenset(self.registry.cadence.intervals),
        )

    def run(
        self,
        ranges: list[OffsetRange],
        only_tables: frozenset[str] | None = None,
        into: BatchReport | None = None,
        ctx: WriteContext | None = None,
    ) -> BatchReport:
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

    def run_part(self, ranges: list[OffsetRange], only_tables: frozenset[str] | None, into: BatchReport) -> BatchReport:
        """A part of a batch being bisected: small parts run the write task right here in the driver
        (a Spark job per probe costs seconds), large ones as a Spark job."""
        import pyarrow as pa

        if sum(r.size for r in ranges) > ISOLATE_IN_DRIVER_MAX:
            return self.run(ranges, only_tables, into=into)
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
            if table is not None and table not in self.registry.specs:
                probes.setdefault(table, []).append(
                    OffsetRange(r.topic, r.partition, r.start, r.end, min(r.limit, PROBE_RECORDS), r.known_end)
                )
        if not probes:
            return
        ctx = self.write_context(frozenset(probes), copy_specs=True)
        # A probe reads a few records: small fetches, not the job's 64 MB ones.
        ctx.consumer_conf = ctx.consumer_conf | {
            "fetch.max.bytes": 1 << 20,
            "max.partition.fetch.bytes": 1 << 18,
            "queued.min.messages": PROBE_RECORDS,
            "queued.max.messages.kbytes": 1024,
        }
        started = time.monotonic()
        try:
            report = BatchReport()
            batches = list(run_write_task([r for rs in probes.values() for r in rs], ctx))
            if batches:
                report.add(pa.Table.from_batches(batches))
        except Exception as exc:  # noqa: BLE001 — the job reads these records again and reports what is wrong
            if is_infrastructure_failure(exc):
                raise
            log.info("probing new tables failed (%s); their job reports their shapes", first_line(exc))
            return
        shapes = {name: list(tr.shapes.values()) for name, tr in report.tables.items() if tr.shapes}
        if shapes:
            self.registry.prepare_tables(shapes)
            log.info(
                "prepared %d new table(s) from their first records in %.2fs", len(shapes), time.monotonic() - started
            )
