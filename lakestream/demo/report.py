"""What the demo prints at the end: row counts, verify, freshness, table layout, one analytical query."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING


from lakestream.identifiers import quote_table
from lakestream.sink.router import TableName

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableLayout:
    table: str
    snapshots: int
    data_files: int
    delete_files: int
    data_bytes: int


def table_layout(spark: SparkSession, catalog: str, name: TableName) -> TableLayout:
    """Snapshots and live files of one Iceberg table, from its metadata tables."""
    base = quote_table(catalog, name.namespace, name.table)
    snapshots = spark.sql(f"SELECT count(*) FROM {base}.snapshots").collect()[0][0]
    files = spark.sql(
        f"""SELECT coalesce(sum(CASE WHEN content = 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content <> 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content = 0 THEN file_size_in_bytes ELSE 0 END), 0)
            FROM {base}.files"""
    ).collect()[0]
    return TableLayout(str(name), int(snapshots), int(files[0]), int(files[1]), int(files[2]))
