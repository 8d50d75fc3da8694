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
                raise AssertionError(f"Debezium did not publish in {timeout:.0f}s: have {have}, want {expected}\n"
                                     f"{self.capture.log_text()[-3000:]}")
            if not self.capture.running:
                raise AssertionError(f"capture exited:\n{self.capture.log_text()[-3000:]}")
            time.sleep(0.5)

    def published(self, table: str) -> list[dict]:
        """Every message of the table's topic so far (value payloads decoded)."""
        import json

        end = self.end_offset(table)
        consumer = Consumer({"bootstrap.servers": self.stack.bootstrap_servers, "group.id": f"rd-{uuid.uuid4().hex}",
                             "enable.auto.commit": False})
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


def start_captured_source(stack, setup_sql: list[str], tables: list[str], label: str,
                          extra: dict | None = None) -> CapturedSource:
    """Create a database, run ``setup_sql``, start Debezium on ``public.<tables>`` (plus any table
    created later whose name starts with ``<label>_``) and wait until it streams.

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
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "group_id": f"lakestream-{label}{uid}",
                  "client": {"session.timeout.ms": 6000}},
        "catalog": catalog,
        "streams": [{"topic_pattern": rf"{prefix}\.public\..*", "namespace": namespace, "table": "{table}"}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": {"host": stack.pg_host, "port": stack.pg_port, "dbname": dbname,
                         "user": stack.pg_user, "password": stack.pg_password},
            "tables": [f"public.{t}" for t in tables],
            "topic_prefix": prefix,
            "slot_name": f"slot_{prefix}",
            "publication_name": f"pub_{prefix}",
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
    config = parse_config(data, "<capture test>")
    yaml_path = workdir / "pipeline.yaml"
    yaml_path.write_text(yaml.safe_dump(data))
    capture = CaptureProcess(yaml_path, log_path=workdir / "capture.log")
    capture.start()
    try:
        capture.wait_until_streaming(timeout=300)
    except Exception:
        capture.stop()
        raise
    return CapturedSource(stack, dbname, conn, prefix, namespace, config, capture, workdir)


def stop_captured_source(source: CapturedSource) -> None:
    source.capture.stop()
    source.conn.close()
    admin = psycopg2.connect(source.stack.pg_dsn())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s AND NOT active", (source.dbname,))
            cur.execute(f"DROP DATABASE IF EXISTS {source.dbname} WITH (FORCE)")
    finally:
        admin.close()
    shutil.rmtree(source.workdir, ignore_errors=True)


def dead_letters(spark, topic: str) -> list:
    if not spark.catalog.tableExists(DEAD_LETTER):
        return []
    return spark.sql(f"SELECT `offset`, error, target_table, value FROM {DEAD_LETTER} WHERE topic = '{topic}' "
                     "ORDER BY `offset`").collect()


def verify_ok(source: CapturedSource, spark, tables: list[str]) -> None:
    from lakestream.verify import verify_tables

    report = verify_tables(source.config, spark, tables=[f"public.{t}" for t in tables])
    assert report.ok, report.to_text()


Predicate = Callable[[], bool]
