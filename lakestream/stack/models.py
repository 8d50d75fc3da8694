"""The typed facts of the local stack: what to start (settings), how to connect (info), what runs (status)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lakestream.errors import ConfigError

BrokerKind = Literal["noida", "tansu"]


@dataclass
class StackSettings:
    """Where the local services keep their state and which loopback ports they listen on."""

    state_dir: Path = Path(".lakestream")
    pg_port: int = 15432
    kafka_port: int = 19092
    broker: BrokerKind = "noida"
    pg_user: str = "lakestream"
    pg_password: str = "lakestream"
    source_db: str = "shop"
    catalog_db: str = "lakestream_catalog"

    def __post_init__(self) -> None:
        # Resolve once: services chdir, and the pid files must not depend on the caller's cwd.
        self.state_dir = Path(self.state_dir).expanduser().resolve()
        for name in ("pg_port", "kafka_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or not 1 <= port <= 65535:
                raise ConfigError(f"{name}={port!r} is not a TCP port (1-65535)")
        if self.pg_port == self.kafka_port:
            raise ConfigError(f"pg_port and kafka_port are both {self.pg_port}; give them different ports")
        if self.broker not in ("noida", "tansu"):
            raise ConfigError(f"broker={self.broker!r} is unknown; use 'noida' or 'tansu'")
        for name in ("pg_user", "source_db", "catalog_db"):
            value = getattr(self, name)
            if not value or not value.replace("_", "").isalnum() or value[0].isdigit():
                raise ConfigError(f"{name}={value!r}: use letters, digits and _ (not starting with a digit)")


def _dsn_value(value: str) -> str:
    # libpq key/value syntax: quote empty values and values with spaces or quotes.
    if value and not any(c in value for c in " '\\\t"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class StackInfo:
    """How clients connect to a running local stack."""

    bootstrap_servers: str
    pg_host: str
    pg_port: int
    pg_user: str
    pg_password: str
    source_db: str
    catalog_db: str
    warehouse: str

    def pg_dsn(self, dbname: str | None = None) -> str:
        """A libpq key/value DSN for psycopg2 (default: the source database)."""
        parts = {
            "host": self.pg_host,
            "port": str(self.pg_port),
            "dbname": dbname or self.source_db,
            "user": self.pg_user,
            "password": self.pg_password,
        }
        return " ".join(f"{key}={_dsn_value(value)}" for key, value in parts.items())

    def catalog_jdbc_uri(self) -> str:
        """The JDBC URI of the Iceberg catalog database."""
        return f"jdbc:postgresql://{self.pg_host}:{self.pg_port}/{self.catalog_db}"


@dataclass
class ServiceStatus:
    """One service as seen by `Stack.status()`."""

    name: str
    running: bool
    pid: int | None
    port: int
    healthy: bool
    persistent: bool
    detail: str = field(default="")

    @property
    def state(self) -> str:
        return "running" if self.running else "stopped"
