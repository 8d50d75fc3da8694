"""The driver loop: run micro-batches until stopped, one progress line per batch.

SIGTERM and Ctrl-C finish the batch in flight and stop cleanly (a second Ctrl-C aborts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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
    pipeline = Pipeline(config, spark)
    results: list[BatchResult] = []
    metrics = metrics_path(config)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    engine_metrics = None
    if config.engine.metrics_port is not None:
        from lakestream.engine.metrics import EngineMetrics

        engine_metrics = EngineMetrics(config.name)
        engine_metrics.serve(config.engine.metrics_port, config.engine.metrics_host)
    maintenance: InlineMaintenance | None = None
    if config.maintenance.mode == "inline":
        from lakestream.maintenance.runner import InlineMaintenance

        maintenance = InlineMaintenance(pipeline.spark, config, metrics)
    failures = 0  # batches failed in a row
    others = 0  # of those, the ones not due to an outage
    outage_since: float | None = None  # when the current outage (a run of failures) began
    batches_since_compaction = 0  # batches committed since the last pause that committed a compaction
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = pipeline.run_batch()
                failures, others, outage_since = 0, 0, None
            except ConfigError:
                raise  # a retry cannot fix the config
            except Exception as exc:  # noqa: BLE001 — recovered below, or re-raised after too many
                failure = classify_failure(exc)
                if failure.kind == "config":
                    # A Spark task's refusal by Kafka reaches the driver as text: say what it named, not the task.
                    raise ConfigError(f"batch failed: {first_line(exc)}") from exc
                if failure.kind == "fatal" or not jvm_alive(pipeline.spark):
                    raise FatalError(
                        f"batch failed and cannot be retried in this process ({_failure_summary(exc)}); "
                        "exiting so that its supervisor restarts it — every table resumes from its "
                        "committed offsets"
                    ) from exc
                if failure.kind == "infrastructure" and storage_unreachable(config.catalog):
                    failure = Failure("outage")  # e.g. a REST catalog's 500 while the store behind it is away
                failures += 1
                outage = failure.kind == "outage"
                others += not outage
                if outage and outage_since is None:
                    outage_since = time.monotonic()
                if engine_metrics is not None:
                    engine_metrics.batch_failed()
                backoff = _retry_backoff(config, outage, failures, others, outage_since)
                if backoff is None:
                    raise
                log.error(
                    "batch failed (%d in a row%s): %s — restarting from the tables' offsets in %.0fs",
                    failures,
                    ", an outage" if outage else "",
                    _failure_summary(exc),
                    backoff,
                )
                # Everything needed to resume lives in the tables: a fresh Pipeline is a clean restart.
                pipeline.close()
                stop.wait(backoff)
                pipeline = Pipeline(config, pipeline.spark, last_batch_id=pipeline.batch_id)
                continue
            idle = result is None or (result.advanced == 0 and not result.tables)
            if result is None or idle:
                # Nothing new (a partition re-checked for records beyond a lagging watermark).
                if stop_when_idle:
                    break
                stop.wait(config.engine.idle_poll_s)
            else:
                results.append(result)
                batches_since_compaction += 1
                log.info(result.progress_line())
                with metrics.open("ab") as fh:
                    fh.write(orjson.dumps(describe_batch(result)) + b"\n")
                if engine_metrics is not None:
                    engine_metrics.observe(result)
                if on_batch:
                    on_batch(result)
                if max_batches is not None and len(results) >= max_batches:
                    break
                remaining = config.fastest_commit_interval - (time.monotonic() - started)
                if remaining > 0:
                    stop.wait(remaining)
            if maintenance is not None and not stop.is_set():
                try:
                    # Beside ingestion, on the tables this pipeline writes (and those a policy names).
                    for action in maintenance.round(
                        time.time(),
                        own=set(pipeline.specs),
                        background=True,
                        rewrite_specs=pipeline.compacted_here(),
                        batch_s=None if result is None or idle else result.seconds,
                    ):
                        log.info("maintenance: %s", action)
                except Exception as exc:  # noqa: BLE001 — maintenance must never stop ingestion
                    log.error("maintenance round failed (next round as scheduled): %s", first_line(exc, 300))
                if idle or batches_since_compaction >= COMPACTION_COMMIT_SPACING:
                    if _commit_compactions(pipeline, maintenance):
                        batches_since_compaction = 0
    finally:
        if maintenance is not None:
            maintenance.finish()
            if jvm_alive(pipeline.spark):
                _commit_compactions(pipeline, maintenance, everything=True)
        _close(pipeline)
        if engine_metrics is not None:
            engine_metrics.close()
    if failures:
        raise StoppedAfterFailures(
            f"stopped while batches were failing ({failures} in a row; last: see above); "
            "nothing is lost — the next start resumes from the tables' offsets"
        )
    return results


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
