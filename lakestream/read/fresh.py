"""Fresh reads: a table's committed snapshot plus the uncommitted tail of its Kafka partitions.

The snapshot stores the Kafka offsets its data came from (`lakestream.sink.commit.offsets`). Everything in
those partitions at or beyond them is the tail: read straight from Kafka, decoded by the pipeline's
own decoder (`RecordDecoder`, routing included, so a record routed elsewhere is left out) and
converted strictly into the table's Arrow schema (`convert_rows`; a record that would be a dead
letter is left out). The tail is then applied as the pipeline would apply it: for an upsert table
the latest change of each key wins and a delete removes the row; an append table gains the rows
(with a de-duplication field, an id already present is not added again).

The answer is as fresh as Kafka, whatever the commit interval, and exact once the pipeline commits
the same records (both paths decode and resolve them the same way).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig, StreamSettings
from lakestream.errors import DecodeError, QueryError
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, ancestry, decode_offsets
from lakestream.sink.write.latest import STORED, latest_per_key
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table as IcebergTable

log = logging.getLogger(__name__)

# A fresh read holds the tail in memory: past this many records per partition it stops reading
# (and says so), since a pipeline that far behind is better waited for than read around.
MAX_TAIL_RECORDS = 1_000_000


@dataclass
class Tail:
    """The decoded, converted tail of one table (Kafka order), as rows in the table's Arrow schema."""

    table: pa.Table  # every change that fits the table, in Kafka order
    ops: list[str]  # c u d r per row
    keys: list[tuple]  # the key (upsert) or de-duplication id (append) per row; () without one
    withheld: list[list[str]]  # per row: columns Debezium withheld (unchanged TOAST values)
    records: int = 0  # Kafka records read (tombstones, other tables' and undecodable records included)
    offsets: dict[TP, tuple[int, int]] = field(default_factory=dict)  # partition → (from, to) read
    truncated: bool = False  # a TRUNCATE in the tail: the snapshot's rows are gone; only changes after it count


def stored_offsets(table: IcebergTable, snapshot_id: int) -> dict[TP, int]:
    """The Kafka offsets stored with ``snapshot_id``: its own, or its newest ancestor's that has them
    (maintenance snapshots carry none)."""
    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    for sid in ancestry(snapshot_id, {sid: s.parent_snapshot_id for sid, s in snapshots.items()}):
        summary = snapshots[sid].summary
        text = summary.additional_properties.get(OFFSETS_PROPERTY) if summary is not None else None
        if text:
            return decode_offsets(text)
    return {}


def read_tail(
    config: PipelineConfig, table_name: str, offsets: dict[TP, int], schema: pa.Schema, key_columns: list[str]
) -> Tail:
    """The records of ``table_name`` in Kafka beyond ``offsets``, decoded and converted into ``schema``;
    each change keyed by ``key_columns`` (the table's key, or its de-duplication field).

    Partitions of the same topics that the snapshot has no offset for (added since) are read from
    their start."""
    from lakestream.decode.records import RecordDecoder
    from lakestream.routing import Router
    from lakestream.sink.write.convert import convert_rows
    from lakestream.source.kafka import KafkaCluster
    from lakestream.source.planner import OffsetRange
    from lakestream.source.reader import read_runs

    topics = {tp.topic for tp in offsets}
    cluster = KafkaCluster(config.kafka)
    try:
        tps = sorted(set(offsets) | set(cluster.partitions_of(lambda t: t in topics)))
        marks = cluster.watermarks(tps) if tps else {}
    finally:
        cluster.close()
    ranges = []
    for tp in tps:
        low, high = marks.get(tp, (0, 0))
        start = offsets.get(tp, low)
        if start < low:
            raise QueryError(
                f"{table_name}: Kafka no longer holds offsets {start}..{low - 1} of {tp} (retention): "
                "the tail cannot be read; read without --fresh"
            )
        # Open-ended: some brokers under-report the high watermark; read to end-of-partition.
        ranges.append(OffsetRange(tp.topic, tp.partition, start, None, MAX_TAIL_RECORDS, high))
    registry = config.kafka.schema_registry
    decoder = RecordDecoder(Router.from_config(config), registry.client_config() if registry else None)
    rows: list[dict[str, Any]] = []
    ops: list[str] = []
    keys: list[tuple] = []
    withheld: list[list[str]] = []
    read = 0
    truncated = False
    spans: dict[TP, tuple[int, int]] = {}
    conf = config.kafka.consumer_config(**{"group.id": f"{config.kafka.group_id}-fresh-read"})
    for item in read_runs(conf, ranges) if ranges else []:
        if isinstance(item, tuple):
            rng, end = item
            spans[rng.tp] = (rng.start, end.next_offset)
            if not end.at_end and end.next_offset - rng.start >= MAX_TAIL_RECORDS:
                log.warning(
                    "%s: the tail of %s is longer than %d records; read up to offset %d",
                    table_name,
                    rng.tp,
                    MAX_TAIL_RECORDS,
                    end.next_offset,
                )
            continue
        for rec in item.records():
            read += 1
            try:
                change = decoder.decode(rec)
            except (
                DecodeError,
                RecursionError,
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
                UnicodeDecodeError,
                OverflowError,
            ):
                continue  # the pipeline makes it a dead letter: never a row of the table
            if change is None or change.table != table_name or change.op == "m":
                continue
            if change.op == "t":
                truncated = True
                rows, ops, keys, withheld = [], [], [], []
                continue
            rows.append(change.row)
            ops.append(change.op)
            keys.append(tuple(change.row.get(k) for k in key_columns))
            withheld.append(list(change.unavailable))
    typed, bad = convert_rows(rows, schema)
    good = [i for i in range(len(rows)) if i not in bad]
    return Tail(
        typed, [ops[i] for i in good], [keys[i] for i in good], [withheld[i] for i in good], read, spans, truncated
    )


def apply_tail(
    snapshot_rows: pa.Table,
    tail: Tail,
    stream: StreamSettings,
    key_columns: list[str],
    existing_ids: pa.Table | None = None,
) -> pa.Table:
    """``snapshot_rows`` with ``tail`` applied (see the module doc); ``tail.table`` must have the same
    schema. ``existing_ids``: the de-duplication ids already in the table (append with dedupe_field)."""
    import numpy as np
    import pyarrow as pa

    if tail.truncated:
        snapshot_rows, existing_ids = snapshot_rows.slice(0, 0), None
    if tail.table.num_rows == 0:
        return snapshot_rows
    tail_rows = tail.table.cast(snapshot_rows.schema)
    if stream.mode == "append":
        if not stream.dedupe_field:
            return pa.concat_tables([snapshot_rows, tail_rows])
        seen: set = set()
        if existing_ids is not None:
            seen = {(v,) for v in existing_ids.column(0).to_pylist()}
        first = []
        for i, key in enumerate(tail.keys):
            if key not in seen:
                seen.add(key)
                first.append(i)
        return pa.concat_tables([snapshot_rows, tail_rows.take(pa.array(first, pa.int64()))])
    # Upsert: the latest change per key; TOAST columns Debezium withheld come from the key's
    # previous version (an earlier change in the tail, else the snapshot's row).
    order, fills = latest_per_key(tail.keys, tail.ops, tail.withheld, range(len(tail.keys)))
    touched = tail_rows.select(key_columns).take(pa.array(order, pa.int64()))
    kept = snapshot_rows
    if snapshot_rows.num_rows:
        # Joined on the key columns and a row number only: Arrow's hash join takes no nested payload.
        numbered = snapshot_rows.select(key_columns).append_column(
            "__lakestream_row", pa.array(np.arange(snapshot_rows.num_rows, dtype=np.int64))
        )
        remaining = numbered.join(touched, keys=key_columns, join_type="left anti").column("__lakestream_row")
        kept = snapshot_rows.take(pa.array(np.sort(remaining.to_numpy())))
    live = [i for i in order if tail.ops[i] != "d"]
    new_rows = tail_rows.take(pa.array(live, pa.int64()))
    if any(i in fills for i in live):
        new_rows = _fill_withheld(new_rows, live, fills, tail_rows, snapshot_rows, key_columns)
    return pa.concat_tables([kept, new_rows]) if new_rows.num_rows else kept


def _fill_withheld(
    new_rows: pa.Table,
    live: list[int],
    fills: dict[int, dict[str, int]],
    tail_rows: pa.Table,
    snapshot_rows: pa.Table,
    key_columns: list[str],
) -> pa.Table:
    import pyarrow as pa

    rows = new_rows.to_pylist()
    earlier: dict[int, dict[str, Any]] = {}
    snapshot_keys = None
    for slot, i in enumerate(live):
        for column, source in fills.get(i, {}).items():
            if source != STORED:
                if source not in earlier:
                    earlier[source] = tail_rows.slice(source, 1).to_pylist()[0]
                rows[slot][column] = earlier[source].get(column)
            else:
                if snapshot_keys is None:
                    snapshot_keys = {tuple(r[k] for k in key_columns): r for r in snapshot_rows.to_pylist()}
                old = snapshot_keys.get(tuple(rows[slot][k] for k in key_columns))
                rows[slot][column] = old.get(column) if old is not None else None
    return pa.Table.from_pylist(rows, schema=new_rows.schema)
