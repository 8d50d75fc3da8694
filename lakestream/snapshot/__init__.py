"""The parallel initial snapshot: PostgreSQL or MariaDB tables → Iceberg in Spark tasks, handed over exactly to
Debezium's stream, and re-snapshots of a table while it streams (`lakestream.snapshot.resnapshot`).

`runner.run_snapshot` checks the request and dispatches: to the re-snapshot, or to the initial load of the source's
kind, one module per kind (`postgresql`, `mariadb`) registered in `runner.INITIAL_LOADS`. What every kind shares
lives once: the mirrors a load fills and what an interrupted run left in them (`mirrors`), the chunk tasks, their
commits and progress (`chunks`, `reader`, `progress`). What the snapshot shares with capture is capture's, below it:
the handover file (`lakestream.capture.handover`) and the lake type of each source column
(`lakestream.capture.source_columns`).
"""

from lakestream.snapshot.chunks import STATE_PROPERTY, SnapshotError
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.resnapshot import RESNAPSHOT_PROPERTY, resnapshot_tables
from lakestream.snapshot.runner import run_snapshot

__all__ = [
    "RESNAPSHOT_PROPERTY",
    "STATE_PROPERTY",
    "SnapshotError",
    "SnapshotReport",
    "TableProgress",
    "resnapshot_tables",
    "run_snapshot",
]
