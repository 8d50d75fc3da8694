"""What the demo prints at the end: row counts, verify, freshness, table layout, one analytical query."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakestream.identifiers import quote_table
from lakestream.sink.router import TableName

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Freshness:
    """Source commit → visible in Iceberg, over all batches (weighted by their records)."""

    p50_s: float
    p99_s: float
    batches: int
    records: int


def freshness_from_metrics(path: Path, since_ms: int = 0) -> Freshness | None:
    """Aggregate the engine's per-batch metrics JSONL (batches committed at or after ``since_ms``).

    Each batch gives quantiles [q01, q50, q99, min] of its source commit times: the batch's median
    freshness is commit − q50, its 99th percentile commit − q01; the overall figures are
    record-weighted percentiles of those per-batch values.
    """
    if not path.exists():
        return None
    p50_points: list[tuple[float, int]] = []
    p99_points: list[tuple[float, int]] = []
    for line in path.read_text().splitlines():
        try:
            batch = json.loads(line)
        except ValueError:
            continue
        quantiles = batch.get("source_ts_quantiles")
        commit = batch.get("commit_ts_ms")
        records = int(batch.get("records") or 0)
        if not quantiles or commit is None or records <= 0 or commit < since_ms:
            continue
        p50_points.append(((commit - quantiles[1]) / 1000, records))
        p99_points.append(((commit - quantiles[0]) / 1000, records))
    if not p50_points:
        return None
    return Freshness(
        p50_s=_weighted_percentile(p50_points, 0.50),
        p99_s=_weighted_percentile(p99_points, 0.99),
        batches=len(p50_points),
        records=sum(w for _, w in p50_points),
    )


def _weighted_percentile(points: list[tuple[float, int]], q: float) -> float:
    points = sorted(points)
    total = sum(w for _, w in points)
    running = 0
    for value, weight in points:
        running += weight
        if running >= q * total:
            return value
    return points[-1][0]


@dataclass
class TableLayout:
    table: str
    snapshots: int
    data_files: int
    delete_files: int
    data_bytes: int


def table_layout(spark: SparkSession, catalog: str, name: TableName) -> TableLayout:
    """Snapshots and live files of one Iceberg table, from its metadata tables."""
    base = quote_table(catalog, name.namespace, name.table)
    snapshots = spark.sql(f"SELECT count(*) FROM {base}.snapshots").collect()[0][0]
    files = spark.sql(
        f"""SELECT coalesce(sum(CASE WHEN content = 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content <> 0 THEN 1 ELSE 0 END), 0),
                   coalesce(sum(CASE WHEN content = 0 THEN file_size_in_bytes ELSE 0 END), 0)
            FROM {base}.files"""
    ).collect()[0]
    return TableLayout(str(name), int(snapshots), int(files[0]), int(files[1]), int(files[2]))
