"""`TableSpec`: the contract between the driver and the write tasks for one table — its name, kind, key, Iceberg
schema and partition spec, where its data files go, the row shapes already accepted or rejected, and the offsets
it has committed. Built by the driver (`lakestream.engine.registry`), shipped to every task.

A table is of one kind:

- ``mirror``: an upsert table with a primary key; the latest change per key wins, replaced rows are deleted;
- ``multiset``: an upsert table without a primary key; its rows form a multiset (`lakestream.sink.index.keyless`);
- ``dedupe``: an append table de-duplicated on one field (``dedupe_field``, kept as its key column);
- ``append``: every record is a new row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from lakestream.source.kafka import TP

TableKind = Literal["mirror", "multiset", "dedupe", "append"]


@dataclass
class TableSpec:
    """What a task needs to write one table (built by the driver, shipped to the tasks)."""

    name: str  # namespace.table
    mode: str  # upsert | append
    key_columns: list[str]  # upsert key, or [dedupe_field] for de-duplicated appends
    schema: dict[str, Any]  # Iceberg schema JSON
    partition_spec: dict[str, Any]  # Iceberg partition spec JSON
    data_location: str
    accepted_shapes: frozenset[str] = frozenset()
    rejected_shapes: dict[str, str] = field(default_factory=dict)  # schema id → reason
    committed: dict[TP, int] = field(default_factory=dict)  # the table's stored next offsets
    drop_missing: bool = False  # on_dropped_column=drop: a full row shape lacking a column goes to the driver
    _arrow: pa.Schema | None = None
    _ddl: dict[str, str] | None = None

    @property
    def keyed(self) -> bool:
        return bool(self.key_columns)

    @property
    def kind(self) -> TableKind:
        """What the table is (see the module doc); decided by the stream's mode and whether there is a key."""
        if self.mode == "upsert":
            return "mirror" if self.keyed else "multiset"
        return "dedupe" if self.keyed else "append"

    def fits(self, names: list[str], ddls: list[str], complete: bool = False) -> bool:
        """Whether rows of this shape can be written to the table as it is (no evolution needed):
        every column exists with the same type or one it widens to. Decided in the task, without
        the driver; anything else goes to the driver (`NewShape`). A ``complete`` shape (the source's
        full row schema) lacking a table column also goes there when dropped columns are dropped."""
        if self._ddl is None:
            from lakestream.sink.types import spark_ddl

            try:
                self._ddl = {f["name"]: spark_ddl(f["type"]) for f in self.schema["fields"]}
            except ValueError:
                self._ddl = {}
        if complete and self.drop_missing and len(self._ddl) > len(set(names) & set(self._ddl)):
            return False
        for name, ddl in zip(names, ddls, strict=False):
            have = self._ddl.get(name)
            if have is None or not _ddl_fits(have, ddl):
                return False
        return True

    def arrow_schema(self) -> pa.Schema:
        if self._arrow is None:
            from lakestream.sink.types import arrow_schema

            self._arrow = arrow_schema(self.schema)
        return self._arrow


def _ddl_fits(table: str, incoming: str) -> bool:
    """Values of Spark type ``incoming`` can be written to a column of type ``table`` without loss
    (the rules of `lakestream.sink.catalog.schema._fits`, on DDL strings)."""
    if table == incoming or table == "string":
        return True
    if table == "bigint" and incoming in ("int", "smallint", "tinyint"):
        return True
    if table == "double" and incoming in ("float", "int", "bigint"):
        return True
    if table.startswith("decimal(") and incoming.startswith("decimal("):
        tp, ts = table[8:-1].split(",")
        ip, is_ = incoming[8:-1].split(",")
        return ts.strip() == is_.strip() and int(ip) <= int(tp)
    return False
