"""The engine's own Prometheus metrics (`engine.metrics_port`), through prometheus-client.

Fed from each batch's `BatchResult` by the loop, held in a dedicated `CollectorRegistry` (never the
process-global one, so a notebook or test that runs two pipelines keeps them apart). Every label
is bounded: table names come from the pipeline's routing, dead-letter reasons are one of
`DEAD_LETTER_KINDS` and conflict causes one of a fixed few, never free text.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from lakestream.engine.result import BatchResult
from lakestream.errors import DEAD_LETTER_KINDS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

# From a tiny batch on an idle stream to a large backlog batch.
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class EngineMetrics:
    """The metrics of one running pipeline; `observe` folds in a batch, `serve` exposes them."""

    def __init__(self, pipeline: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.batch_seconds = Histogram(
            "lakestream_batch_seconds",
            "Seconds per micro-batch: plan, read and write, commit, advance",
            buckets=BATCH_SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_failures = Counter(
            "lakestream_batch_failures",
            "Micro-batches that failed and were retried from the tables' offsets",
            registry=r,
        )
        self.records = Counter(
            "lakestream_table_records", "Kafka records routed to a table (dead letters included)", ["table"], registry=r
        )
        self.changes = Counter(
            "lakestream_table_changes",
            "Row changes a table's commits applied: keys upserted "
            "or deleted (the latest change per key), rows appended",
            ["table"],
            registry=r,
        )
        self.dead_letters = Counter(
            "lakestream_dead_letters",
            "Records written to the dead-letter table, by kind of reason",
            ["kind"],
            registry=r,
        )
        for kind in DEAD_LETTER_KINDS:
            self.dead_letters.labels(kind)  # every kind present from the start (0 is a value, absent is not)
        self.skipped = Counter(
            "lakestream_records_skipped",
            "Records that carry no row change on purpose and were "
            "skipped: logical-decoding messages, truncates in append streams",
            ["reason"],
            registry=r,
        )
        self.conflicts = Counter(
            "lakestream_commit_conflicts",
            "Table commits that met another writer's snapshot (stale key index) or a retryable Iceberg commit failure",
            ["table", "cause"],
            registry=r,
        )
        self.retries = Counter(
            "lakestream_commit_retries", "Table commit attempts repeated after a conflict", ["table"], registry=r
        )
        self.lag = Gauge(
            "lakestream_table_kafka_lag",
            "Kafka records not yet committed to the table (as of the table's last batch)",
            ["table"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "lakestream_consumer_lag",
            "Records behind the high watermarks over the partitions the last batch read",
            registry=r,
        )
        self.freshness = Gauge(
            "lakestream_table_freshness_seconds",
            "Now minus the newest source change committed to the table",
            ["table"],
            registry=r,
        )
        self.last_batch = Gauge(
            "lakestream_last_batch_timestamp_seconds", "When the last non-empty batch committed", registry=r
        )
        self.info = Gauge("lakestream_pipeline_info", "The pipeline this process runs", ["pipeline"], registry=r)
        self.info.labels(pipeline).set(1)
        self._source_ts_ms: dict[str, int] = {}
        self._server: WSGIServer | None = None

    def observe(self, result: BatchResult) -> None:
        """Fold one committed batch into the metrics."""
        self.batch_seconds.observe(result.seconds)
        for table, n in result.table_records.items():
            self.records.labels(table).inc(n)
        for table, n in result.table_changes.items():
            self.changes.labels(table).inc(n)
        for kind, n in result.dead_letter_kinds.items():
            self.dead_letters.labels(kind if kind in DEAD_LETTER_KINDS else "malformed").inc(n)
        for reason, n in result.skipped.items():
            self.skipped.labels(reason).inc(n)
        for table, cause in result.commit_conflicts:
            self.conflicts.labels(table, cause).inc()
        for table, n in result.commit_retries.items():
            self.retries.labels(table).inc(n)
        for table, n in result.table_lag.items():
            self.lag.labels(table).set(n)
        if result.lag is not None:
            self.consumer_lag.set(result.lag)
        for table, ts in result.table_source_ts_ms.items():
            if ts > self._source_ts_ms.get(table, -1):
                if table not in self._source_ts_ms:
                    # Measured when scraped: freshness keeps growing while nothing new commits.
                    self.freshness.labels(table).set_function(partial(self._freshness_s, table))
                self._source_ts_ms[table] = ts
        self.last_batch.set(result.commit_ts_ms / 1000)

    def _freshness_s(self, table: str) -> float:
        return time.time() - self._source_ts_ms[table] / 1000

    def batch_failed(self) -> None:
        self.batch_failures.inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (0: any free port) from a daemon thread; the port bound."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        bound = int(self._server.server_address[1])
        log.info("serving the engine's Prometheus metrics on http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
