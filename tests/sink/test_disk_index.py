"""The bucketed, memory-mapped key index against a dict model: lookups, updates, deletes, files forgotten,
merges of the overlay into new generations (with bucket splits), the per-commit deltas and a reload from
the durable files alone (what a restart after SIGKILL sees). No Spark: the index is plain files."""

from __future__ import annotations

import random

import numpy as np

from lakestream.sink.index import disk as disk_index
from lakestream.sink.index.disk import DiskKeyIndex
from lakestream.sink.index.keys import MISSING, pack, unpack
from lakestream.sink.index.store import IndexStore


def _check(index: DiskKeyIndex, model: dict[int, tuple[str, int]], universe: int) -> None:
    probe = np.arange(universe, dtype=np.int64)
    got = index.lookup(probe)
    fids, pos = unpack(got)
    for k in range(universe):
        want = model.get(k)
        if want is None:
            assert got[k] == MISSING, k
        else:
            assert (index.paths[int(fids[k])], int(pos[k])) == want, k
    assert len(index) == len(model)


def test_bucketed_index_matches_a_dict_through_merges_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_index, "BUCKET_ROWS", 64)  # many buckets, and splits as the index grows
    monkeypatch.setattr(disk_index, "MIN_MERGE", 50)
    rng = random.Random(7)
    universe = 1200
    index = DiskKeyIndex(False, ["id"], "u")
    index.snapshot_id, index.valid = 1, True
    store = IndexStore(str(tmp_path / "store"))
    model: dict[int, tuple[str, int]] = {}
    files = 0
    for commit in range(60):
        snapshot = commit + 2
        if commit % 17 == 16 and model:  # a compaction-like diff: one file's rows are forgotten
            victim = rng.choice(sorted({v[0] for v in model.values()}))
            index.forget_files([index.known_file_id(victim)])
            model = {k: v for k, v in model.items() if v[0] != victim}
        files += 1
        path = f"file-{files}"
        keys = sorted(rng.sample(range(universe), rng.randint(1, 80)))
        locs, n = [], 0
        for k in keys:
            if rng.random() < 0.2:
                locs.append(MISSING)
                model.pop(k, None)
            else:
                locs.append(pack(np.array([index.file_id(path)]), np.array([n]))[0])
                model[k] = (path, n)
                n += 1
        index.update(np.array(keys, np.int64), np.array(locs, np.int64))
        index.snapshot_id = snapshot
        store.persist(index)
        if commit % 10 == 9:
            _check(index, model, universe)
            reloaded = IndexStore(str(tmp_path / "store")).load(DiskKeyIndex(False, ["id"], "u"))
            assert reloaded is not None and reloaded.snapshot_id == snapshot
            _check(reloaded, model, universe)
    store.finish_merge(index, wait=True)
    assert index.bits > 1 and len(index.runs) > 2  # the base really is bucketed
    assert store.base_seq is not None and store.base_seq > 1  # merges happened
    _check(index, model, universe)


def test_a_merge_beside_the_batches_never_holds_a_commit_and_loses_nothing(tmp_path, monkeypatch):
    """The overlay's merge into a new generation runs on a thread: commits go on writing deltas meanwhile, a
    restart in the middle loads the old base and every delta, and the index adopts the new generation later
    with only the keys updated since in its overlay."""
    import threading

    from lakestream.sink.index import store as index_store

    release = threading.Event()
    real_merge = disk_index.merge_generation

    def held_merge(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # the first base is written in line
            assert release.wait(30)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(disk_index, "merge_generation", held_merge)
    monkeypatch.setattr(index_store, "MAX_DELTAS", 4)
    index = DiskKeyIndex(False, ["id"], "u")
    index.snapshot_id, index.valid = 1, True
    store = IndexStore(str(tmp_path / "store"))
    model: dict[int, tuple[str, int]] = {}
    rng = random.Random(3)
    touched: set[int] = set()

    def commit(n: int) -> None:
        path = f"file-{n}"
        keys = sorted(rng.sample(range(300), 40))
        touched.update(keys)
        locs = []
        for i, k in enumerate(keys):
            if rng.random() < 0.2:
                locs.append(MISSING)
                model.pop(k, None)
            else:
                locs.append(pack(np.array([index.file_id(path)]), np.array([i]))[0])
                model[k] = (path, i)
        index.update(np.array(keys, np.int64), np.array(locs, np.int64))
        index.snapshot_id = n + 1
        store.persist(index)

    for n in range(1, 6):
        commit(n)  # the first writes a base; the fifth starts a merge (4 deltas)
    assert store.merge is not None and not store.merge.done.is_set()
    first_generation = index.generation
    touched.clear()
    for n in range(6, 12):
        commit(n)  # the merge is held: these commits write deltas and return
    assert index.generation == first_generation
    during = IndexStore(str(tmp_path / "store")).load(DiskKeyIndex(False, ["id"], "u"))
    assert during is not None and during.snapshot_id == 12
    _check(during, model, 300)
    release.set()
    store.finish_merge(index, wait=True)
    assert index.generation != first_generation and store.base_seq is not None
    assert set(index.ov_keys.tolist()) == touched  # only the keys updated since the merge began stay
    _check(index, model, 300)
    commit(12)
    after = IndexStore(str(tmp_path / "store")).load(DiskKeyIndex(False, ["id"], "u"))
    assert after is not None and after.snapshot_id == 13 and after.generation == index.generation
    _check(after, model, 300)


def test_adopting_a_merge_leaves_deleting_the_old_generation_to_a_thread(tmp_path, monkeypatch):
    """The batch that adopts a merge writes the new base and switches to it; deleting the generation it replaced
    (1.5 GB at 100M keys: 0.45-1 s) and the deltas the base covers happens on a thread at a lower priority."""
    import os
    import threading

    from lakestream.sink.index import store as index_store

    monkeypatch.setattr(index_store, "MAX_DELTAS", 2)
    index = DiskKeyIndex(False, ["id"], "u")
    index.snapshot_id, index.valid = 1, True
    store = IndexStore(str(tmp_path / "store"))
    for n in range(1, 4):  # a base, two deltas, then a merge into a new generation
        index.update(np.array([n], np.int64), pack(np.array([index.file_id(f"file-{n}")]), np.array([0])))
        index.snapshot_id = n + 1
        store.persist(index)
    assert store.merge is not None
    old_generation = index.generation
    release, deleting = threading.Event(), []

    class HeldDeletes:  # the store's filesystem, with its deletes held until released
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def delete_dir(self, path):
            deleting.append((path, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            assert release.wait(30)
            self.fs.delete_dir(path)

    store.fs = HeldDeletes(store.fs)
    store.finish_merge(index, wait=True)  # returns while the old generation's delete is held
    assert index.generation != old_generation and store.collecting is not None
    assert store.collecting.is_alive()
    assert os.path.isdir(tmp_path / "store" / old_generation)
    release.set()
    store.collecting.join(30)
    assert [p.rsplit("/", 1)[1] for p, _ in deleting] == [old_generation]
    assert not os.path.exists(tmp_path / "store" / old_generation)
    assert deleting[0][1] >= 10  # at a lower priority than the batches
    assert sorted(os.listdir(tmp_path / "store")) == sorted([index.generation, f"base-{store.base_seq:012d}.json"])
    reloaded = IndexStore(str(tmp_path / "store")).load(DiskKeyIndex(False, ["id"], "u"))
    assert reloaded is not None and reloaded.snapshot_id == 4 and len(reloaded) == 3


def test_hashed_keys_bucket_the_same_everywhere(tmp_path):
    import pyarrow as pa

    from lakestream.sink.index.keys import index_keys

    keys = index_keys(pa.table({"a": [f"k{i}" for i in range(1000)], "b": ["x"] * 1000}), ["a", "b"])
    buckets = disk_index.bucket_of(keys, 4)
    assert set(buckets.tolist()) == set(range(16))
    assert np.array_equal(disk_index.bucket_of(keys.copy(), 4), buckets)


def test_merge_sorted_applies_replacements_inserts_and_tombstones_like_a_dict():
    rng = np.random.default_rng(7)
    for dtype in (np.int64, np.dtype("S16")):
        for base_n, ov_n in ((0, 50), (2_000, 0), (2_000, 300), (50, 2_000)):
            pool = rng.choice(10_000, base_n + ov_n, replace=False).astype(np.int64)
            base_keys = np.sort(rng.choice(pool, base_n, replace=False))
            ov_keys = np.sort(rng.choice(pool, ov_n, replace=False))  # some in the base, some new
            base_locs = rng.integers(0, 1 << 40, base_n)
            ov_locs = rng.integers(0, 1 << 40, ov_n)
            ov_locs[rng.random(ov_n) < 0.2] = MISSING  # tombstones, of known and of unknown keys
            if dtype != np.int64:
                base_keys, ov_keys = np.sort(base_keys.astype(dtype)), np.sort(ov_keys.astype(dtype))
            want = dict(zip(base_keys.tolist(), base_locs.tolist(), strict=True))
            for k, v in zip(ov_keys.tolist(), ov_locs.tolist(), strict=True):
                if v == MISSING:
                    want.pop(k, None)
                else:
                    want[k] = v
            keys, locs = disk_index.merge_sorted(base_keys, base_locs, ov_keys, ov_locs)
            assert keys.tolist() == sorted(want)
            assert locs.tolist() == [want[k] for k in sorted(want)]


def test_a_merge_waits_while_a_maintenance_round_runs_beside_the_batches(tmp_path, monkeypatch):
    """One heavy job beside the batches at a time: while the slot is taken (an inline round) a merge that is
    due is left for a later commit, unless the overlay is past twice its threshold; the merge then holds
    the slot until it ends."""
    from lakestream import beside
    from lakestream.sink.index import store as index_store

    monkeypatch.setattr(disk_index, "MIN_MERGE", 20)
    monkeypatch.setattr(index_store, "MAX_DELTAS", 1000)
    index = DiskKeyIndex(False, ["id"], "u")
    index.snapshot_id, index.valid = 1, True
    store = IndexStore(str(tmp_path / "store"))
    store.persist(index)  # the first base
    rng = random.Random(5)

    def commit(n: int, count: int) -> None:
        keys = np.array(sorted(rng.sample(range(10_000), count)), np.int64)
        index.update(keys, pack(np.full(count, index.file_id(f"file-{n}"), np.int64), np.arange(count)))
        index.snapshot_id = n + 1
        store.persist(index)

    assert beside.take_slot()  # a round runs
    try:
        commit(1, 25)  # past the threshold (20): due, but the slot is taken
        assert index.wants_merge() and store.merge is None
        commit(2, 10)  # still not past twice the threshold
        assert store.merge is None
        commit(3, 30)  # past 40: merged now, beside the round, without taking the slot
        assert store.merge is not None
        store.finish_merge(index, wait=True)
        assert beside.slot_taken()  # still the round's
    finally:
        beside.release_slot()
    commit(4, 25)
    assert store.merge is not None
    store.finish_merge(index, wait=True)
    assert not beside.slot_taken()  # the merge released it at its end
    assert not index.wants_merge()


def test_opening_a_generation_asks_the_kernel_to_read_it_ahead(tmp_path, monkeypatch):
    """A cold page cache made the first batch after a start read the index page by page (14 s at 100M keys):
    opening a generation starts a sequential readahead of every bucket file."""
    import os
    import threading

    advised: list[str] = []
    done = threading.Event()

    def record(fd, offset, length, advice):
        advised.append(os.readlink(f"/proc/self/fd/{fd}"))
        assert advice == os.POSIX_FADV_WILLNEED and (offset, length) == (0, 0)
        if len(advised) == 4:
            done.set()

    monkeypatch.setattr(os, "posix_fadvise", record)
    index = DiskKeyIndex(False, ["id"], "u")
    index.snapshot_id, index.valid = 1, True
    keys = np.arange(0, 6_000_000, 2, dtype=np.int64)  # two buckets
    index.update(keys, pack(np.zeros(len(keys), np.int64), np.arange(len(keys))))
    store = IndexStore(str(tmp_path / "store"))
    store.persist(index)  # writes a generation and maps it
    assert done.wait(10), advised
    assert sorted(os.path.basename(p) for p in advised) == sorted(
        f"bucket-{b:05d}.{part}.npy" for b in index.runs for part in ("keys", "locs")
    )
