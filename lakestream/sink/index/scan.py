"""The one scan an index is rebuilt from: a table's rows at a snapshot with Iceberg's ``_file``/``_pos``
metadata columns (every delete applied), each row's location packed against the index's file ids.

`scan_locations` collects to the driver (the in-memory indexes: a keyless table, a re-snapshot's mirror);
`DiskKeyIndex.rebuild` runs the same query on the executors (`lakestream.sink.index.disk.build_on_executors`)
and shares `data_files` with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lakestream.sink.index.keys import pack

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILE_COLUMN = "__lakestream_file"  # xxhash64 of the row's data file path
POS_COLUMN = "__lakestream_pos"


def data_files(spark: SparkSession, ident: str, snapshot_id: int) -> dict[int, str]:
    """The table's data files at ``snapshot_id`` by the 64-bit hash of their path (rows ship the hash, not the
    path: 20M rows stay ~24 bytes each)."""
    return {
        int(r[1]): r[0]
        for r in spark.sql(
            f"SELECT file_path, xxhash64(file_path) FROM {ident}.data_files VERSION AS OF {int(snapshot_id)}"
        ).collect()
    }


def scan_sql(ident: str, columns_sql: str, snapshot_id: int) -> str:
    """``columns_sql`` of every live row at ``snapshot_id`` with its file hash and position."""
    return (
        f"SELECT {columns_sql}, xxhash64(_file) AS {FILE_COLUMN}, _pos AS {POS_COLUMN} "
        f"FROM {ident} VERSION AS OF {int(snapshot_id)}"
    )


def scan_locations(
    spark: SparkSession, ident: str, columns_sql: str, snapshot_id: int, file_id: Callable[[str], int]
) -> tuple[pa.Table, np.ndarray] | None:
    """The rows (``columns_sql``, then the two metadata columns) at ``snapshot_id`` and their packed locations
    (file ids given by ``file_id``); None when the table has no rows."""
    paths = data_files(spark, ident, snapshot_id)
    batches = spark.sql(scan_sql(ident, columns_sql, snapshot_id))._collect_as_arrow()
    if not batches:
        return None
    table = pa.Table.from_batches(batches)
    hashes = table.column(FILE_COLUMN).to_numpy()
    known = np.array(sorted(paths), dtype=np.int64)
    slot = np.searchsorted(known, hashes)
    if len(known) == 0 or not np.array_equal(known[np.minimum(slot, len(known) - 1)], hashes):
        raise RuntimeError(f"{ident}: rows of a data file missing from its files table at snapshot {snapshot_id}")
    fid_of_slot = np.array([file_id(paths[int(h)]) for h in known], dtype=np.int64)
    return table, pack(fid_of_slot[slot], table.column(POS_COLUMN).to_numpy())
