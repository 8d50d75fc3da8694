"""The Spark peer: Structured Streaming from Kafka, `MERGE INTO` an Iceberg v3 table in `foreachBatch`.

The program a PySpark team writes for Debezium topics: read the topic, parse the envelope, keep each key's last
change of the micro-batch, MERGE it into the table, one micro-batch per trigger interval. ``--merge-mode``:
merge-on-read (deletion vectors, no rewrite of data files) or copy-on-write (Iceberg's ``write.merge.mode``);
``--distribution hash`` (Iceberg's default for MERGE, apache/iceberg#6679) or none; ``--dedupe max_by`` (each key's
last change by one aggregation) or window (row_number over a sort). The checkpoint directory holds the offsets:
after a crash the last batch is run again, and MERGE of the same changes leaves the same rows. The bench reads the
checkpoint's offset and commit logs to know when a backlog is drained (a batch's commit log entry is written after
its MERGE committed).

    python bench/peers/spark_merge.py --bootstrap HOST:PORT --topic T --table ns.t --catalog-uri jdbc:postgresql://...
        --warehouse file:///... --checkpoint DIR [--trigger-s 10] [--jars a.jar,b.jar] [--merge-mode M]
        [--distribution D] [--dedupe D] [--schemas on|off] [--fs-jar J] [--java-options O] [--kafka k=v,...]

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
PAYLOAD = StructType([StructField("before", ROW), StructField("after", ROW), StructField("op", StringType())])
ENVELOPE = StructType([StructField("payload", PAYLOAD)])  # schemas on: {"schema": ..., "payload": ...}
COLUMNS = """id INT NOT NULL, customer_id BIGINT, status STRING, amount DOUBLE, qty INT, price DOUBLE,
    express BOOLEAN, version INT, created_day DATE, created_at TIMESTAMP_NTZ, updated_at TIMESTAMP, note STRING"""


def session(args) -> SparkSession:
    builder = (
        SparkSession.builder.master(args.master)
        .appName("peer-spark-merge")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.extraJavaOptions", args.java_options)
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
    )
    if args.fs_jar:
        # The file system every JVM of the bench writes file: through (configs.LOCAL_FS_CLASS): on the driver's own
        # class path, as Spark opens file: before spark.jars load.
        builder = builder.config("spark.driver.extraClassPath", args.fs_jar).config(
            "spark.hadoop.fs.file.impl", "lakestream.fs.LocalFileSystemNoFork"
        )
    return builder.getOrCreate()


def create_table(spark: SparkSession, table: str, merge_mode: str, distribution: str) -> None:
    """Format v3; MERGE in ``merge_mode`` with ``distribution`` (update and delete as MERGE)."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{table.split('.')[0]}")
    spark.sql(f"""CREATE TABLE IF NOT EXISTS lake.{table} ({COLUMNS}) USING iceberg TBLPROPERTIES (
        'format-version'='3', 'write.merge.mode'='{merge_mode}', 'write.update.mode'='{merge_mode}',
        'write.delete.mode'='{merge_mode}', 'write.distribution-mode'='{distribution}',
        'write.merge.distribution-mode'='{distribution}')""")


def changes(batch: DataFrame, dedupe: str = "max_by", schemas: bool = True) -> DataFrame:
    """Each key's last change in the batch: (columns..., op), deletes keyed by ``before``."""
    value = F.col("value").cast("string")
    event = F.from_json(value, ENVELOPE)["payload"] if schemas else F.from_json(value, PAYLOAD)
    parsed = (
        batch.where(F.col("value").isNotNull())  # tombstones
        .select("partition", "offset", event.alias("e"))
        .where(F.col("e.op").isin("c", "r", "u", "d"))
    )
    row = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
    flat = parsed.select("partition", "offset", F.col("e.op").alias("op"), row.alias("r"))
    if dedupe == "max_by":
        # A key's changes share a partition: the highest offset is its last change. One hash aggregation.
        last = F.max_by(F.struct("op", "r"), F.col("offset"))
        flat = flat.groupBy(F.col("r.id").alias("key")).agg(last.alias("l")).select("l.op", "l.r")
    else:
        latest = Window.partitionBy("r.id").orderBy(F.col("offset").desc())
        flat = flat.withColumn("n", F.row_number().over(latest)).where("n = 1")
    return flat.select(
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


def merge_batch(table: str, dedupe: str, schemas: bool):
    def run(batch: DataFrame, batch_id: int) -> None:
        changes(batch, dedupe, schemas).createOrReplaceTempView("peer_changes")
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
    parser.add_argument("--trigger-s", type=float, default=10.0)
    parser.add_argument("--merge-mode", choices=("merge-on-read", "copy-on-write"), default="merge-on-read")
    parser.add_argument("--distribution", choices=("hash", "none", "range"), default="hash")
    parser.add_argument("--dedupe", choices=("max_by", "window"), default="max_by")
    parser.add_argument("--schemas", choices=("on", "off"), default="on", help="JSON with Connect schemas or not")
    parser.add_argument("--fs-jar", default=None, help="the jar of the bench's local file system")
    parser.add_argument("--java-options", default="", help="the driver JVM's options")
    parser.add_argument("--kafka", default="", help="comma-separated consumer properties k=v")
    parser.add_argument("--max-offsets", type=int, default=None, help="maxOffsetsPerTrigger (default: no limit)")
    parser.add_argument("--jars", default="")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    args = parser.parse_args()
    spark = session(args)
    spark.sparkContext.setLogLevel("WARN")
    create_table(spark, args.table, args.merge_mode, args.distribution)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
    )
    for kv in filter(None, args.kafka.split(",")):
        key, value = kv.split("=", 1)
        reader = reader.option(f"kafka.{key}", value)
    if args.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets)
    query = (
        reader.load()
        .writeStream.foreachBatch(merge_batch(args.table, args.dedupe, args.schemas == "on"))
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_s} seconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
