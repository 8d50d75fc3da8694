"""The latest change per key and its TOAST fills: one rule for the write tasks and fresh reads (pure units)."""

import numpy as np
import pyarrow as pa

from lakestream.config import StreamSettings
from lakestream.read.fresh import Tail, apply_tail
from lakestream.sink.write.latest import STORED, first_per_key, last_per_key, latest_per_key


def test_the_last_change_of_each_key_wins_in_the_given_order():
    keys = np.array([1, 2, 1, 3, 2], dtype=np.int64)
    order = np.array([0, 1, 2, 3, 4])
    assert last_per_key(keys, order) == [2, 3, 4]
    # the order is Kafka order, not row order: row 2 comes before row 0 here
    assert last_per_key(keys, np.array([2, 0, 1, 3, 4])) == [0, 3, 4]
    assert first_per_key([1, 2, 1, 3, 2], [0, 1, 2, 3, 4]) == [0, 1, 3]
    final, fills = latest_per_key([1, 2, 1, 3, 2], ["c", "c", "u", "c", "d"], [[]] * 5, [0, 1, 2, 3, 4])
    assert (final, fills) == ([2, 3, 4], {})


def test_a_withheld_value_comes_from_the_change_that_carried_it_or_the_stored_row():
    keys = ["a", "a", "a", "b"]
    ops = ["u", "u", "u", "u"]
    withheld = [[], ["doc"], ["doc", "blob"], ["doc"]]
    final, fills = latest_per_key(keys, ops, withheld, [0, 1, 2, 3])
    assert final == [2, 3]
    # row 1 takes doc from row 0; row 2 follows row 1's source for doc, and blob (carried by row 1) from row 1
    assert fills == {1: {"doc": 0}, 2: {"doc": 0, "blob": 1}, 3: {"doc": STORED}}


def test_nothing_is_taken_from_before_a_delete():
    final, fills = latest_per_key(["a", "a", "a"], ["u", "d", "c"], [[], [], ["doc"]], [0, 1, 2])
    assert final == [2] and fills == {}
    # a delete's own withheld columns are never filled (it writes no row)
    assert latest_per_key(["a"], ["d"], [["doc"]], [0]) == ([0], {})


def test_a_fresh_read_fills_from_the_tail_and_from_the_snapshot():
    schema = pa.schema([("id", pa.int64()), ("doc", pa.string()), ("n", pa.int64())])
    snapshot = pa.table({"id": [1, 2], "doc": ["s1", "s2"], "n": [10, 20]}, schema=schema)
    tail_rows = pa.table({"id": [1, 2, 2, 3], "doc": [None, "t2", None, "t3"], "n": [11, 21, 22, 30]}, schema=schema)
    tail = Tail(tail_rows, ["u", "u", "u", "c"], [(1,), (2,), (2,), (3,)], [["doc"], [], ["doc"], []])
    out = apply_tail(snapshot, tail, StreamSettings(topics=["t"], table="ns.t"), ["id"])
    got = sorted(out.to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": 1, "doc": "s1", "n": 11}, {"id": 2, "doc": "t2", "n": 22}, {"id": 3, "doc": "t3", "n": 30}]
