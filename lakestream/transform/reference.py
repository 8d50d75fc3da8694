"""Reference tables for enrichment: Iceberg tables a SQL transform joins (product catalogs, mirrors).

The driver reads each reference table as Arrow, ships it to the write tasks as a Spark broadcast
variable (Arrow IPC bytes), and re-reads it only when the table's current snapshot changes
(`lakestream.engine.references`). In a task the table is registered in DuckDB as a view named as
declared, next to ``batch``. Python workers keep the decoded table of the latest snapshot, so a batch
whose references did not change costs one catalog look-up per reference on the driver and nothing in
the tasks. This module is what the tasks need: `ReferenceData`, the broadcast's rows, per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class ReferenceData:
    """One reference table as the tasks get it: which snapshot, and its rows in a broadcast variable.

    ``key`` identifies the table and the columns read (two transforms may read the same table with
    different columns); ``rows`` is a pyspark ``Broadcast`` of Arrow IPC bytes."""

    key: str
    table: str  # catalog.namespace.table
    snapshot_id: int | None
    rows: Any
    num_rows: int
    nbytes: int


# Per Python process (a Spark worker, or the driver): key → (snapshot id, table). Only the latest
# snapshot of each reference is kept.
_loaded: dict[str, tuple[int | None, pa.Table]] = {}
_loaded_lock = threading.Lock()


def reference_rows(data: ReferenceData) -> pa.Table:
    """The rows of ``data``, decoded once per process and snapshot."""
    with _loaded_lock:
        hit = _loaded.get(data.key)
        if hit is not None and hit[0] == data.snapshot_id:
            return hit[1]
    with pa.ipc.open_stream(pa.py_buffer(data.rows.value)) as reader:
        table = reader.read_all()
    keep_rows(data.key, data.snapshot_id, table)
    return table


def keep_rows(key: str, snapshot_id: int | None, table: pa.Table) -> None:
    """Keep ``table`` as this process's rows of reference ``key`` at ``snapshot_id`` (the driver runs transforms
    too: schemas, isolation)."""
    with _loaded_lock:
        _loaded[key] = (snapshot_id, table)


def resolve_table(table: str, default_catalog: str) -> tuple[str, str, str]:
    """(catalog, namespace, table) of a ``[catalog.]namespace.table`` reference."""
    parts = table.split(".")
    return (default_catalog, *parts) if len(parts) == 2 else tuple(parts)  # type: ignore[return-value]
