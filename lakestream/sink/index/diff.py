"""Refresh a keyed index by the diff of the snapshots since its own: per snapshot, the entries of the data files
it removed are dropped, the rows of the files it added are read (the key columns only, from those files alone),
and rows it deleted by position are looked up and dropped. Driver side.

`DIFF_MAX` is the one cap of a refresh by diff, in rows: the positions a diff lists (JVM side 8 bytes each,
then base64) and the rows it moves into the overlay. Past it the index is built again on the executors
(`lakestream.sink.index.refresh`). It equals the overlay's own bound (`disk.MAX_OVERLAY`): a diff never puts
more entries in the driver's memory than the overlay holds before a merge, and a foreign DELETE or a backfill of
millions of rows costs a build, never the driver's heap.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from lakestream.sink.index.disk import MAX_OVERLAY, DiskKeyIndex
from lakestream.sink.index.keys import MISSING, index_keys, pack
from lakestream.storage import filesystem_path

if TYPE_CHECKING:
    pass

T = TypeVar("T")

DIFF_MAX = MAX_OVERLAY
# Data files whose key columns a diff reads at once (pyarrow reads release the GIL; each holds one file's keys).
DIFF_READERS = 4


def _file_keys(path: str, key_columns: tuple[str, ...]) -> np.ndarray:
    """The index keys of every row of data file ``path``, by position (only the key columns are read)."""
    import pyarrow.parquet as pq

    fs, local = filesystem_path(path)
    pf = pq.ParquetFile(local, filesystem=fs)
    names = {n.lower(): n for n in pf.schema_arrow.names}
    columns = [names.get(k.lower(), k) for k in key_columns]
    table = pf.read(columns=columns)
    table = table.rename_columns(list(key_columns))
    return index_keys(table, list(key_columns))


def _drop_rows_at(index: DiskKeyIndex, fid: int, keys: np.ndarray, positions: np.ndarray) -> int:
    """Drop the entries of ``keys`` that still point at their row (``fid``, ``positions``)."""
    if len(keys) == 0:
        return 0
    mine = index.lookup(keys) == pack(np.full(len(keys), fid), positions)
    if not mine.any():
        return 0
    k = np.unique(keys[mine])
    index.update(k, np.full(len(k), MISSING, np.int64))
    return len(k)


def read_ahead(paths: list[str], read: Callable[[str], T]) -> Iterator[tuple[str, T]]:
    """``(path, read(path))`` in order, `DIFF_READERS` reads at a time, at most twice that many read ahead of the
    consumer."""
    with ThreadPoolExecutor(max_workers=DIFF_READERS, thread_name_prefix="index-diff") as pool:
        window: deque[tuple[str, Future[T]]] = deque()
        for path in paths:
            window.append((path, pool.submit(read, path)))
            if len(window) > 2 * DIFF_READERS:
                done, future = window.popleft()
                yield done, future.result()
        while window:
            done, future = window.popleft()
            yield done, future.result()


def refresh_by_diff(index: DiskKeyIndex, changes: dict[str, Any]) -> dict[str, int]:
    """Move ``index`` over the snapshots in ``changes`` (`snapshot_changes`), reading only the files they
    added and the rows they deleted (several files at once). Returns counts of what it did."""
    if changes.get("positions_over"):
        raise DiffTooBig("more rows deleted by position since the index's snapshot than a diff lists (DIFF_MAX)")
    keys_of = functools.partial(_file_keys, key_columns=index.key_columns)
    stats = {"snapshots": 0, "files_read": 0, "rows_added": 0, "entries_dropped": 0, "compactions": 0}

    def removed_keys(path: str) -> np.ndarray | None:
        try:
            return keys_of(path)
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return None  # already deleted from storage (expired history)

    for snap in changes["snapshots"]:
        deleted = {d["data_file"]: np.asarray(d["positions"], np.int64) for d in snap["deleted"]}
        unreadable = []
        # The rows of a removed file are found through its own keys (O(its rows)); a file already
        # deleted from storage costs one pass over the index's locations instead. Lakestream's own compaction
        # moved every live row of its inputs into the files it added, where they are read below: those rows'
        # entries are overwritten there, and the inputs need not be read (nor the index passed over).
        removed = [] if snap.get("compaction") else [p for p in snap["removed"] if index.known_file_id(p) is not None]
        for path, keys in read_ahead(removed, removed_keys):
            fid = index.file_id(path)  # known: `removed` holds only files the index has
            if keys is None:
                unreadable.append(fid)
                continue
            stats["files_read"] += 1
            stats["entries_dropped"] += _drop_rows_at(index, fid, keys, np.arange(len(keys), dtype=np.int64))
        stats["entries_dropped"] += index.forget_files(unreadable)
        added_paths = {f["path"] for f in snap["added"]}
        for path, keys in read_ahead([f["path"] for f in snap["added"]], keys_of):
            stats["files_read"] += 1
            live = np.ones(len(keys), bool)
            gone = deleted.get(path)
            if gone is not None and len(gone):
                live[gone[gone < len(keys)]] = False
            positions = np.flatnonzero(live)
            keys = keys[live]
            if len(keys) == 0:
                continue
            # Within one snapshot a key written twice keeps its last row (file order, then position).
            order = np.argsort(keys, kind="stable")
            k = keys[order]
            last = np.r_[k[1:] != k[:-1], True]
            fid = index.file_id(path)
            index.update(k[last], pack(np.full(int(last.sum()), fid), positions[order][last]))
            stats["rows_added"] += int(last.sum())

        def deleted_keys(path: str, deleted: dict[str, np.ndarray] = deleted) -> tuple[np.ndarray, np.ndarray]:
            """The keys at the file's newly deleted positions (only those are kept in memory)."""
            keys = keys_of(path)
            positions = deleted[path]
            positions = positions[positions < len(keys)]
            return keys[positions], positions

        others = [p for p in deleted if p not in added_paths and index.known_file_id(p) is not None and len(deleted[p])]
        for path, (keys, positions) in read_ahead(others, deleted_keys):
            stats["files_read"] += 1
            stats["entries_dropped"] += _drop_rows_at(index, index.file_id(path), keys, positions)
        index.snapshot_id = snap["snapshot_id"]
        stats["snapshots"] += 1
        stats["compactions"] += bool(snap.get("compaction"))
    return stats


def rows_to_follow(changes: dict[str, Any]) -> int:
    """Rows a diff over ``changes`` reads into the index: the rows of the files each snapshot added and removed,
    but for Lakestream's own compactions only those of the files they added (their inputs are not read)."""
    return sum(int(f["records"]) for snap in changes.get("snapshots", []) for f in snap["added"]) + sum(
        int(snap.get("removed_records", 0)) for snap in changes.get("snapshots", []) if not snap.get("compaction")
    )


class DiffTooBig(ValueError):
    """The snapshots since the index's own delete more rows by position than a diff lists (a foreign DELETE of
    millions of rows): build it again, on the executors."""
