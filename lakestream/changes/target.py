"""The change feed appended into another Iceberg table, with the consumer's checkpoint in the same commit.

Each append's snapshot summary carries ``lakestream.changes.source`` (the table read) and
``lakestream.changes.until`` (the snapshot read up to): the next append starts after it, so a consumer that
crashes before its commit reads the same range again and one that crashes after it starts where the commit left
off. Rows and checkpoint are one Iceberg commit: exactly once, for one writer per target table.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lakestream.changes.feed import read_changes
from lakestream.errors import ChangeFeedError
from lakestream.identifiers import TableName, quote, quote_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SOURCE_PROPERTY = "lakestream.changes.source"
UNTIL_PROPERTY = "lakestream.changes.until"
# `_row_id` is reserved for Iceberg's own row lineage column in a v3 table: the target keeps the source's as this.
SOURCE_ROW_ID = "_source_row_id"


def checkpoint(spark: SparkSession, catalog: str, target: TableName, source: TableName) -> int | None:
    """The ``until`` of the newest commit of ``target`` that appended changes of ``source`` (None: none did)."""
    ident = quote_table(catalog, target.namespace, target.table)
    rows = spark.sql(f"SELECT summary FROM {ident}.snapshots ORDER BY committed_at DESC, snapshot_id DESC").collect()
    for row in rows:
        summary = row["summary"] or {}
        if summary.get(SOURCE_PROPERTY) == str(source) and summary.get(UNTIL_PROPERTY):
            return int(summary[UNTIL_PROPERTY])
    return None


def _current_snapshot(spark: SparkSession, catalog: str, table: TableName) -> int:
    ident = quote_table(catalog, table.namespace, table.table)
    row = spark.sql(
        f"SELECT snapshot_id FROM {ident}.history WHERE is_current_ancestor ORDER BY made_current_at DESC LIMIT 1"
    ).first()
    if row is None:
        raise ChangeFeedError(f"{table} has no snapshot yet: nothing has changed")
    return int(row[0])


def append_changes(
    spark: SparkSession,
    catalog: str,
    table: TableName | str,
    target: TableName | str,
    since: int | None = None,
    until: int | None = None,
    *,
    all_changes: bool = False,
    key_columns: list[str] | None = None,
) -> dict[str, Any]:
    """Append the changes of ``table`` into ``target`` (created on first use, format v3) and record ``until``
    (default: the current snapshot) in that commit. The source's ``_row_id`` is stored as ``_source_row_id``
    (``_row_id`` is the target's own lineage column). ``since`` None: the checkpoint ``target`` holds for ``table``.
    Returns ``{source, target, since, until, rows}``."""
    from lakestream.sink.catalog.sink import table_info

    ref = table if isinstance(table, TableName) else TableName.parse(table, catalog)
    tref = target if isinstance(target, TableName) else TableName.parse(target, catalog)
    if (tref.namespace, tref.table) == (ref.namespace, ref.table):
        raise ChangeFeedError(f"--to {tref}: the changes of a table cannot be appended into the table itself")
    exists = bool(table_info(spark, catalog, tref.namespace, tref.table).get("exists"))
    stored = checkpoint(spark, catalog, tref, ref) if exists else None
    if since is None:
        if stored is None:
            raise ChangeFeedError(
                f"{tref} holds no checkpoint for {ref} (it does not exist yet, or never took its changes): "
                "give --since, the snapshot of the source to start after"
            )
        since = stored
    elif stored is not None and stored != since:
        log.warning("%s's checkpoint for %s is snapshot %s; reading after %s as asked", tref, ref, stored, since)
    until = _current_snapshot(spark, catalog, ref) if until is None else int(until)
    changes = read_changes(
        spark, catalog, ref, since, until, all_changes=all_changes, key_columns=key_columns
    ).withColumnRenamed("_row_id", SOURCE_ROW_ID)
    ident = quote_table(catalog, tref.namespace, tref.table)
    if not exists:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(catalog, 'catalog')}.{quote(tref.namespace, 'namespace')}")
        changes.limit(0).writeTo(ident).using("iceberg").tableProperty("format-version", "3").create()
    rows = changes.count() if since != until else 0
    # An append with no rows still commits (a snapshot with no files), so the checkpoint moves past an idle range.
    (
        changes.writeTo(ident)
        .option(f"snapshot-property.{SOURCE_PROPERTY}", str(ref))
        .option(f"snapshot-property.{UNTIL_PROPERTY}", str(until))
        .append()
    )
    return {"source": str(ref), "target": str(tref), "since": since, "until": until, "rows": rows}
