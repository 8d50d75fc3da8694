"""Tables without a primary key: the mirror is a multiset of rows, kept exact through the same index
and deletion vectors as keyed tables.

Debezium publishes such a table's events with a null key. An insert adds one row. Under ``REPLICA
IDENTITY FULL`` an update or delete carries the whole old row, and removes exactly one row equal to it
(two identical rows stay two until one of them is deleted); an update then adds its new row.

- **Index**: a row's identity is the 16-byte hash of its whole content (`index.row_keys`); the *j*-th
  copy of content *h* lives at index key (h, j). A second map holds how many copies of *h* the table
  has, so an insert lands at (h, count) and a delete removes (h, count − 1). Both are `KeyIndex`es
  (hashed keys, the count stored where a location would be), rebuilt from a scan of the whole table
  when the table moved on (compaction, another writer) or its columns changed.
- **Re-sent events**: Debezium is at-least-once; after a capture crash it sends events again, which
  for a table without a key would add rows twice. Events carry their source position
  (`decode.envelope.source_position`: the commit LSN of the transaction before, the event's LSN), and
  along a topic partition positions never decrease. Each commit stores the newest position applied per
  partition, and how many events it applied at exactly that position (rows of one COPY share it), in
  the snapshot summary (``lakestream.source-positions``); an event at or below it is a re-send and
  leaves the table as it is.
- **A key appears later** (the source table gained a primary key): the mirror stays a multiset.
  Inserts are still appended; an update or delete that carries a key is a dead letter naming the fix
  (recreate the mirror), because under ``REPLICA IDENTITY DEFAULT`` it no longer carries the old row.
"""
from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa

from lakestream.sink.index.contract import IndexIdentity
from lakestream.sink.index.keys import MISSING, keys_from_arrow, pack, row_keys, unpack
from lakestream.sink.index.memory import KeyIndex
from lakestream.sink.index.scan import FILE_COLUMN, POS_COLUMN, scan_locations
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.sink.report import TableReport

log = logging.getLogger(__name__)

POSITIONS_PROPERTY = "lakestream.source-positions"
OP_INSERT, OP_UPDATE, OP_DELETE = 0, 1, 2
_MIX = np.uint64(0x9E3779B97F4A7C15)


def copy_keys(hashes: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """Index keys of the ``ordinals``-th copies of rows with content ``hashes`` (16-byte keys)."""
    both = np.ascontiguousarray(hashes, "S16").view(np.uint64).reshape(-1, 2).copy()
    with np.errstate(over="ignore"):
        both[:, 1] ^= (np.asarray(ordinals, np.uint64) + np.uint64(1)) * _MIX
    return both.view("S16").reshape(-1)


def change_schema() -> pa.Schema:
    """The rows of a keyless table's `RowLocations` blob: every change of the task, in Kafka order."""
    return pa.schema([
        ("op", pa.int8()),                 # OP_INSERT (c, r) | OP_UPDATE | OP_DELETE
        ("new_row", pa.binary(16)),        # content hash of the row it adds (insert, update)
        ("old_row", pa.binary(16)),        # content hash of the row it removes (update, delete)
        ("task_file", pa.int32()),         # where the added row landed (-1: none)
        ("pos", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("commit_lsn", pa.int64()),        # the source position (`envelope.source_position`)
        ("lsn", pa.int64()),
    ])


def is_keyless_report(table: pa.Table) -> bool:
    return "new_row" in table.column_names


def _encode_positions(positions: dict[TP, tuple[int, int, int]]) -> str:
    return orjson.dumps([[tp.topic, tp.partition, *p] for tp, p in sorted(positions.items())]).decode()


def _decode_positions(text: str | None) -> dict[TP, tuple[int, int, int]]:
    if not text:
        return {}
    try:
        return {TP(t, int(p)): (int(a), int(b), int(n)) for t, p, a, b, n in orjson.loads(text)}
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"unreadable {POSITIONS_PROPERTY} snapshot property {text[:200]!r}: {exc}") from None


class KeylessIndex(IndexIdentity):
    """Row copies → locations, content → copy count, and the newest source position applied per partition;
    valid for ``snapshot_id`` (`TableIndex`, not keyed)."""

    keyed = False

    def __init__(self, schema: pa.Schema | None = None, table_uuid: str | None = None):
        self.hashed = True
        self.key_columns: tuple[str, ...] = ()
        self.schema = schema  # the table's columns, as the write tasks hash rows (`keys.row_keys`)
        self.table_uuid = table_uuid  # a saved index is only loaded for the same table
        self.rows = KeyIndex(True)
        self.counts = KeyIndex(True)  # the "location" is the number of copies
        self.positions: dict[TP, tuple[int, int, int]] = {}
        self.columns: tuple[str, ...] = ()
        # Events seen at exactly the stored position in the current pass (see `resolve_keyless`).
        self._seen_at: dict[TP, int] = {}
        self.snapshot_id: int | None = None
        self.valid = False

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def paths(self) -> list[str]:
        return self.rows.paths

    def file_id(self, path: str) -> int:
        return self.rows.file_id(path)

    def known_file_id(self, path: str) -> int | None:
        return self.rows.known_file_id(path)

    def reset(self) -> None:
        """Forget every row, count and position."""
        self.__init__(self.schema, self.table_uuid)  # type: ignore[misc]

    def save(self, path: Path) -> None:
        """Write the index, valid at ``snapshot_id``, to ``path`` (driver-local state, at a clean close)."""
        self.rows._merge()
        self.counts._merge()
        meta = orjson.dumps({"snapshot_id": self.snapshot_id, "paths": self.rows.paths,
                             "positions": _encode_positions(self.positions), "columns": list(self.columns),
                             **self.identity()})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=self.rows.keys, locs=self.rows.locs, count_keys=self.counts.keys,
                     counts=self.counts.locs, meta=np.frombuffer(meta, np.uint8))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, snapshot_id: int | None, table_uuid: str | None) -> KeylessIndex | None:
        """The index saved at ``path`` if it describes ``snapshot_id`` of the table ``table_uuid`` (else None)."""
        if snapshot_id is None or not path.exists():
            return None
        try:
            with np.load(path) as saved:
                meta = orjson.loads(saved["meta"].tobytes())
                index = cls(None, table_uuid)
                if meta.get("snapshot_id") != snapshot_id or not index.matches(meta):
                    return None
                index.rows.keys, index.rows.locs = saved["keys"], saved["locs"]
                index.counts.keys, index.counts.locs = saved["count_keys"], saved["counts"]
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
            log.warning("ignoring the saved keyless index %s: %s", path, exc)
            return None
        for p in meta["paths"]:
            index.rows.file_id(p)
        index.positions = _decode_positions(meta.get("positions"))
        index._seen_at = {tp: p[2] for tp, p in index.positions.items()}
        index.columns = tuple(meta.get("columns") or ())
        index.snapshot_id, index.valid = snapshot_id, True
        return index

    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Load the index from a scan of every column of the table at ``snapshot_id`` (deletes applied), and
        the source positions from the newest snapshot summary that has them."""
        from lakestream.spark import jvm_helper

        started = time.monotonic()
        self.reset()
        if snapshot_id is not None:
            scanned = scan_locations(spark, ident, "*", int(snapshot_id), self.rows.file_id)
            if scanned is not None:
                table, locs = scanned
                content = self.schema or pa.schema([f for f in table.schema
                                                    if f.name not in (FILE_COLUMN, POS_COLUMN)])
                hashes = row_keys(table, content)
                order = np.argsort(hashes, kind="stable")
                h = hashes[order]
                starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
                sizes = np.diff(np.r_[starts, len(h)])
                ordinals = np.arange(len(h)) - np.repeat(starts, sizes)
                keys = copy_keys(h, ordinals)
                by_key = np.argsort(keys, kind="stable")
                self.rows.keys, self.rows.locs = keys[by_key], locs[order][by_key]
                self.counts.keys, self.counts.locs = h[starts], sizes.astype(np.int64)
            self.positions = _decode_positions(str(jvm_helper(spark).latestSummaryValue(
                spark._jsparkSession, ident, POSITIONS_PROPERTY) or "") or None)
            self._seen_at = {tp: p[2] for tp, p in self.positions.items()}
        if self.schema is not None:
            self.columns = tuple(self.schema.names)
        self.snapshot_id = snapshot_id
        self.valid = True
        log.info("keyless index of %s rebuilt at snapshot %s: %d rows, %.2fs", ident, snapshot_id, len(self.rows.keys),
                 time.monotonic() - started)


@dataclass
class KeylessResolution:
    """What one batch does to a keyless table."""

    deletes: dict[str, list[int]]  # data file → positions to delete
    rows: tuple[np.ndarray, np.ndarray]  # copy keys → new packed locations (MISSING: gone)
    counts: tuple[np.ndarray, np.ndarray]  # content hashes → new copy counts
    positions: dict[TP, tuple[int, int, int]]
    seen_at: dict[TP, int]
    applied: int
    resent: int
    unmatched: int
    # (new row, committed row): an update's new row keeps the `_row_id` of the equal row it replaces
    kept: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)


def resolve_keyless(index: KeylessIndex, changes: TableReport) -> KeylessResolution:
    """Apply a batch's changes of a keyless table in Kafka order (see the module doc); nothing is changed
    in ``index`` until `apply_resolution` after the commit. After a TRUNCATE in the batch no earlier row
    survives (the commit removes every existing data file): its partition's changes before it only move
    the source position."""
    if changes.truncates:
        emptied = KeylessIndex(index.schema, index.table_uuid)
        emptied.positions, emptied._seen_at = dict(index.positions), dict(index._seen_at)
        emptied.rows.paths, emptied.rows._path_ids = index.rows.paths, index.rows._path_ids
        index = emptied
    paths: list[str] = []
    base: dict[str, int] = {}
    by_task: dict[str, dict[int, str]] = defaultdict(dict)
    for f in changes.files:
        by_task[f.task_id][f.task_file] = f.path
    for task_id, files in by_task.items():
        base[task_id] = len(paths)
        paths.extend(files.get(i, "") for i in range(max(files) + 1))
    parts = [loc.locations for loc in changes.locations if is_keyless_report(loc.locations)]
    task_files = []
    for loc in changes.locations:
        if is_keyless_report(loc.locations):
            tf = loc.locations.column("task_file").to_numpy()
            task_files.append(np.where(tf >= 0, base.get(loc.task_id, 0) + tf, -1))
    deletes: dict[str, list[int]] = defaultdict(list)
    if not parts:
        return KeylessResolution({}, (np.empty(0, "S16"), np.empty(0, np.int64)),
                                 (np.empty(0, "S16"), np.empty(0, np.int64)), dict(index.positions),
                                 dict(index._seen_at), 0, 0, 0)
    rows = pa.concat_tables(parts)
    files = np.concatenate(task_files)
    topics = rows.column("topic").to_pylist()
    topic_codes = np.unique(np.array(topics, dtype=object), return_inverse=True)[1]
    order = np.lexsort((rows.column("offset").to_numpy(), rows.column("partition").to_numpy(), topic_codes))
    ops = rows.column("op").to_numpy()
    zero = pa.scalar(b"\0" * 16, pa.binary(16))
    new_h = keys_from_arrow(rows.column("new_row").combine_chunks().fill_null(zero))
    old_h = keys_from_arrow(rows.column("old_row").combine_chunks().fill_null(zero))
    pos = rows.column("pos").to_numpy()
    parts_ = rows.column("partition").to_numpy()
    commit = rows.column("commit_lsn").to_numpy()
    lsn = rows.column("lsn").to_numpy()
    offsets = rows.column("offset").to_numpy()

    # Batch-local overlays over the index: copy key → (path, pos) or None; content → count.
    row_at: dict[bytes, tuple[str, int] | None] = {}
    count_of: dict[bytes, int] = {}
    contents = np.unique(np.concatenate([new_h, old_h]))
    stored_counts = dict(zip(contents.tolist(), index.counts.lookup(contents).tolist(), strict=True))

    def count(h: bytes) -> int:
        if h in count_of:
            return count_of[h]
        c = stored_counts.get(h, MISSING)
        return 0 if c == MISSING else int(c)

    def location(h: bytes, j: int) -> tuple[str, int] | None:
        key = copy_keys(np.array([h], "S16"), np.array([j]))[0]
        if key in row_at:
            return row_at[key]
        packed = index.rows.lookup(np.array([key], "S16"))[0]
        if packed == MISSING:
            return None
        fid, p = unpack(np.array([packed]))
        return index.rows.paths[int(fid[0])], int(p[0])

    positions = dict(index.positions)
    seen_at = dict(index._seen_at)
    # A row this batch wrote → the committed row whose identity it carries (None: a new row).
    origin: dict[tuple[str, int], tuple[str, int] | None] = {}
    applied = resent = unmatched = 0
    for i in order.tolist():
        tp = TP(topics[i], int(parts_[i]))
        here = (int(commit[i]), int(lsn[i]))
        stored = positions.get(tp)
        if stored is not None:
            at = (stored[0], stored[1])
            if here < at:
                seen_at[tp] = 0  # a re-send pass began before the stored position
                duplicate = True
            elif here == at:
                seen = seen_at.get(tp, stored[2])
                duplicate = seen < stored[2]
                seen_at[tp] = seen + 1
                if not duplicate:
                    positions[tp] = (at[0], at[1], stored[2] + 1)
            else:
                duplicate = False
        else:
            duplicate = False
        cut = changes.truncates.get(tp) if changes.truncates else None
        if duplicate:
            resent += 1
            if files[i] >= 0:
                deletes[paths[files[i]]].append(int(pos[i]))
            continue
        if stored is None or here > (stored[0], stored[1]):
            positions[tp] = (here[0], here[1], 1)
            seen_at[tp] = 1
        if cut is not None and offsets[i] < cut:
            if files[i] >= 0:
                deletes[paths[files[i]]].append(int(pos[i]))
            continue
        applied += 1
        carried = None
        if ops[i] in (OP_UPDATE, OP_DELETE):
            h = old_h[i]
            c = count(h)
            gone = location(h, c - 1) if c > 0 else None
            if gone is not None:
                carried = origin.get(gone, gone)
            if gone is None:
                unmatched += 1
            else:
                deletes[gone[0]].append(gone[1])
                row_at[copy_keys(np.array([h], "S16"), np.array([c - 1]))[0]] = None
                count_of[h] = c - 1
        if ops[i] in (OP_INSERT, OP_UPDATE) and files[i] >= 0:
            h = new_h[i]
            c = count(h)
            row_at[copy_keys(np.array([h], "S16"), np.array([c]))[0]] = (paths[files[i]], int(pos[i]))
            count_of[h] = c + 1
            origin[(paths[files[i]], int(pos[i]))] = carried if ops[i] == OP_UPDATE else None
    if unmatched:
        log.warning("%d update(s)/delete(s) of a keyless table found no equal row in the mirror", unmatched)
    row_keys_ = np.array(list(row_at), "S16") if row_at else np.empty(0, "S16")
    new_locs = np.array([MISSING if v is None else 0 for v in row_at.values()], np.int64)
    for g, v in enumerate(row_at.values()):
        if v is not None:
            new_locs[g] = pack(np.array([index.rows.file_id(v[0])]), np.array([v[1]]))[0]
    count_keys = np.array(list(count_of), "S16") if count_of else np.empty(0, "S16")
    counts = np.array([c if c > 0 else MISSING for c in count_of.values()], np.int64)
    live = {v for v in row_at.values() if v is not None}
    kept = [(new, old) for new, old in origin.items() if old is not None and new in live]
    return KeylessResolution(dict(deletes), (row_keys_, new_locs), (count_keys, counts), positions, seen_at,
                             applied, resent, unmatched, kept)


def apply_resolution(index: KeylessIndex, resolved: KeylessResolution, truncated: bool = False) -> None:
    """Move the index to the state after the batch's commit."""
    if truncated:
        index.rows.keys, index.rows.locs = np.empty(0, "S16"), np.empty(0, np.int64)
        index.rows.delta_keys, index.rows.delta_locs = np.empty(0, "S16"), np.empty(0, np.int64)
        index.counts.reset()
    for keys, values, target in ((resolved.rows[0], resolved.rows[1], index.rows),
                                 (resolved.counts[0], resolved.counts[1], index.counts)):
        if len(keys):
            order = np.argsort(keys, kind="stable")
            target.update(keys[order], values[order])
    index.positions = resolved.positions
    index._seen_at = resolved.seen_at


def positions_property(resolved: KeylessResolution) -> dict[str, str]:
    return {POSITIONS_PROPERTY: _encode_positions(resolved.positions)}


def write_keyless_changes(typed: pa.Table, ops: list[str], old: dict[int, pa.Table | None], schema: pa.Schema,
                          file_of: np.ndarray, pos_of: np.ndarray, topics: list[str], partitions: np.ndarray,
                          offsets: np.ndarray, positions: list[tuple[int, int]]) -> pa.Table:
    """The `change_schema` blob of a task's changes of a keyless table (row i ↔ change i): ``typed`` holds
    each change's row (the new row; a delete's old row), ``old`` an update's typed old row by change."""
    n = typed.num_rows
    hashes = row_keys(typed, schema)
    op_codes = np.array([OP_DELETE if o == "d" else OP_UPDATE if o == "u" else OP_INSERT for o in ops], np.int8)
    old_hashes: list[bytes | None] = [None] * n
    for i in range(n):
        if op_codes[i] == OP_DELETE:
            old_hashes[i] = bytes(hashes[i]).ljust(16, b"\0")
        elif op_codes[i] == OP_UPDATE and old.get(i) is not None:
            old_hashes[i] = bytes(row_keys(old[i], schema)[0]).ljust(16, b"\0")
    new_hashes = [None if op_codes[i] == OP_DELETE else bytes(hashes[i]).ljust(16, b"\0") for i in range(n)]
    return pa.table({
        "op": pa.array(op_codes),
        "new_row": pa.array(new_hashes, pa.binary(16)),
        "old_row": pa.array(old_hashes, pa.binary(16)),
        "task_file": pa.array(file_of.astype(np.int32)),
        "pos": pa.array(pos_of.astype(np.int64)),
        "topic": pa.array(topics, pa.string()),
        "partition": pa.array(np.asarray(partitions).astype(np.int32)),
        "offset": pa.array(np.asarray(offsets).astype(np.int64)),
        "commit_lsn": pa.array([p[0] for p in positions], pa.int64()),
        "lsn": pa.array([p[1] for p in positions], pa.int64()),
    }, schema=change_schema())
