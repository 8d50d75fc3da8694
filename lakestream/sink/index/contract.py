"""The contract every table index implements, and the parts the implementations share.

An index maps what identifies a row (its primary key; for a table without one, its content and copy number) to
the row's packed location (data file id << 32 | row position) and is exact at one snapshot of its table. The
driver asks it where the previous row of each changed key is (the commit turns that into a deletion vector),
moves it to the new snapshot after the commit, and refreshes it (`lakestream.sink.index.refresh`) when another
writer moved the table.

- `TableIndex` is what the engine and the commit path rely on, whatever the implementation.
- ``keyed`` says which family an index is of: keyed indexes (`DiskKeyIndex`, `KeyIndex`) answer `lookup`
  per key; the keyless one (`KeylessIndex`) is driven by the keyless resolution in Kafka order.
- `IndexIdentity`, `FileIds` and `Journal` are written once here and mixed into the implementations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from lakestream.sink.index.keys import KEY_ENCODING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class TableIndex(Protocol):
    """Row identity → location of the live row, valid for ``snapshot_id`` while ``valid``."""

    keyed: ClassVar[bool]  # True: rows found by primary key; False: by whole-row content (a multiset)
    hashed: bool
    key_columns: tuple[str, ...]
    table_uuid: str | None  # a table dropped and created again under its name is another table
    snapshot_id: int | None  # the snapshot the index describes
    valid: bool  # False once a commit found the table elsewhere: refresh before use

    @property
    def paths(self) -> list[str]:
        """The data file of each file id."""

    def __len__(self) -> int:
        """Live rows (keys, or row copies) it holds."""

    def identity(self) -> dict[str, Any]:
        """What a saved index must match to be loaded (see `IndexIdentity`)."""

    def matches(self, meta: dict[str, Any]) -> bool:
        """Whether saved ``meta`` describes this index's table, key columns and key encoding."""

    def file_id(self, path: str) -> int:
        """The id of data file ``path``, given one if it has none."""

    def known_file_id(self, path: str) -> int | None:
        """The id of data file ``path`` if the index has one."""

    def reset(self) -> None:
        """Forget every entry (a TRUNCATE, before a rebuild)."""

    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Load the index from a scan of the table at ``snapshot_id`` (deletes applied)."""


class KeyedIndex(TableIndex, Protocol):
    """A keyed index (``keyed``): the packed location of each key's live row (`DiskKeyIndex`, `KeyIndex`)."""

    journal_parent: int | None  # the snapshot its journal of changes starts from (see `Journal`)

    def lookup(self, probe: np.ndarray) -> np.ndarray:
        """Packed locations of ``probe`` keys (MISSING where absent or deleted)."""

    def update(self, probe: np.ndarray, locations: np.ndarray) -> None:
        """Set the location of each (distinct) key; MISSING marks a deleted key."""

    def forget_files(self, file_ids: list[int]) -> int:
        """Drop every entry whose row is in one of ``file_ids``; returns how many."""

    def journal_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The changes since the index was last made durable, the last of each key, sorted by key."""


class IndexIdentity:
    """``identity``/``matches``: an index saved for one table, key and key encoding is loaded only for them."""

    keyed: ClassVar[bool] = True
    hashed: bool
    key_columns: tuple[str, ...]
    table_uuid: str | None

    def identity(self) -> dict[str, Any]:
        """The table (its UUID), the key columns, the key encoding and whether keys are hashed; a keyless
        index adds ``keyless``."""
        return {
            "table_uuid": self.table_uuid,
            "key_columns": list(self.key_columns),
            "key_encoding": KEY_ENCODING,
            "hashed": self.hashed,
            **({} if self.keyed else {"keyless": True}),
        }

    def matches(self, meta: dict[str, Any]) -> bool:
        """Whether saved ``meta`` has this identity (key column names compared without case)."""
        if bool(meta.get("keyless")) == self.keyed:
            return False
        for name, value in self.identity().items():
            if name == "key_columns":
                if [k.lower() for k in meta.get(name) or []] != [k.lower() for k in value]:
                    return False
            elif meta.get(name) != value:
                return False
        return True


class FileIds:
    """Data file paths ↔ the small ids a packed location holds."""

    paths: list[str]
    _path_ids: dict[str, int]

    def file_id(self, path: str) -> int:
        fid = self._path_ids.get(path)
        if fid is None:
            fid = self._path_ids[path] = len(self.paths)
            self.paths.append(path)
        return fid

    def known_file_id(self, path: str) -> int | None:
        return self._path_ids.get(path)


class Journal:
    """The changes since the index was last made durable (`lakestream.sink.index.store`): (keys, locations) in
    order; ``journal_parent`` is the snapshot they start from, ``rebased`` whether everything before them was
    replaced (a rebuild, a truncate)."""

    dtype: np.dtype[Any]
    journal: list[tuple[np.ndarray, np.ndarray]]
    journal_parent: int | None
    rebased: bool

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
