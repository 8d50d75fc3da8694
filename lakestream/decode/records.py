"""Decoding one raw Kafka record into a routed change (or a `DecodeError` with the reason).

Used inside the write tasks: the stream's format (Debezium envelope or plain JSON event), the
target table, the key, and the row with typed values (see `lakestream.decode.types`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lakestream.config import StreamSettings
from lakestream.decode.avro import schema_id_of, schemas_for
from lakestream.decode.envelope import (
    COLUMNS,
    MESSAGE,
    TRUNCATE,
    Columns,
    SchemaCache,
    decode_debezium,
    decode_json_event,
    source_position,
)
from lakestream.errors import DecodeError, MissingKey, UnroutableRecord
from lakestream.routing import Router


@dataclass(slots=True)
class DecodedRecord:
    """One change, routed: its table, operation, key columns, row and row shape."""

    table: str  # namespace.table
    stream: StreamSettings
    op: str  # c u d r; t: truncate the table (no row); m: a logical-decoding message (skipped); COLUMNS: no row
    key_columns: list[str]
    row: dict[str, Any]
    unavailable: list[str]
    source_ts_ms: int | None
    columns: Columns
    # Keyless tables (no primary key: Debezium sends no message key) only.
    old_row: dict[str, Any] | None = None  # an update's old row (REPLICA IDENTITY FULL)
    position: tuple[int, int] | None = None  # `envelope.source_position`: recognizes a re-sent event


class RecordDecoder:
    """Decodes raw Kafka records for one task (schemas are parsed once per distinct schema)."""

    def __init__(self, router: Router, schema_registry: dict[str, Any] | None = None):
        """``schema_registry``: `SchemaRegistrySettings.client_config()`, to read Avro records."""
        self.router = router
        self.cache = SchemaCache()
        self.avro = schemas_for(schema_registry) if schema_registry else None

    @staticmethod
    def _key_columns(stream: StreamSettings, key: dict[str, Any] | None) -> list[str]:
        if stream.key_columns:
            return stream.key_columns
        return list(key) if key else []

    def decode(self, rec: Any) -> DecodedRecord | None:
        """The routed change of ``rec``; None for records that carry none (tombstones, heartbeats).

        Raises DecodeError for anything that cannot be read or routed.
        """
        stream_index = self.router.stream_index(rec.topic)
        if stream_index is None:
            raise UnroutableRecord(f"no stream in the config matches topic {rec.topic!r}")
        stream = self.router.streams[stream_index]
        if rec.value is None:
            return None  # tombstone: the delete event before it already removed the row
        if stream.record_format != "debezium" and self.avro is not None and schema_id_of(rec.value) is not None:
            raise DecodeError(
                f"Avro record (schema id {schema_id_of(rec.value)}) on a plain-JSON stream: "
                "lakestream reads Avro for Debezium change events (format: debezium) only"
            )
        if stream.record_format == "debezium":
            change = decode_debezium(rec.key, rec.value, self.cache, self.avro)
        else:
            change = decode_json_event(rec.value, self.cache, stream.event_time_field)
        if change is None:
            return None
        if change.op == MESSAGE:
            # pg_logical_emit_message() output on <prefix>.message: not a row change of any table.
            return DecodedRecord("", stream, MESSAGE, [], {}, [], change.source_ts_ms, change.columns)
        _, table = self.router.route(rec.topic, change.row, rec.headers)
        if change.op in (TRUNCATE, COLUMNS):
            return DecodedRecord(str(table), stream, change.op, [], {}, [], change.source_ts_ms, change.columns)
        key_cols: list[str] = []
        row = change.row
        if (
            stream.mode == "upsert"
            and not stream.key_columns
            and change.key is None
            and stream.record_format == "debezium"
        ):
            # A table without a primary key: its mirror is a multiset of rows (`lakestream.sink.index.keyless`).
            if change.op == "u" and change.old_row is None:
                raise MissingKey(
                    "an update of a table without a primary key carries no old row, so the mirror "
                    "cannot tell which row changed — fix: ALTER TABLE ... REPLICA IDENTITY FULL"
                )
            return DecodedRecord(
                str(table),
                stream,
                change.op,
                [],
                row,
                change.unavailable,
                change.source_ts_ms,
                change.columns,
                change.old_row,
                source_position(change.payload),
            )
        if stream.mode == "upsert":
            key_cols = self._key_columns(stream, change.key)
            if not key_cols:
                raise MissingKey("missing key: the message has no key and the stream sets no key_columns")
            missing = [k for k in key_cols if row.get(k) is None]
            if missing:
                raise MissingKey(f"key column(s) {missing} missing or null in the row")
            if change.op == "d":
                # Deletes carry only the key: with REPLICA IDENTITY DEFAULT the other 'before'
                # columns hold defaults, not the old row.
                row = {k: row[k] for k in key_cols}
        elif stream.dedupe_field:
            if row.get(stream.dedupe_field) is None:
                raise MissingKey(f"de-duplication field {stream.dedupe_field!r} is missing or null")
            key_cols = [stream.dedupe_field]
        # The position too: a table that was keyless when its mirror was made stays a multiset
        # (`lakestream.sink.index.keyless`).
        position = source_position(change.payload) if stream.mode == "upsert" else None
        return DecodedRecord(
            str(table),
            stream,
            change.op,
            key_cols,
            row,
            change.unavailable,
            change.source_ts_ms,
            change.columns,
            change.old_row,
            position,
        )
