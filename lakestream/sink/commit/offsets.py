"""Kafka offsets stored in the same Iceberg snapshot as the data they produced: the one module that
encodes, decodes and looks them up (the engine, health and maintenance all use it).

Each data commit of a table carries the summary property ``lakestream.offsets``: for every
partition that fed the table, the next offset to read. Because data and offsets land in one
atomic snapshot, a crash at any instant leaves each table either with both or with neither.
On restart a record is applied to a table only if its offset is at or past the table's stored
offset for that partition. Maintenance snapshots (compaction, expiry) carry no offsets, so the
lookup walks back through the snapshot ancestry to the newest snapshot that has them: ``ancestry`` is that
walk for the readers outside the JVM (fresh reads through pyiceberg, table inspection through Spark SQL's
metadata tables); the engine walks the same chain in the JVM (``LakestreamHelper.latestSummaryValue``,
Iceberg's ``SnapshotUtil.currentAncestors``) without copying the table's snapshot list into Python.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from lakestream.runtime.spark import jvm_helper
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

OFFSETS_PROPERTY = "lakestream.offsets"
SOURCE_TS_PROPERTY = "lakestream.source-ts-max-ms"
PIPELINE_PROPERTY = "lakestream.pipeline"
BATCH_PROPERTY = "lakestream.batch-id"


def encode_offsets(offsets: dict[TP, int]) -> str:
    nested: dict[str, dict[str, int]] = {}
    for tp, off in sorted(offsets.items()):
        nested.setdefault(tp.topic, {})[str(tp.partition)] = off
    return orjson.dumps(nested).decode()


def commit_properties(
    offsets: dict[TP, int], pipeline: str, batch_id: int, source_ts_ms: int | None = None, **extra: str
) -> dict[str, str]:
    """The snapshot summary of a pipeline commit: the offsets it consumed (merged with the table's), the
    pipeline and batch that made it, the newest source change it holds, and ``extra`` (e.g. a watermark).
    The one place these properties are built, so every table reads back the same shape."""
    props = {OFFSETS_PROPERTY: encode_offsets(offsets), PIPELINE_PROPERTY: pipeline, BATCH_PROPERTY: str(batch_id)}
    if source_ts_ms is not None:
        props[SOURCE_TS_PROPERTY] = str(source_ts_ms)
    return props | extra


def ancestry(snapshot_id: int | None, parent_of: Mapping[int, int | None]) -> list[int]:
    """``snapshot_id`` and its ancestors, newest first (``parent_of``: every known snapshot → its parent),
    as far back as the table still has them: expiry removes the oldest, and the chain ends there."""
    chain: list[int] = []
    seen: set[int] = set()
    while snapshot_id is not None and snapshot_id in parent_of and snapshot_id not in seen:
        chain.append(snapshot_id)
        seen.add(snapshot_id)
        snapshot_id = parent_of[snapshot_id]
    return chain


def decode_offsets(text: str | None, strict: bool = True) -> dict[TP, int]:
    """``{TP: next offset}`` from the summary property. A malformed value raises ValueError, or with
    ``strict=False`` (read-only surfaces such as health) is logged and read as no offsets."""
    if not text:
        return {}
    try:
        nested = orjson.loads(text)
        return {TP(str(topic), int(p)): int(off) for topic, parts in nested.items() for p, off in parts.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        if strict:
            raise ValueError(f"unreadable {OFFSETS_PROPERTY} snapshot property {text[:200]!r}: {exc}") from None
        log.warning("unreadable %s snapshot property %r", OFFSETS_PROPERTY, text[:200])
        return {}


class TableOffsets:
    """The committed offsets of every table the pipeline writes, loaded lazily, cached after commits."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self._cache: dict[str, dict[TP, int]] = {}

    def load(self, table_ident: str, refresh: bool = False) -> dict[TP, int]:
        """``table_ident`` is the quoted catalog.namespace.table."""
        if refresh or table_ident not in self._cache:
            raw = jvm_helper(self.spark).latestSummaryValue(self.spark._jsparkSession, table_ident, OFFSETS_PROPERTY)
            self._cache[table_ident] = decode_offsets(raw)
        return self._cache[table_ident]

    def merged_after_commit(self, table_ident: str, consumed: dict[TP, int]) -> dict[TP, int]:
        """The table's offsets once ``consumed`` is committed (offsets of other partitions carried forward)."""
        merged = dict(self.load(table_ident))
        merged.update(consumed)
        return merged

    def record(self, table_ident: str, offsets: dict[TP, int]) -> None:
        self._cache[table_ident] = dict(offsets)
