"""Real Debezium capture for sink tests: a fresh source database, a pipeline config over it, the
capture subprocess, and waits that follow Kafka watermarks instead of sleeping.

Module-scoped (one Debezium JVM per test module): the fixtures here cannot use the
function-scoped ``pipeline_config_factory``, so they build the same config by hand.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from conftest import catalog_settings

from lakestream.capture import CaptureProcess
from lakestream.config import PipelineConfig, parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.engine.result import BatchResult

DEAD_LETTER = "lake.lakestream.dead_letter"


@dataclass
class CapturedSource:
    """A source database captured by Debezium into ``<prefix>.public.<table>`` topics."""

    stack: object
    dbname: str
    conn: psycopg2.extensions.connection
    prefix: str
    namespace: str
    config: PipelineConfig
    capture: CaptureProcess
    workdir: Path
    runs: list[list[BatchResult]] = field(default_factory=list)

    def sql(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)

    def topic(self, table: str) -> str:
        return f"{self.prefix}.public.{table}"

    def table(self, table: str) -> str:
        return f"lake.{self.namespace}.{table}"

    def end_offset(self, table: str) -> int:
        """High watermark of the table's topic (0 if the topic does not exist yet)."""
        consumer = Consumer({"bootstrap.servers": self.stack.bootstrap_servers, "group.id": f"wm-{uuid.uuid4().hex}"})
        try:
            topics = consumer.list_topics(timeout=10).topics
            if self.topic(table) not in topics:
                return 0
            return consumer.get_watermark_offsets(TopicPartition(self.topic(table), 0), timeout=10)[1]
        except KafkaException:
            return 0
        finally:
            consumer.close()

    def wait_for_events(self, expected: dict[str, int], timeout: float = 240.0) -> None:
        """Block until each table's topic has reached the given end offset."""
        deadline = time.monotonic() + timeout
        while True:
            have = {t: self.end_offset(t) for t in expected}
            if all(have[t] >= n for t, n in expected.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Debezium did not publish in {timeout:.0f}s: have {have}, want {expected}\n"
                    f"{self.capture.log_text()[-3000:]}"
                )
            if not self.capture.running:
                raise AssertionError(f"capture exited:\n{self.capture.log_text()[-3000:]}")
            time.sleep(0.5)

    def published(self, table: str) -> list[dict]:
        """Every message of the table's topic so far (value payloads decoded)."""
        import json

        end = self.end_offset(table)
        consumer = Consumer(
            {
                "bootstrap.servers": self.stack.bootstrap_servers,
                "group.id": f"rd-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(self.topic(table), 0, OFFSET_BEGINNING)])
        out: list[dict] = []
        deadline = time.monotonic() + 60
        try:
            while len(out) < end and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                value = None if msg.value() is None else json.loads(msg.value())
                if isinstance(value, dict) and "payload" in value and "schema" in value:
                    value = value["payload"]
                out.append({"offset": msg.offset(), "value": value})
        finally:
            consumer.close()
        return out

    def run(self) -> list[BatchResult]:
        """One engine run until idle (everything published so far is written)."""
        from pyspark.sql import SparkSession

        results = run_pipeline(self.config, spark=SparkSession.getActiveSession(), stop_when_idle=True)
        self.runs.append(results)
        return results

    def sync(self, expected: dict[str, int], timeout: float = 240.0) -> list[BatchResult]:
        """Wait until Debezium published up to ``expected`` end offsets, then run the engine once."""
        self.wait_for_events(expected, timeout)
        return self.run()


def prepare_captured_source(
    stack, setup_sql: list[str], tables: list[str], label: str, extra: dict | None = None
) -> tuple[str, psycopg2.extensions.connection, str, str, dict, Path]:
    """Create a database, run ``setup_sql`` and write the pipeline config capturing ``public.<tables>`` (plus
    any table created later whose name starts with ``<label>_``): (dbname, connection, topic prefix, namespace,
    the config as a dict, the work directory holding ``pipeline.yaml``).

    ``extra`` is merged into the config's top-level sections (e.g. ``{"capture": {"format": "avro"}}``)."""
    uid = uuid.uuid4().hex[:6]
    dbname, prefix, namespace = f"src_{label}_{uid}", f"{label}{uid}", f"{label}_{uid}"
    admin = psycopg2.connect(stack.pg_dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {dbname}")
    admin.close()
    conn = psycopg2.connect(stack.pg_dsn(dbname))
    conn.autocommit = True
    with conn.cursor() as cur:
        for stmt in setup_sql:
            cur.execute(stmt)
    workdir = Path(tempfile.mkdtemp(prefix=f"lakestream-{label}-"))
    catalog = catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password}
    data = {
        "name": f"{label}{uid}",
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-{label}{uid}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog,
        "streams": [{"topic_pattern": rf"{prefix}\.public\..*", "namespace": namespace, "table": "{table}"}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": dbname,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": [f"public.{t}" for t in tables],
            "topic_prefix": prefix,
            "slot_name": f"slot_{prefix}",
            "publication_name": f"pub_{prefix}",
            # No column records (`lakestream.capture.columns`): these tests wait for a topic's end offset to count
            # Debezium's events, which a column record published after DDL would count too.
            # tests/capture/test_ddl_without_rows.py turns them on.
            "column_check_interval_s": 0,
            "connector": {
                # tables created later must be captured too: a regex include list and a
                # publication FOR ALL TABLES (a filtered publication lists only today's tables)
                "table.include.list": rf"public\.{label}_.*",
                "publication.autocreate.mode": "all_tables",
                "heartbeat.interval.ms": "1000",
            },
        },
    }
    for section, settings in (extra or {}).items():
        if isinstance(settings, dict) and isinstance(data.get(section), dict):
            data[section].update(settings)
        else:
            data[section] = settings
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(data))
    return dbname, conn, prefix, namespace, data, workdir


def start_captured_source(
    stack, setup_sql: list[str], tables: list[str], label: str, extra: dict | None = None
) -> CapturedSource:
    """`prepare_captured_source`, then start ``lakestream capture`` (the embedded Debezium engine) on it and
    wait until it streams."""
    dbname, conn, prefix, namespace, data, workdir = prepare_captured_source(stack, setup_sql, tables, label, extra)
    config = parse_config(data, "<capture test>")
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    capture.start()
    try:
        capture.wait_until_streaming(timeout=300)
    except Exception:
        capture.stop()
        raise
    return CapturedSource(stack, dbname, conn, prefix, namespace, config, capture, workdir)


class ConnectCapture:
    """A connector on a Kafka Connect worker, seen the way `CapturedSource` sees a capture process."""

    def __init__(self, worker, name: str, source_dsn: str, slot_name: str):
        self.worker = worker
        self.name = name
        self.source_dsn = source_dsn
        self.slot_name = slot_name
        self._log_offset = worker.log_path.stat().st_size if worker.log_path.exists() else 0

    def state(self) -> tuple[str | None, list[str]]:
        """The connector's state and its tasks' (RUNNING, FAILED, ...); (None, []) while the worker is away."""
        from lakestream.stack.connect import ConnectError

        try:
            status = self.worker.connector_status(self.name)
        except (ConnectError, OSError):
            return None, []
        if status is None:
            return None, []
        return status["connector"]["state"], [t["state"] for t in status.get("tasks", [])]

    @property
    def running(self) -> bool:
        connector, tasks = self.state()
        return connector == "RUNNING" and bool(tasks) and all(t == "RUNNING" for t in tasks)

    def wait_until_running(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.running:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"connector {self.name} not running after {timeout:.0f}s: {self.state()} "
                    f"{self.worker.connector_status(self.name)}\n{self.log_text()[-3000:]}"
                )
            time.sleep(0.5)

    def log_text(self) -> str:
        """The worker's log since this connector was made."""
        if not self.worker.log_path.exists():
            return ""
        with open(self.worker.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode("utf-8", errors="replace")

    def stop(self, timeout: float = 60.0) -> None:
        """Delete the connector (the worker keeps running for the module's other tests) and wait until its task
        let go of the replication slot (the worker stops it after answering the DELETE)."""
        if self.worker.pid() is None:
            return
        self.worker.delete_connector(self.name)
        deadline = time.monotonic() + timeout
        conn = psycopg2.connect(self.source_dsn)
        try:
            with conn.cursor() as cur:
                while time.monotonic() < deadline:
                    cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,))
                    row = cur.fetchone()
                    conn.rollback()
                    if row is None or not row[0]:
                        return
                    time.sleep(0.3)
        finally:
            conn.close()
        raise AssertionError(f"slot {self.slot_name} still active {timeout:.0f}s after deleting connector {self.name}")


def stop_captured_source(source: CapturedSource) -> None:
    source.capture.stop()
    source.conn.close()
    admin = psycopg2.connect(source.stack.pg_dsn())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (source.dbname,),
            )
            cur.execute(f"DROP DATABASE IF EXISTS {source.dbname} WITH (FORCE)")
    finally:
        admin.close()
    shutil.rmtree(source.workdir, ignore_errors=True)


def dead_letters(spark, topic: str) -> list:
    if not spark.catalog.tableExists(DEAD_LETTER):
        return []
    return spark.sql(
        f"SELECT `offset`, error, target_table, value FROM {DEAD_LETTER} WHERE topic = '{topic}' ORDER BY `offset`"
    ).collect()


def verify_ok(source: CapturedSource, spark, tables: list[str]) -> None:
    from lakestream.verify.compare import verify_tables

    report = verify_tables(source.config, spark, tables=[f"public.{t}" for t in tables])
    assert report.ok, report.to_text()


Predicate = Callable[[], bool]
