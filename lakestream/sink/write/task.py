"""The write task: the body of the one Spark job of a micro-batch.

Each task reads its planned Kafka ranges, decodes and routes every record, converts each table's
rows strictly into that table's Arrow schema, keeps the latest change per key (upsert) or the
first per event id (de-duplicated appends), writes the table's Parquet data files itself, and
reports small facts to the driver (`lakestream.sink.report`). No row crosses to the driver and
nothing is parsed twice.

A table the driver has not prepared for a record's shape (a new table, a new column, a wider
type) is not written by this job: the task reports the shape, the driver creates or evolves the
table, and a second job writes that table alone.
"""

from __future__ import annotations

import bisect
import gc
import os
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from lakestream.decode.avro import schema_id_of
from lakestream.decode.envelope import COLUMNS, MESSAGE, TRUNCATE
from lakestream.decode.records import DecodedRecord, RecordDecoder
from lakestream.decode.vectorized import DecodedRun, RunDecoder, decode_events
from lakestream.errors import BadValue, DecodeError
from lakestream.routing import Router
from lakestream.sink import report as rp
from lakestream.sink.index.keys import index_keys, is_integer_key, keys_to_arrow
from lakestream.sink.spec import TableSpec
from lakestream.sink.write.convert import convert_rows
from lakestream.sink.write.latest import STORED, first_per_key, last_per_key, latest_per_key
from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange
from lakestream.source.reader import RecordRun, read_runs
from lakestream.storage import StorageContext, active_options, use_options
from lakestream.transform.apply import (
    Derived,
    apply_isolating,
    fit_output,
    reference_views,
    run_transform,
    with_meta,
)
from lakestream.transform.reference import ReferenceData


@dataclass
class WriteContext:
    """Everything a task needs besides its ranges."""

    consumer_conf: dict[str, Any]
    router: Router
    tables: dict[str, TableSpec]
    only_tables: frozenset[str] | None = None  # second pass: write these tables only
    # Called with every record read, before it is decoded (tests inject a failing record through it).
    record_hook: Callable[[Any], None] | None = None
    derived: dict[str, list[Derived]] = field(default_factory=dict)  # input table → its transforms
    # Input table of a derived table kept by key → the columns to report of each change (ChangedKeys).
    changed_keys: dict[str, list[str]] = field(default_factory=dict)
    # Reference key → the reference table's data for this batch (a broadcast; see transform.reference).
    references: dict[str, ReferenceData] = field(default_factory=dict)
    # Transform outputs that commit at their own cadence (lakestream.engine.cadence): they may lag their
    # input, so the input's records they lack are read again to feed them, and not written again.
    held_outputs: frozenset[str] = frozenset()

    def reread_from(self, table: str, tp: TP, committed: int) -> int:
        """The first offset of ``tp`` to read for ``table``: its own stored offset (``committed``), or a
        lagging held output's, lower."""
        outputs = [d for d in self.derived.get(table, ()) if self.writes(d.table)]
        return reread_from(outputs, self.tables, self.held_outputs, tp, committed)

    def wanted(self, table: str) -> bool:
        """Whether this job reads ``table``'s changes: to write it, or to feed one of its transforms."""
        if self.only_tables is None or table in self.only_tables:
            return True
        return any(d.table in self.only_tables for d in self.derived.get(table, ()))

    def writes(self, table: str) -> bool:
        return self.only_tables is None or table in self.only_tables

    # `SchemaRegistrySettings.client_config()` (secrets resolved on the driver), to read Avro records.
    schema_registry: dict[str, Any] | None = field(default=None, repr=False)  # holds secrets: never in a repr
    # The driver's object storage (credentials included): the tasks write their files through it.
    storage: StorageContext = field(default_factory=active_options, repr=False)


class _Pending:
    """One table's changes within a task, in Kafka order."""

    __slots__ = (
        "spec",
        "topics",
        "partitions",
        "offsets",
        "ops",
        "rows",
        "withheld",
        "source_ts",
        "kafka_ts",
        "raw_keys",
        "raw_values",
        "runs",
        "truncates",
        "old_rows",
        "positions",
    )

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.ops: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.withheld: list[list[str]] = []
        self.source_ts: list[int | None] = []
        self.kafka_ts: list[int] = []
        self.raw_keys: list[bytes | None] = []
        self.raw_values: list[bytes | None] = []
        self.runs: list[tuple[str, int, DecodedRun]] = []  # (topic, partition, run) decoded vectorized
        self.truncates: list[tuple[str, int, int, int | None]] = []  # (topic, partition, offset, source ts)
        self.old_rows: list[dict[str, Any] | None] = []  # keyless tables: an update's old row
        self.positions: list[tuple[int, int] | None] = []  # the source position of each change

    def add(self, rec: Any, change: DecodedRecord) -> None:
        self.topics.append(rec.topic)
        self.partitions.append(rec.partition)
        self.offsets.append(rec.offset)
        self.ops.append(change.op)
        self.rows.append(change.row)
        self.withheld.append(change.unavailable)
        self.source_ts.append(change.source_ts_ms)
        self.kafka_ts.append(rec.timestamp_ms)
        self.raw_keys.append(rec.key)
        self.raw_values.append(rec.value)
        self.old_rows.append(change.old_row)
        self.positions.append(change.position)


@dataclass
class _Rows:
    """One table's decoded changes of a task, typed, with their Kafka positions (row i ↔ entry i)."""

    table: pa.Table
    topics: list[str]
    partitions: np.ndarray
    offsets: np.ndarray
    ops: list[str]
    withheld: list[list[str]]
    source_ts: np.ndarray  # float64, NaN where unknown
    kafka_ts: np.ndarray
    old_rows: list[dict[str, Any] | None] | None = None  # keyless tables (record-by-record rows only)
    positions: list[tuple[int, int] | None] | None = None


def change_stats(
    name: str, topics: list[str], partitions: np.ndarray, offsets: np.ndarray, source_ts: np.ndarray
) -> list[rp.TableStats]:
    """Per partition: records consumed (kept or not: a dead letter is consumed too) and source times."""
    out = []
    distinct = set(zip(topics, partitions.tolist(), strict=True))
    for topic, partition in distinct:
        if len(distinct) == 1:
            sel = slice(None)
        else:
            sel = np.array([t == topic for t in topics], dtype=bool) & (partitions == partition)
        offs, ts = offsets[sel], source_ts[sel]
        ts = ts[~np.isnan(ts)]
        q = np.quantile(ts, [0.01, 0.5, 0.99]).tolist() if len(ts) else None
        out.append(
            rp.TableStats(
                name,
                TP(topic, partition),
                len(offs),
                int(offs.min()),
                int(offs.max()),
                int(ts.min()) if len(ts) else None,
                int(ts.max()) if len(ts) else None,
                q,
            )
        )
    return out


def _apply_fills(table: pa.Table, fills: dict[int, dict[str, int]]) -> pa.Table:
    """Copy withheld column values from earlier rows (``fills``: row → column → source row)."""
    by_column: dict[str, dict[int, int]] = {}
    for row, columns in fills.items():
        for column, source in columns.items():
            by_column.setdefault(column, {})[row] = source
    for column, mapping in by_column.items():
        if column not in table.column_names:
            continue
        take = np.arange(table.num_rows)
        for row, source in mapping.items():
            take[row] = source
        i = table.column_names.index(column)
        table = table.set_column(i, table.schema.field(i), table.column(column).take(pa.array(take)))
    return table


class TableWriter:
    """Converts, de-duplicates and writes one table's changes of one task."""

    def __init__(self, spec: TableSpec, task_id: str):
        self.spec = spec
        self.task_id = task_id

    def finish(self, pending: _Pending, facts: list[rp.Fact], write: bool = True) -> _Rows | None:
        """Write the table's changes (``write``); return them typed, for its transforms."""
        rows = self._typed_rows(pending, facts if write else [])
        if rows is None or not write:
            return rows
        self._write_changes(rows, facts)
        return rows

    def _write_changes(self, rows: _Rows, facts: list[rp.Fact]) -> None:
        spec = self.spec
        if spec.kind == "multiset" and rows.positions is not None:
            self._write_keyless(rows, facts)
            return
        typed, ops, withheld = rows.table, rows.ops, rows.withheld
        if spec.keyed:
            keys_np = index_keys(typed, spec.key_columns)
            # Kafka order within a partition; partitions of one key do not interleave in Debezium.
            order_np = rp.kafka_order(rows.topics, rows.partitions, rows.offsets)
            fills: dict[int, dict[str, int]] = {}
            if spec.kind == "mirror" and not any(withheld):
                final = last_per_key(keys_np, order_np)
            elif spec.kind == "mirror":
                keys, order = keys_np.tolist(), order_np.tolist()
                final, fills = latest_per_key(keys, ops, withheld, order)
                # a value from the stored row stays withheld here: the committer fills it from the table
                fills = {
                    row: mine
                    for row, columns in fills.items()
                    if (mine := {c: src for c, src in columns.items() if src != STORED})
                }
                if fills:
                    typed = _apply_fills(typed, fills)
                    withheld = [[c for c in w if c not in fills.get(j, {})] for j, w in enumerate(withheld)]
            else:
                final = first_per_key(keys_np.tolist(), order_np.tolist())
        else:
            final = list(range(typed.num_rows))
        is_delete = np.array([ops[j] == "d" for j in final], dtype=bool)
        data_rows = [j for j, d in zip(final, is_delete, strict=True) if not d]
        data = typed.take(pa.array(data_rows, pa.int64())) if len(data_rows) != typed.num_rows else typed
        file_of = np.full(len(final), -1, np.int32)
        pos_of = np.zeros(len(final), np.int64)
        if data.num_rows:
            self._write_files(data, np.flatnonzero(~is_delete), file_of, pos_of, facts)
        if spec.keyed:
            sel = np.array(final, dtype=np.int64)
            op = np.where(is_delete, rp.KeyedOp.DELETE, rp.KeyedOp.UPSERT).astype(np.int8)
            if spec.kind == "mirror" and "d" in ops:
                deleted = keys_np[np.array([o == "d" for o in ops], dtype=bool)]
                op[np.isin(keys_np[sel], deleted) & ~is_delete] = rp.KeyedOp.RECREATE
            locations = pa.table(
                {
                    "key": keys_to_arrow(keys_np[sel]),
                    "op": pa.array(op),
                    "task_file": pa.array(file_of),
                    "pos": pa.array(pos_of),
                    "topic": pa.array([rows.topics[j] for j in final], pa.string()),
                    "partition": pa.array(rows.partitions[sel].astype(np.int32)),
                    "offset": pa.array(rows.offsets[sel]),
                    "withheld": pa.array([withheld[j] or None for j in final], pa.list_(pa.string()))
                    if any(withheld)
                    else pa.nulls(len(final), pa.list_(pa.string())),
                },
                schema=rp.location_schema(not is_integer_key(typed.schema, spec.key_columns)),
            )
            facts.append(rp.RowLocations(spec.name, self.task_id, locations))

    def _write_keyless(self, rows: _Rows, facts: list[rp.Fact]) -> None:
        """A table without a primary key (`lakestream.sink.index.keyless`): every insert and update writes its new
        row; the
        driver resolves which existing row each update or delete removes, and which events are re-sends."""
        from lakestream.sink.write.keyless import write_keyless_changes

        typed, ops = rows.table, rows.ops
        is_delete = np.array([o == "d" for o in ops], dtype=bool)
        file_of = np.full(len(ops), -1, np.int32)
        pos_of = np.zeros(len(ops), np.int64)
        data_rows = np.flatnonzero(~is_delete)
        if len(data_rows):
            data = typed.take(pa.array(data_rows, pa.int64())) if len(data_rows) != typed.num_rows else typed
            self._write_files(data, data_rows, file_of, pos_of, facts)
        schema = self.spec.arrow_schema()
        old_rows = rows.old_rows or [None] * len(ops)  # set, with positions, for every keyless change
        updates = [i for i, o in enumerate(ops) if o == "u" and old_rows[i] is not None]
        old: dict[int, pa.Table | None] = {}
        if updates:
            converted, bad = convert_rows([row for i in updates if (row := old_rows[i]) is not None], schema)
            good = [j for j in range(len(updates)) if j not in bad]
            for i in updates:
                old[i] = None
            for k, j in enumerate(good):
                old[updates[j]] = converted.slice(k, 1)
        blob = write_keyless_changes(
            typed,
            ops,
            old,
            schema,
            file_of,
            pos_of,
            rows.topics,
            rows.partitions,
            rows.offsets,
            [p or (0, 0) for p in rows.positions or []],
        )
        facts.append(rp.RowLocations(self.spec.name, self.task_id, blob))

    def _typed_rows(self, pending: _Pending, facts: list[rp.Fact]) -> _Rows | None:
        """Every change of the table, typed: record-by-record rows converted strictly (a value that
        does not fit makes its record a dead letter), then the runs decoded vectorized."""
        spec = self.spec
        schema = spec.arrow_schema()
        run_topics: list[str] = []
        for topic, _, run in pending.runs:
            run_topics += [topic] * run.table.num_rows
        all_topics = pending.topics + run_topics
        all_partitions = np.concatenate(
            [np.asarray(pending.partitions, np.int64)]
            + [np.full(run.table.num_rows, p, np.int64) for _, p, run in pending.runs]
        )
        all_offsets = np.concatenate(
            [np.asarray(pending.offsets, np.int64)] + [run.offsets for _, _, run in pending.runs]
        )
        source_ts = np.concatenate(
            [np.array([np.nan if t is None else t for t in pending.source_ts], np.float64)]
            + [run.source_ts for _, _, run in pending.runs]
        )
        kafka_ts = np.concatenate(
            [np.asarray(pending.kafka_ts, np.int64)]
            + [np.asarray(run.kafka_ts, np.int64) for _, _, run in pending.runs]
        )
        if pending.truncates:
            # A truncate is consumed by the table like any change: its offset commits with the table.
            t_topics, t_parts, t_offs, t_ts = zip(*pending.truncates, strict=True)
            facts.extend(
                change_stats(
                    spec.name,
                    all_topics + list(t_topics),
                    np.concatenate([all_partitions, np.asarray(t_parts, np.int64)]),
                    np.concatenate([all_offsets, np.asarray(t_offs, np.int64)]),
                    np.concatenate([source_ts, np.array([np.nan if t is None else t for t in t_ts])]),
                )
            )
            last: dict[TP, int] = {}
            for topic, partition, offset, _ in pending.truncates:
                tp = TP(topic, partition)
                last[tp] = max(last.get(tp, -1), offset)
            facts.extend(rp.Truncate(spec.name, tp, offset) for tp, offset in last.items())
        else:
            facts.extend(change_stats(spec.name, all_topics, all_partitions, all_offsets, source_ts))
        typed, bad = convert_rows(pending.rows, schema)
        for i, reason in sorted(bad.items()):
            facts.append(
                dead_letter(
                    TP(pending.topics[i], pending.partitions[i]),
                    pending.offsets[i],
                    pending.kafka_ts[i],
                    reason,
                    pending.raw_keys[i],
                    pending.raw_values[i],
                    spec.name,
                    BadValue.kind,
                )
            )
        good = [i for i in range(len(pending.rows)) if i not in bad]
        if bad:
            keep = np.array(good + list(range(len(pending.rows), len(all_topics))), dtype=np.int64)
            all_topics = [all_topics[i] for i in keep]
            all_partitions, all_offsets = all_partitions[keep], all_offsets[keep]
            source_ts, kafka_ts = source_ts[keep], kafka_ts[keep]
        tables = [typed] + [run.table for _, _, run in pending.runs]
        table = pa.concat_tables(tables) if len(tables) > 1 else typed
        if table.num_rows == 0:
            return None
        ops = [pending.ops[i] for i in good] + [op for _, _, run in pending.runs for op in run.ops]
        # A run's changes withhold nothing: one shared empty list (nothing mutates a change's list in place).
        withheld = [pending.withheld[i] for i in good] + [[]] * len(run_topics)
        old_rows = positions = None
        if spec.kind == "multiset" and not pending.runs:
            old_rows = [pending.old_rows[i] for i in good]
            positions = [pending.positions[i] for i in good]
        return _Rows(
            table, all_topics, all_partitions, all_offsets, ops, withheld, source_ts, kafka_ts, old_rows, positions
        )

    def _write_files(
        self, data: pa.Table, final_slots: np.ndarray, file_of: np.ndarray, pos_of: np.ndarray, facts: list[rp.Fact]
    ) -> None:
        """Write ``data`` (one partition per file); record where each row of ``final_slots`` landed."""
        from lakestream.sink.write.files import write_data_file
        from lakestream.sink.write.partitioning import partition_values

        spec = self.spec
        if spec.partition_spec.get("fields"):
            groups = partition_values(spec.partition_spec, spec.schema, data)
        else:
            groups = [([], np.arange(data.num_rows))]
        for values, rows in groups:
            rows = np.asarray(rows, dtype=np.int64)
            whole = len(rows) == data.num_rows and not spec.partition_spec.get("fields")
            part = data if whole else data.take(pa.array(rows))
            task_file = sum(1 for f in facts if isinstance(f, rp.DataFileWritten))
            written = write_data_file(part, spec.data_location, spec.arrow_schema(), f"{self.task_id}-{task_file:05d}")
            facts.append(
                rp.DataFileWritten(
                    spec.name,
                    written["path"],
                    written["file_size"],
                    written["record_count"],
                    list(values),
                    self.task_id,
                    task_file,
                )
            )
            file_of[final_slots[rows]] = task_file
            pos_of[final_slots[rows]] = np.arange(len(rows))


def _keys_in_table(spec: TableSpec, change: DecodedRecord) -> bool:
    names = set(spec.arrow_schema().names)
    return bool(change.key_columns) and all(k in names for k in change.key_columns)


def topic_table(router: Router, topic: str) -> str | None:
    """The table a topic routes to when that does not depend on the record (for dead letters)."""
    try:
        stream_index = router.stream_index(topic)
        if stream_index is None:
            return None
        stream = router.streams[stream_index]
        if stream.route_field or stream.route_header:
            return None
        return str(router.route(topic)[1])
    except DecodeError:
        return None


def _defaults_json(columns: Any) -> dict[str, Any]:
    """The shape's column defaults in Iceberg's single-value JSON form (those a column can take)."""
    if not columns.defaults:
        return {}
    from lakestream.sink.write.defaults import iceberg_json

    ddl = dict(zip(columns.names, (t.ddl for t in columns.types), strict=True))
    return {name: v for name, wire in columns.defaults.items() if (v := iceberg_json(ddl[name], wire)) is not None}


def _shape_schema(shape: rp.NewShape) -> pa.Schema | None:
    """The Arrow schema a new table of ``shape`` would get (flat columns only; None otherwise)."""
    from lakestream.sink.types import ddl_arrow_type

    fields = []
    for name, ddl in shape.columns:
        arrow = ddl_arrow_type(ddl)
        if arrow is None:
            return None
        fields.append(pa.field(name, arrow))
    return pa.schema(fields)


def run_write_task(ranges: list[OffsetRange], ctx: WriteContext) -> Iterator[pa.RecordBatch]:
    """Read ``ranges`` (distinct partitions) with one consumer, write the tables, yield the report.

    With ``LAKESTREAM_PROFILE_DIR`` set in the executors' environment, each task leaves a cProfile
    dump there (``task-<id>.prof``): where a write task spends its time, on any cluster."""
    profile_dir = os.environ.get("LAKESTREAM_PROFILE_DIR")
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile()
        report = profiler.runcall(lambda: list(_write_task(ranges, ctx)))
        profiler.dump_stats(os.path.join(profile_dir, f"task-{os.getpid()}-{uuid.uuid4().hex[:8]}.prof"))
        yield from report
        return
    yield from _write_task(ranges, ctx)


MAX_REASON = 2000  # characters of a dead letter's reason


def dead_letter(
    tp: TP,
    offset: int,
    kafka_ts: int | None,
    reason: str,
    key: bytes | None,
    value: bytes | None,
    table: str | None,
    kind: str,
) -> rp.DeadLetter:
    """The one way a task reports a record it cannot write: its Kafka coordinates, raw bytes and a bounded
    reason (``kind``: one of `lakestream.errors.DEAD_LETTER_KINDS`)."""
    return rp.DeadLetter(tp, offset, kafka_ts, reason[:MAX_REASON], key, value, table, kind)


def _write_task(ranges: list[OffsetRange], ctx: WriteContext) -> Iterator[pa.RecordBatch]:
    with collector_paused():
        report = WriteTask(ctx).run(ranges)
    yield report


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a write task, back as it was after it.

    A task allocates a container object per Kafka record (confluent-kafka's `Message` is one), so the collector's
    thresholds are passed every few hundred records and its full collections rescan everything alive: 7-12% of a
    task's CPU on the peers' events (bench/task.py --events peers). The task's data makes no reference cycles that
    outlive it unreclaimed for long: whatever cycles it leaves are collected by the first collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class WriteTask:
    """One write task: reads its ranges (`run`), places every record (`place_record`, or a whole run at once:
    `place_run`), leaves the tables the driver must prepare first to a second job (`defer_unprepared`), writes
    the others and their transforms' outputs (`write_tables`), and returns its facts."""

    def __init__(self, ctx: WriteContext):
        self.ctx = ctx
        self.task_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        use_options(ctx.storage)
        self.decoder = RecordDecoder(ctx.router, ctx.schema_registry)
        self.runs = RunDecoder()
        self.facts: list[rp.Fact] = []
        self.pending: dict[str, _Pending] = {}
        self.reread: dict[str, _Pending] = {}  # changes a table holds already, read again for its lagging outputs
        self.deferred: dict[str, dict[str, rp.NewShape]] = {}
        self.topic_tables: dict[str, str | None] = {}
        self.event_time_fields: dict[str, str | None] = {}  # topics of plain JSON event streams → event time field
        self.skipped: dict[str, int] = {}
        self.raw_runs: list[RecordRun] = []  # kept for the dead letters of transforms

    # -- the steps ---------------------------------------------------------------------------------
    def run(self, ranges: list[OffsetRange]) -> pa.RecordBatch:
        """Read, place, defer, write: the task's report."""
        ctx = self.ctx
        for item in read_runs(ctx.consumer_conf, list(ranges)):
            if isinstance(item, tuple):
                rng, end = item
                self.facts.append(rp.RangeEnd(rng.tp, end.next_offset, end.at_end))
                continue
            if ctx.derived:
                self.raw_runs.append(item)
            if ctx.record_hook is not None:
                for i in range(len(item)):
                    ctx.record_hook(item.record(i))
            self.place_run(item)
        self.defer_unprepared()
        self.write_tables()
        self.facts.extend(rp.Skipped(reason, count) for reason, count in self.skipped.items())
        return rp.to_batch(self.facts)

    def dead_letter(self, rec: Any, reason: str, table: str | None, kind: str) -> None:
        """Report record ``rec`` as a dead letter."""
        self.facts.append(
            dead_letter(
                TP(rec.topic, rec.partition), rec.offset, rec.timestamp_ms, reason, rec.key, rec.value, table, kind
            )
        )

    def skip(self, reason: str) -> None:
        """Count a record that carries no row change on purpose (reported once, by the first job)."""
        if self.ctx.only_tables is None:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def place_record(self, rec: Any) -> DecodedRecord | None:
        """Decode, route and place one record; its change when the record was kept or deferred."""
        change = self.decode(rec)
        if change is None:
            return None
        if change.op == MESSAGE:
            self.skip("logical_decoding_message")
            return None
        table = change.table
        if not self.ctx.wanted(table):
            return None
        spec = self.ctx.tables.get(table)
        if change.op == TRUNCATE:
            self.truncate(rec, change, spec)
            return None
        if change.op == COLUMNS:
            self.evolve_to(rec, change, spec)
            return None
        placed = self.place_shape(rec, change, spec)
        if placed != "accepted" or spec is None:
            return change if placed == "deferred" else None
        if not self.fits_kind(rec, change, spec):
            return None
        tp = TP(rec.topic, rec.partition)
        committed = spec.committed.get(tp, -1)
        if rec.offset < committed:
            if self.ctx.held_outputs and rec.offset >= self.ctx.reread_from(table, tp, committed):
                self._buffer(self.reread, spec).add(rec, change)
                return change
            return None  # the table already holds it (a re-read after a restart)
        self._buffer(self.pending, spec).add(rec, change)
        return change

    def decode(self, rec: Any) -> DecodedRecord | None:
        """The record's change (None: no change, or a dead letter for what its content made the decoder raise)."""
        try:
            return self.decoder.decode(rec)
        except (
            DecodeError,
            RecursionError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            UnicodeDecodeError,
            OverflowError,
        ) as exc:
            # Anything a record's content can make the decoder raise is that record's fault.
            if self.ctx.only_tables is None:
                reason = str(exc) if isinstance(exc, DecodeError) else f"cannot decode: {type(exc).__name__}: {exc}"
                kind = exc.kind if isinstance(exc, DecodeError) else DecodeError.kind
                self.dead_letter(rec, reason, topic_table(self.ctx.router, rec.topic), kind)
            return None

    def truncate(self, rec: Any, change: DecodedRecord, spec: TableSpec | None) -> None:
        """A TRUNCATE of a mirrored table: its rows as of this offset go (see `TableWriter.finish`)."""
        if change.stream.mode != "upsert":
            self.skip("truncate_in_append_stream")
            return
        if spec is None or rec.offset < spec.committed.get(TP(rec.topic, rec.partition), -1):
            return  # no table yet (nothing to empty), or the table already applied it
        self._buffer(self.pending, spec).truncates.append((rec.topic, rec.partition, rec.offset, change.source_ts_ms))

    def evolve_to(self, rec: Any, change: DecodedRecord, spec: TableSpec | None) -> None:
        """A column record (`lakestream.capture.columns`): its shape goes to the driver like a row's, which adds
        and widens the table's columns; it writes no row, creates no table (a second pass after preparing finds
        none: skipped) and is never a dead letter (an incompatible change makes the rows of that shape ones)."""
        self.skip("column_record")
        if spec is None and self.ctx.only_tables is not None:
            return
        if spec is not None and change.columns.schema_id in spec.rejected_shapes:
            return
        self.place_shape(rec, change, spec)

    def place_shape(
        self, rec: Any, change: DecodedRecord, spec: TableSpec | None
    ) -> Literal["accepted", "rejected", "deferred"]:
        """Whether the table takes the change's row shape as it is; a rejected shape is a dead letter, a new one is
        reported for the driver to prepare (the table is deferred to a second job)."""
        table, shape_id = change.table, change.columns.schema_id
        if spec is not None and shape_id in spec.rejected_shapes:
            reason = spec.rejected_shapes[shape_id]
            if (schema_id := schema_id_of(rec.value)) is not None:
                reason = f"{reason} (Avro writer schema id {schema_id})"
            self.dead_letter(rec, reason, table, "incompatible_schema")
            return "rejected"
        if (
            spec is not None
            and shape_id not in spec.accepted_shapes
            and table not in self.deferred
            and (
                change.op == "d"
                and _keys_in_table(spec, change)
                or spec.fits(
                    change.columns.names, [t.ddl for t in change.columns.types], complete=not change.columns.inferred
                )
            )
        ):
            # The table can take it as it is (a delete writes only its key).
            spec.accepted_shapes = spec.accepted_shapes | {shape_id}
        if spec is None or shape_id not in spec.accepted_shapes or table in self.deferred:
            shapes = self.deferred.setdefault(table, {})
            if shape_id not in shapes:
                cols = change.columns
                shapes[shape_id] = rp.NewShape(
                    table,
                    rec.topic,
                    shape_id,
                    [(n, t.ddl) for n, t in zip(cols.names, cols.types, strict=True)],
                    change.key_columns,
                    cols.inferred,
                    _defaults_json(cols),
                )
            return "deferred"
        return "accepted"

    def fits_kind(self, rec: Any, change: DecodedRecord, spec: TableSpec) -> bool:
        """Whether the change fits the table's kind: a keyed mirror needs a key; a multiset cannot take an update
        or delete that names its row by a key it does not have. Else a dead letter."""
        if spec.kind == "mirror" and not change.key_columns:
            # A keyless event (no message key) for a table mirrored by key.
            self.dead_letter(
                rec,
                f"missing key: the message has no key and the stream sets no key_columns "
                f"(table {spec.name} is mirrored by key {spec.key_columns})",
                spec.name,
                "missing_key",
            )
            return False
        if spec.kind == "multiset" and change.key_columns and change.op in ("u", "d"):
            self.dead_letter(
                rec,
                f"the source table gained a primary key {change.key_columns}, but its mirror "
                f"{spec.name} holds rows without one (a multiset), and this {change.op!r} event no "
                "longer names the old row — fix: drop the mirror and capture the table again, "
                "so it is recreated keyed",
                spec.name,
                "missing_key",
            )
            return False
        return True

    @staticmethod
    def _buffer(buffers: dict[str, _Pending], spec: TableSpec) -> _Pending:
        buf = buffers.get(spec.name)
        if buf is None:
            buf = buffers[spec.name] = _Pending(spec)
        return buf

    def place_run(self, run: RecordRun) -> None:
        """A partition's run of a fetch: decoded as one when it can be, else record by record."""
        ctx = self.ctx
        topic, partition = run.topic, run.partition
        table = self._run_table(topic)
        changes = (
            run if None not in run.values else run.select([i for i, v in enumerate(run.values) if v is not None])
        )  # tombstones carry no change
        if table is None or len(changes) < 16 or not ctx.wanted(table):
            self._one_by_one(run)
            return
        # The first record goes the careful way: it proves the run's shape is one the table accepts.
        first = self.place_record(changes.record(0))
        spec = ctx.tables.get(table)
        committed = spec.committed.get(TP(topic, partition), -1) if spec is not None else -1
        start = ctx.reread_from(table, TP(topic, partition), committed) if ctx.held_outputs else committed
        rest = changes.tail(max(1, bisect.bisect_left(changes.offsets, start)))
        if first is None or not len(rest) or rest.offsets[0] < committed:  # re-read records go one by one
            self._one_by_one(rest)
            return
        if table in self.deferred:
            # Not written by this job (the driver creates or evolves the table first): the run only
            # has to prove it brings no other shape, which a vectorized parse in the first record's
            # shape does; anything else is decoded record by record to report it.
            shape = self.deferred[table].get(first.columns.schema_id)
            schema = _shape_schema(shape) if shape is not None else None
            if schema is None or self._decode_run(rest, schema, first.key_columns, changes.values[0] or b"") is None:
                self._one_by_one(rest)
            return
        if spec is None or table not in self.pending or spec.kind == "multiset":
            # (a table without a primary key needs each event's source position: record by record)
            self._one_by_one(rest)
            return
        decoded = self._decode_run(rest, spec.arrow_schema(), spec.key_columns, changes.values[0] or b"")
        if decoded is None:
            self._one_by_one(rest)
        else:
            self.pending[table].runs.append((topic, partition, decoded))

    def _one_by_one(self, run: RecordRun) -> None:
        for i in range(len(run)):
            self.place_record(run.record(i))

    def _run_table(self, topic: str) -> str | None:
        """The table a topic's runs may be decoded for as one (None: its records go one by one)."""
        if topic not in self.topic_tables:
            router = self.ctx.router
            stream = router.streams[i] if (i := router.stream_index(topic)) is not None else None
            eligible = stream is not None and (
                stream.record_format == "debezium"
                and stream.mode == "upsert"
                or stream.record_format == "json"
                and stream.mode == "append"
            )
            self.topic_tables[topic] = topic_table(router, topic) if eligible else None
            if stream is not None and eligible and stream.record_format == "json":
                self.event_time_fields[topic] = stream.event_time_field
        return self.topic_tables[topic]

    def _decode_run(
        self, records: RecordRun, schema: pa.Schema, key_columns: list[str], like: bytes
    ) -> DecodedRun | None:
        """``records`` decoded as one typed run, or None (decode them one by one); ``like``: a
        message of theirs whose shape the table accepts (its first)."""
        if records.topic in self.event_time_fields:
            return decode_events(records, schema, key_columns, self.event_time_fields[records.topic])
        return self.runs.decode(records, schema, key_columns, expected_like=like)

    def defer_unprepared(self) -> None:
        """A deferred table is written by a second job once the driver has prepared it: its new shapes are
        reported instead, and its changes dropped here. That job reports its records of rejected shapes again:
        reported here too, they would be dead letters twice."""
        if self.deferred:
            self.facts[:] = [
                f
                for f in self.facts
                if not (
                    isinstance(f, rp.DeadLetter) and f.table in self.deferred and f.reason_kind == "incompatible_schema"
                )
            ]
        for table, shapes in self.deferred.items():
            self.pending.pop(table, None)
            self.reread.pop(table, None)
            self.facts.extend(shapes.values())

    def write_tables(self) -> None:
        """Write each table's changes (and feed its transforms); re-read changes feed only the held outputs."""
        ctx = self.ctx
        for table, buf in self.reread.items():  # for the held outputs only: the input holds these already
            rows = TableWriter(buf.spec, self.task_id).finish(buf, self.facts, write=False)
            self.feed_transforms(table, rows, ctx.held_outputs)
        for table, buf in self.pending.items():
            rows = TableWriter(buf.spec, self.task_id).finish(buf, self.facts, write=ctx.writes(table))
            if rows is not None and ctx.writes(table) and table in ctx.changed_keys:
                self.facts.append(rp.ChangedKeys(table, self.task_id, _changed_keys(rows, ctx.changed_keys[table])))
            self.feed_transforms(table, rows)

    def feed_transforms(self, table: str, rows: _Rows | None, only: Collection[str] | None = None) -> None:
        """Run the transforms of input ``table`` over its typed changes (those of ``only`` outputs)."""
        ctx = self.ctx
        for derived in ctx.derived.get(table, ()):
            if (
                rows is not None
                and ctx.writes(derived.table)
                and derived.table in ctx.tables
                and (only is None or derived.table in only)
            ):
                _run_derived(
                    derived,
                    ctx.tables[derived.table],
                    rows,
                    self.raw_runs,
                    self.task_id,
                    self.facts,
                    reference_views(derived, ctx.references),
                )


def _changed_keys(rows: _Rows, columns: list[str]) -> pa.Table:
    """``columns`` of every change (null where the table lacks one), its op and Kafka position, and
    whether Debezium withheld one of those columns (an unchanged TOASTed value)."""
    names = rows.table.column_names
    n = rows.table.num_rows
    wanted = set(columns)
    out = {c: rows.table.column(c) if c in names else pa.nulls(n) for c in columns}
    out["_op"] = pa.array(rows.ops, pa.string())
    out["_topic"] = pa.array(rows.topics, pa.string())
    out["_partition"] = pa.array(rows.partitions, pa.int64())
    out["_offset"] = pa.array(rows.offsets, pa.int64())
    out["_withheld"] = pa.array([bool(wanted.intersection(w)) for w in rows.withheld], pa.bool_())
    return pa.table(out)


def reread_from(
    derived: Iterable[Derived],
    specs: dict[str, TableSpec],
    held: Collection[str],
    tp: TP,
    committed: int,
    default: int = -1,
) -> int:
    """``committed`` (an input table's stored offset of ``tp``), lowered to the stored offset of any of its
    transform outputs that holds its commits (``held``) and has committed less (``default`` if none yet)."""
    for d in derived:
        out = specs.get(d.table)
        if d.table in held and out is not None:
            committed = min(committed, out.committed.get(tp, default))
    return committed


def _run_derived(
    derived: Derived,
    spec: TableSpec,
    rows: _Rows,
    raw_runs: list[RecordRun],
    task_id: str,
    facts: list[rp.Fact],
    views: dict[str, pa.Table] | None = None,
) -> None:
    """Run one transform over an input table's typed changes and append its output to ``spec``'s
    table; rows it fails on become dead letters. Changes the output table already holds are skipped."""
    fresh = np.array(
        [
            o >= spec.committed.get(TP(t, int(p)), -1)
            for t, p, o in zip(rows.topics, rows.partitions, rows.offsets, strict=True)
        ],
        dtype=bool,
    )
    if not fresh.any():
        return
    order = rp.kafka_order(rows.topics, rows.partitions, rows.offsets)
    order = order[fresh[order]]
    take = pa.array(order, pa.int64())
    topics = [rows.topics[i] for i in order]
    partitions, offsets = rows.partitions[order], rows.offsets[order]
    source_ts = rows.source_ts[order]
    batch = with_meta(
        rows.table.take(take),
        {
            "_op": [rows.ops[i] for i in order],
            "_topic": topics,
            "_kafka_partition": partitions.astype(np.int32),
            "_kafka_offset": offsets,
            "_source_ts_ms": [None if np.isnan(v) else int(v) for v in source_ts],
            "_kafka_ts_ms": rows.kafka_ts[order],
        },
    )
    schema = spec.arrow_schema()
    outputs, failed = apply_isolating(lambda part: fit_output(run_transform(derived, part, views), schema), batch)
    facts.extend(change_stats(spec.name, topics, partitions, offsets, source_ts))
    if failed:
        raws = {
            (run.topic, run.partition, o): (run.keys[i], run.values[i], run.timestamps[i])
            for run in raw_runs
            for i, o in enumerate(run.offsets)
        }
        for row, error in sorted(failed.items()):
            tp, offset = TP(topics[row], int(partitions[row])), int(offsets[row])
            key, value, ts = raws.get((tp.topic, tp.partition, offset), (None, None, None))
            facts.append(
                dead_letter(
                    tp,
                    offset,
                    ts,
                    f"transform {derived.name} ({derived.where}) failed: {error}",
                    key,
                    value,
                    spec.name,
                    "transform_failed",
                )
            )
    data = pa.concat_tables(outputs) if outputs else None
    if data is not None and data.num_rows:
        n = data.num_rows
        TableWriter(spec, task_id)._write_files(
            data.combine_chunks(), np.arange(n), np.full(n, -1, np.int32), np.zeros(n, np.int64), facts
        )
