"""Iceberg's partition transforms re-implemented over Arrow (executor side): the write tasks split rows by
partition without a JVM.

Partition values travel as JSON in Iceberg's internal form: day/month/year/hour/bucket -> int,
identity/truncate -> the source's internal form (int, long, string, boolean, float, date -> int days,
time/timestamp/timestamptz -> long micros, decimal -> string with the type's scale such as "12.30",
uuid -> canonical string, binary/fixed -> base64 string), null allowed.
"""

from __future__ import annotations

import base64
import decimal
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakestream.sink.types import decimal_ps

# -- partition transforms (Iceberg spec, "Partition Transforms" and "Appendix B") -----------------

_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_HOUR = 3_600_000_000


def _as_int64(values: pa.ChunkedArray) -> np.ndarray:
    """date -> days, time/timestamp -> micros, ints -> themselves; nulls as 0 (masked by the caller)."""
    if pa.types.is_date(values.type):
        values = values.cast(pa.int32())
    elif pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz=values.type.tz)).cast(pa.int64())
    elif pa.types.is_time(values.type):
        values = values.cast(pa.time64("us")).cast(pa.int64())
    out: np.ndarray = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return out


def _days(values: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_date(values.type):
        return _as_int64(values)
    days: np.ndarray = np.floor_divide(_as_int64(values), _MICROS_PER_DAY)
    return days


def _months(values: pa.ChunkedArray) -> np.ndarray:
    months: np.ndarray = _days(values).astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)
    return months


def _fmix_mul(h: np.ndarray, k: np.ndarray | np.uint32) -> np.ndarray:
    product: np.ndarray = (h * k).astype(np.uint32)
    return product


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return ((x << np.uint32(r)) | (x >> np.uint32(32 - r))).astype(np.uint32)


def murmur3_long(values: np.ndarray) -> np.ndarray:
    """Iceberg's 32-bit hash (murmur3_x86_32, seed 0) of int64 values as 8-byte little-endian longs,
    vectorized; returns signed int32 like Java's ``Murmur3_32.hashLong``."""
    u = values.astype(np.int64).view(np.uint64)
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
    h = np.zeros(len(u), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for block in ((u & np.uint64(0xFFFFFFFF)).astype(np.uint32), (u >> np.uint64(32)).astype(np.uint32)):
            k = _rotl(_fmix_mul(block, c1), 15)
            h ^= _fmix_mul(k, c2)
            h = (_fmix_mul(_rotl(h, 13), np.uint32(5)) + np.uint32(0xE6546B64)).astype(np.uint32)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h = _fmix_mul(h, np.uint32(0x85EBCA6B))
        h ^= h >> np.uint32(13)
        h = _fmix_mul(h, np.uint32(0xC2B2AE35))
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def _unscaled_bytes(unscaled: int) -> bytes:
    """Minimal big-endian two's complement bytes (Java's ``BigInteger.toByteArray``)."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def _unscaled(value: decimal.Decimal, scale: int) -> int:
    return int(value.scaleb(scale).to_integral_value())


def _bucket_hash_bytes(data: bytes) -> int:
    import mmh3

    return mmh3.hash(data, 0, signed=True)


def _bucket(column: pa.ChunkedArray, source_type: Any, n: int) -> pa.Array:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if isinstance(source_type, str) and source_type in ("int", "long", "date", "time", "timestamp", "timestamptz"):
        hashes = murmur3_long(_as_int64(column))
        out = (hashes.astype(np.int64) & 0x7FFFFFFF) % n
        return pa.array(out.astype(np.int32), mask=~valid)
    if source_type == "string":
        hashed = [None if v is None else _bucket_hash_bytes(v.encode("utf-8")) for v in column.to_pylist()]
    elif isinstance(source_type, str) and source_type.startswith("decimal("):
        scale = decimal_ps(source_type)[1]
        hashed = [
            None if v is None else _bucket_hash_bytes(_unscaled_bytes(_unscaled(v, scale))) for v in column.to_pylist()
        ]
    elif source_type in ("binary", "uuid") or (isinstance(source_type, str) and source_type.startswith("fixed[")):
        hashed = [None if v is None else _bucket_hash_bytes(bytes(v)) for v in column.to_pylist()]
    else:
        raise ValueError(f"bucket transform does not apply to Iceberg type {source_type!r}")
    return pa.array([None if h is None else (h & 0x7FFFFFFF) % n for h in hashed], pa.int32())


def _truncate(column: pa.ChunkedArray, source_type: Any, w: int) -> pa.Array | pa.ChunkedArray:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if source_type in ("int", "long"):
        v = _as_int64(column)
        out = v - np.mod(v, w)  # floor modulo: v - (((v % W) + W) % W)
        return pa.array(out, mask=~valid).cast(column.type)
    if source_type == "string":
        return pc.utf8_slice_codeunits(column, 0, w)  # code points, like Iceberg's truncateString
    if source_type == "binary":
        return pa.array([None if v is None else v[:w] for v in column.to_pylist()], pa.binary())
    if isinstance(source_type, str) and source_type.startswith("decimal("):
        scale = decimal_ps(source_type)[1]
        out = []
        for v in column.to_pylist():
            if v is None:
                out.append(None)
            else:
                u = _unscaled(v, scale)
                out.append(decimal.Decimal(u - (u % w)).scaleb(-scale))
        return pa.array(out, column.type)
    raise ValueError(f"truncate transform does not apply to Iceberg type {source_type!r}")


def _temporal(column: pa.ChunkedArray, transform: str) -> pa.Array:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if transform == "day":
        values = _days(column)
    elif transform == "hour":
        values = np.floor_divide(_as_int64(column), _MICROS_PER_HOUR)
    elif transform == "month":
        values = _months(column)
    else:
        values = np.floor_divide(_months(column), 12)
    return pa.array(values.astype(np.int32), mask=~valid)


def _transform_array(column: pa.ChunkedArray, source_type: Any, transform: str) -> pa.Array | pa.ChunkedArray:
    """The partition values of ``column`` under ``transform``, as an Arrow array (for grouping)."""
    if transform == "identity":
        return column
    if transform in ("year", "month", "day", "hour"):
        return _temporal(column, transform)
    if transform.startswith("bucket["):
        return _bucket(column, source_type, int(transform[7:-1]))
    if transform.startswith("truncate["):
        return _truncate(column, source_type, int(transform[9:-1]))
    if transform == "void":
        return pa.nulls(len(column), pa.int32())
    raise ValueError(f"unsupported partition transform {transform!r}")


def _json_value(value: Any, source_type: Any, transform: str) -> Any:
    """One partition value (as Arrow's to_pylist gives it) in the JSON form `commit_files` takes."""
    if value is None:
        return None
    if transform not in ("identity",) and not transform.startswith("truncate["):
        return int(value)
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return f"{value:f}"
    if isinstance(value, bytes):
        if source_type == "uuid":
            return str(uuid.UUID(bytes=value))
        return base64.b64encode(value).decode()
    raise ValueError(f"cannot express partition value {value!r} of type {source_type!r}")


def _find_column(table: pa.Table, schema: dict[str, Any], source_id: int) -> tuple[pa.ChunkedArray, Any]:
    """The column (top-level or nested in structs) with Iceberg field id ``source_id``, and its type."""

    def walk(fields: list[dict[str, Any]], path: list[str]) -> tuple[list[str], Any] | None:
        for f in fields:
            if f["id"] == source_id:
                return path + [f["name"]], f["type"]
            if isinstance(f["type"], dict) and f["type"]["type"] == "struct":
                found = walk(f["type"]["fields"], path + [f["name"]])
                if found:
                    return found
        return None

    found = walk(schema["fields"], [])
    if found is None:
        raise ValueError(f"partition source field id {source_id} is not in the schema")
    names, source_type = found
    column = table.column(names[0])
    for name in names[1:]:
        column = pc.struct_field(column, name)
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    return column, source_type


def partition_values(
    spec: dict[str, Any], schema: dict[str, Any], table: pa.Table
) -> list[tuple[list[Any], np.ndarray]]:
    """Rows of ``table`` grouped by partition: ``[(partition values, row indices)]``, groups in order
    of first appearance. Values are one per spec field in the JSON form `commit_files` takes (see the
    module docstring); an unpartitioned spec gives one group ``([], all rows)``."""
    fields = spec.get("fields", [])
    if not fields:
        return [([], np.arange(table.num_rows, dtype=np.int64))] if table.num_rows else []
    keys: dict[str, Any] = {}
    meta = []
    for i, pf in enumerate(fields):
        column, source_type = _find_column(table, schema, pf["source-id"])
        transform = pf["transform"]
        values = _transform_array(column, source_type, transform)
        if transform == "identity" and source_type in ("date", "time", "timestamp", "timestamptz"):
            # internal form: date -> int days, time/timestamps -> long micros
            internal = _as_int64(values)
            values = pa.array(
                internal.astype(np.int32) if source_type == "date" else internal,
                mask=~values.is_valid().to_numpy(zero_copy_only=False),
            )
        keys[f"p{i}"] = values
        meta.append((source_type, transform))
    keys["__row"] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    grouped = (
        pa.table(keys).group_by([f"p{i}" for i in range(len(fields))], use_threads=False).aggregate([("__row", "list")])
    )
    rows = grouped.column("__row_list").to_pylist()
    columns = [grouped.column(f"p{i}").to_pylist() for i in range(len(fields))]
    out = []
    for g, indices in enumerate(rows):
        values = [_json_value(columns[i][g], *meta[i]) for i in range(len(fields))]
        out.append((values, np.asarray(indices, dtype=np.int64)))
    out.sort(key=lambda item: item[1][0])
    return out
