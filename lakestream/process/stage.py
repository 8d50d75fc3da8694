"""The contract between the engine and the process stages (alerts, windows, derived tables).

A stage receives a `StageContext`, never the engine: the Spark session, the config, the catalog, the
table registry, the committed offsets, the batch id, and the one way to build a commit's properties.
It declares which tables it writes from which (`reads`) and when it runs: ``before_commits`` (it stages
or commits its tables before the batch's tables, as alerts and windows do) or ``after_commits`` (it
reads its inputs as the batch committed them, as derived tables do). The committer derives the commit
order from these declarations and the transforms' (`commit_phases`): a table commits before every
table it is computed from, so a restart, which reads from the inputs' offsets, never finds an input
past a table computed from it (each skips what it holds already).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from lakestream.sink.commit.offsets import commit_properties

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.config import PipelineConfig, StreamSettings
    from lakestream.sink.catalog.schema import TableManager
    from lakestream.sink.commit.offsets import TableOffsets
    from lakestream.sink.report import BatchReport, NewShape
    from lakestream.sink.spec import TableSpec
    from lakestream.source.kafka import TP


class Registry(Protocol):
    """What a stage uses of the engine's table registry (`lakestream.engine.registry.TableRegistry`): the specs of the
    tables the pipeline writes, and the one place a table is created or evolved."""

    specs: dict[str, TableSpec]

    def prepare_table(
        self, name: str, shapes: list[NewShape], stream: StreamSettings | None = None, topic: str | None = None
    ) -> None:
        """Create or evolve ``name`` so every compatible shape can be written."""


@dataclass
class StageContext:
    """What a stage may use of the running pipeline."""

    config: PipelineConfig
    spark: SparkSession
    tables: TableManager  # the catalog: exists, schema, namespaces, DDL
    registry: Registry  # specs, table preparation
    offsets: TableOffsets
    batch_id: int = 0  # the batch in flight

    def commit_properties(
        self, offsets: dict[TP, int], source_ts_ms: int | None = None, **extra: str
    ) -> dict[str, str]:
        """The snapshot properties of a commit by this pipeline in this batch
        (`sink.commit.offsets.commit_properties`)."""
        return commit_properties(offsets, self.config.name, self.batch_id, source_ts_ms, **extra)


class Stage(Protocol):
    """A process stage of the micro-batch."""

    when: Literal["before_commits", "after_commits"]

    def reads(self) -> dict[str, set[str]]:
        """Each table the stage writes → the tables it is computed from."""

    def run(self, report: BatchReport, isolated: bool) -> None:
        """This batch's part, ``before_commits`` or ``after_commits`` (``isolated``: records were isolated)."""

    def idle(self) -> None:
        """A round with nothing to read (commit what is due by time)."""

    def close(self) -> None:
        """The pipeline stops."""


def commit_phases(tables: list[str], reads: dict[str, set[str]]) -> list[list[str]]:
    """``tables`` in groups that commit one after the other (each group's tables at once): a table comes
    before every table it reads, directly or through others. Unrelated tables share the last group."""
    depth: dict[str, int] = {}

    def rank(table: str, seen: frozenset[str] = frozenset()) -> int:
        if table not in depth:
            sources = reads.get(table, set()) - seen - {table}
            depth[table] = 1 + max((rank(s, seen | {table}) for s in sources), default=-1)
        return depth[table]

    groups: dict[int, list[str]] = {}
    for table in tables:
        groups.setdefault(rank(table), []).append(table)
    return [groups[r] for r in sorted(groups, reverse=True)]
