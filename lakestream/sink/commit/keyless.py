"""The resolution of a keyless table's batch across tasks (driver side): the changes of every task in Kafka order,
each insert landing at the next copy of its content, each update or delete removing the newest copy of the row it
carries, re-sent events skipped by their source position (see `lakestream.sink.index.keyless`). Nothing changes
in the index until `apply_resolution` after the commit."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from lakestream.sink.index.keyless import POSITIONS_PROPERTY, KeylessIndex, copy_keys, encode_positions
from lakestream.sink.index.keys import MISSING, keys_from_arrow, pack, unpack
from lakestream.sink.report import KeylessOp, TableReport, is_keyless_report, kafka_order
from lakestream.source.kafka import TP

log = logging.getLogger(__name__)


@dataclass
class KeylessResolution:
    """What one batch does to a keyless table."""

    deletes: dict[str, list[int]]  # data file → positions to delete
    rows: tuple[np.ndarray, np.ndarray]  # copy keys → new packed locations (MISSING: gone)
    counts: tuple[np.ndarray, np.ndarray]  # content hashes → new copy counts
    positions: dict[TP, tuple[int, int, int]]
    seen_at: dict[TP, int]
    applied: int
    resent: int
    unmatched: int
    # (new row, committed row): an update's new row keeps the `_row_id` of the equal row it replaces
    kept: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)


def resolve_keyless(index: KeylessIndex, changes: TableReport) -> KeylessResolution:
    """Apply a batch's changes of a keyless table in Kafka order (see the module doc); nothing is changed
    in ``index`` until `apply_resolution` after the commit. After a TRUNCATE in the batch no earlier row
    survives (the commit removes every existing data file): its partition's changes before it only move
    the source position."""
    if changes.truncates:
        emptied = KeylessIndex(index.schema, index.table_uuid)
        emptied.positions, emptied.seen_at = dict(index.positions), dict(index.seen_at)
        emptied.rows.paths, emptied.rows._path_ids = index.rows.paths, index.rows._path_ids
        index = emptied
    paths: list[str] = []
    base: dict[str, int] = {}
    by_task: dict[str, dict[int, str]] = defaultdict(dict)
    for f in changes.files:
        by_task[f.task_id][f.task_file] = f.path
    for task_id, numbered in by_task.items():
        base[task_id] = len(paths)
        paths.extend(numbered.get(i, "") for i in range(max(numbered) + 1))
    parts = [loc.locations for loc in changes.locations if is_keyless_report(loc.locations)]
    task_files = []
    for loc in changes.locations:
        if is_keyless_report(loc.locations):
            tf = loc.locations.column("task_file").to_numpy()
            task_files.append(np.where(tf >= 0, base.get(loc.task_id, 0) + tf, -1))
    deletes: dict[str, list[int]] = defaultdict(list)
    if not parts:
        return KeylessResolution(
            {},
            (np.empty(0, "S16"), np.empty(0, np.int64)),
            (np.empty(0, "S16"), np.empty(0, np.int64)),
            dict(index.positions),
            dict(index.seen_at),
            0,
            0,
            0,
        )
    rows = pa.concat_tables(parts)
    files = np.concatenate(task_files)
    topics = rows.column("topic").to_pylist()
    order = kafka_order(topics, rows.column("partition").to_numpy(), rows.column("offset").to_numpy())
    ops = rows.column("op").to_numpy()
    zero = pa.scalar(b"\0" * 16, pa.binary(16))
    new_h = keys_from_arrow(rows.column("new_row").combine_chunks().fill_null(zero))
    old_h = keys_from_arrow(rows.column("old_row").combine_chunks().fill_null(zero))
    pos = rows.column("pos").to_numpy()
    parts_ = rows.column("partition").to_numpy()
    commit = rows.column("commit_lsn").to_numpy()
    lsn = rows.column("lsn").to_numpy()
    offsets = rows.column("offset").to_numpy()

    # Batch-local overlays over the index: copy key → (path, pos) or None; content → count.
    row_at: dict[bytes, tuple[str, int] | None] = {}
    count_of: dict[bytes, int] = {}
    contents = np.unique(np.concatenate([new_h, old_h]))
    stored_counts = dict(zip(contents.tolist(), index.counts.lookup(contents).tolist(), strict=True))

    def count(h: bytes) -> int:
        if h in count_of:
            return count_of[h]
        c = stored_counts.get(h, MISSING)
        return 0 if c == MISSING else int(c)

    def location(h: bytes, j: int) -> tuple[str, int] | None:
        key = copy_keys(np.array([h], "S16"), np.array([j]))[0]
        if key in row_at:
            return row_at[key]
        packed = index.rows.lookup(np.array([key], "S16"))[0]
        if packed == MISSING:
            return None
        fid, p = unpack(np.array([packed]))
        return index.rows.paths[int(fid[0])], int(p[0])

    positions = dict(index.positions)
    seen_at = dict(index.seen_at)
    # A row this batch wrote → the committed row whose identity it carries (None: a new row).
    origin: dict[tuple[str, int], tuple[str, int] | None] = {}
    applied = resent = unmatched = 0
    for i in order.tolist():
        tp = TP(topics[i], int(parts_[i]))
        here = (int(commit[i]), int(lsn[i]))
        stored = positions.get(tp)
        if stored is not None:
            at = (stored[0], stored[1])
            if here < at:
                seen_at[tp] = 0  # a re-send pass began before the stored position
                duplicate = True
            elif here == at and ops[i] in (KeylessOp.UPDATE, KeylessOp.DELETE):
                # An update or delete is a WAL record (a binlog row) of its own: one at the stored position is
                # that event again, a re-send that begins exactly at the last event applied.
                duplicate = True
            elif here == at:
                # Inserts share a position within one record (COPY's multi-row inserts) and snapshot rows share
                # the snapshot's: the first ``count`` of them seen again in a re-send pass are the ones applied.
                seen = seen_at.get(tp, stored[2])
                duplicate = seen < stored[2]
                seen_at[tp] = seen + 1
                if not duplicate:
                    positions[tp] = (at[0], at[1], stored[2] + 1)
            else:
                duplicate = False
        else:
            duplicate = False
        cut = changes.truncates.get(tp) if changes.truncates else None
        if duplicate:
            resent += 1
            if files[i] >= 0:
                deletes[paths[files[i]]].append(int(pos[i]))
            continue
        if stored is None or here > (stored[0], stored[1]):
            positions[tp] = (here[0], here[1], 1)
            seen_at[tp] = 1
        if cut is not None and offsets[i] < cut:
            if files[i] >= 0:
                deletes[paths[files[i]]].append(int(pos[i]))
            continue
        applied += 1
        carried = None
        if ops[i] in (KeylessOp.UPDATE, KeylessOp.DELETE):
            h = old_h[i]
            c = count(h)
            gone = location(h, c - 1) if c > 0 else None
            if gone is not None:
                carried = origin.get(gone, gone)
            if gone is None:
                unmatched += 1
            else:
                deletes[gone[0]].append(gone[1])
                row_at[copy_keys(np.array([h], "S16"), np.array([c - 1]))[0]] = None
                count_of[h] = c - 1
        if ops[i] in (KeylessOp.INSERT, KeylessOp.UPDATE) and files[i] >= 0:
            h = new_h[i]
            c = count(h)
            row_at[copy_keys(np.array([h], "S16"), np.array([c]))[0]] = (paths[files[i]], int(pos[i]))
            count_of[h] = c + 1
            origin[(paths[files[i]], int(pos[i]))] = carried if ops[i] == KeylessOp.UPDATE else None
    if unmatched:
        log.warning("%d update(s)/delete(s) of a keyless table found no equal row in the mirror", unmatched)
    row_keys_ = np.array(list(row_at), "S16") if row_at else np.empty(0, "S16")
    new_locs = np.array([MISSING if v is None else 0 for v in row_at.values()], np.int64)
    for g, v in enumerate(row_at.values()):
        if v is not None:
            new_locs[g] = pack(np.array([index.rows.file_id(v[0])]), np.array([v[1]]))[0]
    count_keys = np.array(list(count_of), "S16") if count_of else np.empty(0, "S16")
    counts = np.array([c if c > 0 else MISSING for c in count_of.values()], np.int64)
    live = {v for v in row_at.values() if v is not None}
    kept = [(new, old) for new, old in origin.items() if old is not None and new in live]
    return KeylessResolution(
        dict(deletes), (row_keys_, new_locs), (count_keys, counts), positions, seen_at, applied, resent, unmatched, kept
    )


def apply_resolution(index: KeylessIndex, resolved: KeylessResolution, truncated: bool = False) -> None:
    """Move the index to the state after the batch's commit."""
    if truncated:
        index.rows.keys, index.rows.locs = np.empty(0, "S16"), np.empty(0, np.int64)
        index.rows.delta_keys, index.rows.delta_locs = np.empty(0, "S16"), np.empty(0, np.int64)
        index.counts.reset()
    for keys, values, target in (
        (resolved.rows[0], resolved.rows[1], index.rows),
        (resolved.counts[0], resolved.counts[1], index.counts),
    ):
        if len(keys):
            order = np.argsort(keys, kind="stable")
            target.update(keys[order], values[order])
    index.positions = resolved.positions
    index.seen_at = resolved.seen_at


def positions_property(resolved: KeylessResolution) -> dict[str, str]:
    return {POSITIONS_PROPERTY: encode_positions(resolved.positions)}
