"""The driver loop: run micro-batches until stopped, one progress line per batch.

SIGTERM and Ctrl-C finish the batch in flight and stop cleanly (a second Ctrl-C aborts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from lakestream.config import PipelineConfig
from lakestream.engine.pipeline import Pipeline
from lakestream.engine.result import BatchResult, describe_batch
from lakestream.errors import ConfigError, Failure, FatalError, StoppedAfterFailures, classify_failure, first_line
from lakestream.runtime.spark import jvm_alive
from lakestream.storage import activate as activate_storage
from lakestream.storage import storage_unreachable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.engine.metrics import EngineMetrics
    from lakestream.maintenance.runner import InlineMaintenance

log = logging.getLogger(__name__)


def metrics_path(config: PipelineConfig) -> Path:
    return Path(config.state_dir) / "metrics" / f"{config.name}.jsonl"


def run_pipeline(
    config: PipelineConfig,
    stop: threading.Event | None = None,
    spark: SparkSession | None = None,
    max_batches: int | None = None,
    stop_when_idle: bool = False,
    on_batch: Callable[[BatchResult], None] | None = None,
) -> list[BatchResult]:
    """Run the pipeline until ``stop`` is set (or ``max_batches`` / idle when asked)."""
    stop = stop or threading.Event()
    # The write tasks reach this config's object storage (a session passed in may have served another).
    activate_storage(config.catalog.storage)
    run = _Run(config, spark, stop)
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = run.pipeline.run_batch()
                run.failing = _Failing()
            except ConfigError:
                raise  # a retry cannot fix the config
            except Exception as exc:  # noqa: BLE001 — recovered below, or re-raised after too many
                outage, backoff = run.count_failure(exc)
                if backoff is None:
                    raise
                run.restart(exc, outage, backoff)
                continue
            idle = result is None or (result.advanced == 0 and not result.tables)
            if result is None or idle:
                # Nothing new (a partition re-checked for records beyond a lagging watermark).
                if stop_when_idle:
                    break
                stop.wait(config.engine.idle_poll_s)
            else:
                run.record(result, on_batch)
                if max_batches is not None and len(run.results) >= max_batches:
                    break
                run.wait_for_commit_interval(started)
            run.maintain(None if result is None or idle else result.seconds, idle)
    finally:
        run.close()
    if run.failing.failures:
        raise StoppedAfterFailures(
            f"stopped while batches were failing ({run.failing.failures} in a row; last: see above); "
            "nothing is lost — the next start resumes from the tables' offsets"
        )
    return run.results


@dataclass
class _Failing:
    """The batches that failed in a row, which the retry decision reads."""

    failures: int = 0
    others: int = 0  # of those, the ones not due to an outage
    outage_since: float | None = None  # when the current outage (a run of failures) began


class _Run:
    """What one `run_pipeline` call holds between batches: the pipeline (a fresh one after a failed batch), the
    metrics it writes, inline maintenance, and the counts the retry and compaction decisions read."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None, stop: threading.Event) -> None:
        self.config = config
        self.stop = stop
        self.pipeline = Pipeline(config, spark)
        self.results: list[BatchResult] = []
        self.metrics = metrics_path(config)
        self.metrics.parent.mkdir(parents=True, exist_ok=True)
        self.engine_metrics = _serve_engine_metrics(config)
        self.maintenance: InlineMaintenance | None = None
        if config.maintenance.mode == "inline":
            from lakestream.maintenance.runner import InlineMaintenance

            self.maintenance = InlineMaintenance(self.pipeline.spark, config, self.metrics)
        self.failing = _Failing()
        self.batches_since_compaction = 0  # batches committed since the last pause that committed a compaction

    def count_failure(self, exc: Exception) -> tuple[bool, float | None]:
        """Count a failed batch: whether it is part of an outage, and the seconds to wait before retrying it (None
        to give up). Raises when no retry in this process can help."""
        failure = classify_failure(exc)
        if failure.kind == "config":
            # A Spark task's refusal by Kafka reaches the driver as text: say what it named, not the task.
            raise ConfigError(f"batch failed: {first_line(exc)}") from exc
        if failure.kind == "fatal" or not jvm_alive(self.pipeline.spark):
            raise FatalError(
                f"batch failed and cannot be retried in this process ({_failure_summary(exc)}); "
                "exiting so that its supervisor restarts it — every table resumes from its "
                "committed offsets"
            ) from exc
        if failure.kind == "infrastructure" and storage_unreachable(self.config.catalog):
            failure = Failure("outage")  # e.g. a REST catalog's 500 while the store behind it is away
        failing = self.failing
        failing.failures += 1
        outage = failure.kind == "outage"
        failing.others += not outage
        if outage and failing.outage_since is None:
            failing.outage_since = time.monotonic()
        if self.engine_metrics is not None:
            self.engine_metrics.batch_failed()
        return outage, _retry_backoff(self.config, outage, failing.failures, failing.others, failing.outage_since)

    def restart(self, exc: Exception, outage: bool, backoff: float) -> None:
        """Wait ``backoff`` seconds, then carry on with a fresh pipeline after a failed batch."""
        log.error(
            "batch failed (%d in a row%s): %s — restarting from the tables' offsets in %.0fs",
            self.failing.failures,
            ", an outage" if outage else "",
            _failure_summary(exc),
            backoff,
        )
        # Everything needed to resume lives in the tables: a fresh Pipeline is a clean restart.
        self.pipeline.close()
        self.stop.wait(backoff)
        self.pipeline = Pipeline(self.config, self.pipeline.spark, last_batch_id=self.pipeline.batch_id)

    def record(self, result: BatchResult, on_batch: Callable[[BatchResult], None] | None) -> None:
        """Keep a batch that did something: its progress line, its metrics line, and the caller's callback."""
        self.results.append(result)
        self.batches_since_compaction += 1
        log.info(result.progress_line())
        with self.metrics.open("ab") as fh:
            fh.write(orjson.dumps(describe_batch(result)) + b"\n")
        if self.engine_metrics is not None:
            self.engine_metrics.observe(result)
        if on_batch:
            on_batch(result)

    def wait_for_commit_interval(self, started: float) -> None:
        """Start the next batch no sooner than the fastest table's commit interval after this one started."""
        remaining = self.config.fastest_commit_interval - (time.monotonic() - started)
        if remaining > 0:
            self.stop.wait(remaining)

    def maintain(self, batch_s: float | None, idle: bool) -> None:
        """Inline maintenance's round between two batches, and a pause to commit its compactions when one is due."""
        maintenance = self.maintenance
        if maintenance is None or self.stop.is_set():
            return
        try:
            # Beside ingestion, on the tables this pipeline writes (and those a policy names).
            for action in maintenance.round(
                time.time(),
                own=set(self.pipeline.specs),
                background=True,
                rewrite_specs=self.pipeline.compacted_here(),
                batch_s=batch_s,
            ):
                log.info("maintenance: %s", action)
        except Exception as exc:  # noqa: BLE001 — maintenance must never stop ingestion
            log.error("maintenance round failed (next round as scheduled): %s", first_line(exc, 300))
        if idle or self.batches_since_compaction >= COMPACTION_COMMIT_SPACING:
            if _commit_compactions(self.pipeline, maintenance):
                self.batches_since_compaction = 0

    def close(self) -> None:
        """Finish inline maintenance (committing what it prepared while the JVM lives), close the pipeline and
        stop serving the engine's metrics."""
        if self.maintenance is not None:
            self.maintenance.finish()
            if jvm_alive(self.pipeline.spark):
                _commit_compactions(self.pipeline, self.maintenance, everything=True)
        _close(self.pipeline)
        if self.engine_metrics is not None:
            self.engine_metrics.close()


def _serve_engine_metrics(config: PipelineConfig) -> EngineMetrics | None:
    """The engine's Prometheus metrics, served when the config names a port."""
    if config.engine.metrics_port is None:
        return None
    from lakestream.engine.metrics import EngineMetrics

    engine_metrics = EngineMetrics(config.name)
    engine_metrics.serve(config.engine.metrics_port, config.engine.metrics_host)
    return engine_metrics


# Rows of compaction committed in one pause between two batches: each moves its key index entry (~1.5 µs a row
# at 100M keys), and Iceberg's commit rewrites the manifests naming the files it removes.
COMPACTION_ROWS_PER_COMMIT = 250_000
# Batches between two such pauses while data keeps arriving: a pause delays the next batch (0.4-1.8 s at 100M
# rows), and back to back each delayed batch is a bigger one delayed again; spaced, the batch between catches up.
COMPACTION_COMMIT_SPACING = 2


def _commit_compactions(pipeline: Pipeline, maintenance: InlineMaintenance, everything: bool = False) -> bool:
    """Commit (a share of, unless ``everything``) the compactions inline maintenance wrote beside the batches,
    between two batches: their commits never race; whether a pause was taken. Only a failure no retry can cure
    (a dead JVM) ends the process."""
    prepared = maintenance.take_prepared(None if everything else COMPACTION_ROWS_PER_COMMIT)
    if not prepared:
        return False
    try:
        results = pipeline.commit_compactions(prepared)
    except Exception as exc:  # noqa: BLE001 — classified just below
        if classify_failure(exc).kind in ("fatal", "config") or not jvm_alive(pipeline.spark):
            raise FatalError(
                f"committing a compaction failed and cannot be retried in this process ({_failure_summary(exc)})"
            ) from exc
        log.error("compaction commit failed (retried by a later round): %s", first_line(exc, 300))
        return True
    maintenance.record_commits(results)
    return True


def _close(pipeline: Pipeline) -> None:
    """Close the pipeline; with a dead JVM there is nothing left to close cleanly (the tables hold the state)."""
    if not jvm_alive(pipeline.spark):
        log.error("the driver's JVM is gone: exiting without a clean close (the next start resumes from the tables)")
        return
    pipeline.close()


def _retry_backoff(
    config: PipelineConfig, outage: bool, failures: int, others: int, outage_since: float | None
) -> float | None:
    """Seconds to wait before retrying a failed batch, or None to give up (the process exits non-zero).

    An unreachable broker, catalog or storage is waited out for up to ``engine.max_outage_s``; the
    batch is then retried from the tables' offsets. Any other failure ends the process once
    ``engine.max_consecutive_failures`` of them came in a row."""
    if outage:
        lasted = time.monotonic() - outage_since if outage_since is not None else 0.0
        return min(2.0**failures, 15.0) if lasted < config.engine.max_outage_s else None
    return min(2.0**failures, 60.0) if others < config.engine.max_consecutive_failures else None


def _failure_summary(exc: BaseException) -> str:
    """One line naming what failed: the Java exception (class and message) of a Py4J error, else the
    informative line of the Python one."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            cause = java
            while cause.getCause() is not None:  # the root cause names the service (e.g. PSQLException)
                cause = cause.getCause()
            text = str(java.toString()) if cause is java else f"{java.toString()} (cause: {cause.toString()})"
            return text.splitlines()[0][:500]
        except Exception:  # noqa: BLE001 — the JVM itself may be what failed
            pass
    return first_line(exc, 300)
