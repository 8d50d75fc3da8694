"""The key index of a keyed table with bounded driver memory: sorted bucket files, memory-mapped, under a
small in-memory overlay of the changes since they were written.

- **Buckets.** Keys are split into 2^bits buckets by a hash of the key (`bucket_of`; hashed keys are
  already hashes: their first 8 bytes), about `BUCKET_ROWS` keys each. Each bucket is two sorted ``.npy``
  files (keys, packed locations) of one *base generation*, written by the executors (`build_on_executors`)
  or by a merge of the overlay (`DiskKeyIndex.write_base`), never by collecting every key to the driver.
- **Lookups** go to the overlay first, then to the probe's bucket: a `searchsorted` over the memory-mapped
  file touches about log2(bucket) pages per probe. The pages are released after each lookup (``madvise
  DONTNEED``), so the driver's resident memory does not grow with the table: what it holds is the overlay
  (24-32 bytes per change since the last merge) and the list of data file paths.
- **Updates** (a commit's moved and deleted keys) go to the overlay, deletes as tombstones. When the overlay
  outgrows an eighth of the base (at least `MIN_MERGE`, at most `MAX_OVERLAY` entries) it is merged into a new
  generation on a thread beside the batches (`lakestream.sink.index.store`), one bucket at a time (memory: one
  bucket; `merge_sorted`: linear inserts, no sort), paced to half the time. That merge still rewrites the whole
  base (O(table) I/O: 1.5 GB at 100M keys, once per ``MAX_OVERLAY`` changes at most).

`lakestream.sink.index.store` keeps the generations and the per-commit deltas beside the table.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lakestream.sink.index.contract import FileIds, IndexIdentity, Journal
from lakestream.sink.index.keys import MISSING, find_sorted, index_keys, keys_from_arrow, keys_to_arrow, pack
from lakestream.sink.index.scan import FILE_COLUMN, POS_COLUMN, scan_sql
from lakestream.storage import ensure_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.storage import StorageContext

log = logging.getLogger(__name__)

BUCKET_ROWS = 2_000_000
MIN_MERGE = 1_000_000
MAX_OVERLAY = 4_000_000  # entries (64-96 MB): the overlay never holds more before a merge
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def bucket_bits(rows: int) -> int:
    bits = 0
    while (rows >> bits) > BUCKET_ROWS and bits < 16:
        bits += 1
    return bits


def bucket_of(keys: np.ndarray, bits: int) -> np.ndarray:
    """The bucket of each key (identical on the driver and in executors)."""
    if bits == 0 or len(keys) == 0:
        return np.zeros(len(keys), np.int64)
    if keys.dtype == np.int64:
        with np.errstate(over="ignore"):
            h = keys.view(np.uint64) * _GOLDEN
    else:
        h = np.ascontiguousarray(keys, "S16").view(np.uint64).reshape(-1, 2)[:, 0]
    return (h >> np.uint64(64 - bits)).astype(np.int64)


def write_npy(fs: Any, path: str, array: np.ndarray) -> None:
    """``array`` as an ``.npy`` file of ``fs``, written straight to the stream (no copy in memory)."""
    with fs.open_output_stream(path) as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(array), allow_pickle=False)


def merge_sorted(
    keys: np.ndarray, locs: np.ndarray, ov_keys: np.ndarray, ov_locs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A base run (sorted ``keys``, their ``locs``) with the overlay's sorted entries applied: an overlay
    key replaces the base's entry, a new one is inserted in order, a tombstone (MISSING) removes the key.
    Linear in the run: one pass of inserts, no sort (the run is millions of keys, the overlay's share of it
    tens of thousands)."""
    if len(keys):
        at = np.searchsorted(keys, ov_keys)
        clipped = np.minimum(at, len(keys) - 1)
        known = keys[clipped] == ov_keys
        new_at = at[~known]
        keys = np.insert(keys, new_at, ov_keys[~known])
        locs = np.insert(locs, new_at, ov_locs[~known])
        # A known key's position after the inserts: shifted by the new keys inserted at or before it.
        replaced = clipped[known]
        locs[replaced + np.searchsorted(new_at, replaced, side="right")] = ov_locs[known]
    else:
        keys, locs = ov_keys, ov_locs
    live = locs != MISSING
    return (keys, locs) if live.all() else (keys[live], locs[live])


def merge_generation(
    fs: Any,
    gen_dir: str,
    frozen_runs: Mapping[int, _Run | tuple[str, str]],
    old_bits: int,
    ov_keys: np.ndarray,
    ov_locs: np.ndarray,
    duty: float = 1.0,
) -> dict[str, Any]:
    """Merge base buckets ``runs`` (mapped, or their keys and locations files) and an overlay into a new
    generation in ``gen_dir``, one bucket in memory at a time; returns ``{bits, rows, buckets}``. With
    ``duty`` < 1 it works that share of the time (a pause after each bucket), so that a merge beside the
    batches leaves them the machine's disk and cores most of the time."""
    runs = {b: r if isinstance(r, _Run) else _Run(*r) for b, r in frozen_runs.items()}
    base_rows = sum(int(len(r.keys)) for r in runs.values())
    bits = max(old_bits, bucket_bits(base_rows + len(ov_keys)))
    ensure_dir(fs, gen_dir)
    ov_buckets = bucket_of(ov_keys, bits)
    by_bucket = np.argsort(ov_buckets, kind="stable")  # stable: each bucket's overlay keys stay sorted
    bounds = np.searchsorted(ov_buckets[by_bucket], np.arange((1 << bits) + 1))
    # Old buckets map to new ones by the top bits (bits only grow): new bucket n reads old n >> (bits - old).
    shift = bits - old_bits
    written, total = [], 0
    for b in range(1 << bits):
        started = time.monotonic()
        mine = by_bucket[bounds[b] : bounds[b + 1]]
        old = runs.get(b >> shift)
        keys, locs = np.empty(0, ov_keys.dtype), np.empty(0, np.int64)
        if old is not None:
            keys, locs = np.asarray(old.keys), np.asarray(old.locs)
            if shift:
                sel = bucket_of(keys, bits) == b
                keys, locs = keys[sel], locs[sel]
        keys, locs = merge_sorted(keys, locs, ov_keys[mine], ov_locs[mine])
        if len(keys):
            write_npy(fs, f"{gen_dir}/bucket-{b:05d}.keys.npy", keys)
            write_npy(fs, f"{gen_dir}/bucket-{b:05d}.locs.npy", locs)
            written.append(b)
            total += len(keys)
        del keys, locs
        if old is not None:
            old.release()
        if duty < 1.0:
            time.sleep((time.monotonic() - started) * (1.0 - duty) / duty)
    return {"bits": bits, "rows": total, "buckets": written}


def warm_page_cache(paths: list[str]) -> None:
    """Ask the kernel to read ``paths`` into its page cache (sequential readahead, in the background).

    A batch's lookups touch ~21 scattered pages per key in every bucket: from a cold cache (a new host, or a
    cache another job evicted) the first batch after a start read them one by one — 14 s for 1,098 keys at 100M
    keys in the sustained run, against ~2 s to read the 1.5 GB generation front to back. The pages land in the
    page cache, not in this process's resident memory."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


class _Run:
    """One bucket's sorted keys and locations, memory-mapped from local ``.npy`` files."""

    def __init__(self, keys_path: str, locs_path: str):
        self.keys_path, self.locs_path = keys_path, locs_path
        self.maps: list[mmap.mmap] = []
        self.keys = self._map(keys_path)
        self.locs = self._map(locs_path)

    def _map(self, path: str) -> np.ndarray:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(fh)
            offset = fh.tell()
            count = int(np.prod(shape))
            if count == 0:
                return np.empty(0, dtype)
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.maps.append(mm)
        return np.frombuffer(mm, dtype=dtype, count=count, offset=offset)

    def release(self) -> None:
        """Drop the pages read so far from this process's resident memory (they stay in the page cache)."""
        for mm in self.maps:
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):
                pass


class DiskKeyIndex(IndexIdentity, FileIds, Journal):
    """Key → packed location of the live row, valid for ``snapshot_id`` (`TableIndex`, keyed)."""

    def __init__(self, hashed: bool, key_columns: list[str] | tuple[str, ...] = (), table_uuid: str | None = None):
        self.hashed = hashed
        self.dtype = np.dtype("S16") if hashed else np.dtype(np.int64)
        self.key_columns = tuple(key_columns)
        self.table_uuid = table_uuid
        self.bits = 0
        self.runs: dict[int, _Run] = {}
        self.base_rows = 0
        self.base_dir: str | None = None  # local directory of the mapped generation
        self.ov_keys = np.empty(0, self.dtype)  # overlay: sorted, MISSING = deleted (a tombstone)
        self.ov_locs = np.empty(0, np.int64)
        self.paths: list[str] = []
        self._path_ids: dict[str, int] = {}
        self.snapshot_id: int | None = None
        self.valid = False
        self.journal: list[tuple[np.ndarray, np.ndarray]] = []
        self.journal_parent: int | None = None
        self.rebased = True
        self.build_root: str | None = None  # where `rebuild` writes a generation (set by the registry)
        self.build_seq = 0
        self.generation: str | None = None  # the name of the mapped generation under the store
        self.resets = 0  # how many times it was emptied (a TRUNCATE, a rebuild)
        self.touched: list[np.ndarray] | None = None  # keys updated since a merge beside the batches began

    # -- size ----------------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held in the driver's memory (the overlay; the mapped buckets are released after use)."""
        return self.ov_keys.nbytes + self.ov_locs.nbytes

    @property
    def overlay_size(self) -> int:
        return len(self.ov_keys)

    def __len__(self) -> int:
        """Live keys (the base's count corrected by the overlay)."""
        if not len(self.ov_keys):
            return self.base_rows
        in_base = self._base_lookup(self.ov_keys) != MISSING
        live = self.ov_locs != MISSING
        return int(self.base_rows + (live & ~in_base).sum() - (~live & in_base).sum())

    # -- lookups and updates -------------------------------------------------------------------------
    def _base_lookup(self, probe: np.ndarray) -> np.ndarray:
        out = np.full(len(probe), MISSING, np.int64)
        if not self.runs or len(probe) == 0:
            return out
        buckets = bucket_of(probe, self.bits)
        for b in np.unique(buckets).tolist():
            run = self.runs.get(int(b))
            if run is None:
                continue
            sel = np.flatnonzero(buckets == b)
            found, idx = find_sorted(run.keys, probe[sel])
            out[sel[found]] = run.locs[idx[found]]
            run.release()
        return out

    def lookup(self, probe: np.ndarray) -> np.ndarray:
        """Packed locations of ``probe`` keys (MISSING where absent or deleted)."""
        out = self._base_lookup(probe)
        found, idx = find_sorted(self.ov_keys, probe)
        out[found] = self.ov_locs[idx[found]]
        return out

    def update(self, probe: np.ndarray, locations: np.ndarray) -> None:
        """Set the location of each (distinct) key; MISSING marks a deleted key."""
        if len(probe) == 0:
            return
        probe = np.asarray(probe, self.dtype)
        locations = np.asarray(locations, np.int64)
        self.journal.append((probe.copy(), locations.copy()))
        if self.touched is not None:
            self.touched.append(self.journal[-1][0])
        found, idx = find_sorted(self.ov_keys, probe)
        self.ov_locs[idx[found]] = locations[found]
        if (~found).any():
            keys = np.concatenate([self.ov_keys, probe[~found]])
            locs = np.concatenate([self.ov_locs, locations[~found]])
            order = np.argsort(keys, kind="stable")
            self.ov_keys, self.ov_locs = keys[order], locs[order]

    def forget_files(self, file_ids: list[int]) -> int:
        """Drop every entry whose row is in one of ``file_ids``; one pass over the locations."""
        if not file_ids:
            return 0
        ids = np.asarray(sorted(file_ids), np.int64)
        dropped_keys = []
        hit = (self.ov_locs >= 0) & np.isin(self.ov_locs >> 32, ids)
        if hit.any():
            dropped_keys.append(self.ov_keys[hit].copy())
        for run in self.runs.values():
            h = (run.locs >= 0) & np.isin(run.locs >> 32, ids)
            if h.any():
                keys = np.array(run.keys[h])
                shadowed, _ = find_sorted(self.ov_keys, keys)  # the overlay already says where they are
                dropped_keys.append(keys[~shadowed])
            run.release()
        if not dropped_keys:
            return 0
        keys = np.unique(np.concatenate(dropped_keys))
        self.update(keys, np.full(len(keys), MISSING, np.int64))
        return len(keys)

    def reset(self) -> None:
        """Forget every entry (a TRUNCATE): an empty base."""
        self.runs, self.bits, self.base_rows, self.base_dir, self.generation = {}, 0, 0, None, None
        self.ov_keys, self.ov_locs = np.empty(0, self.dtype), np.empty(0, np.int64)
        self.journal, self.rebased = [], True
        self.resets += 1
        self.touched = None

    def wants_merge(self) -> bool:
        return len(self.ov_keys) > max(MIN_MERGE, min(self.base_rows // 8, MAX_OVERLAY))

    def needs_merge(self) -> bool:
        """Past twice the merge threshold: merged now even beside another heavy job (memory stays bounded)."""
        return len(self.ov_keys) > 2 * max(MIN_MERGE, min(self.base_rows // 8, MAX_OVERLAY))

    # -- generations -----------------------------------------------------------------------------------
    def open_base(self, local_dir: str | None, meta: dict[str, Any]) -> None:
        """Map the generation in ``local_dir`` described by ``meta`` (None: an empty base)."""
        self.runs = {}
        self.bits = int(meta.get("bits", 0))
        self.base_rows = int(meta.get("rows", 0))
        self.base_dir = local_dir
        for b in meta.get("buckets", []):
            self.runs[int(b)] = _Run(
                f"{local_dir}/bucket-{int(b):05d}.keys.npy", f"{local_dir}/bucket-{int(b):05d}.locs.npy"
            )
        if self.runs:
            paths = [p for r in self.runs.values() for p in (r.keys_path, r.locs_path)]
            threading.Thread(target=warm_page_cache, args=(paths,), name="key-index-warm", daemon=True).start()
        self.paths, self._path_ids = [], {}
        for p in meta.get("paths", []):
            self.file_id(p)

    def write_generation(self, fs: Any, gen_dir: str) -> dict[str, Any]:
        """Merge the base and the overlay into a new generation in ``gen_dir`` (one bucket in memory at a
        time); returns its meta (not yet including the snapshot)."""
        meta = merge_generation(fs, gen_dir, self.runs, self.bits, self.ov_keys, self.ov_locs)
        return {**meta, "paths": list(self.paths), **self.identity()}

    def freeze(self) -> dict[str, Any]:
        """What a merge beside the batches needs, as it is now: the base's bucket files and a copy of the
        overlay; from here on the keys updated are tracked, to stay in the overlay after `swap_base`."""
        self.touched = []
        return {
            "runs": {b: (r.keys_path, r.locs_path) for b, r in self.runs.items()},
            "bits": self.bits,
            "ov_keys": self.ov_keys.copy(),
            "ov_locs": self.ov_locs.copy(),
            "snapshot_id": self.snapshot_id,
            "paths": list(self.paths),
            "resets": self.resets,
            "identity": self.identity(),
        }

    def swap_base(self, local_dir: str, meta: dict[str, Any], generation: str) -> None:
        """Switch to a generation merged beside the batches from `freeze`'s state: the overlay keeps only
        the keys updated since."""
        touched = np.unique(np.concatenate(self.touched)) if self.touched else np.empty(0, self.dtype)
        self.touched = None
        found, idx = find_sorted(self.ov_keys, touched)
        keep = np.sort(idx[found])
        ov_keys, ov_locs = self.ov_keys[keep], self.ov_locs[keep]
        paths, ids = self.paths, self._path_ids
        self.open_base(local_dir, meta)
        self.paths, self._path_ids = paths, ids
        self.ov_keys, self.ov_locs = ov_keys, ov_locs
        self.generation = generation

    def adopt(self, local_dir: str, meta: dict[str, Any]) -> None:
        """Switch to a generation just written from this index's own state: the overlay is in it now."""
        paths, ids = self.paths, self._path_ids
        self.open_base(local_dir, meta)
        self.paths, self._path_ids = paths, ids
        self.ov_keys, self.ov_locs = np.empty(0, self.dtype), np.empty(0, np.int64)

    # -- a full build on the executors ------------------------------------------------------------------
    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Build the index from a scan of the table at ``snapshot_id`` (deletes applied), on the executors:
        each task writes its buckets' sorted files under `build_root`; the driver gets file counts only."""
        started = time.monotonic()
        self.reset()
        if snapshot_id is not None:
            if self.build_root is None:
                raise RuntimeError(f"{ident}: no location to build the key index in")
            self.build_seq += 1
            meta = build_on_executors(
                spark,
                ident,
                list(self.key_columns),
                int(snapshot_id),
                self.hashed,
                self.build_root,
                f"build-{os.getpid()}-{int(time.time() * 1000)}",
            )
            meta.update(self.identity())
            self.open_base(meta["local_dir"], meta)
            self.generation = meta["name"]
        self.snapshot_id = snapshot_id
        self.valid = True
        self.rebased = True
        log.info(
            "index of %s built at snapshot %s on the executors: %d keys in %d bucket(s), %.2fs",
            ident,
            snapshot_id,
            self.base_rows,
            len(self.runs),
            time.monotonic() - started,
        )


def _progress(spark: SparkSession, what: str, done: threading.Event, every_s: float = 10.0) -> None:
    tracker = spark.sparkContext.statusTracker()
    started = time.monotonic()
    while not done.wait(every_s):
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        parts = [f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks" for s in stages if s is not None]
        log.info("%s: %.0fs, %s", what, time.monotonic() - started, ", ".join(parts) or "planning")


def build_on_executors(
    spark: SparkSession, ident: str, key_columns: list[str], snapshot_id: int, hashed: bool, root: str, name: str
) -> dict[str, Any]:
    """Scan the table's key columns with ``_file``/``_pos`` at ``snapshot_id``; the executors compute the
    index keys and locations, shuffle them by bucket and write each bucket's sorted files under
    ``root/name``. Returns the generation's meta (bits, rows, buckets, paths, local_dir)."""
    from lakestream.identifiers import quote_column
    from lakestream.storage import active_options, filesystem_path

    paths, hashes, fids, rows = _numbered_data_files(spark, ident, snapshot_id)
    bits = bucket_bits(rows)
    gen = f"{root.rstrip('/')}/{name}"
    fs, gen_path = filesystem_path(gen)
    ensure_dir(fs, gen_path)
    key_type = "binary" if hashed else "bigint"
    keys_sql = ", ".join(quote_column(k) for k in key_columns)
    log.info(
        "building the key index of %s on the executors: %d rows in %d data files, %d bucket(s)",
        ident,
        rows,
        len(paths),
        1 << bits,
    )
    entries = _entries_of(ident, key_columns, hashed, bits, hashes, fids)
    write = _bucket_writer(gen, hashed, active_options())
    done = threading.Event()
    watcher = threading.Thread(target=_progress, args=(spark, f"building the key index of {ident}", done), daemon=True)
    watcher.start()
    try:
        df = spark.sql(scan_sql(ident, keys_sql, snapshot_id))
        written = (
            df.mapInArrow(entries, f"bucket int, key {key_type}, loc bigint")
            .repartition(max(1, min(1 << bits, 4096)), "bucket")
            .mapInArrow(write, "bucket int, rows bigint")
        ).collect()
    finally:
        done.set()
    buckets = sorted(int(r["bucket"]) for r in written)
    total = sum(int(r["rows"]) for r in written)
    return {
        "bits": bits,
        "rows": total,
        "buckets": buckets,
        "paths": paths,
        "name": name,
        "local_dir": local_generation(fs, gen_path, name, buckets),
    }


def _numbered_data_files(
    spark: SparkSession, ident: str, snapshot_id: int
) -> tuple[list[str], np.ndarray, np.ndarray, int]:
    """The table's data files at ``snapshot_id`` (sorted: a file's id is its place), their path hashes (sorted)
    with each hash's file id, and their rows."""
    files = spark.sql(
        f"SELECT file_path, xxhash64(file_path) AS h, record_count FROM {ident}.data_files VERSION AS OF {snapshot_id}"
    ).collect()
    paths = sorted(r["file_path"] for r in files)
    fid_of_hash = {int(r["h"]): paths.index(r["file_path"]) for r in files} if len(files) < 2000 else None
    if fid_of_hash is None:
        position = {p: i for i, p in enumerate(paths)}
        fid_of_hash = {int(r["h"]): position[r["file_path"]] for r in files}
    rows = sum(int(r["record_count"]) for r in files)
    hashes = np.array(sorted(fid_of_hash), np.int64)
    fids = np.array([fid_of_hash[int(h)] for h in hashes], np.int64)
    return paths, hashes, fids, rows


# The two steps of the build run on the executors: each is a closure over what the driver knows, which Spark
# ships with the task.
def _entries_of(
    ident: str, key_columns: list[str], hashed: bool, bits: int, hashes: np.ndarray, fids: np.ndarray
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' first step: each scanned row's index key, bucket and location (file id, position)."""

    def entries(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            t = pa.Table.from_batches([rb])
            keys = index_keys(t.select(list(range(len(key_columns)))).rename_columns(key_columns), key_columns)
            h = t.column(FILE_COLUMN).to_numpy()
            slot = np.searchsorted(hashes, h)
            slot_c = np.minimum(slot, len(hashes) - 1)
            if len(hashes) == 0 or not np.array_equal(hashes[slot_c], h):
                raise RuntimeError(f"{ident}: rows of a data file missing from its files table")
            locs = pack(fids[slot_c], t.column(POS_COLUMN).to_numpy())
            arrow_keys = keys_to_arrow(keys)
            if hashed:
                arrow_keys = arrow_keys.cast(pa.binary())
            yield pa.record_batch(
                [pa.array(bucket_of(keys, bits).astype(np.int32)), arrow_keys, pa.array(locs, pa.int64())],
                names=["bucket", "key", "loc"],
            )

    return entries


def _bucket_writer(
    gen: str, hashed: bool, storage: StorageContext
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' second step: write each bucket's entries, sorted by key, into generation ``gen``; yields
    each bucket's row count."""
    from lakestream.storage import filesystem_path, use_options

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        use_options(storage)  # a fresh Python worker knows no object store but the default AWS one
        by_bucket: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for rb in batches:
            b = rb.column(0).to_numpy()
            column = rb.column(1)
            k = keys_from_arrow(column.cast(pa.binary(16)) if hashed else column)
            loc = rb.column(2).to_numpy()
            for bucket in np.unique(b).tolist():
                sel = b == bucket
                by_bucket.setdefault(int(bucket), []).append((k[sel], loc[sel]))
        wfs, wroot = filesystem_path(gen)
        out = []
        for bucket, parts in by_bucket.items():
            k = np.concatenate([p[0] for p in parts])
            loc = np.concatenate([p[1] for p in parts])
            order = np.argsort(k, kind="stable")
            write_npy(wfs, f"{wroot}/bucket-{bucket:05d}.keys.npy", k[order])
            write_npy(wfs, f"{wroot}/bucket-{bucket:05d}.locs.npy", loc[order])
            out.append((bucket, len(k)))
        yield pa.record_batch(
            [pa.array([o[0] for o in out], pa.int32()), pa.array([o[1] for o in out], pa.int64())],
            names=["bucket", "rows"],
        )

    return write


def local_generation(fs: Any, path: str, name: str, buckets: list[int]) -> str:
    """A local directory holding generation ``path`` of ``fs``: itself on a local filesystem, else a copy
    in the machine's temporary directory (memory-mapping needs local files)."""
    import tempfile

    import pyarrow.fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        return path
    # Keyed by the generation's whole location: every table's generations are named gen-<seq>, so a copy
    # keyed by the name alone would serve one table's keys to another.
    digest = hashlib.sha1(f"{type(fs).__name__}:{path}".encode()).hexdigest()[:20]
    local = os.path.join(tempfile.gettempdir(), "lakestream-index", f"{digest}-{name}")
    os.makedirs(local, exist_ok=True)
    for b in buckets:
        for part in ("keys", "locs"):
            target = os.path.join(local, f"bucket-{b:05d}.{part}.npy")
            if not os.path.exists(target):
                source = f"{path}/bucket-{b:05d}.{part}.npy"
                with fs.open_input_stream(source) as src, open(target + ".tmp", "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                os.replace(target + ".tmp", target)
    return local


if TYPE_CHECKING:  # mypy checks here that DiskKeyIndex has the contract (`contract.KeyedIndex`)
    from lakestream.sink.index.contract import KeyedIndex

    def _conforms(index: DiskKeyIndex) -> KeyedIndex:
        return index
