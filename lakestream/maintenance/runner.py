"""One maintenance round over the catalog's tables, a `--watch` loop, and the engine's inline hook.

Order within a table: compact cold partitions → rewrite position deletes → rewrite manifests → expire
snapshots → trim the metadata log → remove orphans, so that expiry sees the snapshots compaction just
replaced and the trim deletes the metadata files written before expiry.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lakestream.beside import BACKGROUND_NICE, lower_jit_compilers, release_slot, take_slot
from lakestream.config import PipelineConfig
from lakestream.errors import first_line
from lakestream.faults import pause_point
from lakestream.maintenance.actions import (
    MaintenanceResult,
    compact_cold_partitions,
    expire_snapshots,
    remove_orphan_files,
    rewrite_manifests,
    rewrite_position_deletes,
    trim_metadata_log,
)
from lakestream.maintenance.history import read_maintenance_log, record_maintenance
from lakestream.maintenance.policy import MaintenancePlan, plan_maintenance
from lakestream.maintenance.settle import Settling, steady_batch_s
from lakestream.read.inspection import collect_table_metrics, format_bytes, list_tables, load_java_table
from lakestream.runtime.spark import jvm_pid

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.maintenance.compaction import PreparedRewrite
    from lakestream.sink.spec import TableSpec

log = logging.getLogger(__name__)


# The Spark scheduler pool of the rounds that run beside ingestion (`spark.scheduler.mode` is FAIR).
MAINTENANCE_POOL = "maintenance"

# A policy matching every table names none: inline maintenance keeps to the pipeline's own tables under it.
_MATCH_ALL = {".*", ".+", "(.*)", "^.*$"}


def select_tables(
    spark: SparkSession, config: PipelineConfig, tables: list[str] | None = None, own: set[str] | None = None
) -> list[str]:
    """``tables`` if given; else with ``own`` (the tables a pipeline writes, for its inline maintenance)
    those, plus the catalog tables an enabled policy names explicitly (a ``tables`` pattern other than
    match-all); else every catalog table whose policy is enabled."""
    if tables:
        names = list(tables)
    elif own is not None:
        names = sorted(own)
        explicit = [p for p in config.maintenance.policies if p.enabled and p.tables.strip() not in _MATCH_ALL]
        if explicit:
            names += [
                n
                for n in list_tables(spark, config.catalog.name)
                if n not in own and any(re.fullmatch(p.tables, n) for p in explicit)
            ]
    else:
        names = list_tables(spark, config.catalog.name)
    return [n for n in names if config.maintenance.policy_for(n).enabled]


def plan_table(spark: SparkSession, config: PipelineConfig, name: str, now_ms: int | None = None) -> MaintenancePlan:
    """The plan one round would carry out on ``name`` (nothing is changed)."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    policy = config.maintenance.policy_for(name)
    metrics = collect_table_metrics(spark, config.catalog.name, name, policy, now_ms=now_ms, for_plan=True)
    return plan_maintenance(metrics, policy, now_ms)


def maintain_table(
    spark: SparkSession,
    config: PipelineConfig,
    name: str,
    dry_run: bool = False,
    remove_orphans: bool = True,
    now_ms: int | None = None,
    rewrite_spec: TableSpec | None = None,
    hand_over: Callable[[PreparedRewrite], None] | None = None,
) -> list[MaintenanceResult]:
    """Plan and run one round of maintenance on one table.

    With ``rewrite_spec`` (an upsert mirror of the pipeline running this round) compaction is written here
    and given to ``hand_over`` as soon as it is, for the pipeline to commit between its batches
    (`lakestream.maintenance.compaction`), hot partitions included."""
    catalog = config.catalog.name
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    policy = config.maintenance.policy_for(name)
    metrics = collect_table_metrics(spark, catalog, name, policy, now_ms=now_ms, for_plan=True)
    plan = plan_maintenance(metrics, policy, now_ms)
    for reason in plan.reasons:
        log.info("%s: %s", name, reason)
    amplification = metrics.write_amplification()
    if amplification["rewritten_bytes"]:
        log.info(
            "%s: compactions wrote %s against %s added by its writers over the last %.0fs (write amplification %s)",
            name,
            format_bytes(amplification["rewritten_bytes"]),
            format_bytes(amplification["ingested_bytes"]),
            amplification["window_s"],
            "-" if amplification["ratio"] is None else f"{amplification['ratio']:g}×",
        )
    jtable = load_java_table(spark, catalog, name)
    results: list[MaintenanceResult] = []
    if rewrite_spec is not None and hand_over is not None and not dry_run:
        if plan.compact or plan.hot_skipped:
            written = write_compaction(
                spark, catalog, name, plan.compact + plan.hot_skipped, policy, rewrite_spec, jtable
            )
            if written is not None:
                written.result.detail["write_amplification_1h"] = amplification
                hand_over(written)  # committed by the pipeline while the round goes on
                results.append(
                    dataclasses.replace(written.result, status="written", detail=dict(written.result.detail))
                )
    elif plan.compact:
        results.append(
            compact_cold_partitions(
                spark, catalog, name, jtable, plan.compact, policy, sort=metrics.has_sort_order, dry_run=dry_run
            )
        )
    if plan.rewrite_deletes:
        results.append(rewrite_position_deletes(spark, catalog, name, metrics.delete_files, dry_run=dry_run))
    if plan.rewrite_manifests:
        results.append(rewrite_manifests(spark, catalog, name, metrics.manifests, dry_run=dry_run))
    if plan.expire:
        results.append(
            expire_snapshots(
                spark,
                catalog,
                name,
                plan.expire_older_than_ms,
                plan.retain_last,
                metrics.snapshots,
                protected_snapshot_id=plan.protected_snapshot_id,
                dry_run=dry_run,
            )
        )
    if plan.trim_metadata:
        results.append(
            trim_metadata_log(spark, catalog, name, jtable, policy.metadata_previous_versions, dry_run=dry_run)
        )
    if remove_orphans:
        # A dry run still lists orphan candidates: listing changes nothing.
        results.append(
            remove_orphan_files(
                spark, catalog, name, jtable, plan.orphan_older_than_ms, dry_run=dry_run or plan.orphan_dry_run
            )
        )
    return results


def write_compaction(
    spark: SparkSession, catalog: str, name: str, partitions: list, policy, spec: TableSpec, jtable=None
) -> PreparedRewrite | None:
    """Compaction of a pipeline's upsert mirror, written on the executors and left for its commit (``jtable``: the
    table as the round just loaded it)."""
    from lakestream.maintenance.compaction import prepare_rewrite, run_rewrite

    started = time.monotonic()
    prepared = prepare_rewrite(spark, catalog, name, partitions, policy.compaction, jtable)
    if prepared is None:
        return None
    pause_point("maintenance.rewrite.planned")
    run_rewrite(spark, prepared, spec)
    if not prepared.groups:
        return None
    pause_point("maintenance.rewrite.written")
    prepared.result.detail.update(
        {
            "groups": len(prepared.groups),
            "start_snapshot_id": prepared.snapshot_id,
            "rewrite_s": round(time.monotonic() - started, 3),
        }
    )
    log.info(
        "%s: compaction of %d file(s) in %d group(s) written in %.1fs; the pipeline commits it",
        name,
        sum(len(g.inputs) for g in prepared.groups),
        len(prepared.groups),
        time.monotonic() - started,
    )
    return prepared


class MaintenanceScheduler:
    """Remembers when each table last had maintenance, and when its (costly, listing) orphan scan ran."""

    def __init__(self, config: PipelineConfig, resume: bool = False):
        self.config = config
        self.last_round_s: float | None = None
        self.last_orphan_scan_s: dict[str, float] = {}
        self.prepared: list[PreparedRewrite] = []  # compactions written, for the pipeline to commit
        self.lock = threading.Lock()
        self.hold_until_s: float | None = None  # no round before (a start catching up)
        self.settling: Settling | None = None  # the first round waits for the batches to settle (inline only)
        if resume:
            if config.maintenance.start_delay_s > 0:
                self.hold_until_s = time.time() + config.maintenance.start_delay_s
            self.resume_from_log()

    def wait_for_settled_batches(self, metrics_log: Path) -> None:
        """Hold the first round, after the start delay, until the batches are back to their steady time
        (`Settling`; at most ``settle_max_s`` after the start)."""
        if self.hold_until_s is None:  # start_delay_s 0: the user wants no wait
            return
        settle = self.config.maintenance
        deadline_s = self.hold_until_s - settle.start_delay_s + max(settle.settle_max_s, settle.start_delay_s)
        self.settling = Settling(steady_batch_s(metrics_log), deadline_s)

    def observe_batch(self, seconds: float | None) -> None:
        """A batch's time, or None for a poll that found nothing (for the first round's wait)."""
        if self.settling is not None:
            if seconds is None:
                self.settling.idle()
            else:
                self.settling.observe(seconds)

    def resume_from_log(self) -> None:
        """Go on with the schedule of the pipeline's earlier life, from its maintenance log: a restart (a crash
        loop above all) would otherwise begin with a full round, orphan listing included, while it catches up."""
        try:
            lines = read_maintenance_log(self.config, limit=5000)
        except OSError:
            return
        ends = [int(line["finished_ms"]) for line in lines if isinstance(line.get("finished_ms"), int)]
        if ends:
            self.last_round_s = max(ends) / 1000
        for line in lines:
            if (
                line.get("action") == "remove_orphans"
                and line.get("status") in ("ok", "dry-run")
                and isinstance(line.get("finished_ms"), int)
            ):
                table = str(line.get("table"))
                self.last_orphan_scan_s[table] = max(
                    self.last_orphan_scan_s.get(table, 0.0), line["finished_ms"] / 1000
                )

    def hand_over(self, prepared: PreparedRewrite) -> None:
        """A compaction written, for the pipeline to commit (`take_prepared`)."""
        with self.lock:
            self.prepared.append(prepared)

    def take_prepared(self, max_rows: int | None = None) -> list[PreparedRewrite]:
        """The compactions written and not taken yet, for the pipeline to commit. With ``max_rows`` only groups
        of up to that many rows (one group at least): a commit waits between two batches and moves each row's
        index entry, so a large compaction is committed over several pauses, a short one each."""
        with self.lock:
            if max_rows is None:
                taken, self.prepared = self.prepared, []
                return taken
            taken, rows = [], 0
            while self.prepared:
                head = self.prepared[0]
                groups = []
                while head.groups and (rows == 0 or rows + head.groups[0].live_rows <= max_rows):
                    groups.append(head.groups.pop(0))
                    rows += groups[-1].live_rows
                if groups:
                    result = dataclasses.replace(
                        head.result,
                        detail=dict(head.result.detail),
                        files_before=sum(len(g.inputs) for g in groups),
                        bytes_before=sum(g.bytes for g in groups),
                    )
                    taken.append(dataclasses.replace(head, groups=groups, result=result))
                if head.groups:
                    break
                self.prepared.pop(0)
        return taken

    def due(self, now_s: float) -> bool:
        if self.hold_until_s is not None and now_s < self.hold_until_s:
            return False
        if self.settling is not None:
            if not self.settling.settled(now_s):
                return False
            log.info(
                "first maintenance round %.0fs after the start (%s)",
                now_s - self.hold_until_s + self.config.maintenance.start_delay_s,
                self.settling.describe(),
            )
            self.settling = None
        return self.last_round_s is None or now_s - self.last_round_s >= self.config.maintenance.interval_s

    def run_round(
        self,
        spark: SparkSession,
        tables: list[str] | None = None,
        dry_run: bool = False,
        now_s: float | None = None,
        own: set[str] | None = None,
        rewrite_specs: dict[str, TableSpec] | None = None,
    ) -> list[MaintenanceResult]:
        """One round over the selected tables; a failing table is logged and does not stop the others.
        ``rewrite_specs``: the tables whose compaction the pipeline commits (`take_prepared`)."""
        now_s = now_s if now_s is not None else time.time()
        wall_started = time.monotonic()
        results: list[MaintenanceResult] = []
        for name in select_tables(spark, self.config, tables, own):
            last_scan = self.last_orphan_scan_s.get(name)
            orphans = last_scan is None or now_s - last_scan >= self.config.maintenance.orphan_interval_s
            try:
                spec = (rewrite_specs or {}).get(name)
                results.extend(
                    maintain_table(
                        spark,
                        self.config,
                        name,
                        dry_run=dry_run,
                        remove_orphans=orphans,
                        now_ms=int(now_s * 1000),
                        rewrite_spec=spec,
                        hand_over=self.hand_over,
                    )
                )
                if orphans:
                    self.last_orphan_scan_s[name] = now_s
            except Exception as exc:  # noqa: BLE001 — one broken table (dropped mid-round, corrupt metadata) must not stop the rest
                log.error("maintenance of %s failed: %s", name, first_line(exc, 300))
                results.append(
                    MaintenanceResult(table=name, action="round", status="failed", error=first_line(exc, 300))
                )
        # Measured from the round's end: a round longer than interval_s must not run back to back inline.
        self.last_round_s = now_s + (time.monotonic() - wall_started)
        if not dry_run:
            try:
                record_maintenance(self.config, results, int(self.last_round_s * 1000), int(now_s * 1000))
            except OSError as exc:  # the round itself succeeded: an unwritable state dir must not fail it
                log.warning("maintenance log not written: %s", exc)
        return results


def maintain_tables(
    spark: SparkSession, config: PipelineConfig, tables: list[str] | None = None, dry_run: bool = False
) -> list[MaintenanceResult]:
    """One maintenance round over all matching tables (or ``tables``, as ``namespace.table``)."""
    return MaintenanceScheduler(config).run_round(spark, tables, dry_run=dry_run)


def watch(
    spark: SparkSession,
    config: PipelineConfig,
    tables: list[str] | None = None,
    dry_run: bool = False,
    stop: threading.Event | None = None,
    max_rounds: int | None = None,
) -> None:
    """Run a round every ``maintenance.interval_s`` until ``stop`` is set (or ``max_rounds`` are done)."""
    stop = stop or threading.Event()
    scheduler = MaintenanceScheduler(config, resume=True)
    rounds = 0
    while not stop.is_set():
        started = time.time()
        try:
            results = scheduler.run_round(spark, tables, dry_run=dry_run, now_s=started)
        except Exception as exc:  # noqa: BLE001 — e.g. the catalog restarting: the next round tries again
            log.error(
                "maintenance round failed (next round in %.0fs): %s",
                config.maintenance.interval_s,
                first_line(exc, 300),
            )
            results = []
        rounds += 1
        log.info("maintenance round %d: %d action(s) in %.1fs", rounds, len(results), time.time() - started)
        if max_rounds is not None and rounds >= max_rounds:
            return
        stop.wait(max(0.0, config.maintenance.interval_s - (time.time() - started)))


class InlineMaintenance:
    """Inline maintenance (``maintenance.mode: inline``) of one pipeline, owned by its loop: a round between batches
    when ``interval_s`` has passed, or beside them on a thread (`round`); the compactions those rounds wrote for the
    pipeline to commit (`take_prepared`, `record_commits`); the wait for a round in progress at close (`finish`).

    ``metrics``: the pipeline's metrics log; given, the first round of the process waits for its batches to settle
    (`Settling`). Beside ingestion the round's Spark jobs run in the ``maintenance`` scheduler pool (FAIR: a
    batch's tasks take the next free slot instead of queueing behind the round's)."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, metrics: Path | None = None):
        self.spark = spark
        self.config = config
        self.scheduler = MaintenanceScheduler(config, resume=True)
        if metrics is not None:
            self.scheduler.wait_for_settled_batches(metrics)
        self.paced = metrics is not None
        self.thread: threading.Thread | None = None  # the round running beside ingestion
        self.finished: list[MaintenanceResult] | None = None  # the results of the last round finished there
        self.lock = threading.Lock()
        self.jit_lowered = False  # the driver JVM's JIT compilers lowered at the first round (`lower_jit_compilers`)

    def round(
        self,
        now: float | None = None,
        own: set[str] | None = None,
        background: bool = False,
        rewrite_specs: dict[str, TableSpec] | None = None,
        batch_s: float | None = None,
    ) -> list[MaintenanceResult]:
        """A round if ``interval_s`` has passed; its results, which never raise: conflicts with the engine's own
        commits are reported and retried on a later round.

        ``now`` is epoch seconds (default: the clock). ``own``: the tables the pipeline writes — the round then
        keeps to them and to tables a policy names explicitly (`select_tables`). With ``background`` the round
        runs on a thread beside ingestion (its commits meet the pipeline's only through the normal commit-conflict
        handling: a stale key index is refreshed by diff, a conflicting compaction is retried next round); the
        call returns at once with the results of the round that finished since the last call ([] if none).
        ``rewrite_specs``: the pipeline's upsert mirrors, whose compaction is written by the round and committed by
        the pipeline (`take_prepared`). ``batch_s``: the time of the batch just run (None after a poll that found
        nothing), for the settling of a paced first round.
        """
        if self.config.maintenance.mode != "inline":
            return []
        now = now if now is not None else time.time()
        scheduler = self.scheduler
        if self.paced:
            scheduler.observe_batch(batch_s)
        if not background:
            if not scheduler.due(now):
                return []
            return scheduler.run_round(self.spark, now_s=now, own=own, rewrite_specs=rewrite_specs)
        with self.lock:
            done, self.finished = self.finished or [], None
            if self.thread is not None and self.thread.is_alive():
                return done
            if not scheduler.due(now):
                return done
            if not self.jit_lowered:
                self.jit_lowered = True
                lowered = lower_jit_compilers(jvm_pid(self.spark))
                log.info(
                    "the driver JVM's %d JIT compiler thread(s) at nice %d from this first round on",
                    lowered,
                    BACKGROUND_NICE,
                )
            if not take_slot():  # a key index merge runs beside the batches: the round waits for a later pause
                return done
            self.thread = threading.Thread(
                target=self._run_beside,
                name="lakestream-maintenance",
                daemon=True,
                args=(now, set(own) if own is not None else None, dict(rewrite_specs or {})),
            )
            try:
                self.thread.start()
            except BaseException:
                release_slot()
                raise
        return done

    def _run_beside(self, now: float, own: set[str] | None, specs: dict[str, TableSpec]) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", MAINTENANCE_POOL)
        try:
            results = self.scheduler.run_round(self.spark, now_s=now, own=own, rewrite_specs=specs)
        except Exception as exc:  # noqa: BLE001 — e.g. the catalog restarting: the next round tries again
            log.error("maintenance round failed (next round as scheduled): %s", first_line(exc, 300))
            self.scheduler.last_round_s = time.time()
            results = []
        finally:
            release_slot()
        with self.lock:
            self.finished = (self.finished or []) + results

    def take_prepared(self, max_rows: int | None = None) -> list[PreparedRewrite]:
        """The compactions the rounds wrote and the pipeline has not committed yet (with ``max_rows``: a share of
        them, `MaintenanceScheduler.take_prepared`)."""
        return self.scheduler.take_prepared(max_rows)

    def record_commits(self, results: list[MaintenanceResult]) -> None:
        """Log the pipeline's compaction commits in the maintenance log, like a round's actions."""
        try:
            finished_ms = int(time.time() * 1000)
            record_maintenance(
                self.config, results, finished_ms, finished_ms - int(1000 * sum(r.seconds or 0 for r in results))
            )
        except OSError as exc:
            log.warning("maintenance log not written: %s", exc)

    def finish(self, timeout_s: float = 60.0) -> None:
        """Wait (up to ``timeout_s``) for the round running beside ingestion, at the pipeline's close. A round cut
        short by the process's end is harmless: each action commits atomically or not at all."""
        thread = self.thread
        if thread is not None and thread.is_alive():
            log.info("waiting up to %.0fs for the maintenance round in progress", timeout_s)
            thread.join(timeout_s)
