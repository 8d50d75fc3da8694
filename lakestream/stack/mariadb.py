"""A private MariaDB server for a MariaDB source database (`lakestream stack up --source mariadb`).

The server lives under ``<state_dir>/mariadb`` and keeps its data across stop/start. It is configured for
Debezium's MariaDB connector: the binary log on, ``binlog_format=ROW``, ``binlog_row_image=FULL``, a
``server_id``, GTIDs in strict mode, utf8mb4 and the server's time zone UTC; it listens on 127.0.0.1 only.
The Iceberg catalog stays in the stack's PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

from lakestream.errors import StackError
from lakestream.stack import process
from lakestream.stack.models import StackSettings

log = logging.getLogger(__name__)

MARIADB_BIN = Path(os.environ.get("LAKESTREAM_MARIADB_BIN", "/usr/bin"))
MARIADB_SBIN = Path(os.environ.get("LAKESTREAM_MARIADB_SBIN", "/usr/sbin"))
# mariadbd refuses to run as root: it runs as this OS user then (Debian's package creates it).
_OS_USER = "mysql"
_MAX_SOCKET_PATH = 100

# What Debezium's binlog connectors need, and a small footprint for a development machine.
SERVER_SETTINGS = {
    "bind-address": "127.0.0.1",
    "log-bin": "binlog",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "gtid-strict-mode": "ON",
    "log-slave-updates": "ON",
    "binlog-expire-logs-seconds": "604800",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_unicode_ci",
    "default-time-zone": "+00:00",
    # Strict, and no zero dates: Debezium would turn a zero date in a NOT NULL column into 1970-01-01.
    "sql-mode": "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ZERO_DATE,NO_ZERO_IN_DATE,NO_ENGINE_SUBSTITUTION",
    "skip-name-resolve": "ON",
    "innodb-buffer-pool-size": "64M",
    "innodb-log-file-size": "48M",
    "max-connections": "100",
    "performance-schema": "OFF",
}


def _mariadb_available() -> bool:
    return (MARIADB_SBIN / "mariadbd").exists() and (MARIADB_BIN / "mariadb-install-db").exists()


class MariaDBServer(process.PidService):
    """Start, stop and health-check the private MariaDB server; create the user and the source database."""

    name = "mariadb"
    persistent = True

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.root = settings.state_dir / "mariadb"
        self.data_dir = self.root / "data"
        self.run_dir = self.root / "run"
        self.socket_path = self.run_dir / "mariadb.sock"
        self.log_path = settings.state_dir / "logs" / "mariadb.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / "mariadb.pid", "mariadbd")
        self.os_user = _OS_USER if os.geteuid() == 0 else None

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.settings.mariadb_port

    @property
    def detail(self) -> str:
        return f"data in {self.data_dir}"

    # -- lifecycle -------------------------------------------------------------------------

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "MariaDB", "--mariadb-port / StackSettings.mariadb_port")

    def start(self, timeout: float = 60.0) -> None:
        """Initialise the data directory if needed, start the server, create the user and database."""
        if not _mariadb_available():
            raise StackError(
                f"MariaDB is not installed ({MARIADB_SBIN / 'mariadbd'} missing) — fix: run "
                "./scripts/bootstrap.sh (it installs Debian's mariadb-server) or apt-get install "
                "mariadb-server"
            )
        if self.pid() is None:
            self.check_port_free()
            self._init_data_dir()
            self._spawn(timeout)
        self._ensure_user_and_database()
        if not self.healthy():
            raise StackError(
                f"MariaDB runs but `SELECT 1` as {self.settings.pg_user!r} over 127.0.0.1:{self.port} "
                f"fails\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def stop(self, timeout: float | None = None) -> None:
        """A clean shutdown (SIGTERM: InnoDB flushes, the binlog is closed); SIGKILL after ``timeout``."""
        pid = self.pid()
        if pid is not None:
            process.stop_pid(pid, sig=signal.SIGTERM, timeout=30.0 if timeout is None else timeout)
        self.pid_file.remove()

    def connect(self, database: str | None = None):
        """An autocommit PyMySQL connection over TCP as the stack's user (default: the source database)."""
        import pymysql

        return pymysql.connect(
            host=process.LOOPBACK,
            port=self.port,
            user=self.settings.pg_user,
            password=self.settings.pg_password,
            database=database or self.settings.source_db,
            connect_timeout=5,
            autocommit=True,
            charset="utf8mb4",
        )

    def healthy(self) -> bool:
        """`SELECT 1` over TCP with the stack's user and password."""
        import pymysql

        try:
            conn = self.connect()
        except pymysql.Error:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return cur.fetchone() == (1,)
        except pymysql.Error:
            return False
        finally:
            conn.close()

    # -- internals -------------------------------------------------------------------------

    def _own(self, path: Path, mode: int = 0o700) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.os_user is not None:
            shutil.chown(path, self.os_user, self.os_user)
        path.chmod(mode)

    def _init_data_dir(self) -> None:
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise StackError(
                f"state_dir {self.settings.state_dir} is too long for a Unix socket path; use a shorter --state-dir"
            )
        if self.os_user is not None:
            blocked = process.unreachable_for_user(self.settings.state_dir, self.os_user)
            if blocked is not None:
                raise StackError(
                    f"OS user {self.os_user!r} (MariaDB does not run as root) cannot enter {blocked}; "
                    f"`chmod o+x {blocked}` or choose a --state-dir it can reach"
                )
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.root, 0o755)
        self._own(self.run_dir, 0o755)
        if (self.data_dir / "mysql").is_dir():
            return
        self._own(self.data_dir)
        log.info("mariadb-install-db %s", self.data_dir)
        argv = [
            str(MARIADB_BIN / "mariadb-install-db"),
            "--no-defaults",
            f"--datadir={self.data_dir}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ]
        if self.os_user is not None:
            argv.append(f"--user={self.os_user}")
        result = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(
                f"mariadb-install-db failed for {self.data_dir}:\n{(result.stdout + result.stderr)[-3000:]}"
            )

    def _spawn(self, timeout: float) -> None:
        argv = [
            str(MARIADB_SBIN / "mariadbd"),
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--port={self.port}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.run_dir / 'mariadbd.pid'}",
            f"--server-id={self.settings.mariadb_server_id}",
        ]
        argv += [f"--{key}={value}" for key, value in SERVER_SETTINGS.items()]
        if self.os_user is not None:
            argv.append(f"--user={self.os_user}")
        log.info("starting MariaDB on 127.0.0.1:%d", self.port)
        pid = process.spawn_detached(argv, self.log_path, cwd=self.root)
        self.pid_file.write(pid)
        process.wait_until(lambda: not process.pid_alive(pid) or self._socket_ready(), timeout, 0.2)
        if not self._socket_ready():
            why = (
                "exited during startup"
                if not process.pid_alive(pid)
                else f"did not accept connections within {timeout:.0f}s"
            )
            self.stop(timeout=5)
            raise StackError(
                f"MariaDB on 127.0.0.1:{self.port} {why}\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def run_as_root(self, statements: str) -> str:
        """Run SQL as MariaDB's root over the Unix socket (socket authentication: only this OS user gets in)."""
        result = subprocess.run(
            [
                str(MARIADB_BIN / "mariadb"),
                "--no-defaults",
                f"--socket={self.socket_path}",
                "-u",
                "root",
                "--batch",
                "--skip-column-names",
                "-e",
                statements,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if result.returncode != 0:
            raise StackError(f"MariaDB refused a statement as root: {result.stderr.strip()[-1000:]}")
        return result.stdout

    def _socket_ready(self) -> bool:
        try:
            self.run_as_root("SELECT 1")
            return True
        except (StackError, subprocess.TimeoutExpired):
            return False

    def _ensure_user_and_database(self) -> None:
        s = self.settings
        password = s.pg_password.replace("\\", "\\\\").replace("'", "\\'")
        # The stack's user may do anything (as its PostgreSQL role is a superuser); a capture user of a real
        # database needs only the grants `lakestream capture` checks (docs/design/capture.md).
        self.run_as_root(
            f"CREATE USER IF NOT EXISTS '{s.pg_user}'@'%' IDENTIFIED BY '{password}';"
            f"ALTER USER '{s.pg_user}'@'%' IDENTIFIED BY '{password}';"
            f"GRANT ALL PRIVILEGES ON *.* TO '{s.pg_user}'@'%' WITH GRANT OPTION;"
            f"CREATE DATABASE IF NOT EXISTS `{s.source_db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;"
        )
