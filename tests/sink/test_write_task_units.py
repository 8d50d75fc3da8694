"""The write task's placing of records (`lakestream.sink.write.task.WriteTask`) without Kafka or Spark: routing
to a prepared table, a deferred table or a dead letter (with its Kafka coordinates and raw bytes), and the facts
written for a table into a local directory. Seconds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from lakestream.config import StreamSettings
from lakestream.routing import Router
from lakestream.sink import report as rp
from lakestream.sink.spec import TableSpec
from lakestream.sink.write.task import WriteContext, WriteTask
from lakestream.source.kafka import TP

TOPIC, TABLE = "p.public.orders", "cdc.public_orders"
SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "required": True, "type": "long"},
        {"id": 2, "name": "status", "required": False, "type": "string"},
    ],
}


def _rec(offset: int, key: Any, value: Any, partition: int = 0) -> SimpleNamespace:
    enc = lambda x: None if x is None else (x if isinstance(x, bytes) else json.dumps(x).encode())  # noqa: E731
    return SimpleNamespace(
        topic=TOPIC,
        partition=partition,
        offset=offset,
        timestamp_ms=1000 + offset,
        key=enc(key),
        value=enc(value),
        headers=None,
    )


def _change(key: int, op: str = "c", status: str = "new") -> tuple[Any, Any]:
    after = None if op == "d" else {"id": key, "status": status}
    before = {"id": key, "status": "old"} if op in ("u", "d") else None
    return {"id": key}, {"before": before, "after": after, "op": op}


def _task(spec: TableSpec | None = None, **stream: Any) -> WriteTask:
    router = Router([StreamSettings(**({"topic_pattern": r"p\..*"} | stream))])
    return WriteTask(WriteContext({}, router, {TABLE: spec} if spec is not None else {}))


def _spec(tmp_path: Path, **kwargs: Any) -> TableSpec:
    return TableSpec(TABLE, "upsert", ["id"], SCHEMA, {"spec-id": 0, "fields": []}, str(tmp_path / "data"), **kwargs)


def _letters(task: WriteTask) -> list[rp.DeadLetter]:
    return [f for f in task.facts if isinstance(f, rp.DeadLetter)]


def test_a_record_that_does_not_decode_is_a_dead_letter_with_its_coordinates(tmp_path: Path) -> None:
    task = _task(_spec(tmp_path))
    rec = _rec(7, {"id": 1}, b"{not json", partition=2)
    assert task.place_record(rec) is None
    [letter] = _letters(task)
    assert (letter.tp, letter.offset, letter.kafka_ts) == (TP(TOPIC, 2), 7, 1007)
    assert letter.raw_value == b"{not json" and letter.raw_key == rec.key
    assert letter.reason_kind == "malformed" and letter.table == TABLE and letter.error


def test_a_keyless_event_for_a_mirror_by_key_is_a_missing_key_dead_letter(tmp_path: Path) -> None:
    task = _task(_spec(tmp_path))
    assert task.place_record(_rec(3, None, _change(1)[1])) is None
    [letter] = _letters(task)
    assert letter.reason_kind == "missing_key" and "mirrored by key ['id']" in letter.error
    assert not task.pending


def test_a_rejected_shape_is_a_dead_letter_naming_the_reason(tmp_path: Path) -> None:
    probe = _task(_spec(tmp_path))
    change = probe.place_record(_rec(0, *_change(1)))
    assert change is not None
    spec = _spec(tmp_path, rejected_shapes={change.columns.schema_id: "column status: string cannot become int"})
    task = _task(spec)
    assert task.place_record(_rec(1, *_change(2))) is None
    [letter] = _letters(task)
    assert letter.reason_kind == "incompatible_schema" and "cannot become int" in letter.error


def test_a_table_not_prepared_is_deferred_and_its_shape_reported(tmp_path: Path) -> None:
    task = _task()
    assert task.place_record(_rec(0, *_change(1))) is not None
    task.defer_unprepared()
    [shape] = [f for f in task.facts if isinstance(f, rp.NewShape)]
    assert shape.table == TABLE and dict(shape.columns) == {"id": "bigint", "status": "string"}
    assert shape.key == ["id"] and TABLE not in task.pending


def test_records_the_table_holds_already_are_skipped(tmp_path: Path) -> None:
    task = _task(_spec(tmp_path, committed={TP(TOPIC, 0): 10}))
    assert task.place_record(_rec(9, *_change(1))) is None
    assert task.place_record(_rec(10, *_change(2))) is not None
    assert [r["id"] for r in task.pending[TABLE].rows] == [2] and not _letters(task)


def test_a_table_s_changes_become_a_data_file_and_row_locations(tmp_path: Path) -> None:
    task = _task(_spec(tmp_path))
    for offset, (key, op) in enumerate([(1, "c"), (2, "c"), (1, "u"), (2, "d")]):
        task.place_record(_rec(offset, *_change(key, op, status=f"v{offset}")))
    task.defer_unprepared()
    task.write_tables()
    [written] = [f for f in task.facts if isinstance(f, rp.DataFileWritten)]
    assert written.record_count == 1 and Path(written.path.removeprefix("file:")).exists()
    [locations] = [f for f in task.facts if isinstance(f, rp.RowLocations)]
    blob = locations.locations.sort_by("key")
    assert blob.column("key").to_pylist() == [1, 2]
    assert blob.column("op").to_pylist() == [rp.KeyedOp.UPSERT, rp.KeyedOp.DELETE]
    assert blob.column("offset").to_pylist() == [2, 3]  # the latest change of each key
    import pyarrow.parquet as pq

    assert pq.read_table(written.path.removeprefix("file:")).to_pydict()["status"] == ["v2"]
    assert pa.types.is_int64(blob.schema.field("key").type)


def test_a_task_runs_with_the_collector_paused_and_leaves_it_as_it_was(monkeypatch: Any) -> None:
    """The cyclic collector is off while a task runs (its full collections rescanned a Message per record) and as it
    was afterwards: back on when it was on, still off when the worker had it off, and back on after a task fails."""
    import gc

    from lakestream.sink.write import task as task_module

    seen: list[bool] = []

    def run(self: WriteTask, ranges: list[Any]) -> str:
        seen.append(gc.isenabled())
        if ranges == ["fail"]:
            raise RuntimeError("the task failed")
        return "report"

    monkeypatch.setattr(WriteTask, "run", run)
    ctx = WriteContext({}, Router([StreamSettings(topic_pattern=r"p\..*")]), {})
    assert gc.isenabled()
    assert list(task_module.run_write_task([], ctx)) == ["report"]
    assert seen == [False] and gc.isenabled()
    try:
        list(task_module.run_write_task(["fail"], ctx))  # type: ignore[list-item]
    except RuntimeError:
        pass
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        list(task_module.run_write_task([], ctx))
        assert not gc.isenabled()
    finally:
        gc.enable()
