"""`lakestream stack up --source mariadb`: a private MariaDB with the binlog settings Debezium needs, data kept
across down/up, and the `mariadb` fixture's server configured the same way."""

from __future__ import annotations

from lakestream.stack import Stack, StackSettings
from lakestream.stack.mariadb import MariaDBServer
from lakestream.stack.process import free_port


def _settings(conn) -> dict:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@gtid_strict_mode, @@server_id, "
            "@@character_set_server, @@time_zone, @@bind_address"
        )
        names = (
            "log_bin",
            "binlog_format",
            "binlog_row_image",
            "gtid_strict_mode",
            "server_id",
            "charset",
            "time_zone",
            "bind_address",
        )
        return dict(zip(names, cur.fetchone(), strict=True))


EXPECTED = {
    "log_bin": 1,
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "gtid_strict_mode": 1,
    "charset": "utf8mb4",
    "time_zone": "+00:00",
    "bind_address": "127.0.0.1",
}


def test_stack_with_source_mariadb_runs_it_and_names_it_as_the_source(service_dir_factory):
    settings = StackSettings(
        state_dir=service_dir_factory("mdbstack"), source="mariadb", mariadb_port=free_port(), mariadb_server_id=7
    )
    stack = Stack(settings)
    assert stack.mariadb in stack._services() and stack.mariadb not in Stack(StackSettings())._services()
    database = stack.info().source_database()
    assert (database["kind"], database["port"], database["dbname"]) == ("mariadb", settings.mariadb_port, "shop")
    assert "kind" not in Stack(StackSettings()).info().source_database()


def test_mariadb_keeps_its_data_across_stop_and_start(service_dir_factory):
    """The server `lakestream stack up --source mariadb` starts, alone (the rest of the stack is tested elsewhere)."""
    server = MariaDBServer(
        StackSettings(
            state_dir=service_dir_factory("mdbstack"), source="mariadb", mariadb_port=free_port(), mariadb_server_id=7
        )
    )
    server.start()
    try:
        assert server.status().healthy and str(server.data_dir).startswith(str(server.settings.state_dir))
        conn = server.connect()
        try:
            assert _settings(conn) == {**EXPECTED, "server_id": 7}
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE kept (id INT PRIMARY KEY, note VARCHAR(20)) ENGINE=InnoDB")
                cur.execute("INSERT INTO kept VALUES (1, 'über 🚀')")
        finally:
            conn.close()
        server.stop()
        assert server.pid() is None and not server.status().running
        server.start()
        conn = server.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, note FROM kept")
                assert cur.fetchall() == ((1, "über 🚀"),)
        finally:
            conn.close()
    finally:
        server.stop()


def test_mariadb_fixture_has_the_binlog_settings(mariadb_source):
    _name, conn = mariadb_source
    assert {k: v for k, v in _settings(conn).items() if k != "server_id"} == EXPECTED
