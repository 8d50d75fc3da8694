"""Decoding one Kafka record into a change: Debezium envelopes (with or without embedded schemas)
and plain JSON events.

The result is a `Change`: the operation, the key, the row in wire form (see `types`), the columns
whose values Debezium withheld (unchanged TOAST), and the row's column types.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from lakestream.decode.avro import AvroSchemas, decode_avro, schema_id_of
from lakestream.decode.types import UNAVAILABLE_VALUE, FieldType, event_time, field_type, identity, infer_type
from lakestream.errors import BadValue, DecodeError

OPS = {"c", "u", "d", "r"}
# Debezium's table-level events: a TRUNCATE ("t") and a logical-decoding message ("m"). Neither
# carries a row image.
TRUNCATE, MESSAGE = "t", "m"
# A column record of lakestream's capture (`lakestream.capture.columns`): a table's columns, no row.
COLUMNS = "lakestream.columns"
# The shape id of a column record starts with this: such a shape evolves a table, never creates one.
COLUMN_RECORD_SHAPE = "columns-"
# Debezium's JsonConverter writes {"schema":...,"payload":...}: the schema first.
_PAYLOAD_MARKER = re.compile(rb',\s*"payload"\s*:')
COMPACT_PAYLOAD_MARKER = b',"payload":'  # Debezium's compact form of it, found first by `split_envelope`


@dataclass(slots=True)
class Columns:
    """The column types of one row shape, and a stable id for that shape."""

    names: list[str]
    types: list[FieldType]
    schema_id: str
    inferred: bool
    defaults: dict[str, Any] = field(default_factory=dict)  # column → its source default, in wire form

    def describe(self, key_columns: list[str]) -> dict[str, Any]:
        columns = [[n, t.ddl] for n, t in zip(self.names, self.types, strict=True)]
        return {"columns": columns, "key": key_columns, "inferred": self.inferred}


@dataclass(slots=True)
class Change:
    op: str  # c u d r, or t (truncate) / m (logical-decoding message): no row
    key: dict[str, Any] | None
    row: dict[str, Any]
    unavailable: list[str]
    source_ts_ms: int | None
    columns: Columns
    payload: dict[str, Any]
    # A keyless table's update: the old row (REPLICA IDENTITY FULL), in wire form like ``row``.
    old_row: dict[str, Any] | None = None


def _shape_id(parts: list[tuple[str, str]]) -> str:
    return hashlib.blake2b(orjson.dumps(parts), digest_size=8).hexdigest()


_NO_COLUMNS = Columns([], [], "none", inferred=True)  # the "shape" of a table-level event


class SchemaCache:
    """Parsed Debezium schemas keyed by their raw bytes: the schema is the same for thousands of events."""

    def __init__(self) -> None:
        self._by_bytes: dict[bytes, tuple[Columns, dict[str, FieldType]]] = {}
        self._inferred: dict[tuple[tuple[str, str], ...], Columns] = {}
        self._key_names: dict[bytes, tuple[str, ...]] = {}
        self._quick: dict[tuple[Any, ...], Columns] = {}

    def cached(self, raw: bytes) -> tuple[Columns, dict[str, FieldType]] | None:
        return self._by_bytes.get(raw)

    def key(self, key: bytes | None) -> dict[str, Any] | None:
        """The message key's fields. A schemas-on key is parsed once per distinct key schema: later
        keys give only the names (values None), which the caller fills from the row."""
        if key is None:
            return None
        split = split_envelope(key)
        if split is not None:
            names = self._key_names.get(split[0])
            if names is not None:
                return dict.fromkeys(names)
        decoded = decode_key(key)
        if split is not None and decoded is not None and len(self._key_names) < 1000:
            self._key_names[split[0]] = tuple(decoded)
        return decoded

    def avro_key(self, key: bytes, avro: AvroSchemas) -> dict[str, Any]:
        """The fields of an Avro message key; like `key`, decoded once per key schema id (later keys
        give only the names, which the caller fills from the row)."""
        names = self._key_names.get(key[:5])
        if names is not None:
            return dict.fromkeys(names)
        decoded = decode_avro_key(key, avro)
        if len(self._key_names) < 1000:
            self._key_names[key[:5]] = tuple(decoded)
        return decoded

    def from_envelope_schema(self, raw: bytes | None, schema: dict[str, Any]) -> tuple[Columns, dict[str, FieldType]]:
        if raw is not None and raw in self._by_bytes:
            return self._by_bytes[raw]
        row_schema = None
        for part in schema.get("fields", []):
            if part.get("field") in ("after", "before") and part.get("type") == "struct":
                row_schema = part
                if part.get("field") == "after":
                    break
        if row_schema is None:
            raise DecodeError("Debezium schema has no 'after'/'before' struct")
        names, types, defaults = [], [], {}
        for column in row_schema.get("fields", []):
            names.append(column["field"])
            types.append(ftype := field_type(column))
            if column.get("default") is not None:
                try:
                    defaults[column["field"]] = ftype.convert(column["default"])
                except Exception:  # noqa: BLE001 — a default we cannot read is no default, not a bad record
                    pass
        parts: list[Any] = [(n, t.ddl) for n, t in zip(names, types, strict=True)]
        if defaults:
            parts.append(["defaults", sorted((k, repr(v)) for k, v in defaults.items())])
        columns = Columns(names, types, _shape_id(parts), inferred=False, defaults=defaults)
        result = (columns, dict(zip(names, types, strict=True)))
        if raw is not None and len(self._by_bytes) < 1000:
            self._by_bytes[raw] = result
        return result

    def inferred(self, row: dict[str, Any], time_field: str | None = None) -> Columns:
        # Fast path: rows of flat values with the same names and Python types share one shape.
        quick = (tuple(row), tuple(map(type, row.values())), time_field)
        columns = self._quick.get(quick)
        if columns is not None:
            return columns
        columns = self._infer(row, time_field)
        if len(self._quick) < 10_000 and not any(t in (dict, list, type(None)) for t in quick[1]):
            self._quick[quick] = columns
        return columns

    def _infer(self, row: dict[str, Any], time_field: str | None) -> Columns:
        signature = tuple(
            (k, "timestamp" if k == time_field else t) for k, v in row.items() if (t := infer_type(v)) is not None
        )
        columns = self._inferred.get(signature)
        if columns is None:
            names = [k for k, _ in signature]
            types = [FieldType(t) for _, t in signature]
            columns = Columns(names, types, "i" + _shape_id(list(signature)), inferred=True)
            if len(self._inferred) < 10_000:
                self._inferred[signature] = columns
        return columns


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as first:
        import json

        if data[:1] == b"\x00" and len(data) >= 5:
            # Confluent's wire format: magic byte 0, a 4-byte schema id, then Avro/Protobuf/JSON-Schema bytes.
            schema_id = int.from_bytes(data[1:5], "big")
            raise DecodeError(
                f"Confluent Schema Registry framed record (magic byte 0, schema id {schema_id}): "
                f"lakestream reads JSON only and no schema registry is configured"
            ) from None

        try:  # Debezium may write NaN/Infinity for float columns, which orjson rejects.
            return json.loads(data)
        except RecursionError:
            raise DecodeError(f"malformed JSON: nested too deeply ({first})") from None
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None


def _convert_row(row: dict[str, Any], types: dict[str, FieldType]) -> tuple[dict[str, Any], list[str]]:
    """The row with values in wire form, and the columns Debezium withheld (unchanged TOAST)."""
    unavailable: list[str] = []
    if UNAVAILABLE_VALUE in row.values():  # one C-level scan; the per-column pass only when needed
        row = dict(row)
        for name, value in row.items():
            if value == UNAVAILABLE_VALUE:
                unavailable.append(name)
                row[name] = None
    converting = [(name, ftype) for name, ftype in types.items() if ftype.convert is not identity]
    if not converting:
        return row, unavailable
    out = dict(row)
    for name, ftype in converting:
        value = out.get(name)
        if value is None:
            continue
        try:
            out[name] = ftype.convert(value)
        except DecodeError as exc:
            raise type(exc)(f"column {name!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 — any conversion failure is a bad record, not a crash
            raise BadValue(f"column {name!r}: cannot convert {str(value)[:80]!r} to {ftype.ddl}: {exc}") from None
    return out, unavailable


def decode_key(key: bytes | None) -> dict[str, Any] | None:
    """The primary key of a Debezium message key (with or without embedded schema)."""
    if key is None:
        return None
    try:
        obj = _loads(key)
    except DecodeError as exc:
        raise DecodeError(f"message key: {exc}") from None
    if isinstance(obj, dict) and "payload" in obj and "schema" in obj:
        obj = obj["payload"]
    if not isinstance(obj, dict):
        raise DecodeError(f"message key is not a JSON object: {key[:80]!r}")
    return obj


def split_envelope(value: bytes) -> tuple[bytes, bytes] | None:
    """(schema part, payload JSON) of a schemas-on message, without parsing it."""
    if not value.startswith(b'{"schema"'):
        return None
    end = value.rstrip()
    if not end.endswith(b"}"):
        return None
    cut = value.find(COMPACT_PAYLOAD_MARKER)  # a plain find is much faster than a regex
    if cut > 0:
        return value[:cut], end[cut + len(COMPACT_PAYLOAD_MARKER) : -1]
    match = _PAYLOAD_MARKER.search(value)
    if match is None:
        return None
    return value[: match.start()], end[match.end() : -1]


def decode_avro_key(key: bytes, avro: AvroSchemas) -> dict[str, Any]:
    """The fields of an Avro message key (Confluent wire format)."""
    try:
        obj, _ = decode_avro(key, avro)
    except DecodeError as exc:
        raise type(exc)(f"message key: {exc}") from None
    if not isinstance(obj, dict):
        raise DecodeError(f"message key is not an Avro record: {str(obj)[:80]!r}")
    return obj


def decode_debezium(
    key: bytes | None, value: bytes, cache: SchemaCache, avro: AvroSchemas | None = None
) -> Change | None:
    """Decode a Debezium change event; None for events that carry no row change (heartbeats, tombstones).

    With ``avro`` (a registry is configured), Confluent-framed Avro events are read too."""
    split = split_envelope(value)
    known = cache.cached(split[0]) if split else None
    columns: Columns | None
    types: dict[str, FieldType]
    if avro is not None and split is None and schema_id_of(value) is not None:
        payload, writer = decode_avro(value, avro)
        if isinstance(payload, dict) and payload.get("op") in (TRUNCATE, MESSAGE):
            columns, types = _NO_COLUMNS, {}
        else:
            columns, types = cache.from_envelope_schema(writer.cache_key, writer.connect)
    elif known is not None and split is not None:  # known implies split
        # The schema is the same bytes as an earlier event's: parse only the payload.
        payload = _loads(split[1])
        columns, types = known
    else:
        obj = _loads(value)
        if not isinstance(obj, dict):
            raise DecodeError("Debezium value is not a JSON object")
        if "payload" in obj and "schema" in obj:
            payload = obj["payload"]
            if isinstance(payload, dict) and payload.get("op") in (TRUNCATE, MESSAGE):
                columns, types = _NO_COLUMNS, {}  # a message event's schema has no row struct at all
            else:
                columns, types = cache.from_envelope_schema(split[0] if split else None, obj["schema"])
        else:
            payload, columns, types = obj, None, {}
    if not isinstance(payload, dict):
        raise DecodeError("Debezium payload is not a JSON object")
    op = payload.get("op")
    if op is None:
        raise DecodeError("missing 'op' field: not a Debezium change event")
    if op == COLUMNS:
        return Change(COLUMNS, None, {}, [], payload.get("ts_ms"), column_record_columns(payload), payload)
    if op in (TRUNCATE, MESSAGE):
        source = payload.get("source")
        ts = source.get("ts_ms") if isinstance(source, dict) else payload.get("ts_ms")
        return Change(op, None, {}, [], ts if isinstance(ts, int) else None, _NO_COLUMNS, payload)
    if op not in OPS:
        raise DecodeError(f"unknown op {op!r} (expected one of c, u, d, r, t, m, {COLUMNS})")
    image = payload.get("before") if op == "d" else payload.get("after")
    if not isinstance(image, dict):
        side = "before" if op == "d" else "after"
        raise DecodeError(f"op {op!r} without a '{side}' row image")
    if columns is None:
        columns = cache.inferred(image)
    row, unavailable = _convert_row(image, types)
    if avro is not None and key is not None and schema_id_of(key) is not None:
        key_obj: dict[str, Any] | None = cache.avro_key(key, avro)
    else:
        key_obj = cache.key(key)
    if key_obj is not None and all(name in row for name in key_obj):
        key_obj = {name: row[name] for name in key_obj}  # same values, in the row's (wire) form
    old_row = None
    if key_obj is None and op == "u" and isinstance(payload.get("before"), dict):
        # No key: the table is a row multiset, and an update replaces one row equal to the old image.
        old_row = _convert_row(payload["before"], types)[0]
        for column in unavailable:  # withheld TOAST values are in the full old image
            if column in old_row:
                row[column] = old_row[column]
        unavailable = [c for c in unavailable if c not in old_row]
    source = payload.get("source")
    ts = source.get("ts_ms") if isinstance(source, dict) else None
    if ts is None:
        ts = payload.get("ts_ms")
    return Change(op, key_obj, row, unavailable, ts, columns, payload, old_row)


def column_record_columns(payload: dict[str, Any]) -> Columns:
    """The shape a column record describes: its columns' types and defaults (wire form)."""
    columns = payload.get("columns")
    if not isinstance(columns, list) or not all(isinstance(c, dict) for c in columns):
        raise DecodeError("a column record without a list of columns")
    names, types, defaults, parts = [], [], {}, []
    for column in columns:
        name, ddl = column.get("name"), column.get("type")
        if not isinstance(name, str) or not isinstance(ddl, str):
            raise DecodeError(f"a column record's column without a name and type: {str(column)[:80]}")
        names.append(name)
        types.append(FieldType(ddl))
        parts.append((name, ddl))
        if column.get("default") is not None:
            defaults[name] = column["default"]
    if defaults:
        parts.append(("defaults", repr(sorted(defaults.items()))))
    return Columns(names, types, COLUMN_RECORD_SHAPE + _shape_id(parts), inferred=True, defaults=defaults)


_BINLOG_FILE_NUMBER = re.compile(r"\.(\d+)$")


def _binlog_position(source: dict[str, Any]) -> tuple[int, int]:
    """(binlog file number << 32 | the row event's position in that file, the row's number in the event) of a
    MariaDB or MySQL event. Events of one transaction are separate row events at rising positions; the file
    number rises when the server rotates its binlog; snapshot rows share the snapshot's position."""
    match = _BINLOG_FILE_NUMBER.search(str(source.get("file") or ""))
    pos, row = source.get("pos"), source.get("row")
    pos = pos if isinstance(pos, int) and 0 <= pos < 1 << 32 else 0
    row = row if isinstance(row, int) else 0
    return ((int(match.group(1)) << 32 | pos) if match else pos, row)


def source_position(payload: dict[str, Any]) -> tuple[int, int]:
    """Where a Debezium event sits in the source's stream. PostgreSQL: (the commit LSN of the transaction
    before it, its own LSN) from ``source.sequence`` / ``source.lsn``; MariaDB and MySQL: the binlog position
    (`_binlog_position`). Transactions arrive in commit order, so these pairs never decrease along a topic
    partition; a re-sent event repeats its pair."""
    source = payload.get("source")
    if not isinstance(source, dict):
        return (0, 0)
    if source.get("connector") in ("mariadb", "mysql"):
        return _binlog_position(source)
    lsn = source.get("lsn")
    lsn = lsn if isinstance(lsn, int) else 0
    commit = 0
    sequence = source.get("sequence")
    if isinstance(sequence, str):
        try:
            first = orjson.loads(sequence)[0]
            commit = int(first) if first is not None else 0
        except (orjson.JSONDecodeError, IndexError, TypeError, ValueError):
            commit = 0
    return (commit, lsn)


def decode_json_event(value: bytes, cache: SchemaCache, time_field: str | None = None) -> Change:
    """Decode a plain JSON event (append mode): the whole object is the row.

    ``time_field`` becomes a timestamp column (for hidden partitioning by event time).
    """
    obj = _loads(value)
    if not isinstance(obj, dict):
        raise DecodeError("event is not a JSON object")
    ts_ms = None
    if time_field is not None:
        raw = obj.get(time_field)
        if raw is None:
            raise DecodeError(f"event time field {time_field!r} is missing or null")
        obj[time_field] = event_time(raw)
        ts_ms = obj[time_field] // 1000
    return Change("c", None, obj, [], ts_ms, cache.inferred(obj, time_field), obj)
