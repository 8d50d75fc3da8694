"""The driver's copy of every reference table a transform joins: read from the lake as Arrow, shipped to the write
tasks as one Spark broadcast per table and snapshot (`lakestream.transform.reference.ReferenceData`), and read again
only when the table's current snapshot changes."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakestream.errors import ConfigError
from lakestream.identifiers import quote_column, quote_table
from lakestream.transform.reference import ReferenceData, keep_rows, resolve_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.config import ReferenceSettings

log = logging.getLogger(__name__)


class ReferenceCache:
    """The driver's copy of every reference table, one broadcast per table and snapshot.

    ``reads`` counts, per table, how many times it was read from the lake (a changed snapshot)."""

    def __init__(self, spark: SparkSession, default_catalog: str):
        self.spark = spark
        self.default_catalog = default_catalog
        self.entries: dict[str, ReferenceData] = {}
        self.schemas: dict[str, pa.Schema] = {}
        self.reads: Counter[str] = Counter()
        self.changed: set[str] = set()  # keys whose schema changed since the pipeline last looked
        self._retired: list[Any] = []
        self._lock = threading.Lock()

    def key(self, ref: ReferenceSettings) -> str:
        catalog, ns, tbl = resolve_table(ref.table, self.default_catalog)
        return f"{catalog}.{ns}.{tbl}" + (f"[{','.join(ref.columns)}]" if ref.columns else "")

    def release_retired(self) -> None:
        """Free the broadcasts of snapshots no batch uses any more (call between batches)."""
        for rows in self._retired:
            try:
                rows.destroy()
            except Exception as exc:  # noqa: BLE001 — a broadcast left behind only costs memory
                log.debug("could not destroy a retired reference broadcast: %s", exc)
        self._retired = []

    def get(self, ref: ReferenceSettings, where: str) -> ReferenceData:
        """The current data of ``ref``: the cached copy while the table's snapshot is the same, else
        read again. ``where`` names the config field in errors."""
        with self._lock:  # tables are prepared from several threads
            return self._get(ref, where)

    def _get(self, ref: ReferenceSettings, where: str) -> ReferenceData:
        from lakestream.sink.catalog.sink import table_info

        key = self.key(ref)
        catalog, ns, tbl = resolve_table(ref.table, self.default_catalog)
        info = table_info(self.spark, catalog, ns, tbl)
        if not info.get("exists"):
            raise ConfigError(
                f"{where}.table: reference table {ref.table} does not exist — fix: create it, or "
                f"name an existing Iceberg table as [catalog.]namespace.table"
            )
        snapshot = info.get("snapshot_id")
        entry = self.entries.get(key)
        if entry is not None and entry.snapshot_id == snapshot:
            return entry
        entry = self._read(ref, key, (catalog, ns, tbl), snapshot, where)
        previous = self.entries.get(key)
        if previous is not None:
            self._retired.append(previous.rows)
        self.entries[key] = entry
        return entry

    def _read(
        self, ref: ReferenceSettings, key: str, name: tuple[str, str, str], snapshot: int | None, where: str
    ) -> ReferenceData:
        from pyspark.sql.pandas.types import to_arrow_schema

        from lakestream.runtime.spark import jvm_helper

        ident = quote_table(*name)
        if snapshot is not None:
            summary = dict(jvm_helper(self.spark).currentSummary(self.spark._jsparkSession, ident))
            total = int(summary.get("total-records") or 0)
            if total > ref.max_rows:
                raise ConfigError(
                    f"{where}: reference table {ref.table} has {total:,} rows, more than max_rows="
                    f"{ref.max_rows:,} — fix: raise {where}.max_rows if the tasks' memory allows it "
                    f"(every Python worker holds a copy), or join a smaller table"
                )
        df = (
            self.spark.sql(f"SELECT * FROM {ident} VERSION AS OF {int(snapshot)}")
            if snapshot is not None
            else self.spark.table(ident)
        )
        if ref.columns:
            df = df.select(*[quote_column(c) for c in ref.columns])
        schema = to_arrow_schema(df.schema)
        batches = df._collect_as_arrow()
        table = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
        if table.num_rows > ref.max_rows or table.nbytes > ref.max_bytes:
            raise ConfigError(
                f"{where}: reference table {ref.table} is {table.num_rows:,} rows, {table.nbytes:,} "
                f"bytes in memory, over max_rows={ref.max_rows:,} / max_bytes={ref.max_bytes:,} — fix: "
                f"list only the needed `columns`, or raise the limits if the tasks' memory allows"
            )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payload = sink.getvalue().to_pybytes()
        rows = self.spark.sparkContext.broadcast(payload)
        keep_rows(key, snapshot, table)  # the driver runs transforms too (schemas, isolation)
        self.reads[key.split("[")[0]] += 1
        before = self.schemas.get(key)
        if before is not None and not before.equals(table.schema):
            self.changed.add(key)  # the transforms' output tables may need new columns
        self.schemas[key] = table.schema
        log.info(
            "reference %s (%s): read snapshot %s, %d rows, %d bytes",
            ref.name,
            ref.table,
            snapshot,
            table.num_rows,
            len(payload),
        )
        return ReferenceData(key, ".".join(name), snapshot, rows, table.num_rows, len(payload))
