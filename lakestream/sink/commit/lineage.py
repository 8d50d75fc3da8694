"""Row lineage (Iceberg v3): an updated row keeps its ``_row_id``.

In a v3 table every row has an id and the sequence number of the commit that last changed it. A data file
that holds no ``_row_id`` column (or a null in it) gives row ``p`` the id ``first_row_id + p``, its
``first_row_id`` being assigned at commit; a null ``_last_updated_sequence_number`` reads as the file's data
sequence number. So a row written as new gets a new id by inheritance, and a writer that replaces a row keeps
its identity by writing the old id explicitly, with a null sequence number (it then reads as the commit that
wrote it). That is what Spark's own UPDATE and MERGE do on a merge-on-read table.

The write tasks cannot do it: they write a batch's rows before the driver finds, through the key index, which
of them replace a committed row. So the driver does it before the commit, for the files of the batch that hold
such rows: it reads each old row's id (`RowIds`: the old file's ``first_row_id`` from the file state the JVM
keeps, plus the position, or the value the old file holds explicitly) and rewrites the new file in place with
the two lineage columns (`write_lineage`: same rows, same order, so every position the commit and the index use
stays valid; the file is referenced by nothing until the commit).

Rows moved without a change (compaction) carry both values explicitly (`lineage_columns`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from lakestream.storage import filesystem_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Iceberg's reserved field ids (MetadataColumns.ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER).
ROW_ID_FIELD = 2147483540
LAST_UPDATED_FIELD = 2147483539
ROW_ID = "_row_id"
LAST_UPDATED = "_last_updated_sequence_number"
UNKNOWN = -1  # no id: the file has none (a table upgraded from v2), the row gets a new one

_FIELD_ID = b"PARQUET:field_id"


def lineage_fields() -> list[pa.Field]:
    """The two lineage columns as Arrow fields carrying their Iceberg field ids."""
    return [
        pa.field(ROW_ID, pa.int64(), metadata={_FIELD_ID: str(ROW_ID_FIELD).encode()}),
        pa.field(LAST_UPDATED, pa.int64(), metadata={_FIELD_ID: str(LAST_UPDATED_FIELD).encode()}),
    ]


def _field_index(schema: pa.Schema, field_id: int) -> int | None:
    wanted = str(field_id).encode()
    for i, f in enumerate(schema):
        if f.metadata and f.metadata.get(_FIELD_ID) == wanted:
            return i
    return None


def without_lineage(table: pa.Table) -> pa.Table:
    """``table`` without the two lineage columns (matched by field id)."""
    for field_id in (ROW_ID_FIELD, LAST_UPDATED_FIELD):
        i = _field_index(table.schema, field_id)
        if i is not None:
            table = table.remove_column(i)
    return table


def lineage_columns(table: pa.Table, row_ids: np.ndarray, sequence_numbers: np.ndarray | None) -> pa.Table:
    """``table`` (without lineage columns) with ``_row_id`` = ``row_ids`` (`UNKNOWN` → null: a new id by
    inheritance) and ``_last_updated_sequence_number`` = ``sequence_numbers`` (None or negative → null: the
    sequence number of the commit that adds the file)."""
    ids = np.asarray(row_ids, np.int64)
    id_array = pa.array(ids, pa.int64(), mask=ids < 0)
    if sequence_numbers is None:
        seq_array = pa.nulls(table.num_rows, pa.int64())
    else:
        seqs = np.asarray(sequence_numbers, np.int64)
        seq_array = pa.array(seqs, pa.int64(), mask=seqs < 0)
    row_field, seq_field = lineage_fields()
    return table.append_column(row_field, id_array).append_column(seq_field, seq_array)


def read_lineage(table: pa.Table) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The explicit ``_row_id`` and ``_last_updated_sequence_number`` values of a data file's rows (-1 where
    null), or None for a column the file does not hold."""
    out: list[np.ndarray | None] = []
    for field_id in (ROW_ID_FIELD, LAST_UPDATED_FIELD):
        i = _field_index(table.schema, field_id)
        out.append(None if i is None else table.column(i).fill_null(UNKNOWN).to_numpy().astype(np.int64))
    return out[0], out[1]


def write_lineage(path: str, row_ids: np.ndarray) -> int:
    """Rewrite the uncommitted data file ``path`` in place with ``_row_id`` = ``row_ids`` (`UNKNOWN` → null)
    and a null ``_last_updated_sequence_number``; returns its new size in bytes."""
    fs, local = filesystem_path(path)
    parquet = pq.ParquetFile(local, filesystem=fs)
    row_group_rows = parquet.metadata.row_group(0).num_rows if parquet.metadata.num_row_groups else 1
    table = without_lineage(parquet.read())
    parquet.close()
    table = lineage_columns(table, row_ids, None)
    pq.write_table(
        table,
        local,
        filesystem=fs,
        compression="zstd",
        row_group_size=max(row_group_rows, 1),
        write_statistics=True,
        store_schema=False,
    )
    size: int = fs.get_file_info(local).size
    return size


class StaleLineage(Exception):
    """The table is no longer at the snapshot whose file state was asked for."""


class RowIds:
    """The ``_row_id`` of committed rows, for one driver: each data file's explicit ids are read once and kept
    (a bounded LRU; data files never change), ``first_row_id`` comes from the JVM's file state. Shared by the
    tables' commits, which run on several threads."""

    def __init__(self, max_ids: int = 4_000_000, max_files: int = 100_000):
        self._explicit: OrderedDict[str, np.ndarray | None] = OrderedDict()
        self._first: OrderedDict[str, int] = OrderedDict()  # first_row_id of files this driver committed
        self._held = 0
        self._lock = threading.Lock()
        self.max_ids, self.max_files = max_ids, max_files

    def remember(self, path: str, ids: np.ndarray | None) -> None:
        """What file ``path`` holds (its explicit ids, or None: no ``_row_id`` column)."""
        with self._lock:
            old = self._explicit.pop(path, None)
            self._held -= 0 if old is None else len(old)
            self._explicit[path] = ids
            self._held += 0 if ids is None else len(ids)
            while (self._held > self.max_ids or len(self._explicit) > self.max_files) and len(self._explicit) > 1:
                _, dropped = self._explicit.popitem(last=False)
                self._held -= 0 if dropped is None else len(dropped)

    def committed(self, first_row_ids: dict[str, int]) -> None:
        """The ``first_row_id`` the commit gave each file it added (`commit_files`' answer)."""
        with self._lock:
            for path, first in first_row_ids.items():
                self._first[path] = int(first)
            while len(self._first) > self.max_files:
                self._first.popitem(last=False)

    def _first_row_ids(
        self, spark: SparkSession, catalog: str, namespace: str, table: str, snapshot_id: int, paths: list[str]
    ) -> dict[str, int | None] | None:
        """Each file's ``first_row_id`` (None: it has none); None when the table does not track lineage. Files
        this driver committed are answered from memory; only the others ask the JVM's file state, which also
        says whether the table is still at ``snapshot_id`` (the commit checks that for the rest)."""
        with self._lock:
            out: dict[str, int | None] = {p: self._first[p] for p in paths if p in self._first}
        missing = [p for p in paths if p not in out]
        if not missing:
            return out
        jvm: Any = spark.sparkContext._jvm
        answer = orjson.loads(
            jvm.lakestream.LakestreamSink.rowLineage(
                spark._jsparkSession, catalog, namespace, table, snapshot_id, orjson.dumps(missing).decode()
            )
        )
        if answer.get("stale"):
            raise StaleLineage(f"{namespace}.{table} is at snapshot {answer.get('snapshot_id')}, not {snapshot_id}")
        if not answer["lineage"]:
            return None
        for path in missing:
            out[path] = (answer["files"].get(path) or [None])[0]
        return out

    def explicit(self, paths: list[str]) -> dict[str, np.ndarray | None]:
        """The explicit ids each file holds (None: none), the files not in memory read eight at a time."""
        out: dict[str, np.ndarray | None] = {}
        with self._lock:
            for path in paths:
                if path in self._explicit:
                    self._explicit.move_to_end(path)
                    out[path] = self._explicit[path]
        missing = [p for p in paths if p not in out]
        if missing:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                for path, ids in zip(missing, pool.map(_read_row_ids, missing), strict=True):
                    self.remember(path, ids)
                    out[path] = ids
        return out

    def lookup(
        self,
        spark: SparkSession,
        catalog: str,
        namespace: str,
        table: str,
        snapshot_id: int,
        paths: list[str],
        positions: list[np.ndarray],
    ) -> list[np.ndarray] | None:
        """The ids of rows ``positions[i]`` of data files ``paths[i]`` at ``snapshot_id`` (`UNKNOWN` where the
        file has none); None when the table does not track lineage (format < 3)."""
        firsts = self._first_row_ids(spark, catalog, namespace, table, snapshot_id, paths)
        if firsts is None:
            return None
        out = []
        held_by = self.explicit(paths)
        for path, pos in zip(paths, positions, strict=True):
            # A file not live at the snapshot (never expected: the index is at it) gives its rows new ids.
            first = firsts[path]
            pos = np.asarray(pos, np.int64)
            ids = np.full(len(pos), UNKNOWN, np.int64) if first is None else first + pos
            explicit = held_by[path]
            if explicit is not None:
                held = explicit[pos]
                ids = np.where(held >= 0, held, ids)
            out.append(ids)
        return out


def _read_row_ids(path: str) -> np.ndarray | None:
    """The ``_row_id`` column of data file ``path`` (`UNKNOWN` where null), or None when it has none."""
    fs, local = filesystem_path(path)
    parquet = pq.ParquetFile(local, filesystem=fs)
    try:
        i = _field_index(parquet.schema_arrow, ROW_ID_FIELD)
        if i is None:
            return None
        column = parquet.read(columns=[parquet.schema_arrow.names[i]]).column(0)
        ids: np.ndarray = column.fill_null(UNKNOWN).to_numpy().astype(np.int64)
        return ids
    finally:
        parquet.close()


ROW_IDS = RowIds()


def file_lineage(answer: dict[str, Any], path: str) -> tuple[int | None, int | None]:
    """(first_row_id, data sequence number) of ``path`` in a `deleted_positions` answer."""
    f = answer["files"][path]
    return f.get("first_row_id"), f.get("data_sequence_number")
