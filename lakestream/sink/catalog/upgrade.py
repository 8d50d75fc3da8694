"""Upgrading existing format-v2 tables to format v3, where upserts write deletion vectors.

Iceberg v3 keeps at most one deletion vector per data file; v2 position-delete files left in the
table would have to be merged into each new vector. The upgrade therefore first rewrites every data
file that has deletes (applying them), drops the delete files, then sets ``format-version=3``.
The table keeps its history; snapshots before the upgrade stay readable.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lakestream.identifiers import quote_table, sql_string

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def format_version(spark: SparkSession, ident: str) -> int:
    rows = spark.sql(f"SHOW TBLPROPERTIES {ident} ('format-version')").collect()
    return int(rows[0]["value"]) if rows and rows[0]["value"].isdigit() else 2


def upgrade_table(spark: SparkSession, catalog: str, namespace: str, table: str) -> str:
    """Upgrade one table to format v3; returns what was done."""
    ident = quote_table(catalog, namespace, table)
    version = format_version(spark, ident)
    if version >= 3:
        return f"{namespace}.{table}: already format v{version}"
    name = sql_string(f"{namespace}.{table}")
    deletes = spark.sql(f"SELECT count(*) AS n FROM {ident}.delete_files").collect()[0]["n"]
    if deletes:
        spark.sql(
            f"CALL {catalog}.system.rewrite_data_files(table => {name}, "
            f"options => map('delete-file-threshold', '1', 'rewrite-all', 'false'))"
        ).collect()
        spark.sql(
            f"CALL {catalog}.system.rewrite_position_delete_files(table => {name}, "
            f"options => map('rewrite-all', 'true'))"
        ).collect()
        left = spark.sql(f"SELECT count(*) AS n FROM {ident}.delete_files").collect()[0]["n"]
        if left:
            raise RuntimeError(
                f"{namespace}.{table}: {left} delete file(s) remain after compaction; run "
                f"`lakestream maintain` and try again"
            )
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('format-version'='3')")
    return f"{namespace}.{table}: v{version} → v3 ({deletes} delete file(s) applied first)"
