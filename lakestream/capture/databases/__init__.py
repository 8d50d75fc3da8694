"""What capture needs to know about each kind of source database, one module per kind.

A kind (``capture.database.kind``) names Debezium's connector, the jar group its JVM runs on, the connector's own
settings, what the embedded engine or a Kafka Connect worker adds to them, and the start check that stops capture
before Debezium starts when the database would not deliver every change (`CaptureDatabase.prepare`). Everything
else in capture (the engine, the publisher, the converters, the topics) is the same for every kind. A new kind is
a module here with a class that satisfies `CaptureDatabase`, registered in `KINDS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lakestream.config import CaptureSettings, KafkaSettings
from lakestream.identifiers import SourceTableName

if TYPE_CHECKING:
    from lakestream.capture.columns import CatalogColumn


class CaptureDatabase(Protocol):
    """One kind of source database, as capture sees it."""

    kind: str
    # The `lakestream/runtime/jars.toml` group the capture JVM runs on (Debezium's embedded engine and this connector).
    jar_group: str
    # The JMX domain of the connector's metrics (``<domain>:type=connector-metrics,context=streaming,server=...``).
    metrics_domain: str

    def connector_name(self, capture: CaptureSettings) -> str:
        """The engine's / Connect connector's name."""
        ...

    def stream_name(self, capture: CaptureSettings) -> str:
        """What Debezium streams from, for logs: ``slot lakestream``, ``the binlog``."""
        ...

    def debezium_settings(self, capture: CaptureSettings) -> dict[str, str]:
        """The connector's own settings, shared by the embedded engine and a Connect cluster."""
        ...

    def embedded_settings(self, capture: CaptureSettings, state_dir: Path) -> dict[str, str]:
        """What the embedded engine (`lakestream capture`) adds: stores kept under ``state_dir``."""
        ...

    def connect_settings(self, capture: CaptureSettings, kafka: KafkaSettings | None) -> dict[str, str]:
        """What a Kafka Connect worker's connector adds (``--print-connector-config``)."""
        ...

    def state_files(self, capture: CaptureSettings, state_dir: Path) -> list[Path]:
        """What the embedded engine keeps in ``state_dir`` besides its offsets (to remove with them)."""
        ...

    def prepare(self, capture: CaptureSettings, resuming: bool = False) -> list[str]:
        """The start check (and, for PostgreSQL, the publication made to cover the tables): CaptureError naming
        the setting or grant to fix when the database would not deliver every change of ``capture.tables``.
        ``resuming``: capture has stored offsets (it streamed before). Returns the captured tables that have no
        primary key (their events have no key)."""
        ...

    def source_connection(self, capture: CaptureSettings) -> Any:
        """An autocommit DB-API connection to the source database."""
        ...

    def read_columns(self, conn: Any, tables: list[SourceTableName]) -> dict[str, tuple[CatalogColumn, ...]]:
        """The columns of each of ``tables`` that exists (by ``str(name)``), in order, as the catalog holds them
        (`lakestream.capture.columns`); a column of a type the mapping does not know is left out."""
        ...


def capture_database(capture: CaptureSettings) -> CaptureDatabase:
    """The module of ``capture.database.kind``."""
    return KINDS[capture.database.kind]


def _kinds() -> dict[str, CaptureDatabase]:
    from lakestream.capture.databases.mariadb import MariaDB
    from lakestream.capture.databases.postgresql import PostgreSQL

    return {"postgresql": PostgreSQL(), "mariadb": MariaDB()}


KINDS: dict[str, CaptureDatabase] = _kinds()
