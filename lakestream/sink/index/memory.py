"""The key index held in the driver's memory: two sorted numpy arrays (keys, locations) plus a small sorted
delta of keys added since the last merge.

Updates of existing keys are written in place; new keys go to the delta, merged when it grows past an eighth of
the base, so the O(n) merge is amortized and a batch's cost follows its changes. Memory: 16 bytes per key for
integer keys (24 for hashed keys), plus the file-path list.

It earns its place beside `DiskKeyIndex` (the index of keyed tables, bounded driver memory) as the building
block of `KeylessIndex` (its row copies and its copy counts are two of these) and as the re-snapshot's mirror of
a table, rebuilt once from a scan and probed in memory (`lakestream.snapshot.resnapshot`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from lakestream.sink.index.contract import FileIds, IndexIdentity, Journal
from lakestream.sink.index.keys import MISSING, find_sorted, index_keys
from lakestream.sink.index.scan import scan_locations

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class KeyIndex(IndexIdentity, FileIds, Journal):
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
        # Changes since the index was last made durable (`lakestream.sink.index.store`): (keys, locations)
        # in order, and whether everything before them was replaced (a rebuild, a truncate).
        self.journal: list[tuple[np.ndarray, np.ndarray]] = []
        self.journal_parent: int | None = None  # the snapshot the journal starts from
        self.rebased = True

    def __len__(self) -> int:
        return int((self.locs >= 0).sum() + (self.delta_locs >= 0).sum())

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.locs.nbytes + self.delta_keys.nbytes + self.delta_locs.nbytes

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

    @classmethod
    def load(
        cls,
        path: Path,
        hashed: bool,
        snapshot_id: int | None,
        key_columns: list[str] | tuple[str, ...] = (),
        table_uuid: str | None = None,
    ) -> KeyIndex | None:
        """The index saved at ``path`` if it describes ``snapshot_id`` of the table ``table_uuid`` keyed on
        ``key_columns`` (else None: rebuild)."""
        if snapshot_id is None or not path.exists():
            return None
        try:
            with np.load(path) as saved:
                meta = orjson.loads(saved["meta"].tobytes())
                index = cls(hashed, key_columns, table_uuid)
                if meta.get("snapshot_id") != snapshot_id or not index.matches(meta):
                    log.info(
                        "the saved key index %s is of another snapshot, table or key (%s); not loaded",
                        path,
                        {k: meta.get(k) for k in ("snapshot_id", "table_uuid", "key_columns", "key_encoding")},
                    )
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
        """Forget every entry."""
        self.__init__(self.hashed, self.key_columns, self.table_uuid)  # type: ignore[misc]

    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Load the index from a scan of the key columns at ``snapshot_id`` (deletes applied)."""
        from lakestream.identifiers import quote_column

        started = time.monotonic()
        self.reset()
        if snapshot_id is not None:
            scanned = scan_locations(
                spark, ident, ", ".join(quote_column(k) for k in self.key_columns), int(snapshot_id), self.file_id
            )
            if scanned is not None:
                table, locs = scanned
                keys = index_keys(table, list(self.key_columns))
                order = np.argsort(keys, kind="stable")
                self.keys, self.locs = keys[order], locs[order]
        self.snapshot_id = snapshot_id
        self.valid = True
        log.info(
            "index of %s rebuilt at snapshot %s: %d keys, %.1f MB, %.2fs",
            ident,
            snapshot_id,
            len(self.keys),
            self.nbytes / 1e6,
            time.monotonic() - started,
        )


if TYPE_CHECKING:  # mypy checks here that KeyIndex has the contract (`contract.KeyedIndex`)
    from lakestream.sink.index.contract import KeyedIndex

    def _conforms(index: KeyIndex) -> KeyedIndex:
        return index
