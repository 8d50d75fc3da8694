"""The lake tables an initial snapshot fills, whatever the source kind: each captured table routed to its upsert
mirror, what an interrupted run left in those mirrors, and the handover a finished run left behind."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from lakestream.config import CaptureSettings, PipelineConfig, StreamSettings
from lakestream.errors import ConfigError
from lakestream.snapshot.chunks import SnapshotError, captured, read_snapshot_state
from lakestream.snapshot.progress import SnapshotReport

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.engine.registry import TableRegistry

log = logging.getLogger(__name__)


class RoutedTable(NamedTuple):
    """Where the router places a captured table: its topic, its stream, its mirror ``namespace.table`` and the
    mirror's quoted catalog identifier."""

    topic: str
    stream: StreamSettings
    lake: str
    ident: str


def require_upsert(topic: str, stream: StreamSettings, purpose: str = "the snapshot fills upsert mirrors") -> None:
    """ConfigError when ``topic`` is routed to an append stream: a snapshot only ever fills upsert mirrors."""
    if stream.mode != "upsert":
        raise ConfigError(
            f"topic {topic} is routed to an append stream; {purpose} — fix: "
            "route Debezium topics to a stream with mode: upsert"
        )


def route_mirrors(config: PipelineConfig, registry: TableRegistry, names: list[str]) -> dict[str, RoutedTable]:
    """Each captured table's mirror as the pipeline's router places it (upsert streams only)."""
    from lakestream.routing import Router

    capture = captured(config)
    router = Router.from_config(config)
    routed = {}
    for name in names:
        topic = capture.topic(name)
        stream, lake = router.route(topic)
        require_upsert(topic, stream)
        routed[name] = RoutedTable(topic, stream, str(lake), registry.catalog.ident(lake.namespace, lake.table))
    return routed


def interrupted_states(
    spark: SparkSession, config: PipelineConfig, routed: dict[str, RoutedTable]
) -> dict[str, dict[str, Any]]:
    """The snapshot state an interrupted run left in each mirror it committed to; SnapshotError when a mirror
    holds data no snapshot wrote."""
    from lakestream.sink.catalog.sink import table_info

    slot_name = captured(config).slot_name
    states = {}
    for name, table in routed.items():
        ns, tbl = table.lake.split(".", 1)
        info = table_info(spark, config.catalog.name, ns, tbl)
        has_data = info["exists"] and info.get("snapshot_id") is not None
        state = read_snapshot_state(spark, table.ident) if has_data else None
        if has_data and state is None:
            raise SnapshotError(
                f"the lake table {table.lake} already has data that no snapshot of slot {slot_name} "
                "wrote — fix: drop it (lakestream sql ... DROP TABLE) to load it again, or use "
                "snapshot: debezium"
            )
        if state is not None:
            states[name] = state
    return states


def already_complete(
    capture: CaptureSettings, names: list[str], handover: dict[str, Any] | None
) -> SnapshotReport | None:
    """The report of a snapshot that finished with every one of ``names`` already (nothing to do), else None."""
    if handover is None or not set(names) <= set(handover["tables"]):
        return None
    log.info("snapshot: already complete (handover at %s); nothing to do", handover["lsn_text"])
    return SnapshotReport(capture.slot_name, handover["lsn_text"], already_complete=True)
