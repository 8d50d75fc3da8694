"""The re-snapshot's window of the table topic (`TopicWindow`): which keys the stream changed between the
low mark and the pipeline's committed offsets, each key's last operation, and whether row events below
the high mark are still unapplied. Pure units, plus one read of a topic that does not exist yet."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa

from lakestream.snapshot.resnapshot import TopicWindow


def _window(events: dict[int, list[tuple[int, int, bool]]], truncates: dict[int, list[int]] | None = None):
    """A window holding ``events``: partition → [(offset, key, is_delete)] (a tombstone is simply absent)."""
    w = TopicWindow({}, "t", {p: 0 for p in events}, ["id"], {"id": pa.int64()}, decoder=None)
    for p, evs in events.items():
        w.next[p] = max(o for o, _, _ in evs) + 1
        w.offsets[p] = [np.array([o for o, _, _ in evs], np.int64)]
        w.keys[p] = [np.array([k for _, k, _ in evs], np.int64)]
        w.deletes[p] = [np.array([d for _, _, d in evs], bool)]
    w.truncates = truncates or {}
    return w


def test_changed_keys_are_the_applied_ones_with_their_last_operation():
    w = _window(
        {
            0: [(10, 1, False), (11, 2, False), (12, 1, True), (13, 3, True), (15, 3, False), (16, 4, True)],
            1: [(5, 7, True), (6, 7, False), (9, 8, False)],
        }
    )
    keys, deleted = w.changed_keys({0: 16, 1: 9})  # offset 16 of partition 0 and 9 of partition 1 not applied
    got = dict(zip(keys.tolist(), deleted.tolist(), strict=True))
    assert got == {1: True, 2: False, 3: False, 7: False}
    assert w.changed_keys({0: 0, 1: 0}) is None


def test_rows_pending_below_the_high_mark_only():
    w = _window({0: [(10, 1, False), (14, 2, False)]})
    assert w.rows_pending({0: 14}, {0: 15})  # offset 14 is a row event, not yet applied
    assert not w.rows_pending({0: 15}, {0: 20})  # 15..19: tombstones only
    assert not w.rows_pending({0: 11}, {0: 14})  # 14 is past the high mark: after the snapshot
    t = _window({0: [(10, 1, False)]}, truncates={0: [12]})
    assert t.rows_pending({0: 11}, {0: 13}) and not t.truncated_before({0: 12}) and t.truncated_before({0: 13})


def test_a_topic_not_created_yet_reads_as_empty(stack):
    w = TopicWindow(
        {"bootstrap.servers": stack.bootstrap_servers, "group.id": "resnapshot-window-test"},
        f"absent.{uuid.uuid4().hex[:8]}",
        {0: 0},
        ["id"],
        {"id": pa.int64()},
        decoder=None,
    )
    assert w.read_to_end([0]) == {0: 0}
    assert w.changed_keys({0: 0}) is None
