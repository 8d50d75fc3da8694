"""The resolution across tasks of a keyed table's batch (`lakestream.sink.commit.tables.resolve_changes`), on the
facts tasks report and an index in memory: which rows become deletion vectors, where each key's row is after the
commit, which rows keep their `_row_id`. No Spark: seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from lakestream.identifiers import TableName
from lakestream.sink.commit.tables import Resolution, TableWrite, resolve_changes
from lakestream.sink.index.keys import MISSING, pack
from lakestream.sink.index.memory import KeyIndex
from lakestream.sink.report import DataFileWritten, KeyedOp, RowLocations, TableReport, location_schema
from lakestream.sink.spec import TableSpec
from lakestream.source.kafka import TP

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}]}
TOPIC = "p.public.orders"


def _write(mode: str = "upsert", index: dict[int, tuple[str, int]] | None = None) -> TableWrite:
    """A write of table ``n.t`` keyed on ``id`` whose index holds ``index`` (key → committed row)."""
    spec = TableSpec("n.t", mode, ["id"], SCHEMA, {"spec-id": 0, "fields": []}, "file:/unused")
    keyed = KeyIndex(False, ["id"], "uuid")
    if index:
        keys = np.array(sorted(index), np.int64)
        keyed.update(
            keys,
            np.array(
                [pack(np.array([keyed.file_id(index[k][0])]), np.array([index[k][1]]))[0] for k in keys.tolist()],
                np.int64,
            ),
        )
    keyed.snapshot_id, keyed.valid = 1, True
    return TableWrite("`lake`.`n`.`t`", "lake", TableName("n", "t"), spec, keyed)


def _task(report: TableReport, task_id: str, files: list[str], changes: list[tuple[Any, ...]]) -> None:
    """One task's facts: its ``files`` (task file i) and ``changes`` (key, op, task file, pos, partition, offset)."""
    for i, path in enumerate(files):
        report.files.append(DataFileWritten("n.t", path, 100, 1, [], task_id, i))
    columns = list(zip(*changes, strict=True)) if changes else [[]] * 6
    report.locations.append(
        RowLocations(
            "n.t",
            task_id,
            pa.table(
                {
                    "key": pa.array(columns[0], pa.int64()),
                    "op": pa.array(columns[1], pa.int8()),
                    "task_file": pa.array(columns[2], pa.int32()),
                    "pos": pa.array(columns[3], pa.int64()),
                    "topic": pa.array([TOPIC] * len(changes), pa.string()),
                    "partition": pa.array(columns[4], pa.int32()),
                    "offset": pa.array(columns[5], pa.int64()),
                    "withheld": pa.array([None] * len(changes), pa.list_(pa.string())),
                },
                schema=location_schema(False),
            ),
        )
    )


def _where(resolved: Resolution) -> dict[int, tuple[str, int] | None]:
    return {
        int(k): (resolved.locations[g] if resolved.locations.file[g] >= 0 else None)
        for g, k in enumerate(resolved.keys.tolist())
    }


def _deleted(resolved: Resolution) -> dict[str, list[int]]:
    return {path: pos.tolist() for path, pos in resolved.deletes.by_file().items()}


UPSERT, DELETE, RECREATE = int(KeyedOp.UPSERT), int(KeyedOp.DELETE), int(KeyedOp.RECREATE)


def test_the_latest_change_of_a_key_wins_across_tasks_in_kafka_order() -> None:
    report = TableReport("n.t")
    # Task b read offset 3 of partition 0, task a offsets 1 and 7: a's later row wins, b's row is deleted.
    _task(report, "a", ["a-0.parquet"], [(1, UPSERT, 0, 0, 0, 1), (1, UPSERT, 0, 1, 0, 7)])
    _task(report, "b", ["b-0.parquet"], [(1, UPSERT, 0, 0, 0, 3), (2, UPSERT, 0, 1, 1, 2)])
    resolved = resolve_changes(_write(), report)
    assert _where(resolved) == {1: ("a-0.parquet", 1), 2: ("b-0.parquet", 1)}
    assert _deleted(resolved) == {"a-0.parquet": [0], "b-0.parquet": [0]}


def test_a_committed_row_is_deleted_and_its_row_id_kept() -> None:
    report = TableReport("n.t")
    _task(report, "a", ["a-0.parquet"], [(5, UPSERT, 0, 0, 0, 10), (6, DELETE, -1, 0, 0, 11)])
    resolved = resolve_changes(_write(index={5: ("old.parquet", 7), 6: ("old.parquet", 8)}), report)
    assert _deleted(resolved) == {"old.parquet": [7, 8]}
    assert _where(resolved) == {5: ("a-0.parquet", 0), 6: None}
    assert resolved.keys[resolved.kept].tolist() == [5]  # the update keeps the row's `_row_id`; 6 is gone
    assert resolved.kept_from[1].tolist() == [7]


def test_a_key_deleted_and_written_again_in_the_batch_is_a_new_row() -> None:
    report = TableReport("n.t")
    _task(report, "a", ["a-0.parquet"], [(5, DELETE, -1, 0, 0, 1), (5, RECREATE, 0, 0, 0, 2)])
    resolved = resolve_changes(_write(index={5: ("old.parquet", 3)}), report)
    assert _deleted(resolved) == {"old.parquet": [3]} and _where(resolved) == {5: ("a-0.parquet", 0)}
    assert len(resolved.kept) == 0


def test_a_truncate_removes_every_change_before_it_in_its_partition() -> None:
    report = TableReport("n.t")
    _task(report, "a", ["a-0.parquet"], [(1, UPSERT, 0, 0, 0, 1), (2, UPSERT, 0, 1, 0, 5), (3, UPSERT, 0, 2, 1, 1)])
    report.truncates[TP(TOPIC, 0)] = 3
    resolved = resolve_changes(_write(index={9: ("old.parquet", 0)}), report)
    # Key 1 came before the TRUNCATE: its row goes; the committed row of 9 is not looked up (every file goes).
    assert _where(resolved) == {1: None, 2: ("a-0.parquet", 1), 3: ("a-0.parquet", 2)}
    assert _deleted(resolved) == {"a-0.parquet": [0]}


def test_a_deduplicated_append_keeps_the_first_row_of_an_id() -> None:
    report = TableReport("n.t")
    _task(report, "a", ["a-0.parquet"], [(1, UPSERT, 0, 0, 0, 4), (2, UPSERT, 0, 1, 0, 5)])
    _task(report, "b", ["b-0.parquet"], [(1, UPSERT, 0, 0, 0, 2)])
    resolved = resolve_changes(_write("append", index={2: ("old.parquet", 0)}), report)
    assert _where(resolved) == {1: ("b-0.parquet", 0), 2: None}  # 1: the earlier offset; 2: already in the table
    assert resolved.unchanged.tolist() == [False, True]
    assert _deleted(resolved) == {"a-0.parquet": [0, 1]}


def test_new_locations_pack_against_the_index_file_ids() -> None:
    report = TableReport("n.t")
    _task(report, "a", ["a-0.parquet"], [(1, UPSERT, 0, 4, 0, 1), (2, DELETE, -1, 0, 0, 2)])
    write = _write()
    resolved = resolve_changes(write, report)
    assert write.index is not None
    packed = resolved.locations.packed(write.index)  # type: ignore[arg-type]
    assert packed.tolist() == [
        int(pack(np.array([write.index.file_id("a-0.parquet")]), np.array([4]))[0]),
        int(MISSING),
    ]
