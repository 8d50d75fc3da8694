"""Source DDL reaches the mirror without a row changing (`lakestream.capture.columns`): real PostgreSQL and MariaDB →
``lakestream capture`` (embedded Debezium, the column check every second) → Kafka → Spark → Iceberg.

For each kind: columns added (with and without a DEFAULT, NOT NULL) and widened on a table no one writes afterwards,
which `verify` rejects until the mirror has them and passes once the engine ran; DDL between two changes of the same
key; and capture SIGKILLed right after the DDL, the restarted capture publishing the columns it missed.
The MariaDB half is marked ``mariadb_slow`` (`make test-mariadb`).
"""

from __future__ import annotations

import time
import uuid

import pytest
import yaml
from capture_harness import start_captured_source, stop_captured_source
from confluent_kafka import Consumer, KafkaException, TopicPartition
from conftest import catalog_settings, mariadb_database

from lakestream.capture import CaptureProcess
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.verify.compare import verify_tables

CHECK = {"column_check_interval_s": 1}


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    except KafkaException:
        return 0
    finally:
        consumer.close()


def _wait_for_offset(bootstrap: str, topic: str, at_least: int, capture: CaptureProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (end := _end_offset(bootstrap, topic)) < at_least:
        if not capture.running:
            raise AssertionError(f"capture exited:\n{capture.log_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} ends at {end}, not {at_least}:\n{capture.log_text()[-3000:]}")
        time.sleep(0.3)


def _columns(spark, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema}


def _rows(spark, table: str, columns: str) -> dict:
    return {r[0]: tuple(r[1:]) for r in spark.sql(f"SELECT {columns} FROM {table}").collect()}


# ---------------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------------

PG_SETUP = [
    "CREATE TABLE quiet (id int PRIMARY KEY, v text, w int)",
    "INSERT INTO quiet SELECT g, 'v' || g, g FROM generate_series(1, 5) g",
    "CREATE TABLE pair (id int PRIMARY KEY, v text)",
    "INSERT INTO pair VALUES (1, 'one'), (2, 'two')",
    "CREATE TABLE crashed (id int PRIMARY KEY, v text)",
    "INSERT INTO crashed VALUES (1, 'one'), (2, 'two')",
]
PG_TABLES = ["quiet", "pair", "crashed"]


@pytest.fixture(scope="module")
def pg(stack, spark):
    source = start_captured_source(
        stack,
        PG_SETUP,
        PG_TABLES,
        "pgddl",
        extra={"capture": {"connector": {"heartbeat.interval.ms": "1000"}, **CHECK}},
    )
    try:
        source.sync({"quiet": 5, "pair": 2, "crashed": 2})  # a first start publishes no column record
        yield source
    finally:
        stop_captured_source(source)


def _pg_verify(source, spark, table: str):
    return verify_tables(source.config, spark, [f"public.{table}"])


def test_postgresql_quiet_table_gains_added_and_widened_columns(pg, spark):
    before = pg.end_offset("quiet")
    pg.sql(
        "ALTER TABLE quiet ADD COLUMN q varchar(5) NOT NULL DEFAULT 'qd', ADD COLUMN n numeric(8,2) DEFAULT 1.5, "
        "ADD COLUMN plain int, ALTER COLUMN w TYPE bigint"
    )
    report = _pg_verify(pg, spark, "quiet")
    assert not report.ok and "lake lacks columns" in report.to_text(), report.to_text()
    pg.sync({"quiet": before + 1})  # the column record: no row of quiet changed
    assert _columns(spark, pg.table("quiet")) == {
        "id": "int",
        "v": "string",
        "w": "bigint",
        "q": "string",
        "n": "decimal(8,2)",
        "plain": "int",
    }
    rows = _rows(spark, pg.table("quiet"), "id, q, CAST(n AS STRING), plain")
    assert rows == {i: ("qd", "1.50", None) for i in range(1, 6)}
    report = _pg_verify(pg, spark, "quiet")
    assert report.ok, report.to_text()


def test_postgresql_ddl_between_two_changes_of_a_key(pg, spark):
    before = pg.end_offset("pair")
    pg.sql(
        "UPDATE pair SET v = 'before' WHERE id = 1",
        "ALTER TABLE pair ADD COLUMN note text NOT NULL DEFAULT 'dflt'",
        "UPDATE pair SET v = 'after', note = 'set' WHERE id = 1",
    )
    time.sleep(2.5)  # the column check runs too (its record may land before, between or after the updates)
    pg.sync({"pair": before + 2})
    assert _rows(spark, pg.table("pair"), "id, v, note") == {1: ("after", "set"), 2: ("two", "dflt")}
    report = _pg_verify(pg, spark, "pair")
    assert report.ok, report.to_text()


def test_postgresql_capture_killed_right_after_ddl(pg, spark):
    before = pg.end_offset("crashed")
    pg.sql("ALTER TABLE crashed ADD COLUMN extra int DEFAULT 7")
    pg.capture.kill()
    pg.capture.start()
    pg.capture.wait_until_streaming(timeout=300)
    pg.sync({"crashed": before + 1})
    assert _rows(spark, pg.table("crashed"), "id, v, extra") == {1: ("one", 7), 2: ("two", 7)}
    report = _pg_verify(pg, spark, "crashed")
    assert report.ok, report.to_text()


# ---------------------------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------------------------

MARIADB_SETUP = [
    "CREATE TABLE quiet (id INT PRIMARY KEY, v VARCHAR(10), w INT, f FLOAT)",
    "INSERT INTO quiet VALUES (1, 'one', 1, 0.5), (2, 'two', 2, 1.5)",
    "CREATE TABLE pair (id INT PRIMARY KEY, v VARCHAR(10))",
    "INSERT INTO pair VALUES (1, 'one'), (2, 'two')",
    "CREATE TABLE crashed (id INT PRIMARY KEY, v VARCHAR(10))",
    "INSERT INTO crashed VALUES (1, 'one'), (2, 'two')",
]


class MariaDBSource:
    def __init__(self, server, dbname, conn, prefix, namespace, config, capture):
        self.server, self.dbname, self.conn, self.prefix = server, dbname, conn, prefix
        self.namespace, self.config, self.capture = namespace, config, capture

    def sql(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{self.dbname}.{table}"

    def table(self, table: str) -> str:
        return f"lake.{self.namespace}.{table}"

    def end_offset(self, table: str) -> int:
        return _end_offset(self.config.kafka.bootstrap_servers, self.topic(table))

    def sync(self, spark, table: str, at_least: int) -> None:
        _wait_for_offset(self.config.kafka.bootstrap_servers, self.topic(table), at_least, self.capture)
        run_pipeline(self.config, spark=spark, stop_when_idle=True)

    def verify(self, spark, table: str):
        return verify_tables(self.config, spark, [f"{self.dbname}.{table}"])


@pytest.fixture(scope="module")
def mdb(stack, mariadb, service_dir_factory, spark):
    uid = uuid.uuid4().hex[:6]
    dbname, prefix, namespace = f"mddl_{uid}", f"mddl{uid}", f"mddl_{uid}"
    mariadb.run_as_root(f"CREATE DATABASE `{dbname}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn = mariadb.connect(dbname)
    with conn.cursor() as cur:
        for statement in MARIADB_SETUP:
            cur.execute(statement)
    workdir = service_dir_factory("mddl")
    data = {
        "name": f"mddl{uid}",
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-mddl{uid}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topic_pattern": rf"{prefix}\..*", "namespace": namespace, "table": "{table}"}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": mariadb_database(mariadb, dbname),
            "topic_prefix": prefix,
            "tables": [f"{dbname}.{t}" for t in ("quiet", "pair", "crashed")],
            "connector": {"heartbeat.interval.ms": "1000"},
            **CHECK,
        },
    }
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(data))
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    capture.start()
    source = MariaDBSource(mariadb, dbname, conn, prefix, namespace, parse_config(data, "<test>"), capture)
    try:
        capture.wait_until_streaming(timeout=180)
        for table in ("quiet", "pair", "crashed"):  # the snapshot's rows (a first start publishes no column record)
            _wait_for_offset(stack.bootstrap_servers, source.topic(table), 2, capture)
        run_pipeline(source.config, spark=spark, stop_when_idle=True)
        yield source
    finally:
        capture.stop()
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")


@pytest.mark.mariadb_slow
def test_mariadb_quiet_table_gains_added_and_widened_columns(mdb, spark):
    before = mdb.end_offset("quiet")
    mdb.sql(
        "ALTER TABLE quiet ADD COLUMN q VARCHAR(5) NOT NULL DEFAULT 'qd'",
        "ALTER TABLE quiet ADD COLUMN e VARCHAR(5) NOT NULL, ADD COLUMN k INT NOT NULL, ADD COLUMN plain INT, "
        "ADD COLUMN d DECIMAL(8,2) DEFAULT 2.5, MODIFY w BIGINT, MODIFY f DOUBLE",
    )
    report = mdb.verify(spark, "quiet")
    assert not report.ok and "lake lacks columns" in report.to_text(), report.to_text()
    mdb.sync(spark, "quiet", before + 1)  # the column record: no row of quiet changed
    columns = _columns(spark, mdb.table("quiet"))
    assert {c: columns.get(c) for c in ("w", "f", "q", "e", "k", "plain", "d")} == {
        "w": "bigint",
        "f": "double",
        "q": "string",
        "e": "string",
        "k": "int",
        "plain": "int",
        "d": "decimal(8,2)",
    }
    rows = _rows(spark, mdb.table("quiet"), "id, q, e, k, plain, CAST(d AS STRING)")
    assert rows == {1: ("qd", "", 0, None, "2.50"), 2: ("qd", "", 0, None, "2.50")}
    report = mdb.verify(spark, "quiet")
    assert report.ok, report.to_text()


@pytest.mark.mariadb_slow
def test_mariadb_ddl_between_two_changes_of_a_key(mdb, spark):
    before = mdb.end_offset("pair")
    mdb.sql(
        "UPDATE pair SET v = 'before' WHERE id = 1",
        "ALTER TABLE pair ADD COLUMN note VARCHAR(10) NOT NULL DEFAULT 'dflt'",
        "UPDATE pair SET v = 'after', note = 'set' WHERE id = 1",
    )
    time.sleep(2.5)  # the column check runs too (its record may land before, between or after the updates)
    mdb.sync(spark, "pair", before + 2)
    assert _rows(spark, mdb.table("pair"), "id, v, note") == {1: ("after", "set"), 2: ("two", "dflt")}
    report = mdb.verify(spark, "pair")
    assert report.ok, report.to_text()


@pytest.mark.mariadb_slow
def test_mariadb_capture_killed_right_after_ddl(mdb, spark):
    before = mdb.end_offset("crashed")
    mdb.sql("ALTER TABLE crashed ADD COLUMN extra INT DEFAULT 7")
    mdb.capture.kill()
    mdb.capture.start()
    mdb.capture.wait_until_streaming(timeout=300)
    mdb.sync(spark, "crashed", before + 1)
    assert _rows(spark, mdb.table("crashed"), "id, v, extra") == {1: ("one", 7), 2: ("two", 7)}
    report = mdb.verify(spark, "crashed")
    assert report.ok, report.to_text()
