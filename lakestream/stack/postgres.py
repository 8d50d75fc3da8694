"""A private PostgreSQL cluster for the source database and the Iceberg JDBC catalog.

The cluster lives under ``<state_dir>/pg`` and keeps its data across stop/start. It is configured
for Debezium (``wal_level=logical``) and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import psycopg2
from psycopg2 import sql

from lakestream.errors import StackError
from lakestream.stack import process
from lakestream.stack.models import ServiceStatus, StackSettings

log = logging.getLogger(__name__)

PG_BIN = Path(os.environ.get("LAKESTREAM_PG_BIN", "/usr/lib/postgresql/15/bin"))
# The bootstrap superuser made by initdb; only ever reached through the Unix socket.
_BOOTSTRAP_USER = "postgres"
# Unix socket paths are limited to 107 bytes by the kernel.
_MAX_SOCKET_PATH = 100

# Debezium needs logical WAL; the slot cap stops an abandoned slot from filling the disk.
_SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_slot_wal_keep_size": "2GB",
    "listen_addresses": "127.0.0.1",
    "shared_buffers": "128MB",
    "max_connections": "100",
    "max_wal_size": "1GB",
    "work_mem": "16MB",
    "maintenance_work_mem": "64MB",
    "logging_collector": "off",
    "log_line_prefix": "%m [%p] %q%u@%d ",
    "log_min_messages": "warning",
}


class PostgresCluster:
    """Start, stop and health-check the private cluster; create the role and the two databases."""

    name = "postgres"
    persistent = True

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.root = settings.state_dir / "pg"
        self.data_dir = self.root / "data"
        self.socket_dir = self.root / "run"
        self.log_path = settings.state_dir / "logs" / "postgres.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / "postgres.pid", "postgres")
        # PostgreSQL refuses to run as root: run it as the `postgres` OS user in that case.
        self.os_user = _BOOTSTRAP_USER if os.geteuid() == 0 else None

    @property
    def port(self) -> int:
        return self.settings.pg_port

    # -- lifecycle -------------------------------------------------------------------------

    def pid(self) -> int | None:
        """The postmaster pid if it runs (adopting one started earlier without our pid file)."""
        pid = self.pid_file.live_pid()
        if pid is None:
            pid = self._postmaster_pid_from_lock_file()
            if pid is not None:
                self.pid_file.write(pid)
        return pid

    def start(self, timeout: float = 60.0) -> None:
        """Initialise the cluster if needed, start it, and create the role and databases."""
        if self.pid() is None:
            self.check_port_free()
            self._init_cluster()
            self._spawn(timeout)
        self._ensure_role_and_databases()
        if not self.healthy():
            raise StackError(
                f"PostgreSQL runs but `SELECT 1` as {self.settings.pg_user!r} over 127.0.0.1:{self.port} fails\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def check_port_free(self) -> None:
        """Raise StackError naming the port and the setting if another process holds the port."""
        process.require_free_port(self.port, "PostgreSQL", "--pg-port / StackSettings.pg_port")

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: abort sessions, checkpoint); SIGKILL the group after ``timeout``."""
        pid = self.pid()
        if pid is not None:
            # SIGTERM would be a "smart" shutdown that waits for every client (e.g. Debezium) to leave.
            process.stop_pid(pid, sig=signal.SIGINT, timeout=timeout)
        self.pid_file.remove()

    def healthy(self) -> bool:
        """`SELECT 1` over TCP with the configured role and password."""
        try:
            conn = psycopg2.connect(
                host=process.LOOPBACK,
                port=self.port,
                user=self.settings.pg_user,
                password=self.settings.pg_password,
                dbname=self.settings.source_db,
                connect_timeout=3,
            )
        except psycopg2.Error:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return cur.fetchone() == (1,)
        except psycopg2.Error:
            return False
        finally:
            conn.close()

    def status(self) -> ServiceStatus:
        pid = self.pid()
        return ServiceStatus(
            name=self.name,
            running=pid is not None,
            pid=pid,
            port=self.port,
            healthy=pid is not None and self.healthy(),
            persistent=True,
            detail=f"data in {self.data_dir}",
        )

    # -- internals -------------------------------------------------------------------------

    def _postmaster_pid_from_lock_file(self) -> int | None:
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, PermissionError, ValueError, IndexError):
            return None
        argv = process.pid_cmdline(pid)
        if process.pid_alive(pid) and argv and Path(argv[0]).name == "postgres":
            return pid
        return None

    def _own(self, path: Path, mode: int = 0o700) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.os_user is not None:
            shutil.chown(path, self.os_user, self.os_user)
        path.chmod(mode)

    def _init_cluster(self) -> None:
        if len(str(self.socket_dir / f".s.PGSQL.{self.port}")) > _MAX_SOCKET_PATH:
            raise StackError(
                f"state_dir {self.settings.state_dir} is too long for a Unix socket path; use a shorter --state-dir"
            )
        if self.os_user is not None:
            blocked = process.unreachable_for_user(self.settings.state_dir, self.os_user)
            if blocked is not None:
                raise StackError(
                    f"OS user {self.os_user!r} (PostgreSQL cannot run as root) cannot enter {blocked}; "
                    f"`chmod o+x {blocked}` or choose a --state-dir it can reach"
                )
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.root, 0o755)
        self._own(self.socket_dir, 0o755)
        if (self.data_dir / "PG_VERSION").exists():
            return
        self._own(self.data_dir)
        log.info("initdb %s", self.data_dir)
        result = subprocess.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                _BOOTSTRAP_USER,
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
            user=self.os_user,
            cwd=self.root,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(f"initdb failed for {self.data_dir}:\n{(result.stdout + result.stderr)[-3000:]}")

    def _spawn(self, timeout: float) -> None:
        argv = [str(PG_BIN / "postgres"), "-D", str(self.data_dir), "-p", str(self.port), "-k", str(self.socket_dir)]
        for key, value in _SERVER_SETTINGS.items():
            argv += ["-c", f"{key}={value}"]
        log.info("starting PostgreSQL on 127.0.0.1:%d", self.port)
        pid = process.spawn_detached(argv, self.log_path, user=self.os_user, cwd=self.root)
        self.pid_file.write(pid)
        process.wait_until(lambda: not process.pid_alive(pid) or self._socket_ready(), timeout, 0.1)
        if not self._socket_ready():
            why = (
                "exited during startup"
                if not process.pid_alive(pid)
                else f"did not accept connections within {timeout:.0f}s"
            )
            self.stop(timeout=5)
            raise StackError(
                f"PostgreSQL on 127.0.0.1:{self.port} {why}\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def _bootstrap_connect(self, dbname: str = "postgres"):
        return psycopg2.connect(
            host=str(self.socket_dir), port=self.port, user=_BOOTSTRAP_USER, dbname=dbname, connect_timeout=3
        )

    def _socket_ready(self) -> bool:
        try:
            self._bootstrap_connect().close()
            return True
        except psycopg2.Error:
            return False

    def _ensure_role_and_databases(self) -> None:
        s = self.settings
        conn = self._bootstrap_connect()
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                role = sql.Identifier(s.pg_user)
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (s.pg_user,))
                verb = sql.SQL("ALTER") if cur.fetchone() else sql.SQL("CREATE")
                # Re-applying the password on every `up` lets a changed setting take effect.
                cur.execute(
                    sql.SQL("{} ROLE {} WITH LOGIN REPLICATION SUPERUSER PASSWORD {}").format(
                        verb, role, sql.Literal(s.pg_password)
                    )
                )
                for db in (s.source_db, s.catalog_db):
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                    if not cur.fetchone():
                        cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), role))
        finally:
            conn.close()
