"""The commit of a compaction written beside ingestion (`lakestream.maintenance.compaction`), made by the
pipeline between two batches: the rows deleted in the inputs since the rewrite read them are carried onto
the new files, and the key index moves with the rows — no diff to read, no conflict to retry.

Row ``p`` of input ``i`` (not deleted at the start snapshot S0) is row ``offset(i) + p - d`` of the output,
where ``offset(i)`` counts the live rows of the inputs before it and ``d`` the positions deleted in input
``i`` before ``p`` at S0. The inputs' deletion vectors only grow between S0 and now (a batch adds to a
file's DV; a delete-file rewrite keeps its positions), so the positions deleted since are their
difference.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lakestream.faults import pause_point
from lakestream.sink.commit.tables import StaleIndex
from lakestream.sink.index.keys import pack

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.sink.commit.tables import TableWrite
    from lakestream.sink.index.contract import KeyedIndex

log = logging.getLogger(__name__)

# A commit property marking the snapshot as the pipeline's own compaction.
COMPACTION_PROPERTY = "lakestream.compaction"
# Rows per group whose index entry is checked against the row the rewrite copied (a sample: a full check
# costs a lookup of every moved key in the base, seconds for millions of rows).
CHECK_SAMPLE = 2000


@dataclass(frozen=True)
class RewriteCommit:
    """What a compaction's commit did."""

    snapshot_id: int | None
    files_removed: int
    files_added: int
    rows_moved: int  # index entries moved to the new files
    deletes_carried: int  # rows deleted in the inputs since the rewrite read them
    dropped_groups: int  # groups not committed (an input no longer live, a DV that shrank)
    timings_s: dict[str, float] = field(default_factory=dict)  # the commit's steps, in order


@dataclass
class RewriteGroup:
    """Data files whose live rows become one new data file (all of one partition): what a compaction
    (`lakestream.maintenance.compaction`) writes and this commit takes."""

    inputs: list[str]
    records: list[int]  # rows of each input
    deleted: list[np.ndarray]  # sorted positions deleted in each input at the start snapshot
    bytes: int = 0
    output: dict[str, Any] | None = None  # {path, file_size, record_count} once written
    keys: np.ndarray | None = None  # the output rows' index keys, by position
    # Each input's (first_row_id, data sequence number): its rows' lineage where the file holds none (format v3).
    lineage: list[tuple[int | None, int | None]] = field(default_factory=list)

    @property
    def live_rows(self) -> int:
        return sum(r - len(d) for r, d in zip(self.records, self.deleted, strict=True))

    def written(self) -> tuple[dict[str, Any], np.ndarray]:
        """The output file and its rows' keys of a group the compaction has written."""
        if self.output is None or self.keys is None:
            raise RuntimeError(f"the rewrite of {self.inputs[:3]} has not been written")
        return self.output, self.keys


def carried_deletes(group: RewriteGroup, now: dict[str, np.ndarray]) -> np.ndarray | None:
    """Positions in the output of the rows deleted in the inputs since S0 (``now``: each input's
    positions deleted at the current snapshot); None when an input's deletes are not a superset of S0's."""
    out = []
    offset = 0
    for path, records, d0 in zip(group.inputs, group.records, group.deleted, strict=True):
        current = now[path]
        new = np.setdiff1d(current, d0, assume_unique=True)
        if len(np.setdiff1d(d0, current, assume_unique=True)):
            return None  # a row deleted at S0 came back: not a state a rewrite can carry over
        out.append(offset + new - np.searchsorted(d0, new))
        offset += records - len(d0)
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _old_locations(group: RewriteGroup, file_ids: list[int]) -> np.ndarray:
    """The packed location each output row had before the rewrite (input file id, position)."""
    parts = []
    for fid, records, d0 in zip(file_ids, group.records, group.deleted, strict=True):
        keep = np.ones(records, bool)
        keep[d0] = False
        positions = np.flatnonzero(keep).astype(np.int64)
        parts.append(pack(np.full(len(positions), fid, np.int64), positions))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def commit_rewrite(spark: SparkSession, write: TableWrite, written: list[RewriteGroup]) -> RewriteCommit:
    """Commit the groups a compaction has ``written`` on the table of ``write`` (its index valid at the table's
    current snapshot); raises `StaleIndex` when the table moved past the index (refresh, then call again)."""
    from lakestream.sink.catalog.sink import commit_rewrite_groups, deleted_positions

    index = write.keyed_index
    if index is None:
        raise TypeError(f"{write.ident}: the pipeline commits compactions of tables kept by key only")
    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(step: str) -> None:
        now_ = time.perf_counter()
        timings[step] = round(timings.get(step, 0.0) + now_ - clock[0], 3)
        clock[0] = now_

    inputs = [p for g in written for p in g.inputs]
    now = deleted_positions(spark, write.catalog, write.name.namespace, write.name.table, inputs)
    lap("deleted_positions")
    if now["snapshot_id"] != index.snapshot_id:
        index.valid = False
        raise StaleIndex(f"{write.ident} is at snapshot {now['snapshot_id']}, its key index at {index.snapshot_id}")
    groups, carried, dropped = _carry_deletes(written, now)
    lap("carry_deletes")
    if not groups:
        return RewriteCommit(None, 0, 0, 0, 0, dropped, timings)
    request = _commit_request(index.snapshot_id, groups, carried)
    pause_point("maintenance.commit.before")
    result = commit_rewrite_groups(spark, write.catalog, write.name.namespace, write.name.table, request)
    lap("commit")
    for step, ms in (result.get("timings_ms") or {}).items():
        timings[f"commit.{step}"] = round(ms / 1000, 3)
    if result.get("stale"):
        index.valid = False
        raise StaleIndex(
            f"{write.ident} is at snapshot {result.get('snapshot_id')}, its key index at "
            f"{index.snapshot_id}: another writer committed in between"
        )

    def committed(moved: int) -> RewriteCommit:
        return RewriteCommit(
            result["snapshot_id"],
            int(result["removed_data_files"]),
            int(result["added_data_files"]),
            moved,
            int(sum(len(d) for d in carried)),
            dropped,
            timings,
        )

    if result.get("parent_snapshot_id") != index.snapshot_id:
        # Another writer committed in between (inside Iceberg's retry): the index is exact at its snapshot
        # and follows both snapshots by their diff.
        index.valid = False
        return committed(0)
    moves, samples, expected = _index_moves(index, groups, carried)
    if samples and not (index.lookup(np.concatenate(samples)) == np.concatenate(expected)).all():
        log.warning(
            "%s: rows of the compaction were not where the key index said; reading its diff instead", write.ident
        )
        index.valid = False
        return committed(0)
    lap("check_index")
    _move_index(index, moves)
    lap("move_index")
    index.snapshot_id = result["snapshot_id"]
    return committed(int(sum(len(m[0]) for m in moves)))


# One group's index move: its live rows' keys, the output file, and their positions in it.
_Move = tuple[np.ndarray, str, np.ndarray]


def _carry_deletes(
    written: list[RewriteGroup], now: dict[str, Any]
) -> tuple[list[RewriteGroup], list[np.ndarray], int]:
    """The groups that can still be committed, each with the positions deleted in its output since the rewrite
    read its inputs, and how many were dropped (an input no longer live, a DV that shrank; their files deleted)."""
    from lakestream.sink.write.files import delete_quietly

    missing = set(now["missing"])
    current = {p: np.asarray(f["positions"], np.int64) for p, f in now["files"].items()}
    groups, carried, dropped = [], [], 0
    for g in written:
        deletes = None if missing.intersection(g.inputs) else carried_deletes(g, current)
        if deletes is None:
            dropped += 1
            delete_quietly([g.written()[0]["path"]])  # never part of a commit; orphan removal would take days
            continue
        groups.append(g)
        carried.append(deletes)
    return groups, carried, dropped


def _commit_request(
    expect_snapshot_id: int | None, groups: list[RewriteGroup], carried: list[np.ndarray]
) -> dict[str, Any]:
    """The JVM's request for the commit of ``groups``, each with the deletes it carries."""
    return {
        "expect_snapshot_id": expect_snapshot_id,
        "groups": [
            {"inputs": g.inputs, "output": g.output, "deletes": d} for g, d in zip(groups, carried, strict=True)
        ],
        "properties": {COMPACTION_PROPERTY: "true"},
    }


def _index_moves(
    index: KeyedIndex, groups: list[RewriteGroup], carried: list[np.ndarray]
) -> tuple[list[_Move], list[np.ndarray], list[np.ndarray]]:
    """Each group's index move, and a sample of its keys with the locations the index should hold for them."""
    moves: list[_Move] = []
    samples, expected = [], []
    for g, deletes in zip(groups, carried, strict=True):
        output, all_keys = g.written()
        live = np.ones(output["record_count"], np.bool_)
        live[deletes] = False
        keys = all_keys[live]
        # Each live row's key must still name the row the rewrite copied (a key updated since S0 has its old
        # row deleted, so it is not live here): in a mirror a live row's key points at it, so a sample checks
        # that the rewrite read what the index describes.
        sample = (
            np.linspace(0, len(keys) - 1, min(len(keys), CHECK_SAMPLE)).astype(np.int64)
            if len(keys)
            else np.empty(0, np.int64)
        )
        samples.append(keys[sample])
        expected.append(_old_locations(g, [index.file_id(p) for p in g.inputs])[live][sample])
        moves.append((keys, output["path"], np.flatnonzero(live).astype(np.int64)))
    return moves, samples, expected


def _move_index(index: KeyedIndex, moves: list[_Move]) -> None:
    """Point the moved rows' keys at their places in the new files."""
    if moves:
        keys = np.concatenate([m[0] for m in moves])
        locations = np.concatenate(
            [pack(np.full(len(k), index.file_id(path), np.int64), positions) for k, path, positions in moves]
        )
        index.update(keys, locations)  # one sorted insert into the overlay


__all__ = ["COMPACTION_PROPERTY", "RewriteCommit", "RewriteGroup", "carried_deletes", "commit_rewrite"]
