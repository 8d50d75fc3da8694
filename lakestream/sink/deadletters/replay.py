"""Working the dead letters: list them, summarise them by table and reason, and replay selected ones.

A replay re-produces each dead letter's original key and value bytes to its original topic and
partition (so a key's changes keep their order), with the header ``lakestream.replay-of:
topic/partition/offset``. The pipeline then reads them like any other record, exactly once. Each
replayed dead letter is recorded in ``<dead-letter table>_replays`` (one Iceberg commit per replay)
and never replayed again.

Exactly once across a crash: a replay that produced its records but died before recording them
would otherwise send them again. So before producing, the replay reads each partition from the
oldest selected dead letter to its end and takes any record whose ``lakestream.replay-of`` header
names a selected dead letter as already sent (replays always append after the original). Run one
replay of a pipeline at a time.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig
from lakestream.errors import KafkaAccessError
from lakestream.identifiers import quote_table
from lakestream.kafka_access import check_access, denied_on_topic, refusals_raised
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REPLAY_HEADER = "lakestream.replay-of"
# Nullable columns: Spark refuses to append a DataFrame (always nullable) to required Iceberg columns.
REPLAY_COLUMNS = (
    "topic string, `partition` int, `offset` bigint, replay_partition int, replay_offset bigint, "
    "replayed_at timestamp, pipeline string"
)


@dataclass
class DeadLetterFilter:
    """Which dead letters: by target table, a text in the reason, topic, or exact coordinates."""

    table: str | None = None  # namespace.table
    reason: str | None = None  # case-insensitive substring of the error
    topic: str | None = None
    coordinates: list[tuple[str, int, int]] = field(default_factory=list)  # (topic, partition, offset)
    include_replayed: bool = False

    def where(self, pipeline: str) -> str:
        clauses = [f"d.pipeline = {_literal(pipeline)}"]
        if self.table:
            clauses.append(f"d.target_table = {_literal(self.table)}")
        if self.reason:
            clauses.append(f"lower(d.error) LIKE {_literal('%' + _like_escape(self.reason.lower()) + '%')}")
        if self.topic:
            clauses.append(f"d.topic = {_literal(self.topic)}")
        if self.coordinates:
            clauses.append(
                "("
                + " OR ".join(
                    f"(d.topic = {_literal(t)} AND d.`partition` = {int(p)} AND d.`offset` = {int(o)})"
                    for t, p, o in self.coordinates
                )
                + ")"
            )
        if not self.include_replayed:
            clauses.append("r.topic IS NULL")
        return " AND ".join(clauses)


@dataclass
class ReplayResult:
    selected: int
    produced: int
    already_sent: int  # found in the topic from an earlier replay that did not record them
    skipped: int  # no value to send (a dead letter without its raw bytes)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _like_escape(text: str) -> str:
    return re.sub(r"([%_\\])", r"\\\1", text)


def replays_table(config: PipelineConfig) -> str:
    return f"{config.engine.dead_letter_table}_replays"


def _idents(spark: SparkSession, config: PipelineConfig) -> tuple[str, str]:
    from lakestream.sink.deadletters.table import ensure_dead_letter_table

    catalog = config.catalog.name
    dead = ensure_dead_letter_table(spark, catalog, config.engine.dead_letter_table)
    replays = quote_table(catalog, *replays_table(config).split(".", 1))
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {replays} ({REPLAY_COLUMNS}) USING iceberg TBLPROPERTIES ('format-version'='2')"
    )
    return dead, replays


def _selection_sql(spark: SparkSession, config: PipelineConfig, flt: DeadLetterFilter, columns: str) -> str:
    dead, replays = _idents(spark, config)
    return (
        f"SELECT {columns} FROM {dead} d LEFT JOIN (SELECT DISTINCT topic, `partition`, `offset` FROM {replays}) r "
        f"ON d.topic = r.topic AND d.`partition` = r.`partition` AND d.`offset` = r.`offset` "
        f"WHERE {flt.where(config.name)}"
    )


def list_dead_letters(
    spark: SparkSession, config: PipelineConfig, flt: DeadLetterFilter, limit: int = 100
) -> list[dict[str, Any]]:
    """Dead letters of the pipeline (newest first), without their raw bytes (sizes instead)."""
    sql = _selection_sql(
        spark,
        config,
        flt,
        "d.target_table, d.topic, d.`partition`, d.`offset`, d.failed_at, "
        "d.error, length(d.key) AS key_bytes, length(d.value) AS value_bytes, "
        "r.topic IS NOT NULL AS replayed",
    )
    sql += " ORDER BY d.failed_at DESC, d.topic, d.`partition`, d.`offset`"
    if limit > 0:
        sql += f" LIMIT {int(limit)}"
    return [row.asDict() for row in spark.sql(sql).collect()]


def reason_class(error: str) -> str:
    """The kind of a dead letter's reason: values, numbers and long details taken out, so that
    "column 'small': value '2147483648' does not fit type int32: ..." and the same with another
    value count as one reason."""
    text = re.sub(r"(value|got \w+|op|decimal|key|name|id) (['\"]).*?\2", r"\1 …", error)
    text = re.sub(r"\b\d+\b", "N", text)
    parts = text.split(": ")
    return ": ".join(parts[:2])[:160]


def summarize_dead_letters(spark: SparkSession, config: PipelineConfig, flt: DeadLetterFilter) -> list[dict[str, Any]]:
    """Counts by target table and reason class, with the first and last failure time and how many
    were replayed."""
    rows = spark.sql(
        _selection_sql(spark, config, flt, "d.target_table, d.error, d.failed_at, r.topic IS NOT NULL AS replayed")
    ).collect()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row.target_table or "-", reason_class(row.error))
        group = groups.setdefault(
            key,
            {
                "table": key[0],
                "reason": key[1],
                "count": 0,
                "replayed": 0,
                "first_failed": row.failed_at,
                "last_failed": row.failed_at,
                "example": row.error[:300],
            },
        )
        group["count"] += 1
        group["replayed"] += int(bool(row.replayed))
        group["first_failed"] = min(group["first_failed"], row.failed_at)
        group["last_failed"] = max(group["last_failed"], row.failed_at)
    return sorted(groups.values(), key=lambda g: (-g["count"], g["table"], g["reason"]))


def replay_dead_letters(
    spark: SparkSession, config: PipelineConfig, flt: DeadLetterFilter, dry_run: bool = False
) -> ReplayResult:
    """Re-send the selected, not yet replayed dead letters to their topics, exactly once (see the module)."""
    flt = DeadLetterFilter(flt.table, flt.reason, flt.topic, list(flt.coordinates), include_replayed=False)
    rows = spark.sql(
        _selection_sql(spark, config, flt, "DISTINCT d.topic, d.`partition`, d.`offset`, d.key, d.value")
    ).collect()
    letters = {(r.topic, r.partition, r.offset): (r.key, r.value) for r in rows}
    sendable = {c: kv for c, kv in letters.items() if kv[1] is not None}
    result = ReplayResult(len(letters), 0, 0, len(letters) - len(sendable))
    if dry_run or not sendable:
        return result
    sent = _already_sent(config, sendable)
    result.already_sent = len(sent)
    todo = sorted(c for c in sendable if c not in sent)
    sent.update(_produce(config, todo, sendable))
    result.produced = len(todo)
    record_replays(spark, config, sent)
    log.info("replayed %d dead letter(s) (%d found already sent by an earlier replay)", len(sent), result.already_sent)
    return result


def _header(coordinate: tuple[str, int, int]) -> bytes:
    return f"{coordinate[0]}/{coordinate[1]}/{coordinate[2]}".encode()


Coordinate = tuple[str, int, int]  # (topic, partition, offset) of a dead letter


def _already_sent(config: PipelineConfig, letters: dict[Coordinate, Any]) -> dict[Coordinate, tuple[int, int]]:
    """Selected dead letters an earlier replay produced but did not record: {coordinate: (partition, offset)}."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    wanted = {_header(c): c for c in letters}
    starts: dict[TP, int] = {}
    for topic, partition, offset in letters:
        tp = TP(topic, partition)
        starts[tp] = min(starts.get(tp, offset), offset)
    found: dict[tuple[str, int, int], tuple[int, int]] = {}
    consumer = Consumer(
        refusals_raised(
            config.kafka.consumer_config(
                **{"group.id": f"{config.kafka.group_id}-replay-check", "enable.partition.eof": True}
            )
        )
    )
    try:
        check_access(consumer)
        for tp, start in sorted(starts.items()):
            low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=30)
            position = max(start + 1, low)
            if position >= high:
                continue
            consumer.assign([TopicPartition(tp.topic, tp.partition, position)])
            deadline = time.monotonic() + 120
            while position < high and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=1.0):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            position = high
                            continue
                        denied = denied_on_topic(error, config.kafka.consumer_config(), "READ", tp.topic)
                        if denied is not None:
                            raise denied
                        raise RuntimeError(f"reading {tp} to check earlier replays: {error}")
                    at, in_partition = msg.offset(), msg.partition()
                    if at is None or in_partition is None:  # only error events lack them
                        continue
                    position = at + 1
                    headers = msg.headers() or []
                    for name, value in headers.items() if isinstance(headers, dict) else headers:
                        if name == REPLAY_HEADER and value in wanted:
                            found[wanted[value]] = (in_partition, at)
            if position < high:
                raise RuntimeError(f"could not read {tp} up to {high} to check earlier replays")
    finally:
        consumer.close()
    return found


def _produce(
    config: PipelineConfig, todo: list[Coordinate], letters: dict[Coordinate, tuple[bytes | None, bytes | None]]
) -> dict[Coordinate, tuple[int, int]]:
    from confluent_kafka import Producer

    conf = config.kafka.producer_config(**{"message.max.bytes": 16 * 1024 * 1024})
    producer = Producer(refusals_raised(conf))
    placed: dict[tuple[str, int, int], tuple[int, int]] = {}
    failures: list[str] = []
    denied: list[KafkaAccessError] = []
    for coordinate in todo:
        key, value = letters[coordinate]

        def delivered(err: Any, msg: Any, coordinate: tuple[str, int, int] = coordinate) -> None:
            if err is not None:
                failures.append(f"{coordinate}: {err}")
                refusal = denied_on_topic(err, conf, "WRITE", coordinate[0])
                if refusal is not None:
                    denied.append(refusal)
            else:
                placed[coordinate] = (msg.partition(), msg.offset())

        producer.produce(
            coordinate[0],
            key=None if key is None else bytes(key),
            value=None if value is None else bytes(value),
            partition=coordinate[1],
            headers=[(REPLAY_HEADER, _header(coordinate))],
            on_delivery=delivered,
        )
        producer.poll(0)
    producer.flush(120)
    if denied:
        raise denied[0]
    if failures or len(placed) != len(todo):
        # What was delivered is recorded by the next replay's check; what was not is sent again then.
        raise RuntimeError(f"replay: {len(todo) - len(placed)} record(s) not delivered: {failures[:3]}")
    return placed


def record_replays(
    spark: SparkSession, config: PipelineConfig, sent: dict[tuple[str, int, int], tuple[int, int]]
) -> None:
    """One commit to the replays table marking ``sent`` dead letters replayed."""
    import datetime as dt

    if not sent:
        return
    _, replays = _idents(spark, config)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = [(t, p, o, rp, ro, now, config.name) for (t, p, o), (rp, ro) in sorted(sent.items())]
    df = spark.createDataFrame(
        rows,
        "topic string, partition int, offset bigint, replay_partition int, "
        "replay_offset bigint, replayed_at timestamp, pipeline string",
    )
    df.writeTo(replays).append()
