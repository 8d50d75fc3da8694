"""The local stack: a private PostgreSQL cluster plus one Kafka-protocol broker, on loopback ports."""
from __future__ import annotations

import logging
from dataclasses import replace

from lakestream.stack import process
from lakestream.stack.broker import Broker, make_broker
from lakestream.stack.models import ServiceStatus, StackInfo, StackSettings
from lakestream.stack.postgres import PostgresCluster

log = logging.getLogger(__name__)


class Stack:
    """Start, stop and inspect the local services described by one `StackSettings`."""

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.postgres = PostgresCluster(settings)
        self.broker: Broker = make_broker(settings)

    def up(self) -> StackInfo:
        """Start whatever is not running (idempotent) and health-check every service."""
        # Check every port first so a conflict never leaves half a stack running.
        for service in (self.postgres, self.broker):
            if service.pid() is None:
                service.check_port_free()
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.state_dir / "warehouse").mkdir(exist_ok=True)
        self.postgres.start()
        self.broker.start()
        return self.info()

    def down(self) -> None:
        """Stop every service by pid; data directories are kept. Safe when nothing runs."""
        # Stop any broker kind left behind by an `up` with a different --broker and this state dir.
        for kind in ("noida", "tansu"):
            make_broker(replace(self.settings, broker=kind)).stop()
        self.postgres.stop()

    def status(self) -> dict[str, ServiceStatus]:
        """Each service by name: running, pid, port, healthy, persistence."""
        return {service.name: service.status() for service in (self.postgres, self.broker)}

    def info(self) -> StackInfo:
        """Connection facts (valid whether or not the services currently run)."""
        s = self.settings
        return StackInfo(
            bootstrap_servers=self.broker.bootstrap_servers,
            pg_host=process.LOOPBACK,
            pg_port=s.pg_port,
            pg_user=s.pg_user,
            pg_password=s.pg_password,
            source_db=s.source_db,
            catalog_db=s.catalog_db,
            warehouse=(s.state_dir / "warehouse").as_uri(),
        )
