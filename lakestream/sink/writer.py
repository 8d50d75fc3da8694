"""Writing one table's share of a micro-batch: type, deduplicate, then one MERGE (or INSERT).

- upsert tables: the latest change per key within the batch wins (Kafka order); one MERGE applies
  deletes and upserts; columns Debezium withheld (unchanged TOAST) keep the stored value.
- a batch of only inserts/snapshot reads into an empty table is appended (no join needed).
- append tables: INSERT, or an insert-only MERGE on the event id when de-duplication is on.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakestream.decode.types import JSON_OPTIONS
from lakestream.identifiers import quote_column, sql_string
from lakestream.sink.commit import commit_with_offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_view_ids = itertools.count()
OP_COL, UNAVAILABLE_COL = "__ls_op", "__ls_unavailable"


@dataclass
class TableWrite:
    """What to write into one table."""

    ident: str  # quoted catalog.namespace.table
    mode: str  # upsert | append
    schema: StructType  # the table schema after evolution
    key_columns: list[str]
    incoming_columns: list[str]  # columns present in this batch's shapes
    unavailable_columns: set[str]  # columns some change in the batch withheld (TOAST)
    table_empty: bool
    dedupe: bool


def typed_changes(changes: DataFrame, schema: StructType) -> DataFrame:
    """Parse the wire-form ``row`` JSON into the table's column types."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    nullable = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
    parsed = changes.select(
        F.from_json("row", nullable, JSON_OPTIONS).alias("__r"),
        F.col("op").alias(OP_COL),
        F.col("key").alias("__ls_key"),
        F.col("topic").alias("__ls_topic"),
        F.col("partition").alias("__ls_partition"),
        F.col("offset").alias("__ls_offset"),
        F.from_json("unavailable", ArrayType(StringType())).alias(UNAVAILABLE_COL),
    )
    return parsed.select("__r.*", OP_COL, "__ls_key", "__ls_topic", "__ls_partition", "__ls_offset", UNAVAILABLE_COL)


def fill_withheld_from_batch(typed: DataFrame, columns: set[str]) -> DataFrame:
    """Give a change whose TOAST column Debezium withheld the value of the same key's earlier change
    in this batch (e.g. an insert followed by an update in one commit interval). Only columns with no
    earlier value in the batch stay withheld; the MERGE keeps the stored value for those.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    earlier = Window.partitionBy("__ls_key").orderBy("__ls_topic", "__ls_partition", "__ls_offset").rowsBetween(
        Window.unboundedPreceding, -1)
    withheld = F.coalesce(F.col(UNAVAILABLE_COL), F.array().cast("array<string>"))
    for column in sorted(columns):
        name = f"__ls_prev_{column}"
        is_withheld = F.array_contains(withheld, column)
        # A struct wrapper tells "the earlier change set NULL" apart from "no earlier value".
        known = F.when(is_withheld | (F.col(OP_COL) == "d"), F.lit(None)).otherwise(F.struct(F.col(column).alias("v")))
        typed = typed.withColumn(name, F.last(known, ignorenulls=True).over(earlier))
        filled = is_withheld & F.col(name).isNotNull()
        typed = (typed.withColumn(column, F.when(filled, F.col(name)["v"]).otherwise(F.col(column)))
                 .withColumn(UNAVAILABLE_COL, F.when(filled, F.array_remove(withheld, column))
                             .otherwise(F.col(UNAVAILABLE_COL)))
                 .drop(name))
        withheld = F.coalesce(F.col(UNAVAILABLE_COL), F.array().cast("array<string>"))
    return typed


def latest_per_key(typed: DataFrame) -> DataFrame:
    """Keep the last change of each key in Kafka order (same key → same partition)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("__ls_key").orderBy(
        F.col("__ls_offset").desc(), F.col("__ls_topic").desc(), F.col("__ls_partition").desc())
    return typed.withColumn("__ls_rn", F.row_number().over(window)).where("__ls_rn = 1").drop("__ls_rn")


def _insert_clause(write: TableWrite) -> str:
    cols = [f.name for f in write.schema.fields]
    names = ", ".join(quote_column(c) for c in cols)
    values = ", ".join(f"s.{quote_column(c)}" for c in cols)
    return f"INSERT ({names}) VALUES ({values})"


def build_merge_sql(write: TableWrite, view: str) -> str:
    cols = [f.name for f in write.schema.fields]
    on = " AND ".join(f"t.{quote_column(k)} = s.{quote_column(k)}" for k in write.key_columns)
    incoming = {c.lower() for c in write.incoming_columns}
    keys = {k.lower() for k in write.key_columns}
    sets = []
    for c in cols:
        if c.lower() in keys or c.lower() not in incoming:
            continue  # a column the source no longer sends keeps its stored value
        qc = quote_column(c)
        if c in write.unavailable_columns:
            sets.append(f"t.{qc} = CASE WHEN array_contains(s.{UNAVAILABLE_COL}, {sql_string(c)}) THEN t.{qc} ELSE s.{qc} END")
        else:
            sets.append(f"t.{qc} = s.{qc}")
    clauses = [f"WHEN MATCHED AND s.{OP_COL} = 'd' THEN DELETE"]
    if sets:
        clauses.append(f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)}")
    clauses.append(f"WHEN NOT MATCHED AND s.{OP_COL} <> 'd' THEN {_insert_clause(write)}")
    return f"MERGE INTO {write.ident} t USING {view} s ON {on} " + " ".join(clauses)


def build_insert_sql(write: TableWrite, view: str, where: str = "") -> str:
    cols = ", ".join(quote_column(f.name) for f in write.schema.fields)
    return f"INSERT INTO {write.ident} ({cols}) SELECT {cols} FROM {view}{where}"


def build_dedupe_append_sql(write: TableWrite, view: str) -> str:
    on = " AND ".join(f"t.{quote_column(k)} = s.{quote_column(k)}" for k in write.key_columns)
    return f"MERGE INTO {write.ident} t USING {view} s ON {on} WHEN NOT MATCHED THEN {_insert_clause(write)}"


def write_table(spark: SparkSession, write: TableWrite, changes: DataFrame, properties: dict[str, str]) -> str:
    """Write ``changes`` (decoded rows of this table) and commit ``properties`` in the same snapshot.

    Returns the kind of write done (merge | append | dedupe-append).
    """
    typed = typed_changes(changes, write.schema)
    if write.mode == "upsert" and write.unavailable_columns:
        typed = fill_withheld_from_batch(typed, write.unavailable_columns)
    if write.mode == "upsert" or write.dedupe:
        typed = latest_per_key(typed)
    view = f"__ls_batch_{next(_view_ids)}"
    typed.createOrReplaceTempView(view)
    try:
        if write.mode == "upsert":
            if write.table_empty:
                # Nothing to match against: the latest change per key, minus deletes, is the table.
                sql, kind = build_insert_sql(write, view, f" WHERE {OP_COL} <> 'd'"), "append"
            else:
                sql, kind = build_merge_sql(write, view), "merge"
        elif write.dedupe:
            sql, kind = build_dedupe_append_sql(write, view), "dedupe-append"
        else:
            sql, kind = build_insert_sql(write, view), "append"
        commit_with_offsets(spark, sql, properties)
        return kind
    finally:
        spark.catalog.dropTempView(view)
