"""Vectorized decoding: a run of Debezium records of one topic, straight into the table's Arrow schema.

The per-record decoder (`lakestream.decode.records`) parses each message in Python. For the common
case this module parses a whole run at once with Arrow's C++ JSON reader, given an explicit schema
built from the table (schemas off) or from the run's Debezium schema (schemas on), and converts
each column with Arrow compute (dates, timestamps, zoned timestamps) or, for the few types Arrow
cannot convert (base64 decimals, bytes), one Python pass over that column only.

It never decides what is wrong with a record. Anything unusual in the run — a malformed message,
a value of another type, an unknown field (a new column), an unknown op, a withheld TOAST value, a
null key, a schema that differs between messages — makes it return None, and the caller decodes
that run record by record, which produces the precise dead letters and shape changes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from lakestream.decode import native
from lakestream.decode.columns import build_column
from lakestream.decode.envelope import COMPACT_PAYLOAD_MARKER, decode_key, split_envelope
from lakestream.decode.types import (
    MAX_DAYS,
    MAX_MICROS,
    MIN_DAYS,
    MIN_MICROS,
    UNAVAILABLE_VALUE,
    FieldType,
    event_time,
    field_type,
    identity,
)
from lakestream.errors import BadValue, DecodeError

if TYPE_CHECKING:
    from lakestream.source.reader import RecordRun

_OPS = pa.array(["c", "u", "r", "d"])

# Connect schema type → the Arrow type its JSON value parses as.
_WIRE = {
    "int8": pa.int64(),
    "int16": pa.int64(),
    "int32": pa.int64(),
    "int64": pa.int64(),
    "float32": pa.float64(),
    "float64": pa.float64(),
    "float": pa.float64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.string(),
}


@dataclass
class DecodedRun:
    """A run of changes of one table: typed rows (deletes carry only their key) and their positions."""

    table: pa.Table
    offsets: np.ndarray
    ops: list[str]
    source_ts: np.ndarray  # float64, NaN where unknown
    kafka_ts: np.ndarray


@dataclass
class _WireField:
    name: str
    wire: pa.DataType
    ftype: FieldType | None  # schemas on: the Debezium conversion; None: the value is already typed
    semantic: str | None = None  # the Connect schema's name (io.debezium.time.Date, ...)


def _schema_fields(schema_part: bytes) -> list[_WireField] | None:
    """Wire fields of the row struct of a schemas-on envelope, or None when a field is not flat."""
    envelope = orjson.loads(schema_part[len(b'{"schema":') :])
    row = next((f for f in envelope.get("fields", []) if f.get("field") == "after"), None)
    if row is None or row.get("type") != "struct":
        return None
    out = []
    for f in row.get("fields", []):
        wire = _WIRE.get(f.get("type"))
        if wire is None:
            return None  # struct, array, map: the record-by-record path handles them
        out.append(_WireField(f["field"], wire, field_type(f), f.get("name")))
    return out


class RunDecoder:
    """Decodes runs of one task; wire schemas are derived once per distinct Debezium schema."""

    def __init__(self) -> None:
        self._schemas: dict[bytes, list[_WireField] | None] = {}

    def decode(
        self, records: RecordRun, table_schema: pa.Schema, key_columns: list[str], expected_like: bytes | None = None
    ) -> DecodedRun | None:
        """``records`` (no tombstones) as one typed run, or None (decode them one by one).

        With ``expected_like``, a schemas-on run must carry the same Debezium schema as that message
        (one whose shape the table is known to accept)."""
        values = cast("list[bytes]", records.values)  # the caller leaves tombstones out
        if values[0][:1] == b"\x00":
            return None  # Confluent-framed (Avro): decoded record by record
        if expected_like is not None:
            expected = split_envelope(expected_like)
            first = split_envelope(values[0])
            if (expected is None) != (first is None) or (
                expected is not None and first is not None and expected[0] != first[0]
            ):
                return None
        try:
            return self._decode(records, table_schema, key_columns)
        except (pa.ArrowException, ValueError, TypeError, KeyError, OverflowError, AttributeError):
            return None

    def _decode(self, records: RecordRun, table_schema: pa.Schema, key_columns: list[str]) -> DecodedRun | None:
        """The run as one typed table, or None at the first thing only the record-by-record path may decide."""
        if not _keys_readable(records.keys):
            return None
        values = cast("list[bytes]", records.values)  # the caller leaves tombstones out
        wire = self._wire(values[0], table_schema)
        if wire is None:
            return None
        by_name = {f.name: f for f in wire.fields}
        if any(name not in by_name for name in key_columns) or any(
            f.name not in table_schema.names for f in wire.fields
        ):
            return None
        parsed = _parse_run(values, wire, key_columns)
        if parsed is None:
            return None
        ops = parsed.column("op").combine_chunks()
        if ops.null_count or not pc.all(pc.is_in(ops, value_set=_OPS)).as_py():
            return None
        columns = _typed_columns(parsed, ops, wire.fields, key_columns, table_schema)
        if columns is None:
            return None
        table = _as_table(columns, table_schema, len(records))
        if table is None:
            return None
        source_ts = parsed.column("source").combine_chunks().field("ts_ms")
        source_ts = pc.coalesce(source_ts, parsed.column("ts_ms").combine_chunks())
        return DecodedRun(
            table,
            np.array(records.offsets, np.int64),
            ops.to_pylist(),
            source_ts.to_numpy(zero_copy_only=False).astype(np.float64),
            np.array(records.timestamps, np.int64),
        )

    def _wire(self, first: bytes, table_schema: pa.Schema) -> _Wire | None:
        """How the run's messages parse, read from its first one; None when the run cannot be parsed at once."""
        split = split_envelope(first)
        if split is not None:
            head = split[0]
            fields = self._schemas.get(head)
            if head not in self._schemas:
                fields = self._schemas[head] = _schema_fields(head) if len(self._schemas) < 1000 else None
            if fields is None:
                return None
            # Every message must carry the first one's schema, byte for byte: then the payloads
            # hold no field the schema lacks and the parser may skip anything unexpected.
            cut = len(first.rstrip()) - 1 - len(split[1])  # the schema part and the payload marker, however spaced
            return _Wire(fields, cut, "ignore", schemas_on=True)
        if first.startswith(b'{"schema"'):
            return None
        fields = _table_wire_fields(table_schema)
        if fields is None:
            return None
        # A new column is an unexpected field: it must show in the parsed schema.
        return _Wire(fields, 0, "infer", schemas_on=False)


@dataclass
class _Wire:
    """How a run's messages parse: their row's fields, where the payload starts in each message (0: the message
    is the payload), and what the parser does with a field the row lacks."""

    fields: list[_WireField]
    cut: int
    unexpected: str
    schemas_on: bool


def _keys_readable(message_keys: list[bytes | None]) -> bool:
    """Whether the record-by-record path reads every message key of the run (else it dead-letters the record)."""
    # The key is taken from the row, but a record whose message key the record-by-record path cannot read is a
    # dead letter there: such a run goes that way. That path parses a schemas-on key once per key schema and
    # takes a later key with the same schema part by that part alone (`SchemaCache.key`), so the first key is
    # parsed and the others must carry its schema part byte for byte (the peers' 156-byte keys: 1.7 µs each
    # parsed, 0.1 µs compared). Schemas-off keys are each parsed, as there.
    first_key = message_keys[0]
    if first_key is None:
        return False
    try:
        decode_key(first_key)
    except DecodeError:
        return False
    key_split = split_envelope(first_key)
    if key_split is not None and first_key.find(COMPACT_PAYLOAD_MARKER) == len(key_split[0]):
        key_head = first_key[: len(key_split[0]) + len(COMPACT_PAYLOAD_MARKER)]
        shared = native.keys_share_head(message_keys, key_head)
        if shared is None:
            shared = all(k is not None and k.startswith(key_head) and k.rstrip().endswith(b"}") for k in message_keys)
        return shared
    loads = orjson.loads
    for key in message_keys:
        if key is None or type(loads(key)) is not dict:
            return False
    return True


def _table_wire_fields(table_schema: pa.Schema) -> list[_WireField] | None:
    """Schemas off: the wire fields of the table's columns, or None when a column's type is not one JSON carries
    as it is."""
    fields = []
    for f in table_schema:
        if not (
            pa.types.is_integer(f.type)
            or pa.types.is_floating(f.type)
            or pa.types.is_boolean(f.type)
            or pa.types.is_string(f.type)
        ):
            return None
        wire = pa.int64() if pa.types.is_integer(f.type) else pa.float64() if pa.types.is_floating(f.type) else f.type
        fields.append(_WireField(f.name, wire, None))
    return fields


def _parse_run(values: list[bytes], wire: _Wire, key_columns: list[str]) -> pa.Table | None:
    """The run's envelopes parsed with the wire's row as before and after image; None when a message does not
    parse or carries a field the table does not have yet (a new column)."""
    fields = wire.fields
    row = pa.struct([(f.name, f.wire) for f in fields])
    # Only a delete reads its before image, and only the key. With schemas on every message carries the first
    # one's schema, so the parser may skip the rest of each before image (a quarter of the parse when updates
    # carry full before images); schemas off, an unknown field there must still show as a new column.
    old_row = pa.struct([(f.name, f.wire) for f in fields if f.name in key_columns]) if wire.schemas_on else row
    explicit = pa.schema(
        [
            ("before", old_row),
            ("after", row),
            ("op", pa.string()),
            ("source", pa.struct([("ts_ms", pa.int64())])),
            ("ts_ms", pa.int64()),
        ]
    )
    parsed = (
        native.parse_envelopes(values, wire.cut, [(f.name, f.wire) for f in fields], key_columns)
        if wire.schemas_on and key_columns and native.available()
        else _read_payloads(values, wire.cut, explicit, wire.unexpected)
    )
    if parsed is None:
        return None
    for side, want in (("before", old_row), ("after", row)):
        if parsed.schema.field(side).type != want:
            return None  # a field the table does not have yet: a new column
    return parsed


def _typed_columns(
    parsed: pa.Table, ops: pa.Array, fields: list[_WireField], key_columns: list[str], table_schema: pa.Schema
) -> dict[str, pa.Array] | None:
    """Each field's column in the table's type: the after image, a delete's key from its before image; None when
    a row lacks its image, a key is null or a value was withheld."""
    is_delete = pc.equal(ops, "d")
    after = parsed.column("after").combine_chunks()
    before = parsed.column("before").combine_chunks()
    any_delete = pc.any(is_delete).as_py()
    if pc.any(pc.and_(pc.invert(is_delete), after.is_null())).as_py():
        return None
    if any_delete and pc.any(pc.and_(is_delete, before.is_null())).as_py():
        return None
    keys = set(key_columns)
    columns = {}
    for f in fields:
        value = after.field(f.name)
        if any_delete:
            old = before.field(f.name) if f.name in keys else pa.nulls(len(value), f.wire)
            value = pc.if_else(is_delete, old, value)
        if f.name in keys and value.null_count:
            return None
        if pa.types.is_string(f.wire) and pc.any(pc.equal(value, UNAVAILABLE_VALUE)).as_py():
            return None  # withheld TOAST values: the record-by-record path keeps the stored value
        columns[f.name] = _convert(value, f, table_schema.field(f.name).type)
    return columns


def _as_table(columns: dict[str, pa.Array], table_schema: pa.Schema, n: int) -> pa.Table | None:
    """The run's ``n`` rows in the table's schema (nulls in the columns the messages lack); None when the record
    path must fill or refuse a column."""
    if any(f.name not in columns and f.metadata and _DEFAULT_KEY in f.metadata for f in table_schema):
        return None  # records that predate a column with a default: the record path fills it
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in table_schema]
    for f, arr in zip(table_schema, arrays, strict=True):
        if not f.nullable and arr.null_count:
            return None
    return pa.Table.from_arrays(arrays, schema=table_schema)


def _read_payloads(values: list[bytes], cut: int, explicit: pa.Schema, unexpected: str) -> pa.Table | None:
    """The payloads (each value from ``cut`` on, without its last byte when ``cut`` is past a schema part, which
    every value must carry as the first one does) parsed by Arrow's JSON reader; None when a value is not one."""
    if cut:
        prefix = values[0][:cut]
        payloads = [v[cut:-1] for v in values if v.startswith(prefix) and v.endswith(b"}")]
        if len(payloads) != len(values):
            return None
    else:
        payloads = values
    parsed = pj.read_json(
        io.BytesIO(b"\n".join(payloads)),
        read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * sum(map(len, payloads))), use_threads=False),
        parse_options=pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior=unexpected),
    )
    return parsed if parsed.num_rows == len(values) else None


def _event_wire(target: pa.DataType) -> pa.DataType | None:
    """The type a plain JSON event's value of a ``target`` column is parsed as (None: not handled here)."""
    if pa.types.is_integer(target):
        return pa.int64()
    if pa.types.is_floating(target):
        return pa.float64()
    if pa.types.is_boolean(target) or pa.types.is_string(target):
        return target
    return None


def decode_events(
    records: RecordRun, table_schema: pa.Schema, key_columns: list[str], time_field: str | None = None
) -> DecodedRun | None:
    """A run of plain JSON events (append streams: the whole object is the row) as one typed run, or
    None (decode them one by one). The same contract as `RunDecoder.decode`: anything unusual — a value
    of another type, a field the table lacks, a missing event time or de-duplication key, invalid
    UTF-8, more or fewer than one object per message — declines the run; the record path decides."""
    values = cast("list[bytes]", records.values)  # the caller leaves tombstones out
    if values[0][:1] == b"\x00" or any(f.metadata and _DEFAULT_KEY in f.metadata for f in table_schema):
        return None
    wires = []
    for f in table_schema:
        if f.name == time_field and pa.types.is_timestamp(f.type):
            # ISO strings or epoch numbers, as the first event has it (a run mixing them declines);
            # converted per value below by the record path's own function
            try:
                first = orjson.loads(values[0])
            except orjson.JSONDecodeError:
                return None
            kind = type(first.get(time_field)) if isinstance(first, dict) else None
            wire = {str: pa.string(), int: pa.int64(), float: pa.float64()}.get(kind)  # type: ignore[arg-type]
            if wire is None:
                return None
            wires.append((f.name, wire))
        elif (wire := _event_wire(f.type)) is not None:
            wires.append((f.name, wire))
        else:
            return None  # nested, decimal, date: the record path
    try:
        data = b"\n".join(values)
        parsed = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * len(data)), use_threads=False),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema(wires), unexpected_field_behavior="infer"),
        )
        if parsed.num_rows != len(records) or parsed.schema.names != [name for name, _ in wires]:
            return None  # not one object per message, or a field the table lacks (a new column)
        parsed.validate(full=True)  # the reader does not check UTF-8
        arrays = []
        source_ts = np.full(len(records), np.nan)
        for f, (name, wire) in zip(table_schema, wires, strict=True):
            value = parsed.column(name).combine_chunks()
            if (name in key_columns or name == time_field or not f.nullable) and value.null_count:
                return None
            if (
                pa.types.is_floating(wire)
                and value.null_count < len(value)
                and pc.max(pc.abs(value)).as_py() >= _EXACT_FLOAT_INT
            ):
                return None  # may be an integer literal no double holds exactly: the record path decides
            if name == time_field and pa.types.is_timestamp(f.type):
                micros = [event_time(v) for v in value.to_pylist()]
                arrays.append(pa.array(micros, pa.int64()).cast(f.type))
                source_ts = np.asarray(micros, np.float64) // 1000
            else:
                arrays.append(pc.cast(value, f.type, safe=True))
        table = pa.Table.from_arrays(arrays, schema=table_schema)
    except (pa.ArrowException, ValueError, TypeError, OverflowError, BadValue):
        return None
    return DecodedRun(
        table,
        np.array(records.offsets, np.int64),
        ["c"] * len(records),
        source_ts,
        np.array(records.timestamps, np.int64),
    )


_EXACT_FLOAT_INT = 2.0**53  # as lakestream.decode.columns' integer check
_DEFAULT_KEY = b"lakestream.write-default"  # lakestream.sink.types.DEFAULT_KEY (no import of the sink here)
_MICROS = {
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")


def _in_range(value: pa.Array, low: int, high: int) -> pa.Array:
    """``value`` when every value is within [low, high] (dates/timestamps readers can represent)."""
    bounds = pc.min_max(value)
    if bounds["min"].is_valid and (bounds["min"].as_py() < low or bounds["max"].as_py() > high):
        raise ValueError("a date or timestamp outside 0001-01-01..9999-12-31")
    return value


def _convert(value: pa.Array, field: _WireField, target: pa.DataType) -> pa.Array:
    """A parsed wire column as ``target`` (raises when a value does not fit: the caller falls back)."""
    name = field.semantic
    if field.ftype is None or (name is None and field.ftype.convert is identity):
        return pc.cast(value, target, safe=True)
    if name in _DATES and pa.types.is_date(target):
        return pc.cast(pc.cast(_in_range(value, MIN_DAYS, MAX_DAYS), pa.int32(), safe=True), target)
    if name in _MICROS and pa.types.is_timestamp(target) and target.tz is None:
        scale = _MICROS[name]
        micros = value if scale == 1 else pc.multiply_checked(value, scale)
        return pc.cast(_in_range(micros, MIN_MICROS, MAX_MICROS), target)
    if name == "io.debezium.time.ZonedTimestamp" and pa.types.is_timestamp(target) and target.tz is not None:
        return pc.cast(value, target)
    if field.ftype.convert is identity and pa.types.is_string(field.wire) and pa.types.is_string(target):
        return value
    if (
        name == "org.apache.kafka.connect.data.Decimal"
        and pa.types.is_string(field.wire)
        and pa.types.is_decimal(target)
        and field.ftype.ddl == f"decimal({target.precision},{target.scale})"
    ):
        fast = decimals_from_base64(value, target)
        if fast is not None:
            return fast
    convert = field.ftype.convert
    return build_column([None if v is None else convert(v) for v in value.to_pylist()], target)


_BASE64 = np.full(256, 255, np.uint8)
_BASE64[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)] = np.arange(64)
_BASE64[ord("=")] = 64


def decimals_from_base64(value: pa.Array, target: pa.Decimal128Type) -> pa.Array | None:
    """Kafka Connect Decimal values (base64 of the big-endian two's-complement unscaled value) as
    ``target``, in numpy, for unscaled values of at most 8 bytes. None when any value is outside
    that (invalid base64, longer, more digits than ``target`` holds): the per-value path decides."""
    n = len(value)
    if n == 0:
        return None
    filled = pc.fill_null(value, "AAAA") if value.null_count else value
    offsets = np.frombuffer(filled.buffers()[1], np.int32, n + 1, filled.offset * 4)
    data = np.frombuffer(filled.buffers()[2], np.uint8)
    lengths = np.diff(offsets)
    if lengths.min() < 4 or lengths.max() > 12 or (lengths % 4).any():
        return None
    columns = np.arange(12)
    inside = columns[None, :] < lengths[:, None]
    sextets = _BASE64[data[np.where(inside, offsets[:-1, None] + columns[None, :], 0)]]
    padding = (sextets == 64) & inside
    pads = padding.sum(axis=1)
    if (
        ((sextets == 255) & inside).any()
        or pads.max() > 2
        or (padding & (columns[None, :] < (lengths - pads)[:, None])).any()
    ):
        return None
    quads = np.where(inside & ~padding, sextets, 0).astype(np.uint32).reshape(n, 3, 4)
    triples = (quads[:, :, 0] << 18) | (quads[:, :, 1] << 12) | (quads[:, :, 2] << 6) | quads[:, :, 3]
    raw = np.stack([triples >> 16, (triples >> 8) & 255, triples & 255], axis=2).reshape(n, 9).astype(np.uint64)
    sizes = lengths // 4 * 3 - pads
    if sizes.max() > 8:
        return None
    unscaled = np.zeros(n, np.uint64)
    for k in range(8):
        unscaled = np.where(k < sizes, (unscaled << np.uint64(8)) | raw[:, k], unscaled)
    signed = unscaled.view(np.int64)
    negative = (raw[:, 0] >= 128) & (sizes < 8)
    signed = np.where(negative, signed - (np.int64(1) << (8 * sizes.astype(np.int64))), signed)
    if target.precision < 19 and (np.abs(signed) >= 10**target.precision).any():
        return None
    words = np.empty((n, 2), np.int64)
    words[:, 0] = signed
    words[:, 1] = signed >> 63
    out = pa.Array.from_buffers(target, n, [None, pa.py_buffer(words)])
    if value.null_count:
        out = pc.if_else(value.is_valid(), out, pa.scalar(None, target))
    return out
