"""Private stand-ins for the shared `stack` / `pg_conn` fixtures (tests/conftest.py) until they land.

A private PostgreSQL (wal_level=logical) and a noida-db Kafka-protocol broker on free loopback ports.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@dataclass
class StackInfo:
    bootstrap_servers: str
    pg_host: str
    pg_port: int
    pg_user: str
    pg_password: str
    source_db: str

    def pg_dsn(self, dbname: str | None = None) -> str:
        return (f"host={self.pg_host} port={self.pg_port} user={self.pg_user} "
                f"password={self.pg_password} dbname={dbname or self.source_db}")


@pytest.fixture(scope="session")
def stack():
    root = Path(tempfile.mkdtemp(prefix="lakestream-capture-"))
    os.chmod(root, 0o755)
    pgdata, sockdir = root / "pg", root / "sock"
    pgdata.mkdir()
    sockdir.mkdir()
    shutil.chown(pgdata, "postgres")
    shutil.chown(sockdir, "postgres")
    pg_port, kafka_port = _free_port(), _free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_pg, str(PG_BIN / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust"],
                   check=True, capture_output=True)
    opts = (f"-p {pg_port} -k {sockdir} -c listen_addresses=127.0.0.1 -c wal_level=logical "
            "-c max_replication_slots=10 -c max_wal_senders=10 -c max_slot_wal_keep_size=1GB -c fsync=off")
    subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(pgdata), "-o", opts, "-l", str(sockdir / "postgres.log"), "-w", "start"],
                   check=True, capture_output=True)
    noida = Path(sys.executable).parent / "noida-db"
    broker = subprocess.Popen(
        [str(noida), "start", "--only", "kafka", "--kafka-port", str(kafka_port), "--host", "127.0.0.1",
         "--data-dir", str(root / "kafka")],
        stdout=open(root / "kafka.log", "wb"), stderr=subprocess.STDOUT,
    )
    try:
        _wait_port(kafka_port)
        conn = psycopg2.connect(host="127.0.0.1", port=pg_port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ALTER USER postgres PASSWORD 'capture-secret-pw'")
            cur.execute("CREATE DATABASE source")
        conn.close()
        yield StackInfo(f"127.0.0.1:{kafka_port}", "127.0.0.1", pg_port, "postgres", "capture-secret-pw", "source")
    finally:
        broker.terminate()
        broker.wait(20)
        subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_conn(stack):
    conn = psycopg2.connect(stack.pg_dsn())
    conn.autocommit = True
    yield conn
    conn.close()
