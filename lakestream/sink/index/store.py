"""The key index made durable with every commit, beside the table's data, and refreshed by diff.

Where: ``<table location>/_lakestream/index/``, written through pyarrow's filesystem of the table's
location (`lakestream.storage.filesystem_path`), so it lives wherever the table lives (a local
warehouse, an object store) and survives the loss of the driver's disk. Iceberg's orphan-file removal
skips paths whose name starts with ``_`` (its hidden-path filter), so it never deletes these files.

What: a **base** (``base-<seq>.json``: the generation of sorted bucket files it names — ``gen-<seq>/`` or
``build-…/``, see `lakestream.sink.index.disk` —, the data file paths, the snapshot it describes, the table
UUID, key columns and key encoding it was built for) and after it one small **delta** per commit
(``delta-<seq>.npz``: the keys the commit moved or deleted, the paths it added, the snapshot it leads to and its
parent). A delta costs what the commit's changes cost. When the index's overlay is due for a merge (or after
`MAX_DELTAS` deltas) the next commit writes a new generation and base instead, and the older files are deleted.

Loading: the newest base that matches the table and key, then its deltas in order while each one's
parent is the snapshot reached so far. Whatever the table committed after that point (a commit whose
delta was never written — the process died between the commit and the delta —, a compaction, a
manual DELETE, a backfill) is applied by `lakestream.sink.index.diff.refresh_by_diff`. A schema change adds no
snapshot and keeps the index. Only when the chain is broken (the index's snapshot is no ancestor of the
current one: a rollback, expired history) or a snapshot holds equality deletes is the index rebuilt.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.fs as pafs

from lakestream.beside import lower_this_thread, release_slot, take_slot
from lakestream.sink.index import disk
from lakestream.sink.index.disk import DiskKeyIndex, local_generation
from lakestream.storage import ensure_dir, filesystem_path

log = logging.getLogger(__name__)

MAX_DELTAS = 256
# Share of the time a merge beside the batches works (it pauses after each bucket): it rewrites the whole base
# (1.5 GB at 100M keys), and at full speed it took the batches' disk and a core for its 12-19 s.
MERGE_DUTY = 0.5
_NAME = re.compile(r"^(base|delta)-(\d{12})\.(json|npz)$")


def own_location(table_location: str) -> str:
    """Where Lakestream keeps its own files beside a table's (no snapshot names them: orphan removal skips it)."""
    return table_location.rstrip("/") + "/_lakestream"


def store_location(table_location: str) -> str:
    return own_location(table_location) + "/index"


class _Merge:
    """A generation being merged on a thread from an index's frozen state (`IndexStore.start_merge`)."""

    def __init__(self, seq: int, generation: str, index: DiskKeyIndex, frozen: dict[str, Any], deltas_before: int):
        self.seq, self.generation, self.index, self.frozen = seq, generation, index, frozen
        self.deltas_before = deltas_before  # deltas the new base covers
        self.done = threading.Event()
        self.meta: dict[str, Any] | None = None
        self.local_dir: str | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0


class IndexStore:
    """The durable files of one table's key index (see the module doc)."""

    def __init__(self, location: str):
        self.location = location
        self.fs, self.root = filesystem_path(location)
        self.seq: int | None = None  # of the newest file written or loaded
        self.base_seq: int | None = None
        self.deltas = 0
        self.paths_written = 0  # data file paths the files so far name (a delta adds the rest)
        self.written_bytes = 0
        self.merge: _Merge | None = None  # a new generation being written beside the batches
        self.collecting: threading.Thread | None = None  # deleting what an adopted merge made unnecessary

    # -- listing and reading ---------------------------------------------------------------------
    def _files(self) -> list[tuple[str, int, str]]:
        """(kind, seq, path) of every index file, by seq."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError as exc:
            log.warning("key index store %s unreadable: %s", self.location, exc)
            return []
        out = []
        for info in infos:
            m = _NAME.match(info.base_name)
            if m and info.type == pafs.FileType.File:
                out.append((m.group(1), int(m.group(2)), info.path))
        return sorted(out, key=lambda f: f[1])

    def _read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as fh:
            data: bytes = fh.read()
        return data

    def _read_delta(self, path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        with np.load(io.BytesIO(self._read_bytes(path))) as saved:
            arrays = {k: saved[k] for k in saved.files}
        return orjson.loads(arrays.pop("meta").tobytes()), arrays

    def _put(self, path: str, data: bytes) -> None:
        # Written whole then moved where a filesystem can rename atomically; an object store's put is
        # atomic anyway (a reader sees the whole object or none).
        tmp = path.rsplit("/", 1)[0] + "/." + path.rsplit("/", 1)[1] + ".tmp"
        try:
            with self.fs.open_output_stream(tmp) as fh:
                fh.write(data)
            self.fs.move(tmp, path)
        except (OSError, pa.ArrowNotImplementedError):
            with self.fs.open_output_stream(path) as fh:
                fh.write(data)
        self.written_bytes += len(data)

    def load(self, index: DiskKeyIndex) -> DiskKeyIndex | None:
        """The index as durable: the newest matching base and its chain of deltas (None: no usable base)."""
        files = self._files()
        for _, seq, path in reversed([f for f in files if f[0] == "base"]):
            try:
                meta = orjson.loads(self._read_bytes(path))
                if not index.matches(meta):
                    log.info(
                        "key index base %s is of another table, key or encoding (%s, not %s): not used",
                        path,
                        {k: meta.get(k) for k in index.identity()},
                        index.identity(),
                    )
                    continue
                loaded = DiskKeyIndex(index.hashed, index.key_columns, index.table_uuid)
                gen = f"{self.root}/{meta['generation']}"
                loaded.open_base(local_generation(self.fs, gen, meta["generation"], meta["buckets"]), meta)
            except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
                log.warning("ignoring key index base %s: %s", path, exc)
                continue
            loaded.generation = meta["generation"]
            loaded.snapshot_id = meta["snapshot_id"]
            self.base_seq = self.seq = seq
            self.deltas = 0
            for kind, dseq, dpath in files:
                if kind != "delta" or dseq <= seq:
                    continue
                try:
                    dmeta, darrays = self._read_delta(dpath)
                except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
                    log.warning(
                        "key index delta %s unreadable (%s): the rest comes from the table's snapshots", dpath, exc
                    )
                    break
                if dmeta.get("parent_snapshot_id") != loaded.snapshot_id or dmeta.get("paths_start") != len(
                    loaded.paths
                ):
                    break  # a gap (a delta never written): the table's snapshots fill it
                for p in dmeta["new_paths"]:
                    loaded.file_id(p)
                if dmeta.get("reset"):
                    loaded.reset()
                loaded.update(darrays["keys"], darrays["locs"])
                loaded.snapshot_id = dmeta["snapshot_id"]
                self.seq = dseq
                self.deltas += 1
            loaded.journal, loaded.rebased, loaded.journal_parent = [], False, loaded.snapshot_id
            self.seq = max([self.seq or 0, *(f[1] for f in files)])  # new files never reuse a name
            self.paths_written = len(loaded.paths)
            loaded.valid = True
            return loaded
        return None

    # -- writing ---------------------------------------------------------------------------------
    def persist(self, index: DiskKeyIndex) -> None:
        """Make ``index`` (valid at its snapshot) durable: a delta of its journal (a new base after a build or
        a reset). When the overlay is due for a merge, or after `MAX_DELTAS` deltas, a new generation is
        merged on a thread beside the batches (`start_merge`) and adopted by a later call."""
        if index.snapshot_id is None or not index.valid:
            return
        self.finish_merge(index)
        if (
            not index.rebased
            and not index.journal
            and index.journal_parent == index.snapshot_id
            and self.base_seq is not None
            and self.paths_written == len(index.paths)
        ):
            return  # already durable as it is
        if index.rebased or self.base_seq is None:
            self.write_base(index)
            return
        self.write_delta(index)
        if self.merge is None and (self.deltas >= MAX_DELTAS or index.wants_merge()):
            # Not beside another heavy job (an inline maintenance round) unless the overlay or the delta chain
            # is past twice its threshold: a later commit starts it.
            holds_slot = take_slot()
            if holds_slot or index.needs_merge() or self.deltas >= 2 * MAX_DELTAS:
                try:
                    self.start_merge(index, holds_slot)
                except BaseException:
                    if holds_slot:
                        release_slot()
                    raise

    def write_delta(self, index: DiskKeyIndex) -> None:
        """One delta: the keys the commits since the last file moved or deleted, and the paths they added."""
        keys, locs = index.journal_entries()
        seq = (self.seq or 0) + 1
        meta = {
            "snapshot_id": index.snapshot_id,
            "parent_snapshot_id": index.journal_parent,
            "paths_start": self.paths_written,
            "new_paths": index.paths[self.paths_written :],
            **index.identity(),
        }
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(orjson.dumps(meta), np.uint8), keys=keys, locs=locs)
        ensure_dir(self.fs, self.root)
        self._put(f"{self.root}/delta-{seq:012d}.npz", buf.getvalue())
        self.seq, self.deltas = seq, self.deltas + 1
        self.paths_written = len(index.paths)
        index.journal = []
        index.journal_parent = index.snapshot_id

    def write_base(self, index: DiskKeyIndex) -> None:
        """A new base: the mapped generation as it is (just built) or merged with the overlay into a new
        one; then the older bases, deltas and generations are deleted."""
        started = time.monotonic()
        seq = (self.seq or 0) + 1
        ensure_dir(self.fs, self.root)
        if index.generation is not None and index.overlay_size == 0:
            meta = {"bits": index.bits, "rows": index.base_rows, "buckets": sorted(index.runs), **index.identity()}
            generation = index.generation
        else:
            generation = f"gen-{seq:012d}"
            meta = index.write_generation(self.fs, f"{self.root}/{generation}")
            index.adopt(local_generation(self.fs, f"{self.root}/{generation}", generation, meta["buckets"]), meta)
            index.generation = generation
        meta.update({"snapshot_id": index.snapshot_id, "paths": index.paths, "generation": generation})
        self._put(f"{self.root}/base-{seq:012d}.json", orjson.dumps(meta))
        self.seq = self.base_seq = seq
        self.deltas = 0
        self.paths_written = len(index.paths)
        index.journal, index.rebased = [], False
        index.journal_parent = index.snapshot_id
        self._collect(seq, generation)
        log.info(
            "key index base %d of %s: %d keys in %d bucket(s), %.2fs",
            seq,
            self.location,
            meta["rows"],
            len(meta["buckets"]),
            time.monotonic() - started,
        )

    # -- merging beside the batches ------------------------------------------------------------
    def start_merge(self, index: DiskKeyIndex, holds_slot: bool = False) -> None:
        """Merge the base and the overlay as they are now into a new generation on a thread. Its base file
        takes the next sequence number now, so the deltas written meanwhile load on top of it; until it is
        adopted, a restart loads the old base and every delta. ``holds_slot``: the merge releases the slot of
        heavy jobs beside the batches (`lakestream.beside`) when it ends."""
        seq = (self.seq or 0) + 1
        self.seq = seq
        merge = _Merge(seq, f"gen-{seq:012d}", index, index.freeze(), self.deltas)
        self.merge = merge

        def work() -> None:
            started = time.monotonic()
            try:
                frozen = merge.frozen
                gen_dir = f"{self.root}/{merge.generation}"
                meta = disk.merge_generation(
                    self.fs,
                    gen_dir,
                    frozen["runs"],
                    frozen["bits"],
                    frozen["ov_keys"],
                    frozen["ov_locs"],
                    duty=MERGE_DUTY,
                )
                merge.local_dir = local_generation(self.fs, gen_dir, merge.generation, meta["buckets"])
                merge.meta = {
                    **meta,
                    **frozen["identity"],
                    "snapshot_id": frozen["snapshot_id"],
                    "paths": frozen["paths"],
                    "generation": merge.generation,
                }
            except Exception as exc:  # noqa: BLE001 — reported when adopted; the deltas stay the durable record
                merge.error = exc
            finally:
                if holds_slot:
                    release_slot()
            merge.seconds = time.monotonic() - started
            merge.done.set()

        threading.Thread(target=work, name="key-index-merge", daemon=True).start()

    def finish_merge(self, index: DiskKeyIndex, wait: bool = False) -> None:
        """Adopt a merge that finished (with ``wait``: once it has): write its base, switch the index to its
        generation (the overlay keeps the keys updated since it began), delete what it made unnecessary."""
        merge = self.merge
        if merge is None:
            return
        if wait:
            merge.done.wait()
        if not merge.done.is_set():
            return
        self.merge = None
        if (
            merge.error is not None
            or merge.meta is None
            or merge.local_dir is None
            or merge.index is not index
            or merge.frozen["resets"] != index.resets
        ):
            if merge.error is not None:
                log.warning(
                    "key index merge of %s failed (%s); the deltas stay its durable record", self.location, merge.error
                )
            index.touched = None
            try:
                self.fs.delete_dir(f"{self.root}/{merge.generation}")
            except OSError:
                pass
            return
        self._put(f"{self.root}/base-{merge.seq:012d}.json", orjson.dumps(merge.meta))
        index.swap_base(merge.local_dir, merge.meta, merge.generation)
        self.base_seq = merge.seq
        self.deltas -= merge.deltas_before
        self._collect(merge.seq, merge.generation, beside=True)
        log.info(
            "key index base %d of %s: %d keys in %d bucket(s), merged beside the batches in %.2fs",
            merge.seq,
            self.location,
            merge.meta["rows"],
            len(merge.meta["buckets"]),
            merge.seconds,
        )

    def _collect(self, seq: int, generation: str, beside: bool = False) -> None:
        """Delete what the base ``seq`` made unnecessary: older bases and deltas, other generations. With
        ``beside`` the deleting runs on a thread at a lower priority (`collecting`): a generation is 1.5 GB at
        100M keys, and deleting it took 0.45-1 s of the batch that adopted a merge. What to delete is listed
        here, so a generation begun later is never among it."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError:
            return
        doomed = [
            (info.path, info.type == pafs.FileType.Directory)
            for info in infos
            if ((m := _NAME.match(info.base_name)) and int(m.group(2)) < seq)
            or (info.type == pafs.FileType.Directory and info.base_name != generation)
        ]

        def delete() -> None:
            for path, is_dir in doomed:
                try:
                    if is_dir:
                        self.fs.delete_dir(path)
                    else:
                        self.fs.delete_file(path)
                except OSError as exc:
                    log.debug("could not delete %s: %s", path, exc)

        if not beside:
            delete()
            return

        def background() -> None:
            lower_this_thread()
            delete()

        self.collecting = threading.Thread(target=background, name="key-index-collect", daemon=True)
        self.collecting.start()

    def footprint(self) -> int:
        """Bytes of the index's files."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True, recursive=True))
        except OSError:
            return 0
        return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
