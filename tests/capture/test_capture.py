"""Capture against real services: PostgreSQL → Debezium (embedded) → Kafka-protocol broker.

Uses the shared `stack` fixture (tests/conftest.py); each test makes its own source database.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from lakestream.capture import CaptureProcess, connect_json, connector_properties
from lakestream.capture.process import LAKESTREAM_COMMAND
from lakestream.config import parse_config
from lakestream.errors import ConfigError

FIXTURE_DIR = Path(__file__).parents[1] / "data"
PASSWORD = "capture-secret-pw"

ALL_TYPES_DDL = """
CREATE TABLE public.all_types (
    id integer PRIMARY KEY,
    big bigint,
    amount numeric(10,2),
    note text,
    flag boolean,
    day date,
    ts timestamp,
    tstz timestamptz,
    doc jsonb,
    uid uuid,
    raw bytea,
    tags integer[]
)"""

INSERT = """INSERT INTO public.all_types VALUES
 (%s, 9000000000, 1234.56, %s, true, '2024-02-29', '2024-02-29 12:34:56.789',
  '2024-02-29 12:34:56.789+02', '{"a": [1, 2], "b": null}', %s, '\\xdeadbeef', '{1,2,3}')"""


def _pipeline(stack, tmp_path: Path, dbname: str, prefix: str, schemas: bool, **capture_extra) -> dict:
    return {
        "name": f"capture-{prefix}",
        "state_dir": str(tmp_path / "state"),
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "catalog": {"type": "hadoop", "warehouse": f"file://{tmp_path}/warehouse"},
        "streams": [{"topic_pattern": rf"{prefix}\..*"}],
        "capture": {
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": dbname,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": ["public.all_types"],
            "topic_prefix": prefix,
            "slot_name": f"slot_{prefix}",
            "publication_name": f"pub_{prefix}",
            "schemas_enabled": schemas,
            **capture_extra,
        },
    }


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


class TopicReader:
    """Reads one topic partition 0 from the beginning, remembering everything seen."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.messages: list[dict] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"t-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    def read_until(self, predicate, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not predicate(self.messages):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out on {self.topic}; got {len(self.messages)} messages: {self.messages[-5:]}"
                )
            msg = self._consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            self.messages.append(
                {
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "key": None if msg.key() is None else msg.key().decode(),
                    "value": None if msg.value() is None else msg.value().decode(),
                }
            )
        return self.messages

    def close(self) -> None:
        self._consumer.close()


def _payload(raw: str | None, schemas: bool):
    if raw is None:
        return None
    doc = json.loads(raw)
    if schemas:
        assert set(doc) == {"schema", "payload"}
        return doc["payload"]
    return doc


def _events(messages, schemas):
    return [(_payload(m["key"], schemas), _payload(m["value"], schemas)) for m in messages]


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas-on", "schemas-off"])
def test_snapshot_then_streaming_changes(stack, source_db, tmp_path, schemas):
    dbname, conn = source_db
    prefix = f"ls{'s' if schemas else 'n'}{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.public.all_types"
    uids = [str(uuid.uuid4()) for _ in range(4)]
    with conn.cursor() as cur:
        cur.execute(ALL_TYPES_DDL)
        for i in (1, 2, 3):
            cur.execute(INSERT, (i, f"row {i}", uids[i - 1]))
    yaml_path = _write_yaml(
        tmp_path / "pipeline.yaml",
        _pipeline(stack, tmp_path, dbname, prefix, schemas, connector={"heartbeat.interval.ms": "1000"}),
    )
    reader = TopicReader(stack.bootstrap_servers, topic)
    capture = CaptureProcess(yaml_path, log_path=tmp_path / "capture.log")
    try:
        capture.start()
        capture.wait_until_streaming(timeout=180)
        snapshot = _events(reader.read_until(lambda m: len(m) >= 3), schemas)
        assert [v["op"] for _, v in snapshot] == ["r", "r", "r"]
        assert [k for k, _ in snapshot] == [{"id": 1}, {"id": 2}, {"id": 3}]
        assert snapshot[0][1]["source"]["snapshot"] in ("first", "true")
        assert snapshot[-1][1]["source"]["snapshot"] == "last"
        row = snapshot[0][1]["after"]
        assert row["id"] == 1 and row["big"] == 9000000000 and row["note"] == "row 1" and row["flag"] is True
        assert row["uid"] == uids[0] and row["tags"] == [1, 2, 3]
        assert json.loads(row["doc"]) == {"a": [1, 2], "b": None}
        assert snapshot[0][1]["source"]["table"] == "all_types" and snapshot[0][1]["source"]["schema"] == "public"

        with conn.cursor() as cur:
            cur.execute(INSERT, (4, "row 4", uids[3]))
            cur.execute("UPDATE public.all_types SET note = 'changed', amount = 1.5 WHERE id = 1")
            cur.execute("DELETE FROM public.all_types WHERE id = 2")
        messages = reader.read_until(lambda m: len(m) >= 7)
        changes = _events(messages[3:7], schemas)
        assert [(k, v and v["op"]) for k, v in changes] == [
            ({"id": 4}, "c"),
            ({"id": 1}, "u"),
            ({"id": 2}, "d"),
            ({"id": 2}, None),
        ]
        assert changes[1][1]["after"]["note"] == "changed"
        assert changes[2][1]["before"]["id"] == 2 and changes[2][1]["after"] is None
        assert messages[6]["value"] is None  # the tombstone after the delete
        assert capture.stop() == 0, capture.log_text()[-3000:]
        assert "capture: stopped after" in capture.log_text()

        # A restart resumes from the stored offsets: no second snapshot, only the new change.
        capture.start()
        capture.wait_until_streaming(timeout=180)
        with conn.cursor() as cur:
            cur.execute(INSERT, (5, "row 5", str(uuid.uuid4())))
        messages = reader.read_until(lambda m: any(_payload(x["key"], schemas) == {"id": 5} for x in m))
        after_restart = _events(messages[7:], schemas)
        assert [v["op"] for _, v in after_restart if v] == ["c"], after_restart
        assert capture.stop() == 0
    finally:
        capture.stop()
        reader.close()
        log_text = capture.log_text()
    password_lines = [line for line in log_text.splitlines() if "password" in line.lower()]
    assert password_lines and not any(stack.pg_password in line for line in password_lines), password_lines
    assert " ERROR " not in log_text, log_text
    # The heartbeat's WAL message is filtered out, never published as an event.
    topics = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "x"}).list_topics(timeout=10).topics
    assert f"{prefix}.message" not in topics
    _save_fixture(messages, schemas)


def _save_fixture(messages: list[dict], schemas: bool) -> None:
    """Keep genuine Debezium output for decoder unit tests (rewritten with LAKESTREAM_SAVE_FIXTURES=1)."""
    path = FIXTURE_DIR / ("debezium_events.jsonl" if schemas else "debezium_events_noschema.jsonl")
    if path.exists() and not os.environ.get("LAKESTREAM_SAVE_FIXTURES"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for m in messages:
            f.write(json.dumps(m) + "\n")


def _capture_settings(**extra):
    return parse_config(_pipeline_dict(**extra)).capture


def _pipeline_dict(**extra) -> dict:
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "client": {"session.timeout.ms": 6000, "linger.ms": 5}},
        "catalog": {"type": "hadoop", "warehouse": "file:///tmp/w"},
        "streams": [{"topic_pattern": r"lakestream\..*"}],
        "capture": {
            "database": {"dbname": "shop", "user": "cdc", "password": PASSWORD},
            "tables": ["public.orders", "sales.items"],
            **extra,
        },
    }


def test_connector_properties_use_debezium_names(tmp_path):
    props = connector_properties(
        _capture_settings(connector={"max.batch.size": "100", "snapshot.fetch.size": "5000"}), tmp_path
    )
    assert props["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert props["plugin.name"] == "pgoutput"
    assert props["table.include.list"] == r"(?-i:public\.orders),(?-i:sales\.items)"
    # lakestream prepares the publication itself (capture.publication); Debezium only uses it
    assert props["publication.autocreate.mode"] == "disabled"
    assert props["publish.via.partition.root"] == "true"
    assert props["tombstones.on.delete"] == "true"
    assert props["value.converter.schemas.enable"] == "true"
    assert props["offset.storage.file.filename"].startswith(str(tmp_path / "capture"))
    assert props["max.batch.size"] == "100" and props["snapshot.fetch.size"] == "5000"  # overrides win
    assert all(isinstance(v, str) for v in props.values())


def test_connect_json_has_no_password_or_embedded_keys():
    doc = connect_json(_capture_settings(schemas_enabled=False))
    assert doc["name"] and doc["config"]["connector.class"].endswith("PostgresConnector")
    assert PASSWORD not in json.dumps(doc)
    assert not any(k.startswith("offset.") for k in doc["config"])
    assert doc["config"]["value.converter.schemas.enable"] == "false"


def test_producer_config_drops_consumer_keys():
    conf = parse_config(_pipeline_dict()).kafka.producer_config()
    assert "session.timeout.ms" not in conf and "group.id" not in conf
    assert conf["linger.ms"] == 5 and conf["enable.idempotence"] is True and conf["acks"] == "all"


def test_cli_prints_connector_config(tmp_path):
    path = _write_yaml(tmp_path / "p.yaml", _pipeline_dict())
    out = subprocess.run(
        [*LAKESTREAM_COMMAND, "capture", str(path), "--print-connector-config", "--skip-publication-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["config"]["database.dbname"] == "shop"
    assert PASSWORD not in out.stdout + out.stderr
    assert "placeholder" in out.stderr


def test_avro_format_sets_the_avro_converter_and_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESTREAM_TEST_SR_USER_INFO", "cdc:sr-secret-pw")
    data = _pipeline_dict(format="avro")
    data["kafka"]["schema_registry"] = {
        "url": "http://registry:8081",
        "basic_auth_user_info_env": "LAKESTREAM_TEST_SR_USER_INFO",
    }
    props = connector_properties(parse_config(data).capture, tmp_path)
    for side in ("key", "value"):
        assert props[f"{side}.converter"] == "io.confluent.connect.avro.AvroConverter"
        assert props[f"{side}.converter.schema.registry.url"] == "http://registry:8081"
        assert props[f"{side}.converter.basic.auth.credentials.source"] == "USER_INFO"
        assert props[f"{side}.converter.basic.auth.user.info"] == "cdc:sr-secret-pw"  # the embedded engine needs it
    path = _write_yaml(tmp_path / "p.yaml", data)
    out = subprocess.run(
        [*LAKESTREAM_COMMAND, "capture", str(path), "--print-connector-config", "--skip-publication-check"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    config = json.loads(out.stdout)["config"]
    assert config["value.converter"] == config["key.converter"] == "io.confluent.connect.avro.AvroConverter"
    assert config["value.converter.schema.registry.url"] == "http://registry:8081"
    assert config["key.converter.schema.registry.url"] == "http://registry:8081"
    assert "value.converter.schemas.enable" not in config
    assert "sr-secret-pw" not in out.stdout + out.stderr and PASSWORD not in out.stdout + out.stderr
    assert config["value.converter.basic.auth.user.info"].startswith("${file:")


def test_avro_format_without_a_registry_is_a_config_error():
    with pytest.raises(ConfigError, match="capture.format avro needs a Schema Registry"):
        parse_config(_pipeline_dict(format="avro"))


def test_apicurio_avro_converter_in_confluent_wire_format_for_connect(tmp_path, monkeypatch):
    """`capture.avro_converter: apicurio`: Apicurio's converter against the registry's own API beside its
    Confluent-compatible URL, writing Confluent's framing; credentials as placeholders in the printed config, and
    the embedded capture refuses it naming the field."""
    monkeypatch.setenv("LAKESTREAM_TEST_SR_USER_INFO", "cdc:sr-secret-pw")
    data = _pipeline_dict(format="avro", avro_converter="apicurio")
    data["kafka"]["schema_registry"] = {
        "url": "http://registry:8080/apis/ccompat/v7",
        "basic_auth_user_info_env": "LAKESTREAM_TEST_SR_USER_INFO",
    }
    config = connect_json(parse_config(data).capture, secrets_file="/run/s.properties")["config"]
    for side in ("key", "value"):
        assert config[f"{side}.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
        assert config[f"{side}.converter.apicurio.registry.url"] == "http://registry:8080/apis/registry/v2"
        assert config[f"{side}.converter.apicurio.registry.as-confluent"] == "true"
        assert config[f"{side}.converter.apicurio.registry.use-id"] == "contentId"
        assert config[f"{side}.converter.apicurio.registry.headers.enabled"] == "false"
        for credential in ("username", "password"):
            placeholder = f"${{file:/run/s.properties:schema.registry.{credential}}}"
            assert config[f"{side}.converter.apicurio.auth.{credential}"] == placeholder
    assert "sr-secret-pw" not in json.dumps(config)
    data["kafka"]["schema_registry"]["url"] = "http://registry:8081"
    with pytest.raises(ConfigError, match=r"capture.avro_converter apicurio: .*/apis/ccompat/v7"):
        connect_json(parse_config(data).capture)
    data["kafka"]["schema_registry"]["url"] = "http://registry:8080/apis/ccompat/v7"
    path = _write_yaml(tmp_path / "p.yaml", data)
    out = subprocess.run([*LAKESTREAM_COMMAND, "capture", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "capture.avro_converter: 'apicurio' names the converter of a Kafka Connect worker" in out.stderr, out.stderr
