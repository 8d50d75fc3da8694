"""The dead-letter table: records that could not be decoded, routed or written, with the reason and
their Kafka coordinates. Written in the same micro-batch, with its own offsets in the snapshot
summary, so dead letters are exactly-once too."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from lakestream.identifiers import quote_table
from lakestream.sink.commit.offsets import TableOffsets
from lakestream.sink.report import BatchReport, DeadLetter
from lakestream.sink.write.convert import convert_rows
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.sink.spec import TableSpec

log = logging.getLogger(__name__)

# (name, Spark DDL type, required)
DEAD_LETTER_COLUMNS = (
    ("topic", "string", True),
    ("partition", "int", True),
    ("offset", "bigint", True),
    ("kafka_timestamp", "timestamp", False),
    ("key", "binary", False),
    ("value", "binary", False),
    ("value_is_raw", "boolean", False),
    ("error", "string", True),
    ("target_table", "string", False),
    ("pipeline", "string", False),
    ("failed_at", "timestamp", True),
)


def ensure_dead_letter_table(spark: SparkSession, catalog: str, dotted: str) -> str:
    """Create the dead-letter table (and its namespace) if missing; its quoted name."""
    from lakestream.sink.catalog.sink import create_table

    namespace, table = dotted.split(".", 1)
    create_table(
        spark,
        catalog,
        namespace,
        table,
        {
            "columns": [{"name": n, "type": t, "required": r} for n, t, r in DEAD_LETTER_COLUMNS],
            "partition_by": ["days(failed_at)"],
            "properties": {"format-version": "2"},
        },
    )
    return quote_table(catalog, namespace, table)


def dead_letter_table(letters: list[DeadLetter], pipeline: str, schema: pa.Schema) -> pa.Table:
    """Dead letters as rows of the dead-letter table (raw key and value kept as they were read)."""
    now = int(time.time() * 1_000_000)
    rows = [
        {
            "topic": d.tp.topic,
            "partition": d.tp.partition,
            "offset": d.offset,
            "kafka_timestamp": None if d.kafka_ts is None or d.kafka_ts < 0 else d.kafka_ts * 1000,
            "key": d.raw_key,
            "value": d.raw_value,
            "value_is_raw": True,
            "error": d.error[:10_000],
            "target_table": d.table,
            "pipeline": pipeline,
            "failed_at": now,
        }
        for d in letters
    ]
    table, bad = convert_rows(rows, schema)
    if bad:
        raise RuntimeError(f"dead letters do not fit the dead-letter table: {bad}")
    return table


class DeadLetterWriter:
    """Commits a batch's dead letters to the dead-letter table, with the offsets the batch consumed in its
    own snapshot (so they are exactly-once too)."""

    def __init__(
        self,
        spark: SparkSession,
        catalog: str,
        dotted: str,
        pipeline: str,
        offsets: TableOffsets,
        properties: Callable[[dict[TP, int]], dict[str, str]],
    ):
        self.spark = spark
        self.catalog = catalog
        self.dotted = dotted  # namespace.table
        self.pipeline = pipeline
        self.offsets = offsets
        self.properties = properties  # offsets → the commit's snapshot properties
        self._spec: TableSpec | None = None

    def prepare(self) -> TableSpec:
        """Create the dead-letter table if missing (at the pipeline's first batch, so that a monitoring query on
        it works before the first dead letter) and learn its layout; once per pipeline."""
        from lakestream.sink.catalog.sink import table_info
        from lakestream.sink.spec import TableSpec

        if self._spec is None:
            ns, tbl = self.dotted.split(".", 1)
            ensure_dead_letter_table(self.spark, self.catalog, self.dotted)
            info = table_info(self.spark, self.catalog, ns, tbl)
            self._spec = TableSpec(self.dotted, "append", [], info["schema"], info["spec"], info["data_location"])
        return self._spec

    def write(self, report: BatchReport, first: int = 0) -> dict[str, int]:
        """Commit the batch's dead letters from the ``first``-th on; their count per kind. The batch's first write
        (``first`` 0) leaves out those the dead-letter table holds already (its offsets are past them: a batch
        read again after a crash); later ones came up in this batch's commits and are all new."""
        from lakestream.sink.catalog.sink import commit_files
        from lakestream.sink.write.files import write_driver_files

        if len(report.dead_letters) <= first:
            return {}
        ns, tbl = self.dotted.split(".", 1)
        ident = quote_table(self.catalog, ns, tbl)
        spec = self.prepare()
        committed = self.offsets.load(ident) if first == 0 else {}
        letters = [d for d in report.dead_letters[first:] if d.offset >= committed.get(d.tp, -1)]
        if not letters:
            return {}
        table = dead_letter_table(letters, self.pipeline, spec.arrow_schema())
        data_files = write_driver_files(table, spec, "dead-letters")
        merged = self.offsets.merged_after_commit(ident, {tp: end.next_offset for tp, end in report.ends.items()})
        commit_files(
            self.spark,
            self.catalog,
            ns,
            tbl,
            {"base_snapshot_id": None, "data_files": data_files, "deletes": [], "properties": self.properties(merged)},
        )
        self.offsets.record(ident, merged)
        log.warning("%d record(s) sent to the dead-letter table %s", len(letters), self.dotted)
        return dict(Counter(letter.reason_kind for letter in letters))
