"""The change feed: what changed in a lake table between two of its snapshots, as the rows a downstream job needs.
Driver side (it plans from the table's metadata and reads through the driver's Spark session).

- `feed`: `read_changes` (a Spark DataFrame) and `read_changes_arrow`: one row per key changed in (since, until],
  with its change type, the row after and the row before, its ``_row_id`` and the commit that made the change;
  every intermediate change with ``all_changes=True``.
- `target`: `append_changes`, the changes appended into another Iceberg table whose snapshots carry the ``until``
  they reached (a downstream consumer's checkpoint, committed with the rows).

    from lakestream.changes import read_changes
    df = read_changes(spark, "lake", "shop.customers", since=4126329795634851112)
"""

from lakestream.changes.feed import CHANGE_COLUMNS, ChangeRange, plan_range, read_changes, read_changes_arrow
from lakestream.changes.target import append_changes

__all__ = ["CHANGE_COLUMNS", "ChangeRange", "append_changes", "plan_range", "read_changes", "read_changes_arrow"]
