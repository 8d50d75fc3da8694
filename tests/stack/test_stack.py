"""The local stack against real services: lifecycle, persistence, port conflicts, shared fixtures."""

from __future__ import annotations

import os
import socket
import time
import uuid

import psycopg2
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lakestream.errors import StackError
from lakestream.stack import StackInfo
from lakestream.stack.process import free_port


def produce_one(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    # Pinned to partition 0: Tansu auto-creates topics with 4 partitions, noida-db with 1.
    producer.produce(topic, value, key=key, partition=0)
    assert producer.flush(10) == 0


def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 10.0) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                records.append((msg.key(), msg.value()))
        return records
    finally:
        consumer.close()


def pg_query(info: StackInfo, query: str, dbname: str | None = None) -> list[tuple]:
    conn = psycopg2.connect(info.pg_dsn(dbname))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def test_data_survives_down_and_up(stack_factory):
    stack = stack_factory()
    info = stack.up()
    status = stack.status()
    assert {name: (s.running, s.healthy) for name, s in status.items()} == {
        "postgres": (True, True),
        "kafka": (True, True),
    }
    assert info.warehouse.startswith("file:///") and info.warehouse.endswith("/warehouse")
    assert info.catalog_jdbc_uri() == f"jdbc:postgresql://127.0.0.1:{info.pg_port}/lakestream_catalog"

    produce_one(info.bootstrap_servers, "persist_check", b"k1", b"v1")
    assert read_all(info.bootstrap_servers, "persist_check", 1) == [(b"k1", b"v1")]
    pg_query(info, "CREATE TABLE customers (id int PRIMARY KEY, name text)")
    pg_query(info, "INSERT INTO customers VALUES (1, 'Ada')")
    assert pg_query(info, "SHOW wal_level") == [("logical",)]
    assert pg_query(info, "SELECT 1", dbname=info.catalog_db) == [(1,)]

    stack.down()
    assert not any(s.running for s in stack.status().values())
    stack.down()  # safe when nothing runs

    assert stack.up() == info
    assert pg_query(info, "SELECT id, name FROM customers") == [(1, "Ada")]
    assert read_all(info.bootstrap_servers, "persist_check", 1) == [(b"k1", b"v1")]


def test_up_is_idempotent_and_detects_stale_pid_files(stack_factory):
    stack = stack_factory()
    # A pid file naming a live process that is not PostgreSQL (this pytest) is stale.
    pid_file = stack.settings.state_dir / "pids" / "postgres.pid"
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{os.getpid()}\n")
    assert not stack.status()["postgres"].running
    assert not pid_file.exists()

    stack.up()
    pids = {name: s.pid for name, s in stack.status().items()}
    started = time.monotonic()
    stack.up()
    assert time.monotonic() - started < 5
    assert {name: s.pid for name, s in stack.status().items()} == pids
    kafka = stack.status()["kafka"]
    assert kafka.healthy and kafka.persistent and "Apache Kafka" in kafka.detail
    stack.down()


@pytest.mark.parametrize("taken", ["pg_port", "kafka_port"])
def test_taken_port_names_the_port_and_the_setting(stack_factory, taken):
    port = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        stack = stack_factory(**{taken: port})
        with pytest.raises(StackError, match=rf"port {port} .*{taken}"):
            stack.up()
        # The check runs before anything starts: no half stack is left behind.
        assert not any(s.running for s in stack.status().values())


def test_shared_fixtures(stack, pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("SELECT current_database(), current_user")
        assert cur.fetchone() == (stack.source_db, stack.pg_user)
    produce_one(stack.bootstrap_servers, "shared_check", b"k", b"v")
    assert read_all(stack.bootstrap_servers, "shared_check", 1) == [(b"k", b"v")]


def test_stack_up_with_connect_registry_and_s3_runs_them_beside_postgres_and_kafka(service_dir_factory):
    """`lakestream stack up --connect --registry --storage s3`: a Kafka Connect worker (Debezium's PostgreSQL connector
    installed), Apicurio Registry (Confluent's API, BACKWARD by default as Confluent's registry) and Versity's S3
    gateway beside PostgreSQL and Kafka, shown by `status`, stopped by `down` (the worker's state stays in the
    broker's topics)."""
    import json
    import urllib.request

    from conftest import run_lakestream

    from lakestream.stack.process import free_ports, pid_alive

    state = service_dir_factory("stack-connect")
    pg, kafka, connect, registry, s3 = free_ports(5)
    ports = ["--state-dir", str(state), "--pg-port", str(pg), "--kafka-port", str(kafka)]
    ports += ["--connect", "--connect-port", str(connect), "--registry", "--registry-port", str(registry)]
    ports += ["--storage", "s3", "--s3-port", str(s3)]
    url = f"http://127.0.0.1:{registry}/apis/ccompat/v7"
    services = ("connect", "registry", "objectstore")
    try:
        up = run_lakestream("stack", "up", *ports, timeout=300)
        assert up.returncode == 0, up.stderr[-3000:]
        assert f"kafka connect      http://127.0.0.1:{connect}" in up.stdout
        assert f"schema registry    {url} (Apicurio Registry, in memory)" in up.stdout, up.stdout
        assert f"object store       http://127.0.0.1:{s3}" in up.stdout, up.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{connect}/connector-plugins", timeout=10) as response:
            plugins = {p["class"]: p["version"] for p in json.loads(response.read())}
        assert plugins == {"io.debezium.connector.postgresql.PostgresConnector": "3.6.3.Final"}
        with urllib.request.urlopen(f"{url}/config", timeout=10) as response:
            assert json.loads(response.read())["compatibilityLevel"] == "BACKWARD"
        status = run_lakestream("stack", "status", *ports)
        for name in services:
            line = next(ln for ln in status.stdout.splitlines() if ln.startswith(f"{name} "))
            assert " running " in line and " yes " in line, status.stdout
        pids = {name: int((state / "pids" / f"{name}.pid").read_text()) for name in services}
    finally:
        down = run_lakestream("stack", "down", *ports, timeout=120)
    assert down.returncode == 0, down.stderr[-3000:]
    assert not any(pid_alive(pid) for pid in pids.values())


def test_connect_port_must_differ_from_the_others(tmp_path):
    from lakestream.errors import ConfigError
    from lakestream.stack import StackSettings

    with pytest.raises(ConfigError, match="two services share a port"):
        StackSettings(state_dir=tmp_path, kafka_port=19092, connect=True, connect_port=19092)
    StackSettings(state_dir=tmp_path, kafka_port=19092, connect=False, connect_port=19092)  # no worker: no clash


def test_registry_port_must_differ_from_the_others(tmp_path):
    from lakestream.errors import ConfigError
    from lakestream.stack import StackSettings

    with pytest.raises(ConfigError, match="two services share a port"):
        StackSettings(state_dir=tmp_path, kafka_port=19092, registry=True, registry_port=19092)
    StackSettings(state_dir=tmp_path, kafka_port=19092, registry=False, registry_port=19092)  # no registry: no clash
