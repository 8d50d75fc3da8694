"""The dead-letter table: records that could not be decoded, routed or written, with the reason and
their Kafka coordinates. Written in the same micro-batch, with its own offsets in the snapshot
summary, so dead letters are exactly-once too."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pyarrow as pa

from lakestream.identifiers import quote, quote_table
from lakestream.sink.convert import convert_rows
from lakestream.sink.report import DeadLetter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEAD_LETTER_COLUMNS = (
    "topic string NOT NULL, `partition` int NOT NULL, `offset` bigint NOT NULL, kafka_timestamp timestamp, "
    "key binary, value binary, value_is_raw boolean, error string NOT NULL, target_table string, "
    "pipeline string, failed_at timestamp NOT NULL"
)


def ensure_dead_letter_table(spark: SparkSession, catalog: str, dotted: str) -> str:
    namespace, _ = dotted.split(".", 1)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(catalog, 'catalog')}.{quote(namespace, 'namespace')}")
    ident = quote_table(catalog, *dotted.split(".", 1))
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {ident} ({DEAD_LETTER_COLUMNS}) USING iceberg PARTITIONED BY (days(failed_at)) "
        "TBLPROPERTIES ('format-version'='2')")
    return ident


def dead_letter_table(letters: list[DeadLetter], pipeline: str, schema: pa.Schema) -> pa.Table:
    """Dead letters as rows of the dead-letter table (raw key and value kept as they were read)."""
    now = int(time.time() * 1_000_000)
    rows = [{"topic": d.tp.topic, "partition": d.tp.partition, "offset": d.offset,
             "kafka_timestamp": None if d.kafka_ts is None or d.kafka_ts < 0 else d.kafka_ts * 1000,
             "key": d.raw_key, "value": d.raw_value, "value_is_raw": True, "error": d.error[:10_000],
             "target_table": d.table, "pipeline": pipeline, "failed_at": now} for d in letters]
    table, bad = convert_rows(rows, schema)
    if bad:
        raise RuntimeError(f"dead letters do not fit the dead-letter table: {bad}")
    return table
