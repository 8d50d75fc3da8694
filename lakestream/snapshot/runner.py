"""`run_snapshot`, the one entry to the parallel snapshot: it checks the request (a capture section with schemas,
captured tables) and hands it to the re-snapshot (tables already handed over, or ``again``) or to the initial load of
the source's kind, one module per kind registered in `INITIAL_LOADS` (`lakestream.snapshot.postgresql`,
`lakestream.snapshot.mariadb`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from lakestream.capture.handover import read_handover
from lakestream.config import CaptureSettings, PipelineConfig
from lakestream.errors import ConfigError
from lakestream.identifiers import SourceTableName
from lakestream.snapshot.chunks import captured
from lakestream.snapshot.mariadb import run_mariadb_snapshot
from lakestream.snapshot.postgresql import run_postgresql_snapshot
from lakestream.snapshot.progress import SnapshotReport, TableProgress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class InitialLoad(Protocol):
    """The initial snapshot of one kind of source database: ``names`` (captured tables, checked) into their
    mirrors, resuming a run a crash interrupted, and the handover point left for ``lakestream capture``."""

    def __call__(
        self,
        config: PipelineConfig,
        names: list[str],
        spark: SparkSession | None,
        *,
        chunk_rows: int,
        parallelism: int | None,
        progress_interval_s: float,
        on_progress: Callable[[list[TableProgress]], Any] | None = None,
    ) -> SnapshotReport: ...


# One module per ``capture.database.kind``; a new kind is a module with its `InitialLoad` and an entry here.
INITIAL_LOADS: dict[str, InitialLoad] = {
    "postgresql": run_postgresql_snapshot,
    "mariadb": run_mariadb_snapshot,
}


def run_snapshot(
    config: PipelineConfig,
    tables: list[str] | None = None,
    spark: SparkSession | None = None,
    *,
    chunk_rows: int | None = None,
    parallelism: int | None = None,
    progress_interval_s: float = 5.0,
    on_progress: Callable[[list[TableProgress]], Any] | None = None,
    again: bool = False,
    wait_timeout_s: float = 600.0,
) -> SnapshotReport:
    """Snapshot ``tables`` (default: every captured table) into their Iceberg mirrors and leave the
    handover point for ``lakestream capture``; resumes a snapshot a crash interrupted.

    Tables named after the handover (or with ``again``) are re-snapshotted while streaming continues
    (`lakestream.snapshot.resnapshot`)."""
    capture = _snapshot_capture(config)
    names = _captured_names(capture, tables)
    chunk_rows = chunk_rows or capture.snapshot_chunk_rows
    if tables and (again or _handed_over(config, capture, names)):
        from lakestream.snapshot.resnapshot import resnapshot_tables

        return resnapshot_tables(
            config,
            names,
            spark,
            chunk_rows=chunk_rows,
            parallelism=parallelism,
            progress_interval_s=progress_interval_s,
            on_progress=on_progress,
            wait_timeout_s=wait_timeout_s,
        )
    load = INITIAL_LOADS[capture.database.kind]
    return load(
        config,
        names,
        spark,
        chunk_rows=chunk_rows,
        parallelism=parallelism,
        progress_interval_s=progress_interval_s,
        on_progress=on_progress,
    )


def _snapshot_capture(config: PipelineConfig) -> CaptureSettings:
    """The capture settings, checked for what a parallel snapshot needs."""
    capture = captured(config)
    if not capture.schemas_enabled:
        raise ConfigError(
            "capture.schemas_enabled: the parallel snapshot needs Debezium's schemas — fix: set it to true"
        )
    return capture


def _captured_names(capture: CaptureSettings, tables: list[str] | None) -> list[str]:
    """``tables`` (default: every captured table) in ``capture.tables``' spelling; ConfigError for one that is
    not captured."""
    names = [str(SourceTableName.parse(t)) for t in (tables or capture.tables)]
    unknown = [t for t in names if t not in capture.tables]
    if unknown:
        raise ConfigError(
            f"{unknown} not in capture.tables {capture.tables} — fix: capture them first, or name a captured table"
        )
    return names


def _handed_over(config: PipelineConfig, capture: CaptureSettings, names: list[str]) -> bool:
    """Whether a finished snapshot handed every one of ``names`` over to the stream already."""
    handover = read_handover(config.state_dir, capture)
    return handover is not None and set(names) <= set(handover["tables"])
