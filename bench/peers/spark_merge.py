"""The Spark peer: Structured Streaming from Kafka, `MERGE INTO` an Iceberg v3 table in `foreachBatch`.

The program a PySpark team writes for Debezium topics: read the topic, parse the envelope, keep each key's last
change of the micro-batch, MERGE it into the table (merge-on-read: deletion vectors, no rewrite of data files),
one micro-batch per trigger interval. The checkpoint directory holds the offsets: after a crash the last batch is
run again, and MERGE of the same changes leaves the same rows.

    python bench/peers/spark_merge.py --bootstrap HOST:PORT --topic T --table ns.t --catalog-uri jdbc:postgresql://...
        --warehouse file:///... --checkpoint DIR [--trigger-s 2] [--jars a.jar,b.jar]

The catalog password comes from CATALOG_PASSWORD. The table's columns are fixed here, as such programs have them:
a column added at the source later is not carried (the parse ignores it).
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DoubleType, IntegerType, LongType, StringType, StructField, StructType

ROW = StructType(
    [
        StructField("id", IntegerType()),
        StructField("customer_id", LongType()),
        StructField("status", StringType()),
        StructField("amount", DoubleType()),
        StructField("qty", IntegerType()),
        StructField("price", DoubleType()),
        StructField("express", BooleanType()),
        StructField("version", IntegerType()),
        StructField("created_day", IntegerType()),  # io.debezium.time.Date: days since the epoch
        StructField("created_at", LongType()),  # io.debezium.time.MicroTimestamp
        StructField("updated_at", StringType()),  # io.debezium.time.ZonedTimestamp (ISO-8601)
        StructField("note", StringType()),
    ]
)
ENVELOPE = StructType(
    [
        StructField(
            "payload",
            StructType(
                [
                    StructField("before", ROW),
                    StructField("after", ROW),
                    StructField("op", StringType()),
                ]
            ),
        )
    ]
)
COLUMNS = """id INT NOT NULL, customer_id BIGINT, status STRING, amount DOUBLE, qty INT, price DOUBLE,
    express BOOLEAN, version INT, created_day DATE, created_at TIMESTAMP_NTZ, updated_at TIMESTAMP, note STRING"""


def session(args) -> SparkSession:
    return (
        SparkSession.builder.master(args.master)
        .appName("peer-spark-merge")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.jars", args.jars)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.lake.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        .config("spark.sql.catalog.lake.uri", args.catalog_uri)
        .config("spark.sql.catalog.lake.jdbc.schema-version", "V1")
        .config("spark.sql.catalog.lake.jdbc.user", args.catalog_user)
        .config("spark.sql.catalog.lake.jdbc.password", os.environ.get("CATALOG_PASSWORD", ""))
        .config("spark.sql.catalog.lake.warehouse", args.warehouse)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .getOrCreate()
    )


def create_table(spark: SparkSession, table: str) -> None:
    """Format v3, merge-on-read for every row-level command (deletion vectors), key sorted within files."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{table.split('.')[0]}")
    spark.sql(f"""CREATE TABLE IF NOT EXISTS lake.{table} ({COLUMNS}) USING iceberg TBLPROPERTIES (
        'format-version'='3', 'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read',
        'write.delete.mode'='merge-on-read', 'write.distribution-mode'='none')""")


def changes(batch: DataFrame) -> DataFrame:
    """Each key's last change in the batch: (columns..., op), deletes keyed by ``before``."""
    parsed = (
        batch.where(F.col("value").isNotNull())  # tombstones
        .select("partition", "offset", F.from_json(F.col("value").cast("string"), ENVELOPE)["payload"].alias("e"))
        .where(F.col("e.op").isin("c", "r", "u", "d"))
    )
    row = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
    latest = Window.partitionBy("r.id").orderBy(F.col("offset").desc())  # a key's changes share a partition
    return (
        parsed.select("partition", "offset", F.col("e.op").alias("op"), row.alias("r"))
        .withColumn("n", F.row_number().over(latest))
        .where("n = 1")
        .select(
            "op",
            "r.id",
            "r.customer_id",
            "r.status",
            "r.amount",
            "r.qty",
            "r.price",
            "r.express",
            "r.version",
            F.date_add(F.lit("1970-01-01").cast("date"), F.col("r.created_day")).alias("created_day"),
            F.timestamp_micros("r.created_at").cast("timestamp_ntz").alias("created_at"),
            F.to_timestamp("r.updated_at").alias("updated_at"),
            "r.note",
        )
    )


def merge_batch(table: str):
    def run(batch: DataFrame, batch_id: int) -> None:
        changes(batch).createOrReplaceTempView("peer_changes")
        batch.sparkSession.sql(f"""MERGE INTO lake.{table} t USING peer_changes s ON t.id = s.id
            WHEN MATCHED AND s.op = 'd' THEN DELETE
            WHEN MATCHED THEN UPDATE SET *
            WHEN NOT MATCHED AND s.op != 'd' THEN INSERT *""")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True, help="namespace.table in the catalog `lake`")
    parser.add_argument("--catalog-uri", required=True)
    parser.add_argument("--catalog-user", default="lakestream")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger-s", type=float, default=2.0)
    parser.add_argument("--max-offsets", type=int, default=None, help="maxOffsetsPerTrigger (default: no limit)")
    parser.add_argument("--jars", default="")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    args = parser.parse_args()
    spark = session(args)
    spark.sparkContext.setLogLevel("WARN")
    create_table(spark, args.table)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
    )
    if args.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets)
    query = (
        reader.load()
        .writeStream.foreachBatch(merge_batch(args.table))
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_s} seconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
