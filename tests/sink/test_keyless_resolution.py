"""The resolution of a keyless table's batch without Spark (`lakestream.sink.commit.keyless`): which events are
re-sends, by their source position against the one the index stored."""

from __future__ import annotations

import pyarrow as pa

from lakestream.sink.commit.keyless import apply_resolution, resolve_keyless
from lakestream.sink.index.keyless import KeylessIndex
from lakestream.sink.report import DataFileWritten, KeylessOp, RowLocations, TableReport, keyless_change_schema
from lakestream.source.kafka import TP

TOPIC = "p.public.log"


def _h(name: str) -> bytes:
    return name.encode().ljust(16, b"\0")


def _batch(changes: list[tuple[KeylessOp, str | None, str | None, tuple[int, int]]], first_offset: int) -> TableReport:
    """One task's changes (op, new row, old row, source position), each added row at its position in one file."""
    report = TableReport("n.log")
    report.files.append(DataFileWritten("n.log", "file:/data/f1.parquet", 100, len(changes), [], "t1", 0))
    added = [new is not None for _, new, _, _ in changes]
    report.locations.append(
        RowLocations(
            "n.log",
            "t1",
            pa.table(
                {
                    "op": pa.array([int(op) for op, _, _, _ in changes], pa.int8()),
                    "new_row": pa.array([_h(new) if new else None for _, new, _, _ in changes], pa.binary(16)),
                    "old_row": pa.array([_h(old) if old else None for _, _, old, _ in changes], pa.binary(16)),
                    "task_file": pa.array([0 if a else -1 for a in added], pa.int32()),
                    "pos": pa.array(list(range(len(changes))), pa.int64()),
                    "topic": pa.array([TOPIC] * len(changes), pa.string()),
                    "partition": pa.array([0] * len(changes), pa.int32()),
                    "offset": pa.array(range(first_offset, first_offset + len(changes)), pa.int64()),
                    "commit_lsn": pa.array([p[0] for *_, p in changes], pa.int64()),
                    "lsn": pa.array([p[1] for *_, p in changes], pa.int64()),
                },
                schema=keyless_change_schema(),
            ),
        )
    )
    return report


def _applied(index: KeylessIndex, report: TableReport):
    resolved = resolve_keyless(index, report)
    apply_resolution(index, resolved, truncated=False)
    return resolved


def test_a_resend_that_begins_exactly_at_the_last_event_applied_is_left_out() -> None:
    index = KeylessIndex(None, "uuid")
    _applied(index, _batch([(KeylessOp.INSERT, "a", None, (10, 100)), (KeylessOp.INSERT, "b", None, (10, 101))], 0))
    update = (KeylessOp.UPDATE, "b2", "b", (20, 200))
    first = _applied(index, _batch([update], 2))
    assert (first.applied, first.resent) == (1, 0)
    # Debezium, restarted, sends that last update again at the next Kafka offset: the same position.
    again = resolve_keyless(index, _batch([update], 3))
    assert (again.applied, again.resent) == (0, 1)
    assert again.deletes == {"file:/data/f1.parquet": [0]}  # the re-sent copy written by the task goes
    # A new event after it is applied.
    later = resolve_keyless(index, _batch([update, (KeylessOp.INSERT, "c", None, (20, 201))], 3))
    assert (later.applied, later.resent) == (1, 1)


def test_a_resent_delete_at_the_stored_position_removes_no_second_equal_row() -> None:
    index = KeylessIndex(None, "uuid")
    _applied(index, _batch([(KeylessOp.INSERT, "a", None, (10, 100)), (KeylessOp.INSERT, "a", None, (10, 101))], 0))
    delete = (KeylessOp.DELETE, None, "a", (20, 200))
    assert _applied(index, _batch([delete], 2)).deletes == {"file:/data/f1.parquet": [1]}
    again = resolve_keyless(index, _batch([delete], 3))
    assert (again.applied, again.resent, again.deletes) == (0, 1, {})  # the other copy of "a" stays


def test_inserts_sharing_one_position_are_counted_not_taken_for_resends() -> None:
    """The rows of one COPY record (or of a snapshot) share a source position, within a batch and across two."""
    index = KeylessIndex(None, "uuid")
    group = [(KeylessOp.INSERT, "x", None, (5, 50)), (KeylessOp.INSERT, "x", None, (5, 50))]
    first = _applied(index, _batch(group, 0))
    assert (first.applied, first.resent) == (2, 0)
    assert index.positions[TP(TOPIC, 0)] == (5, 50, 2)
    # The group goes on in the next batch: more rows, not re-sends.
    more = _applied(index, _batch([(KeylessOp.INSERT, "y", None, (5, 50))], 2))
    assert (more.applied, more.resent) == (1, 0)
    # A re-send from an earlier position: the rows of the group after it, up to the count applied, are re-sends.
    resent = resolve_keyless(
        index,
        _batch([(KeylessOp.INSERT, "w", None, (5, 49)), *group, (KeylessOp.INSERT, "y", None, (5, 50))], 3),
    )
    assert (resent.applied, resent.resent) == (0, 4)
