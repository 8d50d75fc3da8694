"""The pipeline's Kafka clients through the stack's SASL_SSL listener (SCRAM-SHA-512, ACLs on), the password
given as ``${VAR}`` in the YAML; a refused client stops the process at once with the setting to fix, and the
password appears in no output."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AclOperation, ResourceType
from conftest import catalog_settings, run_lakestream

from lakestream.config import load_config
from lakestream.read.query import read_table
from lakestream.stack import StackInfo
from lakestream.stack.broker import allow, upsert_scram_user
from lakestream.stack.tls import make_ca

PASSWORD_ENV = "LAKESTREAM_TEST_KAFKA_PASSWORD"


def sasl_pipeline_yaml(
    stack: StackInfo, path: Path, topic: str, table: str, sections: dict | None = None, **client
) -> Path:
    """A pipeline YAML reading ``topic`` through SASL_SSL as the stack's user, its password as ${PASSWORD_ENV}."""
    data = {
        "name": f"sasl{uuid.uuid4().hex[:6]}",
        "kafka": {
            "bootstrap_servers": stack.kafka_sasl_bootstrap_servers,
            "group_id": f"lakestream-{table}",
            "client": {**stack.kafka_sasl_client("${" + PASSWORD_ENV + "}"), **client},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topics": [topic], "namespace": "sasl", "table": table}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[1]", "driver_memory": "1g"},
        "state_dir": str(path.parent / "state"),
        **(sections or {}),
    }
    path.write_text(yaml.safe_dump(data))
    return path


def high_watermark(stack: StackInfo, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "sasl-test-watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def produce_sasl(stack: StackInfo, topic: str, ids: range) -> None:
    """Debezium-shaped JSON changes, produced as the stack's SCRAM user over SASL_SSL."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": stack.kafka_sasl_bootstrap_servers,
            **stack.kafka_sasl_client(stack.kafka_sasl_password()),
        }
    )
    failures = []
    for i in ids:
        producer.produce(
            topic,
            key=json.dumps({"id": i}),
            value=json.dumps({"op": "c", "after": {"id": i, "n": i}}),
            partition=0,
            on_delivery=lambda err, _msg: err and failures.append(str(err)),
        )
    assert producer.flush(30) == 0 and not failures, failures


def assert_no_secret(outputs: list[str], *secrets: str) -> None:
    for text in outputs:
        for secret in secrets:
            assert secret not in text


@pytest.fixture
def topic(stack):
    name = f"sasl{uuid.uuid4().hex[:6]}.public.items"
    produce_sasl(stack, name, range(5))
    return name


def test_a_pipeline_run_a_fresh_read_and_a_replay_through_sasl_ssl(stack, topic, tmp_path, monkeypatch):
    password = stack.kafka_sasl_password()
    monkeypatch.setenv(PASSWORD_ENV, password)
    table = "items_" + topic[4:10]
    config = sasl_pipeline_yaml(stack, tmp_path / "p.yaml", topic, table)
    assert password not in config.read_text()
    from confluent_kafka import Producer

    malformed = Producer({"bootstrap.servers": stack.bootstrap_servers})
    malformed.produce(topic, key=b'{"id": 99}', value=b"not json", partition=0)  # becomes a dead letter
    assert malformed.flush(10) == 0

    run = run_lakestream("run", str(config), "--until-idle")
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(read_table(load_config(config), f"sasl.{table}").column("id").to_pylist()) == list(range(5))
    before = high_watermark(stack, topic)
    replay = run_lakestream("dead-letters", "replay", str(config), "--topic", topic)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert high_watermark(stack, topic) == before + 1  # the dead letter, sent again as the SCRAM user
    produce_sasl(stack, topic, range(5, 8))  # a tail the pipeline has not committed
    fresh = run_lakestream("query", str(config), f"sasl.{table}", "--fresh", "--format", "json")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert sorted(row["id"] for row in json.loads(fresh.stdout)) == list(range(8))
    assert_no_secret([p.stdout + p.stderr for p in (run, replay, fresh)], password)


def test_the_alerts_producer_through_sasl_ssl(stack, topic, tmp_path, monkeypatch):
    password = stack.kafka_sasl_password()
    monkeypatch.setenv(PASSWORD_ENV, password)
    uid = topic[4:10]
    alerts_topic = f"sasl_alerts_{uid}"
    config = sasl_pipeline_yaml(
        stack,
        tmp_path / "p.yaml",
        topic,
        f"history_{uid}",
        sections={
            "streams": [
                {
                    "topics": [topic],
                    "mode": "append",
                    "namespace": "sasl",
                    "table": f"raw_{uid}",
                    "transforms": [
                        {
                            "name": "history",
                            "table": f"history_{uid}",
                            "sql": "SELECT after.id AS id, after.id AS event_no, _kafka_ts_ms AS ts_ms, "
                            "_topic, _kafka_partition, _kafka_offset, _kafka_ts_ms AS _source_ts_ms "
                            "FROM batch",
                        }
                    ],
                }
            ],
            "rules": [
                {
                    "name": "big",
                    "source": f"sasl.history_{uid}",
                    "key": "id",
                    "event_time": "ts_ms",
                    "event_id": "event_no",
                    "alerts_table": f"sasl.alerts_{uid}",
                    "alerts_topic": alerts_topic,
                    "checks": [{"name": "big", "kind": "predicate", "sql": "id >= 3"}],
                }
            ],
        },
    )

    run = run_lakestream("run", str(config), "--until-idle")
    assert run.returncode == 0, run.stderr[-3000:]
    assert high_watermark(stack, alerts_topic) == 2  # ids 3 and 4
    assert_no_secret([run.stdout, run.stderr], password)


@pytest.mark.parametrize("refusal", ["wrong password", "untrusted certificate"])
def test_a_refused_client_stops_the_run_at_once_naming_the_setting(stack, topic, tmp_path, monkeypatch, refusal):
    password = stack.kafka_sasl_password()
    if refusal == "wrong password":
        given, client, setting = "not-" + password, {}, "kafka.client.sasl.password"
    else:
        other_ca = make_ca(tmp_path / "other-ca", "not the broker's")
        given, client, setting = password, {"ssl.ca.location": str(other_ca)}, "kafka.client.ssl.ca.location"
    monkeypatch.setenv(PASSWORD_ENV, given)
    config = sasl_pipeline_yaml(stack, tmp_path / "p.yaml", topic, "refused", **client)

    started = time.monotonic()
    run = run_lakestream("run", str(config), "--until-idle", timeout=120)
    elapsed = time.monotonic() - started
    assert run.returncode != 0
    assert setting in run.stderr, run.stderr[-3000:]
    assert "KafkaAccessError" not in run.stdout and "batch failed (" not in run.stderr  # no retry
    assert elapsed < 30, elapsed  # before Spark starts, not waited out as an outage
    assert_no_secret([run.stdout, run.stderr], password, given)


def test_a_principal_without_read_on_the_topic_stops_the_run(stack, topic, tmp_path, monkeypatch):
    user, password = f"noread{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    upsert_scram_user(stack.bootstrap_servers, user, password)
    # It sees the topic and may use its group, but may not read the topic's records.
    allow(stack.bootstrap_servers, user, [(ResourceType.TOPIC, topic)], AclOperation.DESCRIBE)
    allow(stack.bootstrap_servers, user, [(ResourceType.GROUP, "*")], AclOperation.READ)
    monkeypatch.setenv(PASSWORD_ENV, password)
    config = sasl_pipeline_yaml(stack, tmp_path / "p.yaml", topic, "noread", **{"sasl.username": user})

    started = time.monotonic()
    run = run_lakestream("run", str(config), "--until-idle", timeout=300)
    elapsed = time.monotonic() - started
    assert run.returncode != 0
    assert f"denied User:{user} READ on topic '{topic}'" in run.stderr, run.stderr[-3000:]
    assert "kafka.client.sasl.username" in run.stderr
    assert "batch failed (" not in run.stderr  # stopped at the first failure, not retried
    assert elapsed < 120, elapsed
    assert_no_secret([run.stdout, run.stderr], password, stack.kafka_sasl_password())


def test_the_stack_exposes_its_sasl_listener_without_the_password(stack):
    password_file = Path(stack.kafka_sasl_password_file)
    assert password_file.stat().st_mode & 0o777 == 0o600
    assert Path(stack.kafka_ca_location).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert stack.kafka_sasl_password() not in repr(stack)
    client = stack.kafka_sasl_client("${X}")
    assert client["sasl.password"] == "${X}" and client["security.protocol"] == "SASL_SSL"


def test_a_refusal_named_by_a_spark_task_is_a_config_failure():
    from lakestream.errors import KafkaAccessError, classify_failure

    remote = RuntimeError(
        'Traceback (most recent call last):\n  File "reader.py", line 1, in _take\n'
        "lakestream.errors.KafkaAccessError: Kafka at h:1 denied User:u READ on topic 't'"
    )
    assert classify_failure(remote).kind == "config" and classify_failure(remote).infrastructure
    assert classify_failure(KafkaAccessError("refused")).kind == "config"


@pytest.fixture
def capture_source(source_db):
    """A fresh source database with one table of three rows: (its name, an autocommit connection)."""
    _, conn = source_db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE public.items (id integer PRIMARY KEY, n integer)")
        cur.execute("INSERT INTO public.items VALUES (1, 1), (2, 2), (3, 3)")
    return source_db


def capture_yaml(stack: StackInfo, path: Path, dbname: str, prefix: str, **client) -> Path:
    """A pipeline YAML whose capture publishes through SASL_SSL as the stack's user (password as ${PASSWORD_ENV})."""
    data = {
        "name": f"capture-{prefix}",
        "state_dir": str(path.parent / "state"),
        "kafka": {
            "bootstrap_servers": stack.kafka_sasl_bootstrap_servers,
            "client": {**stack.kafka_sasl_client("${" + PASSWORD_ENV + "}"), **client},
        },
        "catalog": {"type": "hadoop", "warehouse": f"file://{path.parent}/warehouse"},
        "streams": [{"topic_pattern": rf"{prefix}\..*"}],
        "capture": {
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": dbname,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": ["public.items"],
            "topic_prefix": prefix,
            "slot_name": f"slot_{prefix}",
            "publication_name": f"pub_{prefix}",
            "schemas_enabled": False,
        },
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_capture_publishes_through_sasl_ssl(stack, capture_source, tmp_path, monkeypatch):
    """Debezium's snapshot and a streamed change reach the topic through the SASL_SSL listener."""
    from lakestream.capture import CaptureProcess

    dbname, conn = capture_source
    password = stack.kafka_sasl_password()
    monkeypatch.setenv(PASSWORD_ENV, password)
    prefix = f"sasl{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.public.items"
    capture = CaptureProcess(
        capture_yaml(stack, tmp_path / "pipeline.yaml", dbname, prefix), log_path=tmp_path / "capture.log"
    )
    try:
        capture.start()
        capture.wait_until_streaming(timeout=180)
        with conn.cursor() as cur:
            cur.execute("UPDATE public.items SET n = 10 WHERE id = 1")
        deadline = time.monotonic() + 60
        while high_watermark(stack, topic) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert high_watermark(stack, topic) == 4  # three snapshot rows and the update
        assert capture.stop() == 0, capture.log_text()[-3000:]
    finally:
        capture.stop()
    assert_no_secret([capture.log_text()], password)


def test_capture_with_a_wrong_password_stops_at_once(stack, capture_source, tmp_path, monkeypatch):
    dbname, _ = capture_source
    password = "not-the-password-" + uuid.uuid4().hex[:8]
    monkeypatch.setenv(PASSWORD_ENV, password)
    prefix = f"sasl{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    done = run_lakestream("capture", str(capture_yaml(stack, tmp_path / "pipeline.yaml", dbname, prefix)), timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    assert "kafka.client.sasl.password" in done.stderr, done.stderr[-3000:]
    assert_no_secret([done.stdout, done.stderr], password)
