"""What an index key is: the key of a row by its primary key, or by its whole content, and the packed location
it maps to.

- Keys: a single integer key column is its own index key (exact). Any other key (strings, decimals, dates,
  composite keys) is a 128-bit hash of the canonical text of its values: two keyed 64-bit SipHashes (collision
  odds about n²/2¹²⁹: 10⁻²⁴ for 20M keys). `row_keys` hashes a whole row the same way (tables without a key).
- Locations: ``file id << 32 | row position`` (`pack`/`unpack`); `MISSING` marks a deleted key.
- Validity: an index describes one snapshot (`lakestream.sink.index.contract`). Before a batch the commit
  compares it with the table's current snapshot; if any other writer committed (compaction, a backfill, a manual
  fix) the index is refreshed (`lakestream.sink.index.refresh`).

Shared by the executors (the write tasks compute their rows' keys) and the driver.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

MISSING = np.int64(-1)
_HASH_KEYS = ("lakestream-key-a1", "lakestream-key-b2")


def find_sorted(keys: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each ``probe`` key: whether the sorted ``keys`` hold it, and its position there (both key indexes)."""
    if len(keys) == 0:
        return np.zeros(len(probe), bool), np.zeros(len(probe), np.int64)
    idx = np.searchsorted(keys, probe)
    idx_c = np.minimum(idx, len(keys) - 1)
    return keys[idx_c] == probe, idx_c


def is_integer_key(schema: pa.Schema, key_columns: list[str]) -> bool:
    return len(key_columns) == 1 and pa.types.is_integer(schema.field(key_columns[0]).type)


def _canonical_text(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The text form a key value hashes by, identical whether it comes from a task or a table scan."""
    t = column.type
    if pa.types.is_timestamp(t):
        column = pc.cast(pc.cast(column, pa.timestamp("us", tz=t.tz)), pa.int64())
    elif pa.types.is_date(t):
        column = pc.cast(pc.cast(column, pa.date32()), pa.int32())
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.array([None if v is None else v.hex() for v in column.to_pylist()], pa.string())
    elif pa.types.is_integer(t):
        column = pc.cast(column, pa.int64())
    return pc.cast(column, pa.string())


def index_keys(table: pa.Table, key_columns: list[str]) -> np.ndarray:
    """The index keys of ``table``'s rows: int64 for one integer key column, else 16-byte hashes."""
    if is_integer_key(table.schema, key_columns):
        integers: np.ndarray = table.column(key_columns[0]).cast(pa.int64()).to_numpy()
        return integers
    texts = [_canonical_text(table.column(k)) for k in key_columns]
    joined = texts[0] if len(texts) == 1 else _unambiguous_join(texts)
    return _hash_texts(np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object))


# Bumped whenever the text a key or a row hashes by changes: an index saved under another encoding
# describes other keys and is never loaded.
KEY_ENCODING = 2


def _unambiguous_join(texts: list[pa.Array]) -> pa.Array:
    """One text per row from several columns' texts, each value written as ``<byte length>:<value>``
    (a null as ``-``) so that no two different tuples give the same text: ``('a\x1fb', 'c')`` and
    ``('a', 'b\x1fc')`` stay two keys whatever characters the values hold."""
    parts = []
    for text in texts:
        length = pc.cast(pc.binary_length(text), pa.string())
        parts.append(pc.fill_null(pc.binary_join_element_wise(length, text, ":"), "-"))
    return pc.binary_join_element_wise(*parts, "")


def _hash_texts(values: np.ndarray) -> np.ndarray:
    """16-byte keys of texts: two keyed 64-bit SipHashes."""
    import pandas as pd

    lo = pd.util.hash_array(values, hash_key=_HASH_KEYS[0].ljust(16)[:16], categorize=False)
    hi = pd.util.hash_array(values, hash_key=_HASH_KEYS[1].ljust(16)[:16], categorize=False)
    both = np.empty((len(values), 2), dtype=np.uint64)
    both[:, 0], both[:, 1] = hi, lo
    return both.view("S16").reshape(-1)


def row_keys(table: pa.Table, schema: pa.Schema) -> np.ndarray:
    """A 16-byte hash of each whole row of ``table`` over ``schema``'s columns (values cast to the column's
    type first), identical for a row converted in a task and the same row scanned from the table: the
    identity of a row in a table without a primary key."""
    n = table.num_rows
    if n == 0:
        return np.empty(0, "S16")
    texts = []
    for f in schema:
        if f.name not in table.column_names:
            column: Any = pa.nulls(n, pa.string())
        else:
            column = table.column(f.name)
            if column.type != f.type:
                try:
                    column = pc.cast(column, f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass
        if pa.types.is_nested(column.type):
            column = pa.array(
                [None if v is None else orjson.dumps(v, default=str).decode() for v in column.to_pylist()], pa.string()
            )
        texts.append(_canonical_text(column))
    joined = _unambiguous_join(texts)
    return _hash_texts(np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object))


def pack(file_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return (file_ids.astype(np.int64) << 32) | positions.astype(np.int64)


def unpack(locations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (locations >> 32).astype(np.int64), (locations & 0xFFFFFFFF).astype(np.int64)


def keys_to_arrow(keys: np.ndarray) -> pa.Array:
    """Index keys as an Arrow column (int64, or fixed 16-byte binary for hashed keys)."""
    if keys.dtype == np.int64:
        return pa.array(keys, pa.int64())
    data = np.ascontiguousarray(keys).tobytes()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(keys), [None, pa.py_buffer(data)])


def keys_from_arrow(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The inverse of `keys_to_arrow`."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_integer(column.type):
        integers: np.ndarray = column.to_numpy(zero_copy_only=False).astype(np.int64)
        return integers
    buf = column.buffers()[1]
    return np.frombuffer(buf, dtype="S16", count=len(column) + column.offset)[column.offset :].copy()
