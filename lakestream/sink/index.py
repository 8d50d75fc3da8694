"""The primary-key index of an upsert table: key → (data file, row position) of its live row.

With it, an upsert or delete becomes a deletion vector on the row's current position, so a batch
costs what its changes cost, whatever the size of the table (no join against the table).

- Keys: a single integer key column is its own index key (exact). Any other key (strings,
  decimals, dates, composite keys) is a 128-bit hash of the canonical text of its values: two
  keyed 64-bit SipHashes (collision odds about n²/2¹²⁹: 10⁻²⁴ for 20M keys).
- Layout: two sorted numpy arrays (keys, locations) plus a small sorted delta of keys added since
  the last merge; a location packs (file id << 32 | row position). Updates of existing keys are
  written in place; new keys go to the delta, merged when it grows past an eighth of the base, so
  the O(n) merge is amortized and a batch's cost follows its changes. Memory: 16 bytes per key
  for integer keys (24 for hashed keys), i.e. 16-24 MB per million keys, plus the file-path list.
- Validity: the index describes one snapshot. Before a batch the committer compares it with the
  table's current snapshot; if any other writer committed (compaction, a backfill, a manual fix)
  the index is rebuilt from a scan of the key columns with Iceberg's ``_file``/``_pos`` metadata
  columns, which applies every delete the table has.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

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
        return table.column(key_columns[0]).cast(pa.int64()).to_numpy()
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
            column = pa.array([None if v is None else orjson.dumps(v, default=str).decode()
                               for v in column.to_pylist()], pa.string())
        texts.append(_canonical_text(column))
    joined = _unambiguous_join(texts)
    return _hash_texts(np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object))


def pack(file_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return (file_ids.astype(np.int64) << 32) | positions.astype(np.int64)


def unpack(locations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (locations >> 32).astype(np.int64), (locations & 0xFFFFFFFF).astype(np.int64)


class KeyIndex:
    """Key → packed location of the live row, valid for ``snapshot_id``."""

    def __init__(self, hashed: bool, key_columns: list[str] | tuple[str, ...] = (), table_uuid: str | None = None):
        self.hashed = hashed
        # What the keys are of: a saved index is only ever loaded for the same table and key columns.
        self.key_columns = tuple(key_columns)
        self.table_uuid = table_uuid
        self.dtype = np.dtype("S16") if hashed else np.dtype(np.int64)
        self.keys = np.empty(0, self.dtype)
        self.locs = np.empty(0, np.int64)
        self.delta_keys = np.empty(0, self.dtype)
        self.delta_locs = np.empty(0, np.int64)
        self.paths: list[str] = []
        self._path_ids: dict[str, int] = {}
        self.snapshot_id: int | None = None
        self.valid = False
        # Changes since the index was last made durable (`lakestream.sink.index_store`): (keys, locations)
        # in order, and whether everything before them was replaced (a rebuild, a truncate).
        self.journal: list[tuple[np.ndarray, np.ndarray]] = []
        self.journal_parent: int | None = None  # the snapshot the journal starts from
        self.rebased = True

    def __len__(self) -> int:
        return int((self.locs >= 0).sum() + (self.delta_locs >= 0).sum())

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.locs.nbytes + self.delta_keys.nbytes + self.delta_locs.nbytes

    def known_file_id(self, path: str) -> int | None:
        """The id of data file ``path`` if the index has one."""
        return self._path_ids.get(path)

    def journal_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The journal as one (keys, locations) pair, the last change of each key, sorted by key."""
        if not self.journal:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        keys = np.concatenate([k for k, _ in self.journal])
        locs = np.concatenate([v for _, v in self.journal])
        order = np.argsort(keys, kind="stable")
        k = keys[order]
        last = np.r_[k[1:] != k[:-1], True] if len(k) else np.empty(0, bool)
        return k[last], locs[order][last]

    def file_id(self, path: str) -> int:
        fid = self._path_ids.get(path)
        if fid is None:
            fid = self._path_ids[path] = len(self.paths)
            self.paths.append(path)
        return fid

    def lookup(self, probe: np.ndarray) -> np.ndarray:
        """Packed locations of ``probe`` keys (MISSING where absent or deleted)."""
        out = np.full(len(probe), MISSING, np.int64)
        found, idx = find_sorted(self.keys, probe)
        out[found] = self.locs[idx[found]]
        found_d, idx_d = find_sorted(self.delta_keys, probe)
        out[found_d] = self.delta_locs[idx_d[found_d]]
        return out

    def update(self, probe: np.ndarray, locations: np.ndarray) -> None:
        """Set the location of each (distinct) key; MISSING marks a deleted key."""
        if len(probe) == 0:
            return
        self.journal.append((np.array(probe, self.dtype), np.array(locations, np.int64)))
        found_d, idx_d = find_sorted(self.delta_keys, probe)
        self.delta_locs[idx_d[found_d]] = locations[found_d]
        rest = ~found_d
        found, idx = find_sorted(self.keys, probe[rest])
        self.locs[idx[found]] = locations[rest][found]
        new_keys, new_locs = probe[rest][~found], locations[rest][~found]
        live = new_locs != MISSING
        new_keys, new_locs = new_keys[live], new_locs[live]
        if len(new_keys):
            keys = np.concatenate([self.delta_keys, new_keys])
            locs = np.concatenate([self.delta_locs, new_locs])
            order = np.argsort(keys, kind="stable")
            self.delta_keys, self.delta_locs = keys[order], locs[order]
        if len(self.delta_keys) > max(65_536, len(self.keys) // 8):
            self._merge()

    def forget_files(self, file_ids: list[int]) -> int:
        """Drop every entry whose row is in one of ``file_ids`` (data files a snapshot removed); returns
        how many. One vectorized pass over the locations."""
        if not file_ids:
            return 0
        ids = np.asarray(sorted(file_ids), np.int64)
        dropped = 0
        for keys, locs in ((self.keys, self.locs), (self.delta_keys, self.delta_locs)):
            hit = (locs >= 0) & np.isin(locs >> 32, ids)
            if hit.any():
                self.journal.append((keys[hit].copy(), np.full(int(hit.sum()), MISSING, np.int64)))
                locs[hit] = MISSING
                dropped += int(hit.sum())
        return dropped

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live (key, location), sorted by key."""
        self._merge()
        return self.keys, self.locs

    def _merge(self) -> None:
        keys = np.concatenate([self.keys, self.delta_keys])
        locs = np.concatenate([self.locs, self.delta_locs])
        order = np.argsort(keys, kind="stable")
        keys, locs = keys[order], locs[order]
        live = locs != MISSING
        self.keys, self.locs = keys[live], locs[live]
        self.delta_keys = np.empty(0, self.dtype)
        self.delta_locs = np.empty(0, np.int64)

    def save(self, path: Path) -> None:
        """Write the index, valid at ``snapshot_id``, to ``path``: a restart loads it instead of
        scanning the table, if the table is still at that snapshot."""
        self._merge()
        meta = orjson.dumps({"snapshot_id": self.snapshot_id, "paths": self.paths, **self.identity()})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=self.keys, locs=self.locs, meta=np.frombuffer(meta, np.uint8))
        os.replace(tmp, path)

    def identity(self) -> dict[str, Any]:
        """What a saved index must match to be loaded: the table (its UUID: a table dropped and created
        again under the same name is another table), the key columns, and the key encoding."""
        return {"table_uuid": self.table_uuid, "key_columns": list(self.key_columns), "key_encoding": KEY_ENCODING,
                "hashed": self.hashed}

    def matches(self, meta: dict[str, Any]) -> bool:
        """Whether saved ``meta`` describes this index's table, key columns and key encoding."""
        return (meta.get("hashed") == self.hashed and meta.get("key_encoding") == KEY_ENCODING
                and meta.get("table_uuid") == self.table_uuid
                and [k.lower() for k in meta.get("key_columns") or []] == [k.lower() for k in self.key_columns])

    @classmethod
    def load(cls, path: Path, hashed: bool, snapshot_id: int | None, key_columns: list[str] | tuple[str, ...] = (),
             table_uuid: str | None = None) -> KeyIndex | None:
        """The index saved at ``path`` if it describes ``snapshot_id`` of the table ``table_uuid`` keyed on
        ``key_columns`` (else None: rebuild)."""
        if snapshot_id is None or not path.exists():
            return None
        try:
            with np.load(path) as saved:
                meta = orjson.loads(saved["meta"].tobytes())
                index = cls(hashed, key_columns, table_uuid)
                if meta.get("snapshot_id") != snapshot_id or not index.matches(meta):
                    log.info("the saved key index %s is of another snapshot, table or key (%s); not loaded", path,
                             {k: meta.get(k) for k in ("snapshot_id", "table_uuid", "key_columns", "key_encoding")})
                    return None
                index.keys, index.locs = saved["keys"], saved["locs"]
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
            log.warning("ignoring the saved key index %s: %s", path, exc)
            return None
        if index.keys.dtype != index.dtype or len(index.keys) != len(index.locs):
            return None
        for p in meta["paths"]:
            index.file_id(p)
        index.snapshot_id, index.valid = snapshot_id, True
        return index

    def reset(self) -> None:
        self.__init__(self.hashed, self.key_columns, self.table_uuid)  # type: ignore[misc]

    def rebuild(self, spark: SparkSession, ident: str, key_columns: list[str], snapshot_id: int | None) -> None:
        """Load the index from a scan of the table at ``snapshot_id`` (deletes applied)."""
        from lakestream.identifiers import quote_column

        started = time.monotonic()
        self.reset()
        if snapshot_id is not None:
            keys_sql = ", ".join(quote_column(k) for k in key_columns)
            # Ship a 64-bit hash of each row's file path, not the path: 20M rows stay ~24 bytes each.
            paths = {int(r[1]): r[0] for r in spark.sql(
                f"SELECT file_path, xxhash64(file_path) FROM {ident}.data_files VERSION AS OF {int(snapshot_id)}"
            ).collect()}
            df = spark.sql(f"SELECT {keys_sql}, xxhash64(_file) AS __file, _pos "
                           f"FROM {ident} VERSION AS OF {int(snapshot_id)}")
            batches = df._collect_as_arrow()
            if batches:
                table = pa.Table.from_batches(batches)
                keys = index_keys(table, key_columns)
                hashes = table.column("__file").to_numpy()
                known = np.array(sorted(paths), dtype=np.int64)
                slot = np.searchsorted(known, hashes)
                if len(known) == 0 or not np.array_equal(known[np.minimum(slot, len(known) - 1)], hashes):
                    raise RuntimeError(f"{ident}: rows of a data file missing from its files table at snapshot "
                                       f"{snapshot_id}")
                fid_of_slot = np.array([self.file_id(paths[int(h)]) for h in known], dtype=np.int64)
                locs = pack(fid_of_slot[slot], table.column("_pos").to_numpy())
                order = np.argsort(keys, kind="stable")
                self.keys, self.locs = keys[order], locs[order]
        self.snapshot_id = snapshot_id
        self.valid = True
        log.info("index of %s rebuilt at snapshot %s: %d keys, %.1f MB, %.2fs", ident, snapshot_id, len(self.keys),
                 self.nbytes / 1e6, time.monotonic() - started)


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
        return column.to_numpy(zero_copy_only=False).astype(np.int64)
    buf = column.buffers()[1]
    return np.frombuffer(buf, dtype="S16", count=len(column) + column.offset)[column.offset:].copy()
