"""The parallel initial snapshot: PostgreSQL tables → Iceberg in Spark tasks, handed over exactly to
Debezium's stream (see `lakestream.snapshot.runner`)."""
from lakestream.snapshot.progress import SnapshotReport, TableProgress
from lakestream.snapshot.runner import STATE_PROPERTY, SnapshotError, run_snapshot

__all__ = ["STATE_PROPERTY", "SnapshotError", "SnapshotReport", "TableProgress", "run_snapshot"]
