"""`lakestream stack up --source mariadb`: a private MariaDB with the binlog settings Debezium needs, data kept
across down/up, and the `mariadb` fixture's server configured the same way."""
from __future__ import annotations

from lakestream.stack.process import free_port


def _settings(conn) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@gtid_strict_mode, @@server_id, "
                    "@@character_set_server, @@time_zone, @@bind_address")
        names = ("log_bin", "binlog_format", "binlog_row_image", "gtid_strict_mode", "server_id", "charset",
                 "time_zone", "bind_address")
        return dict(zip(names, cur.fetchone()))


EXPECTED = {"log_bin": 1, "binlog_format": "ROW", "binlog_row_image": "FULL", "gtid_strict_mode": 1,
            "charset": "utf8mb4", "time_zone": "+00:00", "bind_address": "127.0.0.1"}


def test_stack_up_source_mariadb_keeps_data(stack_factory):
    stack = stack_factory(source="mariadb", mariadb_port=free_port(), mariadb_server_id=7)
    info = stack.up()
    assert {name: (s.running, s.healthy) for name, s in stack.status().items()} == {
        "postgres": (True, True), "kafka": (True, True), "mariadb": (True, True)}
    assert info.mariadb_port == stack.settings.mariadb_port
    database = info.source_database()
    assert database["kind"] == "mariadb" and database["port"] == info.mariadb_port
    assert str(stack.mariadb.data_dir).startswith(str(stack.settings.state_dir))

    conn = stack.mariadb.connect()
    try:
        assert _settings(conn) == {**EXPECTED, "server_id": 7}
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE kept (id INT PRIMARY KEY, note VARCHAR(20)) ENGINE=InnoDB")
            cur.execute("INSERT INTO kept VALUES (1, 'über 🚀')")
    finally:
        conn.close()

    stack.down()
    assert stack.mariadb.pid() is None
    stack.up()
    conn = stack.mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, note FROM kept")
            assert cur.fetchall() == ((1, "über 🚀"),)
    finally:
        conn.close()


def test_mariadb_fixture_has_the_binlog_settings(mariadb_source):
    _name, conn = mariadb_source
    assert {k: v for k, v in _settings(conn).items() if k != "server_id"} == EXPECTED
