"""The contract every table index implements (`lakestream.sink.index.contract.TableIndex`), run against each
implementation: identity, file ids, emptiness and reset, the saved form, and for keyed indexes the key →
location map against a plain dict. No Spark: seconds."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lakestream.sink.index.contract import TableIndex
from lakestream.sink.index.disk import DiskKeyIndex
from lakestream.sink.index.keyless import KeylessIndex
from lakestream.sink.index.keys import KEY_ENCODING, MISSING, pack, unpack
from lakestream.sink.index.memory import KeyIndex
from lakestream.sink.index.store import IndexStore

Factory = Callable[..., Any]

IMPLEMENTATIONS: dict[str, Factory] = {
    "disk": lambda uuid="uuid-1", key=("id",): DiskKeyIndex(False, key, uuid),
    "memory": lambda uuid="uuid-1", key=("id",): KeyIndex(False, key, uuid),
    "keyless": lambda uuid="uuid-1", key=(): KeylessIndex(None, uuid),
}
KEYED = ["disk", "memory"]


def _save_and_load(kind: str, index: Any, tmp_path: Path, uuid: str) -> Any:
    """The index as its saved form loads it back for table ``uuid`` (None: not loaded)."""
    if kind == "disk":
        IndexStore(str(tmp_path / "store")).persist(index)
        return IndexStore(str(tmp_path / "store")).load(DiskKeyIndex(index.hashed, index.key_columns, uuid))
    index.save(tmp_path / "saved.npz")
    if kind == "memory":
        return KeyIndex.load(tmp_path / "saved.npz", index.hashed, index.snapshot_id, index.key_columns, uuid)
    return KeylessIndex.load(tmp_path / "saved.npz", index.snapshot_id, uuid)


def _put(index: Any, keys: list[int], file_id: int) -> None:
    """Rows at positions 0.. of ``file_id`` for ``keys`` (through the public update of each family)."""
    if index.keyed:
        index.update(np.array(keys, np.int64), pack(np.full(len(keys), file_id), np.arange(len(keys))))
    else:
        copies = np.array([k.to_bytes(16, "big") for k in keys], "S16")
        index.rows.update(np.sort(copies), pack(np.full(len(keys), file_id), np.arange(len(keys))))


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_implementation_has_the_contract(kind: str) -> None:
    index: TableIndex = IMPLEMENTATIONS[kind]()  # mypy checks the Protocol here
    for member in (
        "keyed",
        "hashed",
        "key_columns",
        "table_uuid",
        "snapshot_id",
        "valid",
        "paths",
        "identity",
        "matches",
        "file_id",
        "known_file_id",
        "reset",
        "rebuild",
    ):
        assert hasattr(index, member), member
    assert index.keyed == (kind in KEYED)
    assert len(index) == 0 and not index.valid and index.snapshot_id is None


def test_identity_names_the_table_key_and_encoding(kind: str) -> None:
    index = IMPLEMENTATIONS[kind]()
    meta = index.identity()
    assert meta["table_uuid"] == "uuid-1" and meta["key_encoding"] == KEY_ENCODING
    assert index.matches(meta)
    assert not index.matches({**meta, "table_uuid": "uuid-2"})  # a table dropped and created again
    assert not index.matches({**meta, "key_encoding": KEY_ENCODING - 1})
    assert not index.matches({k: v for k, v in meta.items() if k != "table_uuid"})
    if index.keyed:
        assert index.matches({**meta, "key_columns": ["ID"]})  # column names compare without case
        assert not index.matches({**meta, "key_columns": ["code"]})
        assert not index.matches({**meta, "keyless": True})
    else:
        assert not index.matches(IMPLEMENTATIONS["memory"]().identity())  # a keyed index's saved form


def test_file_ids_are_stable_and_dense(kind: str) -> None:
    index = IMPLEMENTATIONS[kind]()
    assert index.known_file_id("a.parquet") is None
    assert [index.file_id(p) for p in ("a.parquet", "b.parquet", "a.parquet")] == [0, 1, 0]
    assert index.known_file_id("b.parquet") == 1 and index.paths == ["a.parquet", "b.parquet"]


def test_reset_forgets_every_entry(kind: str) -> None:
    index = IMPLEMENTATIONS[kind]()
    _put(index, [1, 2, 3], index.file_id("a.parquet"))
    assert len(index) == 3
    index.reset()
    assert len(index) == 0
    if index.keyed:
        assert (index.lookup(np.array([1, 2, 3], np.int64)) == MISSING).all()


def test_the_saved_form_loads_for_the_same_table_only(kind: str, tmp_path: Path) -> None:
    index = IMPLEMENTATIONS[kind]()
    _put(index, [5, 7], index.file_id("a.parquet"))
    index.snapshot_id, index.valid = 42, True
    loaded = _save_and_load(kind, index, tmp_path, "uuid-1")
    assert loaded is not None and loaded.valid and loaded.snapshot_id == 42 and len(loaded) == 2
    assert loaded.paths == ["a.parquet"] and loaded.identity() == index.identity()
    assert _save_and_load(kind, index, tmp_path / "other", "uuid-2") is None


@pytest.mark.parametrize("keyed_kind", KEYED)
def test_a_keyed_index_is_a_key_to_location_map(keyed_kind: str) -> None:
    """Random batches of moves and deletes (as commits apply them), against a dict."""
    index = IMPLEMENTATIONS[keyed_kind]()
    model: dict[int, int] = {}
    rng = random.Random(7)
    for batch in range(40):
        fid = index.file_id(f"file-{batch}")
        keys = np.array(sorted(rng.sample(range(500), 30)), np.int64)
        deleted = np.array([rng.random() < 0.3 for _ in keys])
        locs = np.where(deleted, MISSING, pack(np.full(len(keys), fid), np.arange(len(keys))))
        index.update(keys, locs)
        for k, loc in zip(keys.tolist(), locs.tolist(), strict=True):
            if loc == MISSING:
                model.pop(k, None)
            else:
                model[k] = loc
        probe = np.arange(500, dtype=np.int64)
        got = index.lookup(probe)
        assert got.tolist() == [model.get(k, int(MISSING)) for k in range(500)], batch
        assert len(index) == len(model)
    # The journal: each key's last change, sorted by key.
    keys, locs = index.journal_entries()
    assert (np.diff(keys) > 0).all() and len(keys) == len(np.unique(keys))
    assert {k: v for k, v in zip(keys.tolist(), locs.tolist(), strict=True) if v != MISSING} == model
    # Forgetting a data file drops exactly the keys whose row is in it.
    gone = index.known_file_id("file-39")
    in_file = {k for k, v in model.items() if int(unpack(np.array([v]))[0][0]) == gone}
    assert index.forget_files([gone]) == len(in_file)
    assert (index.lookup(np.array(sorted(in_file), np.int64)) == MISSING).all()
    assert len(index) == len(model) - len(in_file)
