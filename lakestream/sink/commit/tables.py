"""The driver side of the sink: turn what the write tasks reported for a table into one Iceberg
snapshot holding the new data files, the deletion vectors for replaced and deleted rows, and the
Kafka offsets the table consumed.

For an upsert table, every change reported by the tasks is placed in Kafka order; the last change
of each key wins. Its previous row, found through the key index (`lakestream.sink.index`), and any
earlier row of the same key written by another task in this batch, are deleted by position. The
index is then moved to the new rows. Nothing here reads the table: the cost follows the changes.

A TRUNCATE in the batch removes every data file the table holds (one snapshot, together with the
batch's new rows), and the batch's own changes that came before it in their partition are deleted
too; changes after it apply as usual.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson
import pyarrow as pa

from lakestream.laps import Laps
from lakestream.sink.index.contract import KeyedIndex
from lakestream.sink.index.keyless import KeylessIndex
from lakestream.sink.index.keys import MISSING, keys_from_arrow, unpack
from lakestream.sink.report import KeyedOp, TableReport, kafka_order

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.identifiers import TableName
    from lakestream.sink.catalog.sink import CommitRequest, CommitResult, DataFileEntry
    from lakestream.sink.spec import TableSpec
    from lakestream.source.kafka import TP

log = logging.getLogger(__name__)


# What a table commit did: resolved changes by key (a mirror or a multiset), de-duplicated appends, appends.
CommitKind = Literal["upsert", "dedupe-append", "append"]


@dataclass(frozen=True)
class TableCommit:
    """What one table's commit did: the kind of write and the row changes it applied (keys upserted
    or deleted after the latest change per key won; rows appended)."""

    kind: CommitKind
    changes: int
    source_ts_ms: int | None = None  # the newest source change it carries (set by Pipeline.commit_table)
    # Where the commit's time went, in ms, in order: the key index lookup ("resolve"), the JVM's own steps
    # ("jvm.<step>"), moving the index ("index_update"); the engine adds its steps around them.
    timings_ms: dict[str, float] = field(default_factory=dict)


class StaleIndex(Exception):
    """The table moved on since its key index was valid: nothing was committed; refresh and retry."""


@dataclass
class TableWrite:
    """One table's share of a batch, ready to commit."""

    ident: str  # quoted catalog.namespace.table
    catalog: str
    name: TableName
    spec: TableSpec
    index: KeyedIndex | KeylessIndex | None  # upsert and de-duplicated tables

    @property
    def mode(self) -> str:
        return self.spec.mode

    @property
    def keyed_index(self) -> KeyedIndex | None:
        """The index of a table kept by key (a mirror, a de-duplicated append); None for the others."""
        index = self.index
        return None if index is None or isinstance(index, KeylessIndex) else index

    @property
    def keyless_index(self) -> KeylessIndex:
        """The index of a table without a primary key (a multiset)."""
        if not isinstance(self.index, KeylessIndex):
            raise TypeError(f"{self.ident} has no keyless index")
        return self.index


class Deletes:
    """Positions to delete, per data file path, gathered as arrays."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = defaultdict(list)

    def add(self, path: str, positions: np.ndarray | list[int]) -> None:
        self._parts[path].append(np.asarray(positions, np.int64))

    def add_grouped(self, file_ids: np.ndarray, positions: np.ndarray, names: list[str]) -> None:
        """Rows ``positions`` of data files ``names[file_ids]``, grouped by file in one sort (a batch of random
        keys names thousands of files, one or two rows each)."""
        if len(file_ids) == 0:
            return
        order = np.lexsort((positions, file_ids))
        fids, pos = np.asarray(file_ids)[order], np.asarray(positions, np.int64)[order]
        starts = np.flatnonzero(np.r_[True, fids[1:] != fids[:-1]])
        for fid, part in zip(fids[starts].tolist(), np.split(pos, starts[1:]), strict=True):
            self._parts[names[fid]].append(part)

    def by_file(self) -> dict[str, np.ndarray]:
        """Sorted distinct positions of each file."""
        return {
            path: parts[0] if len(parts) == 1 and len(parts[0]) == 1 else np.unique(np.concatenate(parts))
            for path, parts in self._parts.items()
        }


class Locations:
    """Where each touched key's row is after the commit: ``paths[file[g]]`` at ``pos[g]``
    (``file[g] < 0``: deleted, or unchanged for de-duplicated appends)."""

    def __init__(self, paths: list[str], file: np.ndarray, pos: np.ndarray):
        self.paths, self.file, self.pos = list(paths), np.asarray(file, np.int64), np.asarray(pos, np.int64)

    def __len__(self) -> int:
        return len(self.file)

    def __getitem__(self, g: int) -> tuple[str | None, int]:
        f = int(self.file[g])
        return (None, 0) if f < 0 else (self.paths[f], int(self.pos[g]))

    def __setitem__(self, g: int, location: tuple[str, int]) -> None:
        path, pos = location
        self.paths.append(path)
        self.file[g], self.pos[g] = len(self.paths) - 1, pos

    def packed(self, index: KeyedIndex) -> np.ndarray:
        """The index's packed locations (file id << 32 | pos; MISSING where there is no row)."""
        used = np.unique(self.file[self.file >= 0])
        ids = np.zeros(max(len(self.paths), 1), np.int64)  # a batch of deletes only writes no file
        for f in used.tolist():
            ids[f] = index.file_id(self.paths[f])
        return np.where(self.file < 0, MISSING, (ids[np.maximum(self.file, 0)] << 32) | self.pos)


@dataclass
class Resolution:
    """What a batch does to a keyed table (`resolve_changes`)."""

    deletes: Deletes
    keys: np.ndarray  # distinct keys touched
    locations: Locations  # their new rows
    unchanged: np.ndarray  # bool: keep the index entry as is (de-duplicated appends)
    patches: list[tuple[int, tuple[str, int], tuple[str, int] | None, list[str]]]
    # Keys whose new row replaces a committed row and keeps its `_row_id` (`sink.commit.lineage`), and that row.
    kept: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kept_from: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.empty(0, np.int64), np.empty(0, np.int64))
    )  # (index file id, position)


def resolve_changes(write: TableWrite, changes: TableReport) -> Resolution:
    """Deletes and new index locations for one table's batch (see module doc)."""
    deletes = Deletes()
    index = write.keyed_index
    if not changes.locations:
        return Resolution(deletes, np.empty(0), Locations([], np.empty(0), np.empty(0)), np.empty(0, bool), [])
    batch = _group_by_key(changes)
    if index is not None and not changes.truncates:
        old = index.lookup(batch.distinct)
    else:  # after a TRUNCATE no earlier row survives: the commit removes every existing data file
        old = np.full(len(batch.distinct), MISSING)
    if write.mode == "upsert":
        return _resolve_upsert(batch, old, index, changes.truncates, deletes)
    return _resolve_dedupe(batch, old, deletes)


# A row whose withheld columns take stored values: its group, its new location, where the values are, the columns.
_Patch = tuple[int, tuple[str, int], tuple[str, int] | None, list[str]]


@dataclass
class _KeyGroups:
    """A batch's changed rows of one table grouped by key, Kafka order inside each group: the arrays
    `resolve_changes` reads, each row's in group order (``order`` maps them back to ``rows``)."""

    rows: pa.Table  # as the tasks reported them, task after task
    topics: list[str]  # each row's topic, in ``rows`` order
    order: np.ndarray  # the rows' indexes in group order
    keys: np.ndarray
    starts: np.ndarray  # each group's first row
    ends: np.ndarray  # each group's end (exclusive)
    last: np.ndarray  # each group's last row: the change that wins
    ops: np.ndarray
    files: np.ndarray  # the row's data file (an index into ``paths``), or -1 when it wrote none
    positions: np.ndarray  # the row's position in that file
    distinct: np.ndarray  # each group's key
    paths: list[str]  # the batch's data files, numbered across tasks


def _group_by_key(changes: TableReport) -> _KeyGroups:
    """The batch's changed rows of every task, grouped by key in Kafka order."""
    # Files numbered across tasks: a task's files are base[task] + its own file number.
    paths: list[str] = []
    base: dict[str, int] = {}
    by_task: dict[str, dict[int, str]] = defaultdict(dict)
    for f in changes.files:
        by_task[f.task_id][f.task_file] = f.path
    for task_id, numbered in by_task.items():
        base[task_id] = len(paths)
        paths.extend(numbered.get(i, "") for i in range(max(numbered) + 1))
    parts, task_file_global = [], []
    for loc in changes.locations:
        t = loc.locations
        parts.append(t)
        tf = t.column("task_file").to_numpy()
        task_file_global.append(np.where(tf >= 0, base.get(loc.task_id, 0) + tf, -1))
    rows = pa.concat_tables(parts)
    keys = keys_from_arrow(rows.column("key"))
    topics = rows.column("topic").to_pylist()
    in_kafka_order = kafka_order(topics, rows.column("partition").to_numpy(), rows.column("offset").to_numpy())
    # Group by key, Kafka order inside each group (a stable sort of rows already in Kafka order).
    order = in_kafka_order[np.argsort(keys[in_kafka_order], kind="stable")]
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    ends = np.r_[starts[1:], len(k)]
    return _KeyGroups(
        rows,
        topics,
        order,
        k,
        starts,
        ends,
        ends - 1,
        rows.column("op").to_numpy()[order],
        np.concatenate(task_file_global)[order],
        rows.column("pos").to_numpy()[order],
        k[starts],
        paths,
    )


def _resolve_upsert(
    batch: _KeyGroups, old: np.ndarray, index: KeyedIndex | None, truncates: dict[TP, int], deletes: Deletes
) -> Resolution:
    """An upsert table's batch: each key's last change wins, and its other rows, in the table or in this batch,
    are deleted."""
    # The key's previous row, wherever it is, and every row of this batch but the last one.
    has_old = old != MISSING
    old_fid, old_pos = unpack(old)
    deletes.add_grouped(old_fid[has_old], old_pos[has_old], index.paths if index is not None else [])
    superseded = np.ones(len(batch.keys), bool)
    superseded[batch.last] = False
    superseded &= batch.files >= 0
    deletes.add_grouped(batch.files[superseded], batch.positions[superseded], batch.paths)
    gone = np.zeros(len(batch.last), bool)
    if truncates:
        gone = _gone_with_truncate(batch, truncates, deletes)
    final_file = np.where((batch.ops[batch.last] == KeyedOp.DELETE) | gone, -1, batch.files[batch.last])
    locations = Locations(batch.paths, final_file, batch.positions[batch.last])
    patches = _withheld_patches(batch, final_file, locations, index, has_old, old_fid, old_pos)
    # A key deleted in this batch and written again is a new row (a new `_row_id`), as a primary-key change is.
    removed = (batch.ops == KeyedOp.DELETE) | (batch.ops == KeyedOp.RECREATE)
    deleted_here = np.maximum.reduceat(removed.astype(np.int8), batch.starts) > 0
    kept = np.flatnonzero(has_old & ~deleted_here & (final_file >= 0))
    return Resolution(
        deletes,
        batch.distinct,
        locations,
        np.zeros(len(batch.distinct), bool),
        patches,
        kept,
        (old_fid[kept], old_pos[kept]),
    )


def _gone_with_truncate(batch: _KeyGroups, truncates: dict[TP, int], deletes: Deletes) -> np.ndarray:
    """Which keys a TRUNCATE in the batch removed (their rows written in this batch deleted)."""
    # A key whose last change came before the TRUNCATE (in its partition) is gone with it.
    cut = np.full(len(batch.keys), -1, np.int64)
    row_topics = np.array(batch.topics, dtype=object)[batch.order]
    row_partitions = batch.rows.column("partition").to_numpy()[batch.order]
    for tp, offset in truncates.items():
        cut[(row_topics == tp.topic) & (row_partitions == tp.partition)] = offset
    gone: np.ndarray = (batch.rows.column("offset").to_numpy()[batch.order] < cut)[batch.last]
    written = gone & (batch.files[batch.last] >= 0)
    deletes.add_grouped(batch.files[batch.last][written], batch.positions[batch.last][written], batch.paths)
    return gone


def _withheld_patches(
    batch: _KeyGroups,
    final_file: np.ndarray,
    locations: Locations,
    index: KeyedIndex | None,
    has_old: np.ndarray,
    old_fid: np.ndarray,
    old_pos: np.ndarray,
) -> list[_Patch]:
    """The new rows with columns Debezium withheld (unchanged TOAST values), each with the row that holds
    their values: the key's earlier change in this batch, or else its row in the table."""
    patches: list[_Patch] = []
    withheld = batch.rows.column("withheld")
    if withheld.null_count < len(withheld):
        withheld_sorted = withheld.take(pa.array(batch.order)).to_pylist()
        for g in np.flatnonzero(final_file >= 0).tolist():
            columns = withheld_sorted[batch.last[g]]
            if not columns:
                continue
            s_, e_ = batch.starts[g], batch.ends[g]
            source = (index.paths[old_fid[g]], int(old_pos[g])) if has_old[g] and index is not None else None
            if e_ - 1 > s_:  # an earlier change of the key in this batch
                prev = e_ - 2
                earlier_row = batch.ops[prev] != KeyedOp.DELETE and batch.files[prev] >= 0
                source = (batch.paths[batch.files[prev]], int(batch.positions[prev])) if earlier_row else None
            new_path, new_pos = locations[g]
            if new_path is not None:  # always: the group has its new row (final_file >= 0)
                patches.append((g, (new_path, new_pos), source, columns))
    return patches


def _resolve_dedupe(batch: _KeyGroups, old: np.ndarray, deletes: Deletes) -> Resolution:
    """A de-duplicated append's batch: the first row of an id wins, in the table or in this batch."""
    location_file = np.full(len(batch.distinct), -1, np.int64)
    location_pos = np.zeros(len(batch.distinct), np.int64)
    unchanged = np.zeros(len(batch.distinct), bool)
    files, positions, paths = batch.files, batch.positions, batch.paths
    for g, (s_, e_) in enumerate(zip(batch.starts, batch.ends, strict=True)):
        keep = None if old[g] != MISSING else s_
        for i in range(s_, e_):
            if files[i] >= 0 and i != keep:
                deletes.add(paths[files[i]], [int(positions[i])])
        if keep is None or files[keep] < 0:
            unchanged[g] = keep is None
        else:
            location_file[g], location_pos[g] = files[keep], positions[keep]
    return Resolution(deletes, batch.distinct, Locations(paths, location_file, location_pos), unchanged, [])


def _read_rows(locations: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    import pyarrow.parquet as pq

    from lakestream.storage import filesystem_path

    out: dict[tuple[str, int], dict[str, Any]] = {}
    by_file: dict[str, list[int]] = defaultdict(list)
    for path, pos in locations:
        by_file[path].append(pos)
    for path, wanted in by_file.items():
        fs, local = filesystem_path(path)
        table = pq.read_table(local, filesystem=fs)
        for pos in wanted:
            out[(path, pos)] = table.slice(pos, 1).to_pylist()[0]
    return out


def _apply_patches(
    write: TableWrite, changes: TableReport, resolved: Resolution, data_files: list[DataFileEntry]
) -> None:
    """Rows whose TOAST columns Debezium withheld get the stored values: the row is copied into a
    new file with the value from its previous version, and the copy replaces it (same snapshot)."""
    from lakestream.sink.write.convert import convert_rows
    from lakestream.sink.write.files import write_data_file

    wanted = [p[1] for p in resolved.patches] + [p[2] for p in resolved.patches if p[2] is not None]
    rows = _read_rows(wanted)
    partition_of = {f.path: f.partition_values for f in changes.files}
    by_partition: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for g, loc, source, columns in resolved.patches:
        row = dict(rows[loc])
        if source is not None:
            for column in columns:
                row[column] = rows[source].get(column)
        resolved.deletes.add(loc[0], [loc[1]])
        by_partition[orjson.dumps(partition_of.get(loc[0], [])).decode()].append((g, row))
    schema = write.spec.arrow_schema()
    for part_key, items in by_partition.items():
        table, bad = convert_rows([r for _, r in items], schema)
        if bad:  # values read back from the table always fit the table
            raise RuntimeError(f"patched rows do not fit {write.ident}: {bad}")
        written = write_data_file(table, write.spec.data_location, schema, "patch")
        data_files.append(
            {
                "path": written["path"],
                "file_size": written["file_size"],
                "record_count": written["record_count"],
                "partition": orjson.loads(part_key),
            }
        )
        for pos, (g, _) in enumerate(items):
            resolved.locations[g] = (written["path"], pos)


@dataclass
class KeptRows:
    """New rows that keep the `_row_id` of the committed rows they replace: row ``i`` is at position
    ``new_pos[i]`` of data file ``new_paths[new_file[i]]`` and replaces row ``old_pos[i]`` of
    ``old_paths[old_file[i]]``."""

    new_paths: list[str]
    new_file: np.ndarray
    new_pos: np.ndarray
    old_paths: list[str]
    old_file: np.ndarray
    old_pos: np.ndarray

    @classmethod
    def of_pairs(cls, pairs: list[tuple[tuple[str, int], tuple[str, int]]]) -> KeptRows:
        new_paths = sorted({new[0] for new, _ in pairs})
        old_paths = sorted({old[0] for _, old in pairs})
        new_ids, old_ids = {p: i for i, p in enumerate(new_paths)}, {p: i for i, p in enumerate(old_paths)}
        return cls(
            new_paths,
            np.array([new_ids[n[0]] for n, _ in pairs], np.int64),
            np.array([n[1] for n, _ in pairs], np.int64),
            old_paths,
            np.array([old_ids[o[0]] for _, o in pairs], np.int64),
            np.array([o[1] for _, o in pairs], np.int64),
        )


def _keep_row_ids(
    spark: SparkSession, write: TableWrite, snapshot_id: int | None, kept: KeptRows, data_files: list[DataFileEntry]
) -> None:
    """Each new row that replaces a committed row keeps that row's `_row_id` (`lakestream.sink.commit.lineage`): the
    batch's files holding such rows are rewritten in place with the lineage columns before the commit."""
    from concurrent.futures import ThreadPoolExecutor

    from lakestream.sink.commit.lineage import ROW_IDS, UNKNOWN, StaleLineage, write_lineage

    rewritten: set[str] = set()
    if len(kept.new_file) and snapshot_id is not None:
        order = np.argsort(kept.old_file, kind="stable")
        fids = kept.old_file[order]
        starts = np.flatnonzero(np.r_[True, fids[1:] != fids[:-1]])
        groups = np.split(order, starts[1:])
        old_paths = [kept.old_paths[int(f)] for f in fids[starts]]
        try:
            found = ROW_IDS.lookup(
                spark,
                write.catalog,
                write.name.namespace,
                write.name.table,
                snapshot_id,
                old_paths,
                [kept.old_pos[g] for g in groups],
            )
        except StaleLineage as exc:
            if write.index is not None:
                write.index.valid = False
            raise StaleIndex(f"{write.ident}: {exc}") from exc
        if found is not None:  # else the table does not track lineage (format < 3)
            old_ids = np.empty(len(kept.new_file), np.int64)
            for g, ids in zip(groups, found, strict=True):
                old_ids[g] = ids
            by_path = {f["path"]: f for f in data_files}
            rewrites = []
            for fid in np.unique(kept.new_file).tolist():
                path = kept.new_paths[fid]
                mine = kept.new_file == fid
                ids = np.full(by_path[path]["record_count"], UNKNOWN, np.int64)
                ids[kept.new_pos[mine]] = old_ids[mine]
                rewrites.append((path, ids))
            with ThreadPoolExecutor(max_workers=min(4, len(rewrites))) as pool:
                sizes = list(pool.map(lambda item: write_lineage(*item), rewrites))
            for (path, ids), size in zip(rewrites, sizes, strict=True):
                by_path[path]["file_size"] = size
                ROW_IDS.remember(path, ids)
                rewritten.add(path)
    for f in data_files:
        if f["path"] not in rewritten:
            ROW_IDS.remember(f["path"], None)


def _remember_first_row_ids(result: CommitResult) -> None:
    """Keep the first_row_id of the files a commit added: the next batch's updates of their rows need it."""
    if result.get("first_row_ids"):
        from lakestream.sink.commit.lineage import ROW_IDS

        ROW_IDS.committed(result["first_row_ids"])


def _kept_rows(index: KeyedIndex, resolved: Resolution) -> KeptRows:
    """The keys whose new row keeps the `_row_id` of the key's committed row."""
    old_fid, old_pos = resolved.kept_from
    return KeptRows(
        resolved.locations.paths,
        resolved.locations.file[resolved.kept],
        resolved.locations.pos[resolved.kept],
        index.paths,
        old_fid,
        old_pos,
    )


def write_table(
    spark: SparkSession, write: TableWrite, changes: TableReport, properties: dict[str, str]
) -> TableCommit:
    """Commit one table's files, deletion vectors and ``properties`` in one snapshot.

    Returns the kind of write and the changes applied. The index (if any) must describe
    the table's current snapshot; it is moved to the new snapshot.
    """
    from lakestream.sink.catalog.sink import commit_files

    if isinstance(write.index, KeylessIndex):
        return _write_keyless(spark, write, changes, properties)
    data_files: list[DataFileEntry] = [
        {"path": f.path, "file_size": f.file_size, "record_count": f.record_count, "partition": f.partition_values}
        for f in changes.files
    ]
    index = write.keyed_index
    laps = Laps()
    resolved = resolve_changes(write, changes) if index is not None else None
    if resolved is not None and resolved.patches:
        _apply_patches(write, changes, resolved, data_files)
    laps.lap("resolve")
    if index is not None and resolved is not None and write.mode == "upsert":
        _keep_row_ids(spark, write, index.snapshot_id, _kept_rows(index, resolved), data_files)
        laps.lap("lineage")
    request: CommitRequest = {
        "base_snapshot_id": index.snapshot_id if index is not None else None,
        **({"expect_snapshot_id": index.snapshot_id} if index is not None else {}),
        "data_files": data_files,
        "deletes": [
            {"data_file": path, "positions": pos}
            for path, pos in (resolved.deletes.by_file().items() if resolved else [])
        ],
        "properties": properties,
        "truncate": bool(changes.truncates),
    }
    result = commit_files(spark, write.catalog, write.name.namespace, write.name.table, request)
    laps.lap("jvm")
    laps.add_steps("jvm", result.get("timings_ms"))
    _remember_first_row_ids(result)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "%s: commit of %d data file(s), deletes in %d, steps (ms) %s",
            write.ident,
            len(data_files),
            len(request["deletes"]),
            result.get("timings_ms"),
        )
    if result.get("stale") and index is not None:
        index.valid = False
        raise StaleIndex(
            f"{write.ident} is at snapshot {result.get('snapshot_id')}, its key index at "
            f"{index.snapshot_id}: another writer committed in between"
        )
    if index is not None and resolved is not None:
        parent = result.get("parent_snapshot_id")
        if parent is not None and parent != index.snapshot_id:
            # Another writer committed in between: the index stays exact at its snapshot, and is refreshed
            # from there (the other writer's snapshot and this one) before its next use.
            index.valid = False
        else:
            if changes.truncates:
                snapshot_id, parent_of_journal = index.snapshot_id, index.journal_parent
                index.reset()  # every earlier row is gone
                index.snapshot_id, index.valid, index.journal_parent = snapshot_id, True, parent_of_journal
            live = ~resolved.unchanged
            index.update(resolved.keys[live], resolved.locations.packed(index)[live])
            index.snapshot_id = result["snapshot_id"]
            laps.lap("index_update")
    appended = sum(f.record_count for f in changes.files)
    if write.mode == "upsert":
        return TableCommit("upsert", len(resolved.keys) if resolved is not None else appended, timings_ms=laps.ms)
    if index is not None and resolved is not None:
        return TableCommit(
            "dedupe-append", int((~resolved.unchanged & (resolved.locations.file >= 0)).sum()), timings_ms=laps.ms
        )
    return TableCommit("append", appended, timings_ms=laps.ms)


def _write_keyless(
    spark: SparkSession, write: TableWrite, changes: TableReport, properties: dict[str, str]
) -> TableCommit:
    """A table without a primary key (`lakestream.sink.index.keyless`): appended rows, one equal row removed per
    update or delete, re-sent events left out; the source positions commit with the offsets."""
    from lakestream.sink.catalog.sink import commit_files
    from lakestream.sink.commit.keyless import apply_resolution, positions_property, resolve_keyless

    index = write.keyless_index
    laps = Laps()
    resolved = resolve_keyless(index, changes)
    laps.lap("resolve")
    data_files: list[DataFileEntry] = [
        {"path": f.path, "file_size": f.file_size, "record_count": f.record_count, "partition": f.partition_values}
        for f in changes.files
    ]
    _keep_row_ids(spark, write, index.snapshot_id, KeptRows.of_pairs(resolved.kept), data_files)
    laps.lap("lineage")
    request: CommitRequest = {
        "base_snapshot_id": index.snapshot_id,
        "expect_snapshot_id": index.snapshot_id,
        "data_files": data_files,
        "deletes": [
            {"data_file": path, "positions": np.unique(np.asarray(pos, np.int64))}
            for path, pos in resolved.deletes.items()
        ],
        "properties": properties | positions_property(resolved),
        "truncate": bool(changes.truncates),
    }
    result = commit_files(spark, write.catalog, write.name.namespace, write.name.table, request)
    laps.lap("jvm")
    laps.add_steps("jvm", result.get("timings_ms"))
    _remember_first_row_ids(result)
    if result.get("stale"):
        index.valid = False
        raise StaleIndex(
            f"{write.ident} is at snapshot {result.get('snapshot_id')}, its index at "
            f"{index.snapshot_id}: another writer committed in between"
        )
    parent = result.get("parent_snapshot_id")
    if parent is not None and parent != index.snapshot_id:
        index.valid = False
    else:
        apply_resolution(index, resolved, truncated=bool(changes.truncates))
    index.snapshot_id = result["snapshot_id"]
    if resolved.resent:
        log.info(
            "%s: %d re-sent event(s) recognised by their source position and left out", write.ident, resolved.resent
        )
    laps.lap("index_update")
    return TableCommit("upsert", resolved.applied, timings_ms=laps.ms)
