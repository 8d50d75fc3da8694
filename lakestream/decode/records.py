"""The Spark task body: read planned offset ranges and decode them into change rows (Arrow).

Besides one row per change, a task emits:
- ``error`` rows (raw key/value kept) for records that cannot be decoded or routed;
- one ``schema`` row per distinct (table, row shape) it saw, so the driver can create or evolve
  tables without touching the data;
- one ``end`` row per range with the offset where reading really stopped.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa

from lakestream.config import StreamSettings
from lakestream.decode.envelope import Change, SchemaCache, decode_debezium, decode_json_event
from lakestream.errors import DecodeError
from lakestream.sink.router import Router
from lakestream.source.planner import OffsetRange
from lakestream.source.reader import read_offset_ranges

KIND_CHANGE, KIND_ERROR, KIND_SCHEMA, KIND_END = "change", "error", "schema", "end"

DECODED_SCHEMA = pa.schema([
    ("kind", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("kafka_ts", pa.int64()),
    ("table", pa.string()),
    ("op", pa.string()),
    ("key", pa.string()),
    ("row", pa.string()),
    ("unavailable", pa.string()),
    ("source_ts_ms", pa.int64()),
    ("schema_id", pa.string()),
    ("error", pa.string()),
    ("raw_key", pa.binary()),
    ("raw_value", pa.binary()),
])

DECODED_DDL = (
    "kind string, topic string, partition int, offset bigint, kafka_ts bigint, table string, op string, "
    "key string, row string, unavailable string, source_ts_ms bigint, schema_id string, error string, "
    "raw_key binary, raw_value binary"
)


class _Columns:
    """Column buffers for one Arrow batch."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in DECODED_SCHEMA}

    def add(self, **values: Any) -> None:
        for name, buf in self.cols.items():
            buf.append(values.get(name))

    def add_change(self, topic: str, partition: int, offset: int, kafka_ts: int, table: str, op: str,
                   key: str | None, row: str, unavailable: str | None, source_ts_ms: int | None,
                   schema_id: str) -> None:
        """The hot path: one change row, appended column by column."""
        c = self.cols
        c["kind"].append(KIND_CHANGE)
        c["topic"].append(topic)
        c["partition"].append(partition)
        c["offset"].append(offset)
        c["kafka_ts"].append(kafka_ts)
        c["table"].append(table)
        c["op"].append(op)
        c["key"].append(key)
        c["row"].append(row)
        c["unavailable"].append(unavailable)
        c["source_ts_ms"].append(source_ts_ms)
        c["schema_id"].append(schema_id)
        c["error"].append(None)
        c["raw_key"].append(None)
        c["raw_value"].append(None)

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def to_batch(self) -> pa.RecordBatch:
        arrays = [pa.array(self.cols[f.name], type=f.type) for f in DECODED_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=DECODED_SCHEMA)


class RecordDecoder:
    """Decodes raw Kafka records into change/error/schema rows for one task."""

    def __init__(self, router: Router):
        self.router = router
        self.cache = SchemaCache()
        self.seen_shapes: set[tuple[str, str]] = set()

    def _key_columns(self, stream: StreamSettings, change: Change) -> list[str]:
        if stream.key_columns:
            return stream.key_columns
        if change.key:
            return list(change.key)
        return []

    def decode(self, rec: Any, out: _Columns) -> None:
        try:
            stream_index = self.router.stream_index(rec.topic)
            if stream_index is None:
                raise DecodeError(f"no stream in the config matches topic {rec.topic!r}")
            stream = self.router.streams[stream_index]
            if rec.value is None:
                return  # tombstone: the delete event before it already removed the row
            if stream.record_format == "debezium":
                change = decode_debezium(rec.key, rec.value, self.cache)
            else:
                change = decode_json_event(rec.value, self.cache, stream.event_time_field)
            if change is None:
                return
            _, table = self.router.route(rec.topic, change.row, rec.headers)
            key_json = None
            key_cols: list[str] = []
            if stream.mode == "upsert":
                key_cols = self._key_columns(stream, change)
                if not key_cols:
                    raise DecodeError("missing key: the message has no key and the stream sets no key_columns")
                missing = [k for k in key_cols if change.row.get(k) is None]
                if missing:
                    raise DecodeError(f"key column(s) {missing} missing or null in the row")
                key_json = orjson.dumps([change.row[k] for k in key_cols]).decode()
                if change.op == "d":
                    # Deletes carry only the key: with REPLICA IDENTITY DEFAULT the other 'before'
                    # columns hold defaults, not the old row.
                    change.row = {k: change.row[k] for k in key_cols}
            elif stream.dedupe_field:
                value = change.row.get(stream.dedupe_field)
                key_json = None if value is None else orjson.dumps(value).decode()
            table_name = str(table)
            shape = (table_name, change.columns.schema_id)
            if shape not in self.seen_shapes:
                self.seen_shapes.add(shape)
                out.add(kind=KIND_SCHEMA, topic=rec.topic, partition=rec.partition, offset=rec.offset,
                        table=table_name, schema_id=change.columns.schema_id,
                        row=orjson.dumps(change.columns.describe(key_cols)).decode())
            out.add_change(rec.topic, rec.partition, rec.offset, rec.timestamp_ms, table_name, change.op, key_json,
                           orjson.dumps(change.row).decode(),
                           orjson.dumps(change.unavailable).decode() if change.unavailable else None,
                           change.source_ts_ms, change.columns.schema_id)
        except DecodeError as exc:
            out.add(kind=KIND_ERROR, error=str(exc), raw_key=rec.key, raw_value=rec.value, topic=rec.topic,
                    partition=rec.partition, offset=rec.offset, kafka_ts=rec.timestamp_ms)


def read_and_decode(
    ranges: Iterable[OffsetRange], consumer_conf: dict[str, Any], router: Router, batch_rows: int = 10_000
) -> Iterator[pa.RecordBatch]:
    """Read the ranges (distinct partitions) with one consumer and yield decoded Arrow batches (the
    body of a ``mapInArrow`` task)."""
    decoder = RecordDecoder(router)
    out = _Columns()
    for item in read_offset_ranges(consumer_conf, list(ranges)):
        if isinstance(item, tuple):
            rng, end = item
            out.add(kind=KIND_END, topic=rng.topic, partition=rng.partition, offset=end.next_offset,
                    op="eof" if end.at_end else "more")
            continue
        for rec in item:
            decoder.decode(rec, out)
        if len(out) >= batch_rows:
            yield out.to_batch()
            out = _Columns()
    if len(out):
        yield out.to_batch()
