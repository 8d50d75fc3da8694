"""The batch format: what a write task reports to the driver, one typed record kind per fact.

A write task (see `lakestream.sink.write.task`) reads Kafka ranges, decodes, converts and writes data
files itself. It sends the driver only small facts, never the rows:

- `RangeEnd`: where reading one partition's range really stopped;
- `DataFileWritten`: a Parquet file it wrote for a table (path, size, rows, partition values);
- `RowLocations`: for upsert and de-duplicated tables, one Arrow IPC blob per table listing each
  change's key, Kafka position and where its row landed (file, row position), so the driver can
  resolve the latest change per key across tasks and write deletion vectors for replaced rows;
- `TableStats`: per table and partition, the offsets and source-time quantiles it consumed;
- `NewShape`: a row shape the driver has not accepted for a table yet: that table is written in a
  second pass after the driver created or evolved it;
- `DeadLetter`: a record that could not be read, decoded, routed or converted, with its reason
  and raw bytes;
- `Truncate`: a TRUNCATE of a table at a Kafka position: the table's rows as of that point go;
- `Skipped`: records that carry no row change on purpose (logical-decoding messages), counted;
- `ChangedKeys`: for an input of a derived table kept by key (`lakestream.process.materialize`), the
  key and derived-key columns of each change, with its op and Kafka position (Arrow IPC blob).

All kinds travel in one Arrow schema (`REPORT_SCHEMA`); each column has one meaning, and each kind
uses the columns its dataclass names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from lakestream.source.kafka import TP

RANGE_END, DATA_FILE, ROW_LOCATIONS, TABLE_STATS, NEW_SHAPE, DEAD_LETTER, TRUNCATE, SKIPPED, CHANGED_KEYS = (
    "range_end",
    "data_file",
    "row_locations",
    "table_stats",
    "new_shape",
    "dead_letter",
    "truncate",
    "skipped",
    "changed_keys",
)

REPORT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("table", pa.string()),  # namespace.table
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),  # range_end: next offset; dead_letter, truncate: the record's offset
        ("at_end", pa.bool_()),  # range_end: the broker said end-of-partition
        ("path", pa.string()),  # data_file
        ("file_size", pa.int64()),  # data_file
        ("record_count", pa.int64()),  # data_file, table_stats, skipped
        ("partition_values", pa.string()),  # data_file: JSON list, Iceberg internal form
        ("task_file", pa.int32()),  # data_file: its number within the task (row_locations refer to it)
        ("task_id", pa.string()),  # data_file, row_locations: which task attempt wrote it
        ("locations", pa.binary()),  # row_locations, changed_keys: Arrow IPC stream
        ("min_offset", pa.int64()),  # table_stats
        ("max_offset", pa.int64()),  # table_stats
        ("source_ts_max", pa.int64()),  # table_stats
        ("source_ts_min", pa.int64()),  # table_stats
        ("source_ts_q", pa.list_(pa.float64())),  # table_stats: [q01, q50, q99]
        ("schema_id", pa.string()),  # new_shape
        ("shape", pa.string()),  # new_shape: JSON {columns, key, inferred}
        ("error", pa.string()),  # dead_letter; skipped: the reason
        ("kafka_ts", pa.int64()),  # dead_letter
        ("raw_key", pa.binary()),  # dead_letter
        ("raw_value", pa.binary()),  # dead_letter
        ("reason_kind", pa.string()),  # dead_letter: one of lakestream.errors.DEAD_LETTER_KINDS
    ]
)

REPORT_DDL = ", ".join(
    f"`{f.name}` {_ddl}"
    for f, _ddl in zip(
        REPORT_SCHEMA,
        [
            "string",
            "string",
            "string",
            "int",
            "bigint",
            "boolean",
            "string",
            "bigint",
            "bigint",
            "string",
            "int",
            "string",
            "binary",
            "bigint",
            "bigint",
            "bigint",
            "bigint",
            "array<double>",
            "string",
            "string",
            "string",
            "bigint",
            "binary",
            "binary",
            "string",
        ],
        strict=True,
    )
)


class KeyedOp(IntEnum):
    """The ``op`` of a change in a keyed table's `RowLocations` blob (`location_schema`)."""

    UPSERT = 0
    DELETE = 1
    RECREATE = 2  # an upsert of a key the task also deleted before it: the row is created again, new `_row_id`


class KeylessOp(IntEnum):
    """The ``op`` of a change in a keyless table's `RowLocations` blob (`keyless_change_schema`)."""

    INSERT = 0  # Debezium c and r
    UPDATE = 1
    DELETE = 2


def location_schema(hashed_key: bool) -> pa.Schema:
    """The rows of a `RowLocations` blob: one per change that survived the task's own de-duplication."""
    return pa.schema(
        [
            ("key", pa.binary(16) if hashed_key else pa.int64()),
            ("op", pa.int8()),  # KeyedOp
            ("task_file", pa.int32()),  # -1 for deletes (no row written)
            ("pos", pa.int64()),  # the row's position in that file
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("withheld", pa.list_(pa.string())),  # TOAST columns Debezium withheld and the task could not fill
        ]
    )


def keyless_change_schema() -> pa.Schema:
    """The rows of a keyless table's `RowLocations` blob: every change of the task, in Kafka order."""
    return pa.schema(
        [
            ("op", pa.int8()),  # KeylessOp
            ("new_row", pa.binary(16)),  # content hash of the row it adds (insert, update)
            ("old_row", pa.binary(16)),  # content hash of the row it removes (update, delete)
            ("task_file", pa.int32()),  # where the added row landed (-1: none)
            ("pos", pa.int64()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("commit_lsn", pa.int64()),  # the source position (`envelope.source_position`)
            ("lsn", pa.int64()),
        ]
    )


def is_keyless_report(table: pa.Table) -> bool:
    """Whether a `RowLocations` blob is of a keyless table (`keyless_change_schema`), not `location_schema`."""
    return "new_row" in table.column_names


def kafka_order(topics: Sequence[str], partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row numbers in Kafka order: by topic, partition, then offset. The one order changes are applied in, by the
    write tasks (the latest change per key) and by the driver (across tasks)."""
    codes = np.unique(np.asarray(topics, dtype=object), return_inverse=True)[1]
    return np.lexsort((np.asarray(offsets), np.asarray(partitions), codes))


@dataclass(frozen=True)
class RangeEnd:
    tp: TP
    next_offset: int
    at_end: bool

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": RANGE_END,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "offset": self.next_offset,
            "at_end": self.at_end,
        }


@dataclass(frozen=True)
class DataFileWritten:
    table: str
    path: str
    file_size: int
    record_count: int
    partition_values: list[Any]
    task_id: str
    task_file: int

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": DATA_FILE,
            "table": self.table,
            "path": self.path,
            "file_size": self.file_size,
            "record_count": self.record_count,
            "partition_values": orjson.dumps(self.partition_values).decode(),
            "task_id": self.task_id,
            "task_file": self.task_file,
        }


@dataclass(frozen=True)
class RowLocations:
    table: str
    task_id: str
    locations: pa.Table

    def to_row(self) -> dict[str, Any]:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.locations.schema) as writer:
            writer.write_table(self.locations)
        return {
            "kind": ROW_LOCATIONS,
            "table": self.table,
            "task_id": self.task_id,
            "locations": sink.getvalue().to_pybytes(),
        }


@dataclass(frozen=True)
class TableStats:
    table: str
    tp: TP
    count: int
    min_offset: int
    max_offset: int
    source_ts_min: int | None
    source_ts_max: int | None
    source_ts_q: list[float] | None

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": TABLE_STATS,
            "table": self.table,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "record_count": self.count,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "source_ts_min": self.source_ts_min,
            "source_ts_max": self.source_ts_max,
            "source_ts_q": self.source_ts_q,
        }


@dataclass(frozen=True)
class NewShape:
    table: str
    topic: str
    schema_id: str
    columns: list[tuple[str, str]]
    key: list[str]
    inferred: bool
    defaults: dict[str, Any] = field(default_factory=dict)  # column → source default (Iceberg single-value JSON)

    def to_row(self) -> dict[str, Any]:
        shape = {
            "columns": [list(c) for c in self.columns],
            "key": self.key,
            "inferred": self.inferred,
            "defaults": self.defaults,
        }
        return {
            "kind": NEW_SHAPE,
            "table": self.table,
            "topic": self.topic,
            "schema_id": self.schema_id,
            "shape": orjson.dumps(shape).decode(),
        }


@dataclass(frozen=True)
class DeadLetter:
    tp: TP
    offset: int
    kafka_ts: int | None
    error: str
    raw_key: bytes | None
    raw_value: bytes | None
    table: str | None = None
    reason_kind: str = "malformed"  # a bounded label (lakestream.errors.DEAD_LETTER_KINDS), for metrics

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": DEAD_LETTER,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "offset": self.offset,
            "kafka_ts": self.kafka_ts,
            "error": self.error,
            "raw_key": self.raw_key,
            "raw_value": self.raw_value,
            "table": self.table,
            "reason_kind": self.reason_kind,
        }


@dataclass(frozen=True)
class Truncate:
    table: str
    tp: TP
    offset: int  # the last TRUNCATE of the table in this partition, in this task

    def to_row(self) -> dict[str, Any]:
        return {
            "kind": TRUNCATE,
            "table": self.table,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "offset": self.offset,
        }


@dataclass(frozen=True)
class Skipped:
    reason: str  # a bounded label: logical_decoding_message | truncate_in_append_stream
    count: int

    def to_row(self) -> dict[str, Any]:
        return {"kind": SKIPPED, "error": self.reason, "record_count": self.count}


@dataclass(frozen=True)
class ChangedKeys:
    table: str
    task_id: str
    changes: pa.Table  # the reported columns plus _op, _topic, _partition, _offset, _withheld

    def to_row(self) -> dict[str, Any]:
        return {"kind": CHANGED_KEYS, "table": self.table, "task_id": self.task_id, "locations": _ipc(self.changes)}


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


Fact = RangeEnd | DataFileWritten | RowLocations | TableStats | NewShape | DeadLetter | Truncate | Skipped | ChangedKeys


def to_batch(facts: Iterable[Fact]) -> pa.RecordBatch:
    """Facts as one Arrow batch in `REPORT_SCHEMA` (the output of a write task)."""
    rows = [f.to_row() for f in facts]
    columns = {name: [r.get(name) for r in rows] for name in REPORT_SCHEMA.names}
    return pa.RecordBatch.from_pydict(columns, schema=REPORT_SCHEMA)


@dataclass
class TableReport:
    """Everything the tasks reported about one table."""

    table: str
    files: list[DataFileWritten] = field(default_factory=list)
    locations: list[RowLocations] = field(default_factory=list)
    stats: list[TableStats] = field(default_factory=list)
    shapes: dict[str, NewShape] = field(default_factory=dict)
    truncates: dict[TP, int] = field(default_factory=dict)  # the last TRUNCATE offset per partition
    changed_keys: list[pa.Table] = field(default_factory=list)  # ChangedKeys.changes, per task

    @property
    def count(self) -> int:
        return sum(s.count for s in self.stats)

    def tp_offsets(self) -> dict[TP, tuple[int, int]]:
        out: dict[TP, tuple[int, int]] = {}
        for s in self.stats:
            lo, hi = out.get(s.tp, (s.min_offset, s.max_offset))
            out[s.tp] = (min(lo, s.min_offset), max(hi, s.max_offset))
        return out

    @property
    def max_source_ts(self) -> int | None:
        values = [s.source_ts_max for s in self.stats if s.source_ts_max is not None]
        return max(values) if values else None


@dataclass
class BatchReport:
    """The whole batch as the driver sees it after the write job."""

    ends: dict[TP, RangeEnd] = field(default_factory=dict)
    tables: dict[str, TableReport] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason → records

    def table(self, name: str) -> TableReport:
        report = self.tables.get(name)
        if report is None:
            report = self.tables[name] = TableReport(name)
        return report

    def add(self, rows: pa.Table) -> None:
        """Fold a collected report (rows in `REPORT_SCHEMA`) into this batch."""
        for r in rows.to_pylist():
            kind = r["kind"]
            if kind == RANGE_END:
                tp = TP(r["topic"], r["partition"])
                prev = self.ends.get(tp)
                if prev is None or r["offset"] > prev.next_offset:
                    self.ends[tp] = RangeEnd(tp, r["offset"], bool(r["at_end"]))
            elif kind == DATA_FILE:
                self.table(r["table"]).files.append(
                    DataFileWritten(
                        r["table"],
                        r["path"],
                        r["file_size"],
                        r["record_count"],
                        orjson.loads(r["partition_values"]),
                        r["task_id"],
                        r["task_file"],
                    )
                )
            elif kind == ROW_LOCATIONS:
                with pa.ipc.open_stream(r["locations"]) as reader:
                    locations = reader.read_all()
                self.table(r["table"]).locations.append(RowLocations(r["table"], r["task_id"], locations))
            elif kind == TABLE_STATS:
                self.table(r["table"]).stats.append(
                    TableStats(
                        r["table"],
                        TP(r["topic"], r["partition"]),
                        r["record_count"],
                        r["min_offset"],
                        r["max_offset"],
                        r["source_ts_min"],
                        r["source_ts_max"],
                        r["source_ts_q"],
                    )
                )
            elif kind == NEW_SHAPE:
                shape = orjson.loads(r["shape"])
                self.table(r["table"]).shapes.setdefault(
                    r["schema_id"],
                    NewShape(
                        r["table"],
                        r["topic"],
                        r["schema_id"],
                        [tuple(c) for c in shape["columns"]],
                        shape["key"],
                        shape["inferred"],
                        shape.get("defaults") or {},
                    ),
                )
            elif kind == DEAD_LETTER:
                self.dead_letters.append(
                    DeadLetter(
                        TP(r["topic"], r["partition"]),
                        r["offset"],
                        r["kafka_ts"],
                        r["error"],
                        r["raw_key"],
                        r["raw_value"],
                        r["table"],
                        r["reason_kind"] or "malformed",
                    )
                )
            elif kind == TRUNCATE:
                truncates = self.table(r["table"]).truncates
                tp = TP(r["topic"], r["partition"])
                truncates[tp] = max(truncates.get(tp, -1), r["offset"])
            elif kind == CHANGED_KEYS:
                with pa.ipc.open_stream(r["locations"]) as reader:
                    self.table(r["table"]).changed_keys.append(reader.read_all())
            elif kind == SKIPPED:
                self.skipped[r["error"]] = self.skipped.get(r["error"], 0) + r["record_count"]
            else:
                raise ValueError(f"unknown report kind {kind!r}")
