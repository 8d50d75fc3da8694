"""A MariaDB source's start check on a real server (binlog settings, grants, tables), its connector settings,
`--print-connector-config`, and the config's validation of `kind: mariadb`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import mariadb_database, run_lakestream

from lakestream.capture.connector import connect_json, connector_properties
from lakestream.capture.databases import capture_database
from lakestream.config import parse_config
from lakestream.errors import CaptureError, ConfigError


def _config(database: dict, tables: list[str], tmp_path: Path, **capture):
    return parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "catalog": {"type": "hadoop", "warehouse": f"file://{tmp_path}/warehouse"},
            "streams": [{"topic_pattern": r"mdb\..*"}],
            "state_dir": str(tmp_path / "state"),
            "capture": {"database": database, "tables": tables, "topic_prefix": "mdb", **capture},
        },
        "<test>",
    )


@pytest.fixture
def user(mariadb, mariadb_source):
    """A MariaDB account of its own per test: ``make(*grants)`` creates it with those grants."""
    made = []

    def make(*grants: str) -> dict:
        name = f"u{uuid.uuid4().hex[:8]}"
        statements = [f"CREATE USER '{name}'@'%' IDENTIFIED BY 'pw-{name}'"]
        statements += [f"GRANT {g} TO '{name}'@'%'" for g in grants]
        mariadb.run_as_root(";".join(statements))
        made.append(name)
        return {**mariadb_database(mariadb, mariadb_source[0]), "user": name, "password": f"pw-{name}"}

    yield make
    for name in made:
        mariadb.run_as_root(f"DROP USER IF EXISTS '{name}'@'%'")


def test_missing_grants_stop_capture_naming_each_grant(mariadb_source, user, tmp_path):
    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
    weak = user(f"SELECT ON `{dbname}`.* ")
    capture = _config(weak, [f"{dbname}.orders"], tmp_path).capture
    with pytest.raises(CaptureError) as err:
        capture_database(capture).prepare(capture)
    account = f"'{weak['user']}'@'%'"
    text = str(err.value)
    assert f"GRANT REPLICATION SLAVE ON *.* TO {account}" in text
    assert f"GRANT REPLICATION CLIENT ON *.* TO {account}" in text
    assert f"GRANT RELOAD ON *.* TO {account}" in text
    assert f"may not read {dbname}.orders" not in text  # SELECT on the database covers the table

    # no lock is needed when the snapshot reads no rows; table-level LOCK TABLES also does
    nolock = _config(weak, [f"{dbname}.orders"], tmp_path, snapshot_mode="no_data").capture
    with pytest.raises(CaptureError) as err:
        capture_database(nolock).prepare(nolock)
    assert "RELOAD" not in str(err.value)


def test_least_grants_pass_and_keyless_tables_are_reported(mariadb_source, user, tmp_path):
    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE keyed (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE `no key` (a INT)")
    least = user("REPLICATION SLAVE, REPLICATION CLIENT ON *.*", f"SELECT, LOCK TABLES ON `{dbname}`.*")
    capture = _config(least, [f"{dbname}.keyed", f"{dbname}.no key"], tmp_path).capture
    assert capture_database(capture).prepare(capture) == [f"{dbname}.no key"]


def test_binlog_settings_missing_tables_and_views_stop_capture(mariadb, mariadb_source, tmp_path):
    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("CREATE VIEW v AS SELECT id FROM t")
    capture = _config(
        mariadb_database(mariadb, dbname), [f"{dbname}.t", f"{dbname}.v", f"{dbname}.gone"], tmp_path
    ).capture
    mariadb.run_as_root("SET GLOBAL binlog_format = 'MIXED'; SET GLOBAL binlog_row_image = 'MINIMAL'")
    try:
        with pytest.raises(CaptureError) as err:
            capture_database(capture).prepare(capture)
    finally:
        mariadb.run_as_root("SET GLOBAL binlog_format = 'ROW'; SET GLOBAL binlog_row_image = 'FULL'")
    text = str(err.value)
    assert "SET GLOBAL binlog_format = 'ROW'" in text and "binlog_format is MIXED" in text
    assert "SET GLOBAL binlog_row_image = 'FULL'" in text and "binlog_row_image is MINIMAL" in text
    assert f"{dbname}.v is a view" in text
    assert f"{dbname}.gone does not exist" in text
    assert f"{dbname}.t " not in text
    # resuming (capture has offsets): a table gone since was dropped or renamed while streaming, a warning only;
    # the view is still refused
    with pytest.raises(CaptureError) as err:
        capture_database(capture).prepare(capture, resuming=True)
    assert "gone" not in str(err.value) and f"{dbname}.v is a view" in str(err.value)


def test_connector_settings_and_print_connector_config(mariadb_source, user, tmp_path):
    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE `Order Items` (id BIGINT UNSIGNED PRIMARY KEY)")
    database = user("ALL PRIVILEGES ON *.*")
    config = _config(database, [f"{dbname}.Order Items"], tmp_path)
    props = connector_properties(config.capture, Path(config.state_dir))
    assert props["connector.class"] == "io.debezium.connector.mariadb.MariaDbConnector"
    assert props["bigint.unsigned.handling.mode"] == "precise" and props["decimal.handling.mode"] == "precise"
    assert props["lakestreamBoolean.type"].endswith("TinyIntOneToBooleanConverter")
    assert props["schema.history.internal"].endswith("FileSchemaHistory")
    assert props["schema.history.internal.file.filename"].startswith(str(tmp_path / "state" / "capture"))
    assert props["table.include.list"] == rf"(?-i:{dbname}\.Order\x{{20}}Items)"
    assert "publication.autocreate.mode" not in props and "slot.name" not in props
    assert 100_000 <= int(props["database.server.id"]) < 2**32

    doc = connect_json(config.capture, kafka=config.kafka)
    assert doc["config"]["schema.history.internal"].endswith("KafkaSchemaHistory")
    assert doc["config"]["schema.history.internal.kafka.bootstrap.servers"] == "127.0.0.1:9"

    data = config.model_dump(mode="json", exclude_none=True)
    data["capture"]["database"]["password"] = database["password"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run_lakestream("capture", str(path), "--print-connector-config")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["name"] == "mdb-mariadb"
    assert printed["config"]["database.password"].startswith("${file:")
    assert database["password"] not in result.stdout + result.stderr

    bad = {**database, "password": "wrong-pw-x"}
    path.write_text(yaml.safe_dump({**data, "capture": {**data["capture"], "database": bad}}))
    result = run_lakestream("capture", str(path), "--print-connector-config")
    assert result.returncode != 0 and "cannot connect to MariaDB" in result.stderr and "wrong-pw-x" not in result.stderr


def test_config_validation_names_the_field_and_the_fix(tmp_path):
    database = {"kind": "mariadb", "dbname": "shop", "user": "u"}
    assert _config(database, ["shop.t"], tmp_path).capture.database.port == 3306
    assert _config({"dbname": "shop", "user": "u"}, ["public.t"], tmp_path).capture.database.port == 5432
    parallel = _config(database, ["shop.t"], tmp_path, snapshot="parallel")
    with pytest.raises(CaptureError, match=r"snapshot: parallel .* Kafka Connect .* fix: run `lakestream capture`"):
        connect_json(parallel.capture, kafka=parallel.kafka)
    with pytest.raises(
        ConfigError,
        match=r"capture.database: server_id is the replica id .* fix: remove it, or set "
        r"kind: mariadb",
    ):
        _config({"dbname": "shop", "user": "u", "server_id": 5}, ["public.t"], tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"capture.database: zero_dates is for MariaDB's zero dates .* fix: remove "
        r"it, or set kind: mariadb",
    ):
        _config({"dbname": "shop", "user": "u", "zero_dates": "null"}, ["public.t"], tmp_path)
    zero = _config({**database, "zero_dates": "null"}, ["shop.t"], tmp_path)
    props = connector_properties(zero.capture, Path(zero.state_dir))
    assert props["converters"] == "lakestreamBoolean,lakestreamZeroDate" and props["lakestreamZeroDate.mode"] == "null"
    with pytest.raises(CaptureError, match="zero_dates: null runs lakestream's converter class"):
        connect_json(zero.capture, kafka=zero.kafka)
    with pytest.raises(ConfigError, match=r"capture.database.kind: .*fix: use one of the allowed values"):
        _config({**database, "kind": "oracle"}, ["shop.t"], tmp_path)


def test_zero_dates_in_not_null_columns_are_warned_about(mariadb, mariadb_source, tmp_path, caplog):
    from lakestream.capture.databases.mariadb import _warn_zero_dates

    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE z (id INT PRIMARY KEY, d DATE NOT NULL, dn DATE NULL, ts TIMESTAMP NOT NULL "
            "DEFAULT CURRENT_TIMESTAMP)"
        )
        capture = _config(mariadb_database(mariadb, dbname), [f"{dbname}.z"], tmp_path).capture
        cur.execute("SELECT @@GLOBAL.sql_mode")
        (before,) = cur.fetchone()
        assert _warn_zero_dates(cur, capture.source_tables) == []  # the stack's server refuses zero dates
        mariadb.run_as_root("SET GLOBAL sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO'")  # MariaDB's own
        try:
            assert _warn_zero_dates(cur, capture.source_tables) == [f"{dbname}.z.d", f"{dbname}.z.ts"]
        finally:
            mariadb.run_as_root(f"SET GLOBAL sql_mode = '{before}'")
        assert "NO_ZERO_DATE,NO_ZERO_IN_DATE" in caplog.text and "1970-01-01" in caplog.text
