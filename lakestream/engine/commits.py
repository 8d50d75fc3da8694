"""The commits of a micro-batch: each table's data files and deletion vectors with the offsets it consumed,
in one snapshot per table (`lakestream.sink.commit.tables.write_table`), retried on commit conflicts, in the
order the stages declare, with the tables that commit at their own cadence held until due.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from lakestream.config import PipelineConfig
from lakestream.engine.isolation import Isolator, without
from lakestream.engine.registry import TableRegistry
from lakestream.errors import classify_failure, conflict_cause, first_line, is_infrastructure_failure
from lakestream.faults import pause_point
from lakestream.identifiers import TableName
from lakestream.laps import Laps
from lakestream.process.stage import commit_phases
from lakestream.sink.commit.offsets import TableOffsets, commit_properties
from lakestream.sink.commit.rewrites import commit_rewrite
from lakestream.sink.commit.tables import StaleIndex, TableCommit, TableWrite, write_table
from lakestream.sink.report import BatchReport, TableReport
from lakestream.sink.write.files import delete_quietly
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange

if TYPE_CHECKING:
    from lakestream.maintenance.actions import MaintenanceResult
    from lakestream.maintenance.compaction import PreparedRewrite

log = logging.getLogger(__name__)

T = TypeVar("T")

# Attempts of one table commit or one compaction commit. A retry follows a commit of another writer (a
# compaction, maintenance, a second pipeline) or a key index behind its table: the index is refreshed by diff and
# the deletes planned again, which is cheap, so a few quick retries (0.2 s, 0.4 s, ... apart) outlast a burst of
# concurrent commits. Past five the contention is no burst: the batch fails and the loop retries it (a compaction
# is reported as not committed), rather than spin.
COMMIT_ATTEMPTS = 5


class Committer:
    """Commits the tables of each batch; records the conflicts it met and the attempts it repeated."""

    def __init__(
        self,
        config: PipelineConfig,
        registry: TableRegistry,
        offsets: TableOffsets,
        isolator: Isolator,
        reads: Callable[[], dict[str, set[str]]],
        batch_id: Callable[[], int],
        clock: Callable[[], float],
    ):
        self.config = config
        self.registry = registry
        self.offsets = offsets
        self.isolator = isolator
        self.reads = reads  # table → the tables it is computed from (it commits before them)
        self.batch_id = batch_id
        self.clock = clock
        self.spark = registry.spark
        # Commit conflicts of the batch in flight, (table, cause), and the tables of the attempts they
        # made repeat; appended from the commit threads (list.append is atomic).
        self.conflicts: list[tuple[str, str]] = []
        self.retries: list[str] = []

    def retrying(
        self,
        name: str,
        commit: Callable[[TableWrite], T],
        settle: Callable[[TableWrite, str], T | None] | None = None,
        record: bool = True,
    ) -> T:
        """``commit`` of table ``name`` on a fresh view of it (its index refreshed), up to `COMMIT_ATTEMPTS` times:
        a `StaleIndex` (another writer committed since the index's snapshot) or a commit conflict is retried,
        anything else raised. ``settle`` may end a conflict with a result (the commit had landed after all).
        ``record``: the conflicts and repeated attempts count in the batch's result."""
        spec = self.registry.specs[name]
        table = TableName.parse(name)
        ident = self.registry.catalog.ident(table.namespace, table.table)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            write = TableWrite(ident, self.config.catalog.name, table, spec, self.registry.fresh_index(name, ident))
            try:
                return commit(write)
            except StaleIndex as exc:
                failure: Exception = exc
                cause, text = "stale_index", str(exc)
            except Exception as exc:  # noqa: BLE001 — classified by Java class below
                found = conflict_cause(exc)
                if found is None:
                    raise
                failure, cause, text = exc, found, first_line(exc)
            if record:
                self.conflicts.append((name, cause))
            if attempt == COMMIT_ATTEMPTS:
                raise failure
            if cause == "stale_index":
                log.info("table %s: %s; refreshing the key index", name, text)
            else:
                settled = settle(write, text) if settle is not None else None
                if settled is not None:
                    return settled
                log.warning(
                    "table %s: commit conflict (attempt %d/%d), re-planning deletes: %s",
                    name,
                    attempt,
                    COMMIT_ATTEMPTS,
                    text[:200],
                )
                if write.index is not None:
                    write.index.valid = False
            if record:
                self.retries.append(name)
            if cause != "stale_index":
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")

    def start_batch(self) -> None:
        self.conflicts, self.retries = [], []

    def commit_table(self, name: str, changes: TableReport, ends: dict[TP, int]) -> TableCommit | None:
        spec = self.registry.specs[name]
        table = TableName.parse(name)
        ident = self.registry.catalog.ident(table.namespace, table.table)
        consumed = {tp: ends[tp] for tp in changes.tp_offsets() if tp in ends}
        merged = self.offsets.merged_after_commit(ident, consumed)
        props = commit_properties(merged, self.config.name, self.batch_id(), changes.max_source_ts)
        if not changes.files and not changes.locations and not changes.truncates:
            return None  # nothing left to write (all dead letters): the offsets advance with the next commit
        laps = Laps()

        def commit(write: TableWrite) -> TableCommit:
            laps.lap("fresh_index")
            pause_point("commit.table.before")
            return write_table(self.spark, write, changes, props)

        def landed(write: TableWrite, text: str) -> TableCommit | None:
            if self.offsets.load(ident, refresh=True) != merged:
                return None
            log.info("table %s: commit had landed despite %s", name, text[:120])
            if write.index is not None:
                write.index.valid = False
            return TableCommit("upsert" if spec.mode == "upsert" else "append", changes.count)

        done = self.retrying(name, commit, settle=landed)
        laps.lap("write")
        pause_point("commit.table.landed")
        self.registry.persist_index(name)  # durable with the commit (a death before this: refreshed by diff)
        laps.lap("persist_index")
        pause_point("commit.table.after")
        self.offsets.record(ident, merged)
        spec.committed = dict(merged)
        return dataclasses.replace(
            done,
            source_ts_ms=changes.max_source_ts,
            timings_ms={**laps.ms, **{f"write.{k}": v for k, v in done.timings_ms.items()}},
        )

    def commit_tables(self, report: BatchReport, ranges: list[OffsetRange] | None = None) -> dict[str, TableCommit]:
        """Commit every table of the batch; tables are independent, so several commit at once. With
        the batch's ``ranges``, a table whose commit fails for a reason other than infrastructure is
        written and committed again in halves of the ranges until the record that fails it is alone.
        A table with a cadence of its own (`lakestream.engine.cadence`) adds its part to what it holds,
        and commits all it holds when its interval is due."""
        ends = {tp: end.next_offset for tp, end in report.ends.items()}
        closed = (
            None
            if ranges is None
            else [
                OffsetRange(r.topic, r.partition, r.start, min(ends[r.tp], r.end or ends[r.tp]), r.limit)
                for r in ranges
                if r.tp in ends
            ]
        )
        now = self.clock()
        todo: list[tuple[str, TableReport, dict[TP, int], list[OffsetRange] | None]] = []
        hold: list[tuple[str, TableReport]] = []
        for name, tr in sorted(report.tables.items()):
            if tr.count <= 0:
                continue
            if not self.registry.cadence.holds(name):
                todo.append((name, tr, ends, closed))
            elif self.registry.cadence.due(name, now):
                self.registry.cadence.add(name, tr, ends, closed or [], now)
            else:
                hold.append((name, tr))
        todo += self.due_held(now, force=False)

        def commit(
            name: str, tr: TableReport, ends: dict[TP, int], closed: list[OffsetRange] | None
        ) -> TableCommit | None:
            try:
                return self.commit_table(name, tr, ends)
            except Exception as exc:  # noqa: BLE001 — classified just below
                if closed is None or is_infrastructure_failure(exc):
                    raise
                log.warning(
                    "table %s: commit failed, isolating the record(s) that make it fail: %s", name, first_line(exc)
                )
                delete_quietly([f.path for f in tr.files])
                fed = set(tr.tp_offsets())
                return self.isolator.bisect_commit(
                    name,
                    [r for r in without(closed, self.isolator.culprits) if r.tp in fed],
                    report,
                    exc,
                    self.commit_table,
                )

        # Tables commit before the tables they read (alerts before their rule's source, transform outputs before
        # their input): a restart reads from the input's offsets, which are then never past a reader's (each
        # skips what it already holds), and a rule's source (its state) never holds records whose alerts were
        # not committed. The order is derived from what the stages declare (`lakestream.process.stage`).
        by_name = {item[0]: item for item in todo}
        phases = [
            [by_name[name] for name in phase] for phase in commit_phases([item[0] for item in todo], self.reads())
        ]
        done: dict[str, TableCommit] = {}
        for phase in phases:
            workers = min(self.config.engine.table_write_parallelism, len(phase))
            if workers <= 1:
                kinds = [commit(*item) for item in phase]
            else:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="table-commit") as pool:
                    kinds = list(pool.map(lambda item: commit(*item), phase))
            done.update({item[0]: kind for item, kind in zip(phase, kinds, strict=True) if kind is not None})
        # Held only now that every commit before them succeeded: what a table holds is always safe to
        # commit (for a rule's source: the alerts of its records are committed).
        for name, tr in hold:
            self.registry.cadence.add(name, tr, ends, closed or [], now)
        return done

    def due_held(
        self, now: float, force: bool
    ) -> list[tuple[str, TableReport, dict[TP, int], list[OffsetRange] | None]]:
        """The held tables whose interval is due (all of them with ``force``), taken for their commit."""
        out: list[tuple[str, TableReport, dict[TP, int], list[OffsetRange] | None]] = []
        for name in sorted(self.registry.cadence.held) if force else self.registry.cadence.due_tables(now):
            held = self.registry.cadence.take(name, now)
            if held is not None and held.report.count > 0:
                out.append((name, held.report, held.ends, held.ranges))
        return out

    def commit_held(self, force: bool = False) -> dict[str, TableCommit]:
        """Commit the held tables that are due (all with ``force``), outside a batch: while the stream is
        idle, and at close."""
        done: dict[str, TableCommit] = {}
        for name, tr, ends, _ in self.due_held(self.clock(), force):
            kind = self.commit_table(name, tr, ends)
            if kind is not None:
                done[name] = kind
        if done:
            log.info("committed held file(s) of %s", ", ".join(f"{n} ({c.changes:,} rows)" for n, c in done.items()))
        return done

    def commit_compaction(self, prepared: PreparedRewrite) -> MaintenanceResult:
        """Commit a compaction written beside ingestion (`lakestream.maintenance.compaction`), between two
        batches: the deletes since its start carried onto the new files, the key index moved with the rows
        and made durable. A failure is reported, never raised, unless the process cannot go on."""
        name = prepared.table
        result = prepared.result
        started = time.monotonic()
        try:
            done = self.retrying(name, lambda write: commit_rewrite(self.spark, write, prepared.groups), record=False)
        except Exception as exc:  # noqa: BLE001 — maintenance never stops ingestion, unless nothing can go on
            if classify_failure(exc).kind in ("fatal", "config"):
                raise
            # The new files stay until orphan removal: whether a failed commit landed is not always known.
            result.status = "conflict" if isinstance(exc, StaleIndex) or conflict_cause(exc) else "failed"
            result.error = first_line(exc, 300)
            result.seconds = time.monotonic() - started
            log.warning("compaction of %s not committed: %s", name, result.error)
            return result
        if done.snapshot_id is not None:
            pause_point("maintenance.commit.landed")
        persist_started = time.monotonic()
        self.registry.persist_index(name)
        done.timings_s["persist_index"] = round(time.monotonic() - persist_started, 3)
        if done.snapshot_id is not None:
            pause_point("maintenance.commit.after")
        result.seconds = time.monotonic() - started  # the commit's own time; the rewrite's is in detail
        result.files_after = done.files_added
        result.bytes_after = (
            sum(g.output["file_size"] for g in prepared.groups if g.output is not None)
            if not done.dropped_groups
            else None
        )
        result.files_before = done.files_removed
        result.detail.update(
            {
                "snapshot_id": done.snapshot_id,
                "rows_moved": done.rows_moved,
                "deletes_carried": done.deletes_carried,
                "groups_dropped": done.dropped_groups,
                "waited_s": round(started - prepared.started, 3),
                "timings_s": done.timings_s,
            }
        )
        if done.snapshot_id is None:
            result.status = "conflict"
            result.error = "every group's inputs changed under the rewrite"
        log.info("%s", result.describe())
        return result
