"""Avro records in Confluent's wire format: magic byte 0, a 4-byte big-endian schema id, the Avro body.

Writer schemas come from a Confluent-compatible Schema Registry (confluent-kafka's
``SchemaRegistryClient``), fetched once per id and process. Each one is turned into the Kafka
Connect schema description Debezium's JsonConverter would have embedded (AvroConverter keeps the
Connect names and parameters as ``connect.name`` / ``connect.parameters``), so Avro records take the
same typed path as JSON ones (`lakestream.decode.types`). Bodies are read with fastavro with logical
types left undone: values stay in the wire form those conversions expect (a decimal's unscaled
bytes, a date's days, a timestamp's epoch count).
"""

from __future__ import annotations

import base64
import copy
import io
import threading
from dataclasses import dataclass
from typing import Any

import orjson

from lakestream.errors import DecodeError, SchemaRegistryUnavailable

MAGIC_BYTE = 0
HEADER_SIZE = 5

_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}

# Avro logical types (when a schema carries no Connect name) → the Connect/Debezium semantic name
# whose conversion `lakestream.decode.types` applies to the raw value.
_LOGICAL = {
    "date": "org.apache.kafka.connect.data.Date",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "uuid": "io.debezium.data.Uuid",
    "decimal": "org.apache.kafka.connect.data.Decimal",
}


def schema_id_of(data: bytes) -> int | None:
    """The schema id of a Confluent-framed record, or None when ``data`` is not one."""
    if len(data) < HEADER_SIZE or data[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(data[1:HEADER_SIZE], "big")


@dataclass(frozen=True)
class WriterSchema:
    """One registered Avro schema, ready to decode with: parsed for fastavro and as a Connect schema."""

    schema_id: int
    parsed: Any
    connect: dict[str, Any]

    @property
    def cache_key(self) -> bytes:
        # Never equal to a JSON envelope's schema bytes (those start with '{"schema"').
        return b"avro-schema-id:%d" % self.schema_id


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Converter:
    """Avro schema JSON → Kafka Connect schema description, resolving named types."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}

    def field_schema(self, avro: Any, namespace: str | None) -> dict[str, Any]:
        if isinstance(avro, list):
            branches = [b for b in avro if b != "null"]
            if len(branches) != 1:
                raise DecodeError(
                    f"unsupported Avro union {orjson.dumps(avro)[:120].decode()}: "
                    'only ["null", T] (an optional field) maps to a column'
                )
            branch = self.field_schema(branches[0], namespace)
            return {**branch, "optional": True}
        if isinstance(avro, str):
            if avro in _PRIMITIVES:
                return {"type": _PRIMITIVES[avro], "optional": False}
            if avro == "null":
                raise DecodeError("an Avro field of type null alone has no column type")
            named = self.named.get(_full_name(avro, namespace)) or self.named.get(avro)
            if named is None:
                raise DecodeError(f"Avro schema refers to unknown type {avro!r}")
            return copy.deepcopy(named)
        if not isinstance(avro, dict):
            raise DecodeError(f"not an Avro schema: {str(avro)[:80]!r}")
        kind = avro.get("type")
        if isinstance(kind, (list, dict)):
            return self.field_schema(kind, namespace)
        name = avro.get("connect.name")
        logical = avro.get("logicalType")
        params = avro.get("connect.parameters")
        if kind == "record":
            full = _full_name(avro["name"], avro.get("namespace", namespace))
            inner_ns = full.rpartition(".")[0] or None
            out: dict[str, Any] = {"type": "struct", "optional": False, "name": name or full, "fields": []}
            self.named[full] = out  # before the fields: a record may refer to itself
            for f in avro.get("fields", []):
                field = self.field_schema(f["type"], inner_ns)
                field["field"] = f["name"]
                if "default" in f and f["default"] is not None:
                    field["default"] = _connect_default(f["default"], field)
                out["fields"].append(field)
            return out
        if kind == "enum":
            out = {"type": "string", "optional": False, "name": name or "io.debezium.data.Enum"}
            self.named[_full_name(avro["name"], avro.get("namespace", namespace))] = out
            return dict(out)
        if kind == "fixed":
            out = {"type": "bytes", "optional": False}
            if logical == "decimal":
                out |= {"name": _LOGICAL["decimal"], "parameters": _decimal_parameters(avro)}
            self.named[_full_name(avro["name"], avro.get("namespace", namespace))] = out
            return dict(out)
        if kind == "array":
            return {"type": "array", "optional": False, "items": self.field_schema(avro["items"], namespace)}
        if kind == "map":
            return {
                "type": "map",
                "optional": False,
                "keys": {"type": "string"},
                "values": self.field_schema(avro["values"], namespace),
            }
        if kind not in _PRIMITIVES:
            raise DecodeError(f"unsupported Avro type {kind!r}")
        ctype = avro.get("connect.type") or _PRIMITIVES[kind]
        out = {"type": ctype, "optional": False}
        if name is None and logical in _LOGICAL:
            name = _LOGICAL[logical]
            if logical == "decimal" and params is None:
                params = _decimal_parameters(avro)
        if name is not None:
            out["name"] = name
        if params is not None:
            out["parameters"] = dict(params)
        return out


def _decimal_parameters(avro: dict[str, Any]) -> dict[str, str]:
    return {"scale": str(avro.get("scale", 0)), "connect.decimal.precision": str(avro["precision"])}


def _connect_default(value: Any, field: dict[str, Any]) -> Any:
    """An Avro default as JsonConverter would show it: Avro writes bytes defaults as ISO-8859-1 text."""
    if field.get("type") == "bytes" and isinstance(value, str):
        return base64.b64encode(value.encode("latin-1")).decode()
    return value


def connect_schema(avro: Any) -> dict[str, Any]:
    """The Kafka Connect schema description (JsonConverter's form) of an Avro writer schema."""
    return _Converter().field_schema(avro, None)


def _without_logical_types(avro: Any) -> Any:
    if isinstance(avro, list):
        return [_without_logical_types(x) for x in avro]
    if isinstance(avro, dict):
        return {k: _without_logical_types(v) for k, v in avro.items() if k != "logicalType"}
    return avro


class AvroSchemas:
    """Writer schemas of one registry by id, each fetched once (thread-safe; one per process)."""

    def __init__(self, client_config: dict[str, Any]):
        self._config = client_config
        self._client: Any = None
        self._by_id: dict[int, WriterSchema] = {}
        self._lock = threading.Lock()
        self.fetches = 0

    def _registry(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(dict(self._config))
        return self._client

    def writer(self, schema_id: int) -> WriterSchema:
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        with self._lock:
            found = self._by_id.get(schema_id)
            if found is None:
                found = self._by_id[schema_id] = self._fetch(schema_id)
            return found

    def _fetch(self, schema_id: int) -> WriterSchema:
        import fastavro
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._registry().get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(
                    f"Avro schema id {schema_id} is not in the schema registry ({exc.error_message})"
                ) from None
            raise SchemaRegistryUnavailable(
                f"schema registry: fetching schema id {schema_id} failed with HTTP "
                f"{exc.http_status_code}: {exc.error_message}"
            ) from None
        except Exception as exc:  # noqa: BLE001 — transport errors (httpx): the registry, not the record
            raise SchemaRegistryUnavailable(
                f"schema registry unreachable while fetching schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        self.fetches += 1
        kind = registered.schema_type or "AVRO"
        if kind != "AVRO":
            raise DecodeError(f"schema id {schema_id} is a {kind} schema; lakestream reads Avro only")
        if registered.references:
            raise DecodeError(f"Avro schema id {schema_id} uses schema references, which lakestream does not resolve")
        try:
            avro = orjson.loads(registered.schema_str)
            parsed = fastavro.parse_schema(_without_logical_types(avro))
        except Exception as exc:  # noqa: BLE001 — a schema fastavro refuses makes its records unreadable
            raise DecodeError(f"Avro schema id {schema_id} cannot be parsed: {exc}") from None
        return WriterSchema(schema_id, parsed, connect_schema(avro))


def decode_avro(data: bytes, schemas: AvroSchemas) -> tuple[Any, WriterSchema]:
    """The datum of one Confluent-framed Avro record (values in wire form) and its writer schema."""
    import fastavro

    schema_id = schema_id_of(data)
    if schema_id is None:
        raise DecodeError("not a Confluent-framed record (magic byte 0 and a 4-byte schema id)")
    writer = schemas.writer(schema_id)
    body = io.BytesIO(data)
    body.seek(HEADER_SIZE)
    try:
        datum = fastavro.schemaless_reader(body, writer.parsed, None)
    except Exception as exc:  # noqa: BLE001 — truncated or corrupt bodies raise EOFError, ValueError, ...
        raise DecodeError(f"Avro body does not match schema id {schema_id}: {type(exc).__name__}: {exc}") from None
    if body.tell() != len(data):
        raise DecodeError(f"Avro body has {len(data) - body.tell()} bytes after the record of schema id {schema_id}")
    return datum, writer


_PROCESS_SCHEMAS: dict[tuple[tuple[str, str], ...], AvroSchemas] = {}
_PROCESS_LOCK = threading.Lock()


def schemas_for(client_config: dict[str, Any]) -> AvroSchemas:
    """This process's schema cache for a registry (write tasks of one executor share it)."""
    key = tuple(sorted((str(k), str(v)) for k, v in client_config.items()))
    with _PROCESS_LOCK:
        found = _PROCESS_SCHEMAS.get(key)
        if found is None:
            found = _PROCESS_SCHEMAS[key] = AvroSchemas(client_config)
        return found
