"""A write task's changes of a table without a primary key as the blob its `RowLocations` fact carries (executor
side): each change's op, the content hashes of the row it adds and removes, where the added row landed, and its
Kafka and source positions (`lakestream.sink.report.keyless_change_schema`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lakestream.sink.index.keys import row_keys
from lakestream.sink.report import KeylessOp, keyless_change_schema


def write_keyless_changes(
    typed: pa.Table,
    ops: list[str],
    old: dict[int, pa.Table | None],
    schema: pa.Schema,
    file_of: np.ndarray,
    pos_of: np.ndarray,
    topics: list[str],
    partitions: np.ndarray,
    offsets: np.ndarray,
    positions: list[tuple[int, int]],
) -> pa.Table:
    """The `keyless_change_schema` blob of a task's changes of a keyless table (row i ↔ change i): ``typed`` holds
    each change's row (the new row; a delete's old row), ``old`` an update's typed old row by change."""
    n = typed.num_rows
    hashes = row_keys(typed, schema)
    op_of = {"d": KeylessOp.DELETE, "u": KeylessOp.UPDATE}
    op_codes = np.array([op_of.get(o, KeylessOp.INSERT) for o in ops], np.int8)
    old_hashes: list[bytes | None] = [None] * n
    for i in range(n):
        if op_codes[i] == KeylessOp.DELETE:
            old_hashes[i] = bytes(hashes[i]).ljust(16, b"\0")
        elif op_codes[i] == KeylessOp.UPDATE and old.get(i) is not None:
            old_hashes[i] = bytes(row_keys(old[i], schema)[0]).ljust(16, b"\0")
    new_hashes = [None if op_codes[i] == KeylessOp.DELETE else bytes(hashes[i]).ljust(16, b"\0") for i in range(n)]
    return pa.table(
        {
            "op": pa.array(op_codes),
            "new_row": pa.array(new_hashes, pa.binary(16)),
            "old_row": pa.array(old_hashes, pa.binary(16)),
            "task_file": pa.array(file_of.astype(np.int32)),
            "pos": pa.array(pos_of.astype(np.int64)),
            "topic": pa.array(topics, pa.string()),
            "partition": pa.array(np.asarray(partitions).astype(np.int32)),
            "offset": pa.array(np.asarray(offsets).astype(np.int64)),
            "commit_lsn": pa.array([p[0] for p in positions], pa.int64()),
            "lsn": pa.array([p[1] for p in positions], pa.int64()),
        },
        schema=keyless_change_schema(),
    )
