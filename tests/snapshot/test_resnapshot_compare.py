"""What a re-snapshot's commit leaves alone (`lakestream.snapshot.compare`): chunk rows matched against the mirror's
by key and content digest, or by content copies for a table without a key. Pure units."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lakestream.sink.index.keyless import KeylessIndex, copy_keys
from lakestream.sink.index.keys import pack, row_keys
from lakestream.snapshot.compare import NO_ROW, MirrorRows, match_keyed, match_keyless

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _digests(ids: list[int], values: list[str]) -> np.ndarray:
    return row_keys(pa.table({"id": ids, "v": values}, schema=SCHEMA), SCHEMA)


def _mirror(ids: list[int], values: list[str]) -> MirrorRows:
    """A mirror of one data file holding ``ids`` at positions 0.. (sorted by key, as a scan leaves it)."""
    mirror = MirrorRows(["id"], False, SCHEMA)
    keys = np.array(ids, np.int64)
    order = np.argsort(keys, kind="stable")
    mirror.keys = keys[order]
    mirror.locs = pack(np.zeros(len(ids), np.int64), np.arange(len(ids)))[order]
    mirror.digests = _digests(ids, values)[order]
    mirror.paths = ["mirror.parquet"]
    return mirror


def test_equal_rows_stay_changed_rows_replace_their_key_new_rows_come_in():
    # Mirror: 1 equal, 2 drifted, 3 only in the mirror, 4 twice (by hand), 5 equal but the stream changed it.
    mirror = _mirror([1, 2, 3, 4, 4, 5], ["a", "drift", "gone", "d", "d", "e"])
    window = np.array([5, 7], np.int64)
    keep = np.isin(mirror.keys, window)  # the window keeps the stream's row of 5
    # Two chunk files: (1, 2, 6) and (4, 5, 7); 6 is new, 7 is a window key the mirror does not hold.
    files_keys = [np.array([1, 2, 6], np.int64), np.array([4, 5, 7], np.int64)]
    files_digests = [_digests([1, 2, 6], ["a", "b", "f"]), _digests([4, 5, 7], ["d", "e2", "g"])]
    match = match_keyed(mirror, keep, window, files_keys, files_digests)
    kept = set(mirror.keys[match.keep].tolist())
    assert kept == {1, 5}  # 2 drifted, 3 vanished, both copies of 4 go
    assert [d.tolist() for d in match.drop] == [[0], [1, 2]]  # 1 equal; 5 and 7 are the stream's
    replaced = [r.tolist() for r in match.replaces]
    at = {p: int(pack(np.zeros(1, np.int64), np.array([p]))[0]) for p in range(6)}  # position -> location
    assert replaced[0] == [NO_ROW, at[1], NO_ROW]  # 2 replaces the mirror's row 2, 6 is new
    assert replaced[1][0] in (at[3], at[4]) and replaced[1][1:] == [NO_ROW, NO_ROW]  # 4: one of its copies
    assert (match.unchanged, match.updated) == (1, 2)


def test_an_empty_mirror_takes_every_row_as_new():
    mirror = MirrorRows(["id"], False, SCHEMA)
    keys = [np.array([1, 2], np.int64)]
    match = match_keyed(mirror, np.zeros(0, bool), np.empty(0, np.int64), keys, [_digests([1, 2], ["a", "b"])])
    assert match.drop[0].tolist() == [] and match.replaces[0].tolist() == [NO_ROW, NO_ROW]
    assert (match.unchanged, match.updated) == (0, 0)


def test_keyless_copies_are_matched_one_for_one():
    content = pa.schema([("v", pa.string())])

    def hashes(values: list[str]) -> np.ndarray:
        return row_keys(pa.table({"v": values}, schema=content), content)

    # Mirror: a twice, b once, c once (the stream touched c), x once (gone from the source).
    rows = ["a", "a", "b", "c", "x"]
    h = hashes(rows)
    ordinals = np.array([0, 1, 0, 0, 0])
    mirror = KeylessIndex(content)
    keys = copy_keys(h, ordinals)
    order = np.argsort(keys, kind="stable")
    mirror.rows.keys, mirror.rows.locs = keys[order], pack(np.zeros(5, np.int64), np.arange(5))[order]
    window = hashes(["c"])
    keep = np.isin(mirror.rows.keys, copy_keys(window, np.zeros(1)))
    # Source: a three times (one more), b once, c twice (the stream's copies stay), d once (new).
    chunk = [hashes(["a", "b", "c"]), hashes(["a", "c", "a", "d"])]
    match = match_keyless(mirror, keep, window, chunk)
    kept_positions = sorted((mirror.rows.locs[match.keep] & 0xFFFFFFFF).tolist())
    assert kept_positions == [0, 1, 2, 3]  # both a, b, and c (the window's); x goes
    dropped = [d.tolist() for d in match.drop]
    assert dropped[0] == [0, 1, 2]  # a (equal to a mirror copy), b (equal), c (the window's)
    assert dropped[1] == [
        0,
        1,
    ]  # the second a (equal to the mirror's second copy), c the window's; the third a and d come in
    assert match.unchanged == 3 and all((r == NO_ROW).all() for r in match.replaces)
