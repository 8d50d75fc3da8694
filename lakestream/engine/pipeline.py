"""The micro-batch engine: plan offset ranges → read and write them in one Spark job → commit each
table's files with its offsets in one snapshot → advance the consumer group.

One `Pipeline.run_batch()` call is one micro-batch; `lakestream.engine.loop` repeats it. This module is
the wiring; each job has its own home:

- `positions`: where each partition is read from, and the plan of a batch;
- `writejob`: the Spark job whose tasks read, decode, convert and write (`lakestream.sink.write.task`);
- `isolation`: bisecting around a record that makes a write or a commit fail;
- `registry`: the tables' specs, key indexes, transforms, and their creation and evolution;
- `commits`: each table's commit with its offsets, retries, commit order and held tables;
- `prefetch`: the next batch's job, started while this one commits;
- `lakestream.sink.deadletters.table`: the dead-letter table; `lakestream.process.stage`: the stages' contract;
- `result`: what a batch did (`BatchResult`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig
from lakestream.engine.commits import Committer
from lakestream.engine.isolation import Isolator
from lakestream.engine.positions import Positions
from lakestream.engine.prefetch import Prefetch
from lakestream.engine.registry import TableRegistry
from lakestream.engine.result import BatchResult, combine_quantiles
from lakestream.engine.writejob import WriteJob
from lakestream.errors import LakestreamError, first_line
from lakestream.faults import pause_point
from lakestream.laps import Laps
from lakestream.process.alerts import AlertStage
from lakestream.process.materialize import MaterializeStage
from lakestream.process.stage import Stage, StageContext
from lakestream.process.windows import WindowStage
from lakestream.routing import Router
from lakestream.sink.catalog.schema import TableManager
from lakestream.sink.commit.offsets import BATCH_PROPERTY, PIPELINE_PROPERTY, TableOffsets
from lakestream.sink.deadletters.table import DeadLetterWriter
from lakestream.sink.report import BatchReport, TableReport
from lakestream.sink.write.files import delete_quietly
from lakestream.source.kafka import KafkaCluster
from lakestream.source.planner import OffsetRange

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Pipeline:
    """A running pipeline: its positions, tables, write job, committer and stages, and the Kafka client."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None, last_batch_id: int = 0):
        from lakestream.runtime.spark import session_for

        self.config = config
        # Kafka first: a client the broker refuses (credentials, TLS trust) stops the run before Spark starts.
        self.kafka = KafkaCluster(config.kafka)
        self.spark = spark or session_for(config, pipeline=True)
        self.router = Router.from_config(config)
        registry = config.kafka.schema_registry
        # Resolved here (secrets from the environment): a missing variable fails the start, not a task.
        self.schema_registry = registry.client_config() if registry is not None else None
        self.tables = TableManager(self.spark, config.catalog.name)
        self.offsets = TableOffsets(self.spark)
        self.clock = time.monotonic  # when streams come due (replaceable in tests)
        self.registry = TableRegistry(config, self.spark, self.tables, self.offsets, batch_id=lambda: self.batch_id)
        self.context = StageContext(config, self.spark, self.tables, self.registry, self.offsets)
        # Batch ids continue from what the tables hold (and from the previous Pipeline after a failed
        # batch), so the snapshot property and the metrics log never repeat a number. Read at the first
        # batch, not here: a catalog that is down then fails that batch, which the loop retries.
        self.batch_id = last_batch_id
        self._batch_id_recovered = False
        self.alerts = AlertStage(self.context) if config.rules else None
        self.windows = WindowStage(self.context) if config.windows else None
        self.materialize = MaterializeStage(self.context) if config.derived_tables else None
        self.stages: list[Stage] = [s for s in (self.alerts, self.windows, self.materialize) if s is not None]
        self.positions = Positions(
            config,
            self.kafka,
            self.router,
            self.registry,
            self.offsets,
            self.spark.sparkContext.defaultParallelism,
            lambda: self.clock(),
        )
        self.job = WriteJob(
            config,
            self.spark,
            self.router,
            self.registry,
            self.schema_registry,
            lambda: self.materialize.reported_columns() if self.materialize is not None else {},
        )
        self.isolator = Isolator(self.job)
        self.committer = Committer(
            config, self.registry, self.offsets, self.isolator, self.reads, lambda: self.batch_id, lambda: self.clock()
        )
        self.dead_letters = DeadLetterWriter(
            self.spark,
            config.catalog.name,
            config.engine.dead_letter_table,
            config.name,
            self.offsets,
            self.context.commit_properties,
        )
        self.prefetch = Prefetch(config, self.positions, self.registry, self.job)
        self._in_batch = False  # a batch started and did not finish (then close() commits nothing held)

    # The parts tests and tools reach through the pipeline.
    @property
    def batch_id(self) -> int:
        return self.context.batch_id

    @batch_id.setter
    def batch_id(self, value: int) -> None:
        self.context.batch_id = value

    @property
    def specs(self) -> dict[str, Any]:
        return self.registry.specs

    @property
    def indexes(self) -> dict[str, Any]:
        return self.registry.indexes

    @property
    def references(self) -> Any:
        return self.registry.references

    @property
    def record_hook(self) -> Any:
        return self.job.record_hook

    @record_hook.setter
    def record_hook(self, hook: Any) -> None:
        self.job.record_hook = hook

    @property
    def isolations(self) -> int:
        return self.isolator.isolations

    def prepare_table(self, *args: Any, **kwargs: Any) -> None:
        self.registry.prepare_table(*args, **kwargs)

    def refresh_references(self) -> None:
        self.registry.refresh_references()

    def compacted_here(self) -> dict[str, Any]:
        """The tables whose compaction this pipeline commits itself (`commit_compactions`): its upsert mirrors
        with a key index; their specs."""
        indexes = self.registry.indexes
        return {
            name: spec
            for name, spec in self.registry.specs.items()
            if spec.kind == "mirror" and name in indexes and indexes[name].keyed
        }

    def commit_compactions(self, prepared: list[Any]) -> list[Any]:
        """Commit compactions written beside the batches (`lakestream.maintenance.compaction`), one by one."""
        return [self.committer.commit_compaction(p) for p in prepared if p.table in self.registry.specs]

    def reads(self) -> dict[str, set[str]]:
        """Each table computed from others in this pipeline → those tables (it commits before them)."""
        reads: dict[str, set[str]] = {}
        for name, derived in self.registry.derived.items():
            for d in derived:
                reads.setdefault(d.table, set()).add(name)
        for stage in self.stages:
            for table, sources in stage.reads().items():
                reads.setdefault(table, set()).update(sources)
        return reads

    def close(self) -> None:
        self.prefetch.close()
        if self.registry.cadence.held and not self._in_batch:
            try:
                self.committer.commit_held(force=True)
            except Exception as exc:  # noqa: BLE001 — nothing is lost: a restart reads them again
                log.warning(
                    "could not commit the held files of %s at close (%s); the next start writes them again",
                    ", ".join(sorted(self.registry.cadence.held)),
                    first_line(exc),
                )
        if self.materialize is not None:
            self.materialize.close()
        self.kafka.close()
        if self.alerts is not None:
            self.alerts.close()
        self.registry.save_indexes()

    def recover_batch_id(self) -> int:
        """The highest ``lakestream.batch-id`` this pipeline committed to any table it writes (0 if none)."""
        from lakestream.runtime.spark import jvm_helper

        helper = jvm_helper(self.spark)
        namespaces = {s.namespace for s in self.config.streams} | {self.config.engine.dead_letter_table.split(".")[0]}
        found = [
            helper.maxSummaryLong(
                self.spark._jsparkSession,
                self.config.catalog.name,
                ns,
                BATCH_PROPERTY,
                PIPELINE_PROPERTY,
                self.config.name,
            )
            for ns in sorted(namespaces)
        ]
        return int(max([0, *found]))

    # -- the batch --------------------------------------------------------------------------
    def run_batch(self) -> BatchResult | None:
        """Plan, read and write, commit, advance. None when there was nothing to read."""
        started = time.monotonic()
        laps = Laps()
        self._in_batch = True
        ranges, report, overlapped = self._plan()
        laps.lap("plan")
        if not ranges:
            self._idle()
            self._in_batch = False
            return None
        self._next_batch_id()
        isolations_before = self.isolator.isolations
        if report is None:  # a prefetched job refreshed the references just before it started
            self.registry.refresh_references()
            self.job.prepare_new_tables(ranges)
            report = self.isolator.write(ranges, self.positions.watermarks)
        jobs = self._write_new_shapes(ranges, report)
        laps.lap("write_job")
        self.prefetch.start(report, started)  # plans without touching the positions' watermarks
        laps.lap("next_job")
        # The job's dead letters commit before any table: the restart reads from the tables' offsets, so after a
        # crash between a table's commit and theirs they would be lost. A crash before the tables commit reads
        # their records again, and the dead-letter table's own offsets leave the second copies out.
        early = len(report.dead_letters)
        dead = self.dead_letters.write(report)
        self._run_stages("before_commits", report)
        read_seconds = time.monotonic() - started
        laps.lap("dead_letters")
        committed = self.committer.commit_tables(report, ranges)
        laps.lap("commit_tables")
        self._run_stages("after_commits", report)
        # Dead letters that came up since (late window readings, records a failing commit isolated): new in this
        # batch, so not left out by the offsets the first write stored.
        for kind, n in self.dead_letters.write(report, first=early).items():
            dead[kind] = dead.get(kind, 0) + n
        commit_ts_ms = int(time.time() * 1000)
        advanced = self._advance(report)
        laps.lap("advance")
        self._in_batch = False
        return self._result(
            report,
            committed,
            dead,
            started,
            read_seconds,
            commit_ts_ms,
            advanced,
            jobs,
            isolations_before,
            overlapped,
            laps.ms,
        )

    def _plan(self) -> tuple[list[OffsetRange], BatchReport | None, bool]:
        """This batch's ranges, and its report when its job already ran during the last commit."""
        prefetched = self.prefetch.take()
        if prefetched is not None:
            ranges, report = prefetched
            return ranges, report, report is not None
        return self.positions.plan_batch(), None, False

    def _idle(self) -> None:
        """Nothing to read: commit what is due by time alone."""
        if self.registry.cadence.held:
            self.committer.commit_held()  # tables whose own interval passed while their stream was idle
        for stage in self.stages:
            stage.idle()  # e.g. derived tables whose commit interval passed while idle

    def _next_batch_id(self) -> None:
        if not self._batch_id_recovered:
            self.batch_id = max(self.batch_id, self.recover_batch_id())
            self.dead_letters.prepare()
            self._batch_id_recovered = True
        self.batch_id += 1
        self.isolator.culprits = set()
        self.committer.start_batch()

    def _write_new_shapes(self, ranges: list[OffsetRange], report: BatchReport) -> int:
        """Tables met with a shape they were not prepared for: create or evolve them, drop what the first
        job wrote for them, and write them again over exactly the same records. The number of jobs run."""
        new_shapes = {name: list(tr.shapes.values()) for name, tr in report.tables.items() if tr.shapes}
        if not new_shapes:
            return 1
        self.registry.prepare_tables(new_shapes)
        discarded = [f.path for name in new_shapes for f in report.tables[name].files]
        for name in new_shapes:
            report.tables.pop(name)
        delete_quietly(discarded)
        # The same task split, every range closed where the first job stopped reading.
        closed = [
            OffsetRange(
                r.topic,
                r.partition,
                r.start,
                min(r.end, report.ends[r.tp].next_offset) if r.end is not None else report.ends[r.tp].next_offset,
                r.limit,
            )
            for r in ranges
            if r.tp in report.ends
        ]
        outputs = {d.table for name in new_shapes for d in self.registry.derived.get(name, ())}
        for name in outputs:
            delete_quietly([f.path for f in report.tables.pop(name, TableReport(name)).files])
        second = self.isolator.write(
            [r for r in closed if r.end is not None and r.end > r.start],
            self.positions.watermarks,
            frozenset(new_shapes) | outputs,
        )
        for name, tr in second.tables.items():
            if tr.shapes:
                raise LakestreamError(
                    f"table {name}: shapes still unprepared after preparing them: {sorted(tr.shapes)}"
                )
            report.tables[name] = tr
        report.dead_letters.extend(second.dead_letters)
        return 2

    def _run_stages(self, when: str, report: BatchReport) -> None:
        for stage in self.stages:
            if stage.when == when:
                stage.run(report, bool(self.isolator.culprits))

    def _advance(self, report: BatchReport) -> int:
        """Move the positions past the batch and commit the consumer group (a lower bound of every table's
        offsets, held tables included); the offsets advanced."""
        advanced = self.positions.advance(report)
        pause_point("commit.group.before")
        cadence = self.registry.cadence
        floor = cadence.floor({t: self.registry.specs[t].committed for t in cadence.held}) if cadence.held else {}
        positions = self.positions.positions
        self.kafka.commit({tp: min(positions[tp], floor.get(tp, positions[tp])) for tp in report.ends})
        return advanced

    def _result(
        self,
        report: BatchReport,
        committed: dict[str, Any],
        dead: dict[str, int],
        started: float,
        read_seconds: float,
        commit_ts_ms: int,
        advanced: int,
        jobs: int,
        isolations_before: int,
        overlapped: bool,
        steps_ms: dict[str, float],
    ) -> BatchResult:
        changes = sum(tr.count for tr in report.tables.values())
        groups = [
            (s.count, s.source_ts_q, s.source_ts_min, s.source_ts_max)
            for tr in report.tables.values()
            for s in tr.stats
            if s.source_ts_q and s.source_ts_min is not None and s.source_ts_max is not None
        ]
        retries: dict[str, int] = {}
        for name in self.committer.retries:
            retries[name] = retries.get(name, 0) + 1
        return BatchResult(
            self.batch_id,
            changes + len(report.dead_letters),
            changes,
            {n: c.kind for n, c in committed.items()},
            sum(dead.values()),
            time.monotonic() - started,
            read_seconds,
            self.positions.lag(),
            commit_ts_ms,
            combine_quantiles(groups),
            advanced,
            jobs,
            table_records={name: tr.count for name, tr in report.tables.items() if tr.count},
            table_changes={n: c.changes for n, c in committed.items()},
            table_source_ts_ms={n: c.source_ts_ms for n, c in committed.items() if c.source_ts_ms is not None},
            table_lag=self.positions.table_lag(),
            dead_letter_kinds=dead,
            commit_conflicts=list(self.committer.conflicts),
            commit_retries=retries,
            isolated=self.isolator.isolations - isolations_before,
            skipped=dict(report.skipped),
            truncated=sorted(n for n, tr in report.tables.items() if tr.truncates and n in committed),
            overlapped=overlapped,
            held=self.registry.cadence.records(),
            steps_ms=steps_ms,
            table_steps_ms={n: c.timings_ms for n, c in committed.items() if c.timings_ms},
        )
