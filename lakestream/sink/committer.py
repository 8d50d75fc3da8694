"""The driver side of the sink: turn what the write tasks reported for a table into one Iceberg
snapshot holding the new data files, the deletion vectors for replaced and deleted rows, and the
Kafka offsets the table consumed.

For an upsert table, every change reported by the tasks is placed in Kafka order; the last change
of each key wins. Its previous row, found through the key index (`lakestream.sink.index`), and any
earlier row of the same key written by another task in this batch, are deleted by position. The
index is then moved to the new rows. Nothing here reads the table: the cost follows the changes.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lakestream.sink.index import MISSING, KeyIndex, keys_from_arrow, pack, unpack
from lakestream.sink.report import OP_DELETE, TableReport

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.sink.router import TableName
    from lakestream.sink.task import TableSpec

log = logging.getLogger(__name__)


@dataclass
class TableWrite:
    """One table's share of a batch, ready to commit."""

    ident: str  # quoted catalog.namespace.table
    catalog: str
    name: TableName
    spec: TableSpec
    index: KeyIndex | None  # upsert and de-duplicated tables
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return self.spec.mode


@dataclass
class _Resolved:
    deletes: dict[str, set[int]]
    keys: np.ndarray  # distinct keys touched
    locations: list[tuple[str | None, int]]  # their new (path, pos); path None = deleted / unchanged
    unchanged: np.ndarray  # bool: keep the index entry as is (de-duplicated appends)
    patches: list[tuple[int, tuple[str, int], tuple[str, int] | None, list[str]]]


def _resolve(write: TableWrite, changes: TableReport) -> _Resolved:
    """Deletes and new index locations for one table's batch (see module doc)."""
    paths = {(f.task_id, f.task_file): f.path for f in changes.files}
    parts = []
    for loc in changes.locations:
        t = loc.locations
        parts.append(t.append_column("task_id", pa.array([loc.task_id] * t.num_rows, pa.string())))
    deletes: dict[str, set[int]] = defaultdict(set)
    if not parts:
        return _Resolved(deletes, np.empty(0), [], np.empty(0, bool), [])
    rows = pa.concat_tables(parts)
    keys = keys_from_arrow(rows.column("key"))
    topics = rows.column("topic").to_pylist()
    topic_codes = np.unique(np.array(topics, dtype=object), return_inverse=True)[1] if topics else np.empty(0)
    kafka_order = np.lexsort((rows.column("offset").to_numpy(), rows.column("partition").to_numpy(), topic_codes))
    # Group by key, Kafka order inside each group (a stable sort of rows already in Kafka order).
    order = kafka_order[np.argsort(keys[kafka_order], kind="stable")]
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    ends = np.r_[starts[1:], len(k)]
    ops = rows.column("op").to_numpy()[order]
    task_files = rows.column("task_file").to_numpy()[order]
    positions = rows.column("pos").to_numpy()[order]
    task_ids = rows.column("task_id").to_pylist()
    task_ids = [task_ids[i] for i in order]
    withheld = rows.column("withheld").to_pylist()
    withheld = [withheld[i] for i in order]

    def new_location(i: int) -> tuple[str, int] | None:
        if task_files[i] < 0:
            return None
        return paths[(task_ids[i], int(task_files[i]))], int(positions[i])

    distinct = k[starts]
    old = write.index.lookup(distinct) if write.index is not None else np.full(len(distinct), MISSING)
    old_fid, old_pos = unpack(old)
    locations: list[tuple[str | None, int]] = []
    unchanged = np.zeros(len(distinct), bool)
    patches = []
    upsert = write.mode == "upsert"
    for g, (s, e) in enumerate(zip(starts, ends)):
        previous = None if old[g] == MISSING else (write.index.paths[old_fid[g]], int(old_pos[g]))
        if upsert:
            if previous is not None:
                deletes[previous[0]].add(previous[1])
            for i in range(s, e - 1):  # replaced within this batch
                loc = new_location(i)
                if loc is not None:
                    deletes[loc[0]].add(loc[1])
            last = e - 1
            loc = new_location(last) if ops[last] != OP_DELETE else None
            if loc is not None and withheld[last]:
                source = previous
                for i in range(last - 1, s - 1, -1):
                    if ops[i] == OP_DELETE:
                        source = None
                        break
                    source = new_location(i)
                    break
                patches.append((g, loc, source, withheld[last]))
            locations.append(loc if loc is not None else (None, 0))
        else:  # de-duplicated append: the first row of an id wins, in the table or in this batch
            keep = None if previous is not None else s
            for i in range(s, e):
                loc = new_location(i)
                if loc is not None and i != keep:
                    deletes[loc[0]].add(loc[1])
            if keep is None:
                unchanged[g] = True
                locations.append((None, 0))
            else:
                locations.append(new_location(keep) or (None, 0))
    return _Resolved(deletes, distinct, locations, unchanged, patches)


def _read_rows(locations: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    import pyarrow.parquet as pq

    from lakestream.sink.storage import filesystem_path

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


def _apply_patches(write: TableWrite, changes: TableReport, resolved: _Resolved, data_files: list[dict[str, Any]]
                   ) -> None:
    """Rows whose TOAST columns Debezium withheld get the stored values: the row is copied into a
    new file with the value from its previous version, and the copy replaces it (same snapshot)."""
    from lakestream.sink.convert import convert_rows
    from lakestream.sink.files import write_data_file

    wanted = [p[1] for p in resolved.patches] + [p[2] for p in resolved.patches if p[2] is not None]
    rows = _read_rows(wanted)
    partition_of = {f.path: f.partition_values for f in changes.files}
    by_partition: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for g, loc, source, columns in resolved.patches:
        row = dict(rows[loc])
        if source is not None:
            for column in columns:
                row[column] = rows[source].get(column)
        resolved.deletes[loc[0]].add(loc[1])
        import orjson

        by_partition[orjson.dumps(partition_of.get(loc[0], [])).decode()].append((g, row))
    schema = write.spec.arrow_schema()
    for part_key, items in by_partition.items():
        table, bad = convert_rows([r for _, r in items], schema)
        if bad:  # values read back from the table always fit the table
            raise RuntimeError(f"patched rows do not fit {write.ident}: {bad}")
        written = write_data_file(table, write.spec.data_location, schema, "patch")
        import orjson

        data_files.append({"path": written["path"], "file_size": written["file_size"],
                           "record_count": written["record_count"], "partition": orjson.loads(part_key)})
        for pos, (g, _) in enumerate(items):
            resolved.locations[g] = (written["path"], pos)


def write_table(spark: SparkSession, write: TableWrite, changes: TableReport, properties: dict[str, str]) -> str:
    """Commit one table's files, deletion vectors and ``properties`` in one snapshot.

    Returns the kind of write (append | upsert | dedupe-append). The index (if any) must describe
    the table's current snapshot; it is moved to the new snapshot.
    """
    from lakestream.sink.files import commit_files

    data_files = [{"path": f.path, "file_size": f.file_size, "record_count": f.record_count,
                   "partition": f.partition_values} for f in changes.files]
    index = write.index
    resolved = _resolve(write, changes) if index is not None else None
    if resolved is not None and resolved.patches:
        _apply_patches(write, changes, resolved, data_files)
    request = {
        "base_snapshot_id": index.snapshot_id if index is not None else None,
        "data_files": data_files,
        "deletes": [{"data_file": path, "positions": sorted(pos)}
                    for path, pos in (resolved.deletes.items() if resolved else [])],
        "properties": properties,
    }
    result = commit_files(spark, write.catalog, write.name.namespace, write.name.table, request)
    write.stats = {"data_files": len(data_files), "deleted_rows": sum(len(d["positions"]) for d in request["deletes"]),
                   "rows": sum(f["record_count"] for f in data_files)}
    if index is not None and resolved is not None:
        parent = result.get("parent_snapshot_id")
        if parent is not None and parent != index.snapshot_id:
            index.valid = False  # another writer committed in between: rebuild before the next use
        else:
            live = ~resolved.unchanged
            keys = resolved.keys[live]
            locs = np.array([MISSING if p is None else pack(np.array([index.file_id(p)]), np.array([pos]))[0]
                             for (p, pos), keep in zip(resolved.locations, live) if keep], dtype=np.int64)
            index.update(keys, locs)
        index.snapshot_id = result["snapshot_id"]
    if write.mode == "upsert":
        return "upsert"
    return "dedupe-append" if index is not None else "append"
