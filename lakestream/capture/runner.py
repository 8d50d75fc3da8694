"""Runs Debezium's embedded engine in this process and publishes its events to Kafka until stopped.

JPype can start one JVM per process and never restart it, so ``run_capture`` is meant to own its
process: the CLI (``lakestream capture``) runs it, and ``CaptureProcess`` starts that CLI.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from lakestream.capture.columns import ColumnWatch
from lakestream.capture.connector import connector_properties
from lakestream.capture.databases import CaptureDatabase, capture_database
from lakestream.capture.handover import handover_properties, seed_offsets
from lakestream.capture.publisher import KafkaPublishingHandler
from lakestream.config import CaptureSettings, PipelineConfig
from lakestream.errors import CaptureError, ConfigError
from lakestream.faults import pause_point
from lakestream.kafka_access import check_access, refusals_raised
from lakestream.runtime.jvm_jars import capture_jar, confluent_avro_jars, debezium_jars
from lakestream.signals import install_stop_signals

if TYPE_CHECKING:
    from confluent_kafka import Producer

log = logging.getLogger(__name__)

# Printed once when the replication stream is connected; CaptureProcess waits for it.
STREAMING_MARKER = "capture streaming:"

PROGRESS_INTERVAL_S = 5.0
JVM_OPTS_BASE = [
    # Let Python own SIGINT/SIGTERM: without -Xrs the JVM's handlers run shutdown hooks and exit
    # the process before the engine is closed and the last offsets are flushed.
    "-Xrs",
]

_LOG4J2 = """\
status = WARN
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %level debezium %c{1}: %m%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = stderr
logger.debezium.name = io.debezium
logger.debezium.level = INFO
logger.dbzjdbc.name = io.debezium.jdbc
logger.dbzjdbc.level = WARN
"""


@dataclass
class CaptureProgress:
    """A point-in-time view of capture, passed to ``on_progress`` every progress interval."""

    total: int
    events_per_s: float
    topic_counts: dict[str, int] = field(default_factory=dict)
    streaming: bool = False
    elapsed_s: float = 0.0


def _write_log_config(capture_dir: Path) -> Path:
    """A log4j2 config sending Debezium's log to stderr (the wheel's default also writes ./logs/)."""
    path = capture_dir / "log4j2.properties"
    path.write_text(_LOG4J2)
    return path


def _streaming_connected(topic_prefix: str, metrics_domain: str = "debezium.postgres") -> bool:
    """Whether Debezium's streaming source is connected to the slot or the binlog (its JMX metric)."""
    import jpype

    try:
        mbeans = jpype.JClass("java.lang.management.ManagementFactory").getPlatformMBeanServer()
        name = jpype.JClass("javax.management.ObjectName")(
            f"{metrics_domain}:type=connector-metrics,context=streaming,server={topic_prefix}"
        )
        if not mbeans.isRegistered(name):
            return False
        return bool(mbeans.getAttribute(name, "Connected"))
    except Exception:  # noqa: BLE001 — a metrics hiccup must never stop capture
        return False


def _format_progress(progress: CaptureProgress) -> str:
    topics = ", ".join(f"{t}={n}" for t, n in sorted(progress.topic_counts.items())) or "none yet"
    return f"capture: {progress.total} events, {progress.events_per_s:,.0f}/s; per topic: {topics}"


def _start_jvm(capture_dir: Path, avro: bool = False, jar_group: str = "debezium") -> None:
    """Start this process's JVM (JPype) with Debezium's jars (``io.debezium`` by coordinates: the connector's
    ``jar_group``), lakestream's capture jar and, for Avro, Confluent's converter."""
    import jpype

    if jpype.isJVMStarted():
        return
    classpath = [str(j) for j in debezium_jars(jar_group)] + [str(capture_jar(jar_group))]
    if avro:
        classpath += [str(j) for j in confluent_avro_jars()]
    opts = [
        "-Xms256m",
        "-Xmx2g",
        "-XX:+UseG1GC",
        *JVM_OPTS_BASE,
        f"-Dlog4j2.configurationFile={_write_log_config(capture_dir).resolve()}",
        *os.environ.get("LAKESTREAM_CAPTURE_JVM_OPTS", "").split(),
    ]
    jpype.startJVM(jpype.getDefaultJVMPath(), *opts, classpath=classpath)


class EmbeddedEngine:
    """Debezium's embedded engine, notifying ``CaptureBatchConsumer`` (Java), which hands each batch to
    ``handler.publish`` in one call. JSON output (JsonConverter) or, with ``avro``, Confluent's AvroConverter."""

    def __init__(self, properties: dict[str, str], handler: KafkaPublishingHandler, avro: bool = False) -> None:
        import jpype

        publisher_class = jpype.JClass("lakestream.capture.CaptureBatchConsumer$Publisher")
        # The proxy only forwards the call; the handler records the error and raises it back to Java.
        self._proxy = jpype.JProxy(publisher_class, dict={"publish": handler.publish})
        self._consumer = jpype.JClass("lakestream.capture.CaptureBatchConsumer")(self._proxy)
        self._properties = properties
        # JsonByteArray: the converter's UTF-8 bytes as they are (Json would make a String of them, which
        # CaptureBatchConsumer.pack then encodes back: two copies of every event, and garbage to collect).
        self._format = jpype.JClass(
            "io.debezium.engine.format.Avro" if avro else "io.debezium.engine.format.JsonByteArray"
        )
        self._engine = None
        # Why the engine stopped, as Debezium reports it to its completion callback (the Java Throwable).
        self.failure: Any = None
        self.failure_message: str | None = None
        self._completion = jpype.JProxy(
            "io.debezium.engine.DebeziumEngine$CompletionCallback", dict={"handle": self._completed}
        )

    def _completed(self, success: bool, message: str, error: Any) -> None:
        if not success:
            self.failure, self.failure_message = error, None if message is None else str(message)

    def run(self) -> None:
        """Build the engine (it reads the offset store when it starts) and run it until closed."""
        import jpype

        java_properties = jpype.JClass("java.util.Properties")()
        for key, value in self._properties.items():
            java_properties.setProperty(str(key), str(value))
        self._engine = (
            jpype.JClass("io.debezium.engine.DebeziumEngine")
            .create(self._format)
            .using(java_properties)
            .using(self._completion)
            .notifying(self._consumer)
            .build()
        )
        self._engine.run()

    def close(self) -> None:
        if self._engine is None:
            return
        try:
            self._engine.close()
        except Exception as exc:  # noqa: BLE001 — closing must not hide the reason capture stopped
            log.warning("capture: closing Debezium failed: %s", exc)


# Confluent's registry client raises this with the registry's error code; 409: the schema breaks the subject's
# compatibility level (Confluent's API, which other registries' compatible APIs answer alike).
REGISTRY_CLIENT_ERROR = "io.confluent.kafka.schemaregistry.client.rest.exceptions.RestClientException"
INCOMPATIBLE_SCHEMA = 409


def _java_causes(error: Any) -> list[Any]:
    """``error`` and its causes (a Java Throwable's chain), outermost first."""
    chain: list[Any] = []
    while error is not None and len(chain) < 20 and all(error is not e for e in chain):
        chain.append(error)
        error = error.getCause()
    return chain


def registry_refusal(error: Any) -> str | None:
    """The registry's message when a Schema Registry refused a schema as incompatible somewhere in ``error``'s
    chain (found by the exception's class and the registry's error code), else None."""
    for cause in _java_causes(error):
        if cause.getClass().getName() == REGISTRY_CLIENT_ERROR and int(cause.getErrorCode()) == INCOMPATIBLE_SCHEMA:
            return str(cause.getMessage())
    return None


def describe_engine_stop(engine: EmbeddedEngine, capture, thread_error: BaseException | None = None) -> str:
    """Why Debezium stopped on its own, in the terms of what to fix."""
    refusal = None if engine.failure is None else registry_refusal(engine.failure)
    if refusal is not None:
        url = "the Schema Registry"
        if capture.schema_registry:
            # the first URL, without any user info a URL could carry
            parts = urlsplit(capture.schema_registry.url.split(",")[0].strip())
            url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
        return (
            f"the Schema Registry ({url}) refused a table's new schema: {refusal}. Debezium stopped before "
            "publishing any change of that shape (nothing was lost: the slot keeps it) — fix: change the table "
            "the way the subject's compatibility level allows (for example add a nullable column instead of "
            "changing a column's type), or, if every consumer can read the new shape, lower that subject's "
            f"level (PUT {url}/config/<subject>), then start capture again"
        )
    if engine.failure is not None:
        return f"Debezium stopped on its own: {engine.failure_message or ''} {engine.failure}".strip()
    return f"Debezium stopped on its own: {thread_error or 'see its log above'}"


def run_capture(
    config: PipelineConfig,
    stop_event: threading.Event | None = None,
    on_progress: Callable[[CaptureProgress], Any] | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
) -> CaptureProgress:
    """Capture ``config.capture`` tables into Kafka until ``stop_event`` is set or SIGTERM/Ctrl-C.

    Raises CaptureError if Debezium stops on its own or Kafka refuses events. Returns the final
    progress after a clean stop.
    """
    capture = _capture_settings(config)
    capture_dir = Path(config.state_dir) / "capture"
    capture_dir.mkdir(parents=True, exist_ok=True)
    stop_event = stop_event or threading.Event()

    properties, database, seed_offset = _prepare_source(config, capture, capture_dir)
    producer, handler = _publishing_handler(config, capture)
    # Start the JVM here, before installing signal handlers, so ours are the ones that stay.
    _start_jvm(capture_dir, avro=capture.format == "avro", jar_group=database.jar_group)
    engine = EmbeddedEngine(properties, handler, avro=capture.format == "avro")
    if seed_offset is not None:
        seed_offsets(Path(properties["offset.storage.file.filename"]), properties, seed_offset)
    watch = _column_watch(config, capture, database, properties)
    engine_error: list[BaseException] = []

    restore = install_stop_signals(stop_event, "capture")
    log.info(
        "capture: %s tables %s → topics %s.<schema>.<table> on %s (%s, snapshot.mode %s)",
        database.kind,
        ",".join(capture.tables),
        capture.topic_prefix,
        config.kafka.bootstrap_servers,
        database.stream_name(capture),
        capture.snapshot_mode,
    )
    thread = threading.Thread(target=_run_engine, args=(engine, engine_error), name="debezium-engine", daemon=True)
    clock = _ProgressClock.start()
    thread.start()
    if watch is not None:
        watch.start()
    try:
        while not stop_event.is_set():
            woke_for_failure = handler.failed.wait(min(progress_interval_s, 1.0))
            if woke_for_failure or handler.error is not None:
                raise handler.error  # type: ignore[misc]
            if not thread.is_alive():
                cause = engine_error[0] if engine_error else None
                raise CaptureError(describe_engine_stop(engine, capture, cause)) from cause
            if not clock.streaming and _streaming_connected(capture.topic_prefix, database.metrics_domain):
                clock.streaming = True
                _announce_streaming(handler, capture, database)
            clock.report_when_due(handler, progress_interval_s, on_progress)
    except KeyboardInterrupt:
        log.info("capture: interrupted")
    finally:
        restore()
        if watch is not None:
            watch.stop()
        log.info("capture: stopping Debezium")
        engine.close()
        thread.join(timeout=60)
        producer.flush(30)
    return clock.final(handler)


def _capture_settings(config: PipelineConfig) -> CaptureSettings:
    """The config's `capture:` section, refused when it is missing or names a converter the embedded capture
    does not run."""
    if config.capture is None:
        raise ConfigError(
            "the pipeline config has no `capture:` section — fix: add capture.database and capture.tables"
        )
    capture = config.capture
    if capture.format == "avro" and capture.avro_converter != "confluent":
        raise ConfigError(
            f"capture.avro_converter: {capture.avro_converter!r} names the converter of a Kafka Connect worker "
            "(`lakestream capture --print-connector-config`); the embedded capture runs Confluent's — fix: set "
            "capture.avro_converter: confluent to run `lakestream capture`, or run the printed configuration in "
            "Kafka Connect"
        )
    return capture


def _prepare_source(
    config: PipelineConfig, capture: CaptureSettings, capture_dir: Path
) -> tuple[dict[str, str], CaptureDatabase, bytes | None]:
    """The connector's properties and the source database, checked before Debezium starts; with the parallel
    snapshot, the offset to seed Debezium's offsets with (None when it streamed before)."""
    properties = connector_properties(capture, capture_dir.parent)
    database = capture_database(capture)
    resuming = Path(properties["offset.storage.file.filename"]).exists()
    keyless = database.prepare(capture, resuming)  # the start check: stops capture before Debezium starts
    if keyless:
        log.info(
            "capture: %s have no primary key: their events have no key, their mirrors are row multisets",
            ", ".join(keyless),
        )
    seed_offset = None
    if capture.snapshot == "parallel":
        properties, seed_offset = handover_properties(config, properties)
    return properties, database, seed_offset


def _publishing_handler(config: PipelineConfig, capture: CaptureSettings) -> tuple[Producer, KafkaPublishingHandler]:
    """The producer Debezium's events are published with (checked against the broker) and the handler that
    publishes them under the configured topic names."""
    from confluent_kafka import Producer

    producer = Producer(refusals_raised(config.kafka.producer_config()))
    check_access(producer)  # a refused client stops capture before Debezium starts
    renames = {t.debezium_topic(capture.topic_prefix): t.topic(capture.topic_prefix) for t in capture.source_tables}
    handler = KafkaPublishingHandler(producer, topic_renames={d: t for d, t in renames.items() if d != t})
    return producer, handler


def _column_watch(
    config: PipelineConfig, capture: CaptureSettings, database: CaptureDatabase, properties: dict[str, str]
) -> ColumnWatch | None:
    """The watch over the source tables' columns, when the config asks for one (JSON capture only)."""
    from confluent_kafka import Producer

    if not (capture.column_check_interval_s > 0 and capture.format == "json"):
        return None
    columns_file = Path(properties["offset.storage.file.filename"]).with_suffix(".columns.json")
    # A producer of its own: a delivery report of the engine's batch served by this thread's flush would be
    # missed by `KafkaPublishingHandler`, which checks its batch's reports after its own flush.
    column_producer = Producer(refusals_raised(config.kafka.producer_config()))
    return ColumnWatch(capture, database, column_producer, capture.column_check_interval_s, columns_file)


def _run_engine(engine: EmbeddedEngine, errors: list[BaseException]) -> None:
    """The engine thread: run Debezium until it is closed, keeping what it raised for the main thread."""
    try:
        engine.run()
    except BaseException as exc:  # noqa: BLE001 — reported on the main thread
        errors.append(exc)


def _announce_streaming(handler: KafkaPublishingHandler, capture: CaptureSettings, database: CaptureDatabase) -> None:
    """Log the marker `CaptureProcess` waits for: the snapshot is done and the replication stream connected."""
    total, _ = handler.snapshot_counts()
    log.info(
        "%s snapshot done (%d events so far), reading %s",
        STREAMING_MARKER,
        total,
        database.stream_name(capture),
    )
    pause_point("capture.streaming.connected")


@dataclass
class _ProgressClock:
    """Capture's progress between two reports: when it started, the last report's time and total, and whether
    the replication stream is connected."""

    started: float
    last_time: float
    last_total: int = 0
    streaming: bool = False

    @classmethod
    def start(cls) -> _ProgressClock:
        """A clock started now, its first report due one interval from now."""
        now = time.monotonic()
        return cls(now, now)

    def report_when_due(
        self,
        handler: KafkaPublishingHandler,
        interval_s: float,
        on_progress: Callable[[CaptureProgress], Any] | None,
    ) -> None:
        """Log (and hand ``on_progress``) the progress once ``interval_s`` passed since the last report."""
        now = time.monotonic()
        if now - self.last_time >= interval_s:
            total, counts = handler.snapshot_counts()
            progress = CaptureProgress(
                total, (total - self.last_total) / (now - self.last_time), counts, self.streaming, now - self.started
            )
            log.info(_format_progress(progress))
            if on_progress is not None:
                on_progress(progress)
            self.last_time, self.last_total = now, total

    def final(self, handler: KafkaPublishingHandler) -> CaptureProgress:
        """The progress of the whole run, once capture stopped."""
        total, counts = handler.snapshot_counts()
        elapsed = time.monotonic() - self.started
        log.info("capture: stopped after %d events in %.1fs", total, elapsed)
        return CaptureProgress(total, total / elapsed if elapsed else 0.0, counts, self.streaming, elapsed)
