"""The dead-letter table: records that could not be decoded, routed or written, with the reason and
their Kafka coordinates. Written in the same micro-batch, with its own offsets in the snapshot
summary, so dead letters are exactly-once too."""
from __future__ import annotations

from typing import TYPE_CHECKING

from lakestream.identifiers import quote, quote_table
from lakestream.sink.commit import commit_with_offsets

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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


def dead_letter_rows(decode_errors: DataFrame, rejected: DataFrame | None, pipeline: str) -> DataFrame:
    """Undecodable records (raw bytes kept) plus rejected changes (decoded row kept), in the table's columns."""
    from pyspark.sql import functions as F

    def shaped(df: DataFrame, key: Column, value: Column, is_raw: bool) -> DataFrame:
        return df.select(
            F.col("topic"), F.col("partition"), F.col("offset"),
            F.timestamp_millis(F.col("kafka_ts")).alias("kafka_timestamp"),
            key.alias("key"), value.alias("value"), F.lit(is_raw).alias("value_is_raw"),
            F.col("error"), F.col("table").alias("target_table"), F.lit(pipeline).alias("pipeline"),
            F.current_timestamp().alias("failed_at"))

    out = shaped(decode_errors, F.col("raw_key"), F.col("raw_value"), True)
    if rejected is not None:
        out = out.unionByName(shaped(rejected, F.encode(F.col("key"), "UTF-8"), F.encode(F.col("row"), "UTF-8"), False))
    return out


def write_dead_letters(spark: SparkSession, ident: str, rows: DataFrame, properties: dict[str, str], view: str) -> None:
    rows.createOrReplaceTempView(view)
    try:
        commit_with_offsets(spark, f"INSERT INTO {ident} SELECT * FROM {view}", properties)
    finally:
        spark.catalog.dropTempView(view)


def reason_column(reasons: dict[str, str]) -> Column:
    """A column giving each rejected schema id its reason."""
    from pyspark.sql import functions as F

    expr = None
    for schema_id, reason in reasons.items():
        cond = F.col("schema_id") == F.lit(schema_id)
        expr = F.when(cond, F.lit(reason)) if expr is None else expr.when(cond, F.lit(reason))
    return expr if expr is not None else F.lit("unknown")
