"""PostgreSQL through Debezium's PostgreSQL connector: pgoutput over a replication slot and a publication that
lakestream prepares and checks (`lakestream.capture.publication`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream.config import CaptureSettings, KafkaSettings
from lakestream.identifiers import SourceTableName

if TYPE_CHECKING:
    from lakestream.capture.columns import CatalogColumn

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
HEARTBEAT_MESSAGE_PREFIX = "lakestream-heartbeat"


class PostgreSQL:
    """`CaptureDatabase` for ``kind: postgresql``."""

    kind = "postgresql"
    jar_group = "debezium"
    metrics_domain = "debezium.postgres"

    def connector_name(self, capture: CaptureSettings) -> str:
        return f"{capture.topic_prefix}-postgres"

    def stream_name(self, capture: CaptureSettings) -> str:
        return f"slot {capture.slot_name}"

    def debezium_settings(self, capture: CaptureSettings) -> dict[str, str]:
        db = capture.database
        props = {
            "connector.class": CONNECTOR_CLASS,
            "plugin.name": "pgoutput",
            "database.hostname": db.host,
            "database.port": str(db.port),
            "database.dbname": db.dbname,
            "database.user": db.user,
            "database.password": db.password.get_secret_value() if db.password else "",
            "topic.prefix": capture.topic_prefix,
            # Debezium takes regular expressions here, matched case-insensitively: one exact pattern per table.
            "table.include.list": ",".join(t.include_pattern() for t in capture.source_tables),
            "slot.name": capture.slot_name,
            "publication.name": capture.publication_name,
            "publication.autocreate.mode": "filtered",
            # A partitioned table's changes under its own name (PostgreSQL 13+), not its partitions'.
            "publish.via.partition.root": "true",
            "snapshot.mode": capture.snapshot_mode,
            "skipped.operations": capture.skipped_operations,
            "tombstones.on.delete": "true",
            # Heartbeats make an idle slot confirm its position. PostgreSQL 15+ skips empty
            # transactions in pgoutput, so busy uncaptured tables alone never advance the slot: the
            # action query writes a tiny WAL message that does (executable by any role by default).
            "heartbeat.interval.ms": "10000",
            "heartbeat.action.query": (
                f"SELECT pg_logical_emit_message(false, '{HEARTBEAT_MESSAGE_PREFIX}', now()::varchar)"
            ),
            # ...and that message must not become a Kafka event of its own.
            "message.prefix.exclude.list": HEARTBEAT_MESSAGE_PREFIX,
            "decimal.handling.mode": "precise",
        }
        if not db.password:
            del props["database.password"]
        return props

    def embedded_settings(self, capture: CaptureSettings, state_dir: Path) -> dict[str, str]:
        # `lakestream capture` prepares and checks the publication itself before Debezium starts
        # (`capture.publication`), quoting any name; Debezium only uses it.
        return {"publication.autocreate.mode": "disabled"}

    def connect_settings(self, capture: CaptureSettings, kafka: KafkaSettings | None) -> dict[str, str]:
        return {}

    def state_files(self, capture: CaptureSettings, state_dir: Path) -> list[Path]:
        return []

    def prepare(self, capture: CaptureSettings, resuming: bool = False) -> list[str]:
        from lakestream.capture.publication import prepare_publication, source_connection

        conn = source_connection(capture)
        try:
            captured = prepare_publication(conn, capture)
        finally:
            conn.close()
        return [str(t.name) for t in captured if t.keyless]

    def source_connection(self, capture: CaptureSettings) -> Any:
        from lakestream.capture.publication import source_connection

        return source_connection(capture)

    def read_columns(self, conn: Any, tables: list[SourceTableName]) -> dict[str, tuple[CatalogColumn, ...]]:
        from lakestream.capture.columns import CatalogColumn, default_wire_value, postgresql_default_literal
        from lakestream.capture.source_columns import UnsupportedColumn, postgresql_source_column

        with conn.cursor() as cur:
            cur.execute(
                """SELECT c.table_schema, c.table_name, c.column_name, c.data_type, t.typtype, c.numeric_precision,
                          c.numeric_scale, c.column_default
                   FROM information_schema.columns c
                   JOIN pg_type t ON t.typname = c.udt_name
                   JOIN pg_namespace tn ON tn.oid = t.typnamespace AND tn.nspname = c.udt_schema
                   WHERE (c.table_schema, c.table_name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
                   ORDER BY c.table_schema, c.table_name, c.ordinal_position""",
                ([t.schema for t in tables], [t.table for t in tables]),
            )
            rows = cur.fetchall()
        found: dict[str, list[CatalogColumn]] = {}
        for schema, table, name, data_type, typtype, precision, scale, default in rows:
            columns = found.setdefault(str(SourceTableName(schema, table)), [])
            try:
                ddl = postgresql_source_column(name, data_type, typtype, precision, scale).ddl
            except UnsupportedColumn:
                continue  # its type arrives with the table's next row
            columns.append(CatalogColumn(name, ddl, default_wire_value(ddl, postgresql_default_literal(default))))
        return {table: tuple(columns) for table, columns in found.items()}
