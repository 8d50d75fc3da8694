"""The parallel initial snapshot: PostgreSQL or MariaDB tables → Iceberg in Spark tasks, handed over exactly to
Debezium's stream (see `lakestream.snapshot.runner`, `lakestream.snapshot.mariadb`), and re-snapshots of a table
while it streams (`lakestream.snapshot.resnapshot`)."""

from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.resnapshot import RESNAPSHOT_PROPERTY, resnapshot_tables
from lakestream.snapshot.runner import STATE_PROPERTY, SnapshotError, run_snapshot

__all__ = [
    "RESNAPSHOT_PROPERTY",
    "STATE_PROPERTY",
    "SnapshotError",
    "SnapshotReport",
    "TableProgress",
    "resnapshot_tables",
    "run_snapshot",
]
