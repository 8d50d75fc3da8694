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
        index = _without_rows(index)
    events = _BatchEvents.read(changes)
    if events is None:
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
    overlay = _Overlay(index, np.unique(np.concatenate([events.new_h, events.old_h])))
    positions = dict(index.positions)
    seen_at = dict(index.seen_at)
    deletes: dict[str, list[int]] = defaultdict(list)
    # A row this batch wrote → the committed row whose identity it carries (None: a new row).
    origin: dict[tuple[str, int], tuple[str, int] | None] = {}
    applied = resent = unmatched = 0
    for i in events.order.tolist():
        tp = TP(events.topics[i], int(events.partitions[i]))
        written = events.written(i)
        if _advance_position(positions, seen_at, tp, events.position(i), events.ops[i]):
            resent += 1
            if written is not None:
                deletes[written[0]].append(written[1])
            continue
        cut = changes.truncates.get(tp) if changes.truncates else None
        if cut is not None and events.offsets[i] < cut:
            if written is not None:
                deletes[written[0]].append(written[1])
            continue
        applied += 1
        carried = None
        if events.ops[i] in (KeylessOp.UPDATE, KeylessOp.DELETE):
            gone = overlay.remove_newest(events.old_h[i])
            if gone is None:
                unmatched += 1
            else:
                deletes[gone[0]].append(gone[1])
                carried = origin.get(gone, gone)
        if events.ops[i] in (KeylessOp.INSERT, KeylessOp.UPDATE) and written is not None:
            overlay.add(events.new_h[i], written)
            origin[written] = carried if events.ops[i] == KeylessOp.UPDATE else None
    if unmatched:
        log.warning("%d update(s)/delete(s) of a keyless table found no equal row in the mirror", unmatched)
    live = overlay.live()
    kept = [(new, old) for new, old in origin.items() if old is not None and new in live]
    return KeylessResolution(
        dict(deletes), overlay.rows(), overlay.counts(), positions, seen_at, applied, resent, unmatched, kept
    )


def _without_rows(index: KeylessIndex) -> KeylessIndex:
    """An empty index with ``index``'s source positions and file ids: what a TRUNCATE in the batch leaves."""
    emptied = KeylessIndex(index.schema, index.table_uuid)
    emptied.positions, emptied.seen_at = dict(index.positions), dict(index.seen_at)
    emptied.rows.paths, emptied.rows._path_ids = index.rows.paths, index.rows._path_ids
    return emptied


@dataclass
class _BatchEvents:
    """The batch's keyless changes from every task, as columns, with the data file each written row went to."""

    topics: list[str]
    partitions: np.ndarray
    offsets: np.ndarray
    ops: np.ndarray
    new_h: np.ndarray  # the new row's content hash (zeros: none)
    old_h: np.ndarray  # the old row's content hash (zeros: none)
    pos: np.ndarray  # the written row's position in its file
    commit: np.ndarray
    lsn: np.ndarray
    files: np.ndarray  # index into ``paths`` of the file the row was written to (-1: none)
    paths: list[str]
    order: np.ndarray  # Kafka order

    @classmethod
    def read(cls, changes: TableReport) -> _BatchEvents | None:
        """The events of ``changes`` (None: it carries no keyless changes)."""
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
        if not parts:
            return None
        rows = pa.concat_tables(parts)
        topics = rows.column("topic").to_pylist()
        zero = pa.scalar(b"\0" * 16, pa.binary(16))
        return cls(
            topics,
            rows.column("partition").to_numpy(),
            rows.column("offset").to_numpy(),
            rows.column("op").to_numpy(),
            keys_from_arrow(rows.column("new_row").combine_chunks().fill_null(zero)),
            keys_from_arrow(rows.column("old_row").combine_chunks().fill_null(zero)),
            rows.column("pos").to_numpy(),
            rows.column("commit_lsn").to_numpy(),
            rows.column("lsn").to_numpy(),
            np.concatenate(task_files),
            paths,
            kafka_order(topics, rows.column("partition").to_numpy(), rows.column("offset").to_numpy()),
        )

    def position(self, i: int) -> tuple[int, int]:
        """Event ``i``'s source position: (commit LSN, LSN)."""
        return int(self.commit[i]), int(self.lsn[i])

    def written(self, i: int) -> tuple[str, int] | None:
        """The (data file, position) event ``i``'s row was written to, if it wrote one."""
        if self.files[i] < 0:
            return None
        return self.paths[self.files[i]], int(self.pos[i])


def _advance_position(
    positions: dict[TP, tuple[int, int, int]], seen_at: dict[TP, int], tp: TP, here: tuple[int, int], op: int
) -> bool:
    """Move ``tp``'s stored source position to the event at ``here``; True when the event is a re-send of one
    applied already (the position stays)."""
    stored = positions.get(tp)
    if stored is not None:
        at = (stored[0], stored[1])
        if here < at:
            seen_at[tp] = 0  # a re-send pass began before the stored position
            return True
        if here == at and op in (KeylessOp.UPDATE, KeylessOp.DELETE):
            # An update or delete is a WAL record (a binlog row) of its own: one at the stored position is
            # that event again, a re-send that begins exactly at the last event applied.
            return True
        if here == at:
            # Inserts share a position within one record (COPY's multi-row inserts) and snapshot rows share
            # the snapshot's: the first ``count`` of them seen again in a re-send pass are the ones applied.
            seen = seen_at.get(tp, stored[2])
            seen_at[tp] = seen + 1
            if seen < stored[2]:
                return True
            positions[tp] = (at[0], at[1], stored[2] + 1)
            return False
    positions[tp] = (here[0], here[1], 1)
    seen_at[tp] = 1
    return False


class _Overlay:
    """The batch's changes over the index, before they are applied: copy key → (path, pos) or None (gone),
    content → copy count."""

    def __init__(self, index: KeylessIndex, contents: np.ndarray):
        self.index = index
        self.row_at: dict[bytes, tuple[str, int] | None] = {}
        self.count_of: dict[bytes, int] = {}
        self.stored_counts = dict(zip(contents.tolist(), index.counts.lookup(contents).tolist(), strict=True))

    def count(self, h: bytes) -> int:
        """How many copies of content ``h`` there are."""
        if h in self.count_of:
            return self.count_of[h]
        c = self.stored_counts.get(h, MISSING)
        return 0 if c == MISSING else int(c)

    def location(self, h: bytes, j: int) -> tuple[str, int] | None:
        """Where copy ``j`` of content ``h`` is (None: nowhere)."""
        key = copy_keys(np.array([h], "S16"), np.array([j]))[0]
        if key in self.row_at:
            return self.row_at[key]
        packed = self.index.rows.lookup(np.array([key], "S16"))[0]
        if packed == MISSING:
            return None
        fid, p = unpack(np.array([packed]))
        return self.index.rows.paths[int(fid[0])], int(p[0])

    def remove_newest(self, h: bytes) -> tuple[str, int] | None:
        """Remove the newest copy of content ``h``; where it was (None: there is none)."""
        c = self.count(h)
        gone = self.location(h, c - 1) if c > 0 else None
        if gone is not None:
            self.row_at[copy_keys(np.array([h], "S16"), np.array([c - 1]))[0]] = None
            self.count_of[h] = c - 1
        return gone

    def add(self, h: bytes, at: tuple[str, int]) -> None:
        """A new copy of content ``h``, written at ``at``."""
        c = self.count(h)
        self.row_at[copy_keys(np.array([h], "S16"), np.array([c]))[0]] = at
        self.count_of[h] = c + 1

    def live(self) -> set[tuple[str, int]]:
        """The rows the batch wrote or moved that stay."""
        return {v for v in self.row_at.values() if v is not None}

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Copy keys → new packed locations (MISSING: gone)."""
        row_keys = np.array(list(self.row_at), "S16") if self.row_at else np.empty(0, "S16")
        new_locs = np.array([MISSING if v is None else 0 for v in self.row_at.values()], np.int64)
        for g, v in enumerate(self.row_at.values()):
            if v is not None:
                new_locs[g] = pack(np.array([self.index.rows.file_id(v[0])]), np.array([v[1]]))[0]
        return row_keys, new_locs

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Content hashes → new copy counts (MISSING: none left)."""
        count_keys = np.array(list(self.count_of), "S16") if self.count_of else np.empty(0, "S16")
        counts = np.array([c if c > 0 else MISSING for c in self.count_of.values()], np.int64)
        return count_keys, counts


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
