"""PostgreSQL through Debezium's PostgreSQL connector: pgoutput over a replication slot and a publication that
lakestream prepares and checks (`lakestream.capture.publication`)."""

from __future__ import annotations

from pathlib import Path

from lakestream.config import CaptureSettings, KafkaSettings

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
