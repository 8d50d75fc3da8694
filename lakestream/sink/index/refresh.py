"""The one refresh policy of a table's index: how an index that no longer describes its table's current snapshot
(another writer committed, a restart) is brought back to it. Driver side.

- A keyless index (`KeylessIndex`) is loaded as saved at the last clean close if it describes the current
  snapshot, else rebuilt from a scan (`lakestream.sink.index.scan`).
- A keyed index (`DiskKeyIndex`) starts from where it is exact: in memory (a commit of another writer came
  between), or as durable beside the table (`lakestream.sink.index.store`). From there it follows the diff of
  the snapshots since (`lakestream.sink.index.diff`), unless the diff cannot be followed (the start is no
  ancestor of the current snapshot, equality deletes) or is bigger than the cap `diff.DIFF_MAX` (more positions
  deleted than a diff lists, or more rows moved than both the cap and the index itself): then it is built
  again on the executors. Reading a backfill bigger than the index on the driver would put it all in the
  overlay; a build on the executors keeps the driver's memory bounded.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lakestream.errors import first_line
from lakestream.sink.catalog.sink import snapshot_changes
from lakestream.sink.index import diff
from lakestream.sink.index.disk import DiskKeyIndex
from lakestream.sink.index.keyless import KeylessIndex
from lakestream.sink.index.store import IndexStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def refresh_keyless(
    spark: SparkSession, ident: str, index: KeylessIndex, current: int | None, saved: Path
) -> KeylessIndex:
    """``index`` at snapshot ``current``: as ``saved`` at a clean close if it describes it, else rebuilt."""
    loaded = KeylessIndex.load(saved, current, index.table_uuid)
    if loaded is not None:
        log.info("table %s: keyless index loaded as saved at snapshot %s (%d rows)", ident, current, len(loaded))
        loaded.schema = index.schema
        return loaded
    index.rebuild(spark, ident, current)
    return index


def refresh_keyed(
    spark: SparkSession,
    catalog: str,
    namespace: str,
    table: str,
    ident: str,
    index: DiskKeyIndex,
    store: IndexStore,
    key_columns: tuple[str, ...],
    current: int | None,
) -> DiskKeyIndex:
    """``index`` (keyed on ``key_columns``) at snapshot ``current``, valid: followed by diff from where it is
    exact, or built again on the executors (see the module doc)."""
    name = f"{namespace}.{table}"
    started = time.monotonic()
    start: DiskKeyIndex | None = None
    origin = ""
    if index.snapshot_id is not None and index.key_columns == key_columns:
        start, origin = index, "memory"  # exact at its snapshot (a commit of another writer came between)
    else:
        index.key_columns = key_columns
        try:
            start, origin = store.load(index), "durable state"
        except (OSError, ValueError) as exc:
            log.warning("table %s: durable key index unreadable (%s); rebuilding", name, exc)
    if start is not None and (start.snapshot_id is None or current is None):
        start = None  # nothing to follow from (no snapshot), or to (the table rolled back to empty)
    if start is not None and start.snapshot_id is not None and start.snapshot_id != current:
        try:
            changes = snapshot_changes(spark, catalog, namespace, table, start.snapshot_id, max_positions=diff.DIFF_MAX)
            listed_s = time.monotonic() - started
            moved = diff.rows_to_follow(changes)
            if not changes["ancestor"] or changes.get("unsupported"):
                log.info(
                    "table %s: the key index's snapshot %s is %s; rebuilding",
                    name,
                    start.snapshot_id,
                    "not an ancestor of the current one"
                    if not changes["ancestor"]
                    else "followed by deletes it cannot follow (equality deletes)",
                )
                start = None
            elif moved > max(diff.DIFF_MAX, start.base_rows):
                log.info(
                    "table %s: %d rows added or removed since the key index's snapshot; building it "
                    "again on the executors",
                    name,
                    moved,
                )
                start = None
            else:
                stats = diff.refresh_by_diff(start, changes)
                log.info(
                    "table %s: key index refreshed by diff from %s: %d snapshot(s) (%d compaction(s)), %d "
                    "file(s) read, %d row(s) added, %d entr(ies) dropped, %d deleted position(s) listed, "
                    "%.2fs (loading and listing %.2fs)",
                    name,
                    origin,
                    stats["snapshots"],
                    stats["compactions"],
                    stats["files_read"],
                    stats["rows_added"],
                    stats["entries_dropped"],
                    changes.get("positions_listed", 0),
                    time.monotonic() - started,
                    listed_s,
                )
        except (OSError, ValueError, KeyError) as exc:
            log.warning("table %s: key index refresh by diff failed (%s); rebuilding", name, first_line(exc))
            start = None
    if start is None:
        index.build_root = store.location
        index.rebuild(spark, ident, current)
        start = index
    start.valid, start.snapshot_id = True, current
    return start
