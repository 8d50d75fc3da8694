"""The tables a pipeline writes: their specs (what the write tasks need), key indexes, transforms and
reference data, and the one place a table is created or evolved for the shapes its records have.

The engine, the parallel snapshot and the re-snapshot all prepare tables through a `TableRegistry`; the
process stages reach it through their `StageContext`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakestream.config import PipelineConfig, StreamSettings
from lakestream.decode.envelope import COLUMN_RECORD_SHAPE
from lakestream.engine.cadence import Cadence
from lakestream.engine.references import ReferenceCache
from lakestream.errors import ConfigError, LakestreamError
from lakestream.identifiers import TableName, topic_parts, validate_identifier
from lakestream.sink.catalog.schema import (
    DEFAULT_TABLE_PROPERTIES,
    Reconciliation,
    Shape,
    TableManager,
    dropped_column_statements,
    merged_columns,
    reconcile,
    unusable_shape,
    widen_to_string_statements,
)
from lakestream.sink.commit.offsets import TableOffsets
from lakestream.sink.index.disk import DiskKeyIndex
from lakestream.sink.index.keyless import KeylessIndex
from lakestream.sink.index.keys import is_integer_key
from lakestream.sink.index.refresh import refresh_keyed, refresh_keyless
from lakestream.sink.index.store import IndexStore, store_location
from lakestream.sink.report import NewShape
from lakestream.sink.spec import TableSpec
from lakestream.transform.apply import Derived, empty_input, output_columns, reference_views, run_transform
from lakestream.transform.reference import ReferenceData

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from lakestream.sink.catalog.sink import TableInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Target:
    """The table `TableRegistry.prepare_table` prepares: its name, where the catalog keeps it, its SQL identifier."""

    name: str
    namespace: str
    table: str
    ident: str


def _write_key(stream: StreamSettings, info: TableInfo, as_shapes: list[Shape]) -> list[str]:
    """The columns the write tasks key rows by: an upsert's key, or a de-duplicated append's field."""
    if stream.mode == "upsert":
        return stream.key_columns or info.get("identifier_fields") or next((s.key for s in as_shapes if s.key), [])
    return [stream.dedupe_field] if stream.dedupe_field else []


class TableRegistry:
    """Specs, key indexes and transforms of every table this pipeline writes, and their preparation."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: SparkSession,
        catalog: TableManager,
        offsets: TableOffsets,
        cadence: Cadence | None = None,
        batch_id: Callable[[], int] = lambda: 0,
    ):
        self.config = config
        self.spark = spark
        self.catalog = catalog
        self.offsets = offsets
        self.cadence = cadence if cadence is not None else Cadence()
        self.batch_id = batch_id  # names the backup column of a widening (`pre_string_<batch>`)
        self.specs: dict[str, TableSpec] = {}
        self.indexes: dict[str, DiskKeyIndex | KeylessIndex] = {}
        self.index_stores: dict[str, IndexStore] = {}  # where each key index is durable
        self.derived: dict[str, list[Derived]] = {}  # input table → its transforms (lakestream.process)
        self.derived_inputs: dict[str, tuple[str, StreamSettings]] = {}  # input table → (a topic, its stream)
        self.references = ReferenceCache(spark, config.catalog.name)
        self.reference_data: dict[str, ReferenceData] = {}  # reference key → this batch's data

    @classmethod
    def for_config(cls, config: PipelineConfig, spark: SparkSession) -> TableRegistry:
        """A registry of its own (the parallel snapshot and the re-snapshot prepare tables through one)."""
        return cls(config, spark, TableManager(spark, config.catalog.name), TableOffsets(spark))

    # -- key indexes between runs -------------------------------------------------------------
    def index_path(self, name: str) -> Path:
        """Where the key index of ``name`` is kept between runs (driver-local state)."""
        safe = name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else hashlib.sha1(name.encode()).hexdigest()
        return Path(self.config.state_dir) / "indexes" / f"{safe}.npz"

    def save_indexes(self) -> None:
        """Keep every valid keyless index for the next start (at a clean close). Key indexes are durable
        with every commit beside their table (`persist_index`)."""
        for name, index in self.indexes.items():
            if isinstance(index, KeylessIndex) and index.valid and index.snapshot_id is not None:
                try:
                    index.save(self.index_path(name))
                except OSError as exc:
                    log.warning("table %s: could not save its key index (%s); the next start rebuilds it", name, exc)

    def output_tables(self) -> set[str]:
        """The tables the transforms of this pipeline write."""
        return {d.table for ds in self.derived.values() for d in ds}

    # -- preparation ----------------------------------------------------------------------------
    def _stream_for_table(self, shapes: list[NewShape]) -> StreamSettings:
        stream = self.config.stream_for(shapes[0].topic) if shapes else None
        return stream or self.config.streams[0]

    def _schema(self, namespace: str, table: str) -> StructType:
        """The table's current schema; the table was just created or found, so its absence means another
        writer dropped it in between."""
        schema = self.catalog.schema(namespace, table, refresh=True)
        if schema is None:
            raise RuntimeError(f"table {namespace}.{table} was dropped while it was being prepared")
        return schema

    def prepare_table(
        self, name: str, shapes: list[NewShape], stream: StreamSettings | None = None, topic: str | None = None
    ) -> None:
        """Create or evolve ``name`` so every compatible shape can be written; reject the others.
        Then the same for the tables of its stream's transforms."""
        from lakestream.sink.catalog.sink import table_info

        table_name = TableName.parse(name)
        ns, tbl = table_name.namespace, table_name.table
        target = _Target(name, ns, tbl, self.catalog.ident(ns, tbl))
        stream = stream or self._stream_for_table(shapes)
        info = table_info(self.spark, self.config.catalog.name, ns, tbl)
        if not info["exists"]:
            # A column record's shape evolves a table; the table's first row creates it.
            shapes = [s for s in shapes if not s.schema_id.startswith(COLUMN_RECORD_SHAPE)]
            if not shapes:
                return
        # A shape no table can take (a column name Spark cannot quote, names equal but for case, a
        # type that does not parse) is rejected here, so its records become dead letters: it must
        # neither fail the batch nor become part of a new table.
        unusable = {s.schema_id: reason for s in shapes if (reason := unusable_shape(s.columns)) is not None}
        shapes = [s for s in shapes if s.schema_id not in unusable]
        as_shapes = [Shape(s.schema_id, list(s.columns), s.key, s.inferred, s.defaults) for s in shapes]
        if not info["exists"] and not shapes and unusable:
            # Only unusable shapes so far: no table yet; the tasks dead-letter these shapes' records.
            self._reject_before_creation(name, stream, unusable)
            return
        if not info["exists"]:
            info = self._create_table(target, stream, as_shapes)
        result = self._evolve(target, stream, as_shapes, info, unusable)
        if result.statements or info.get("schema") is None or name not in self.specs:
            info = table_info(self.spark, self.config.catalog.name, ns, tbl)
        key = _write_key(stream, info, as_shapes)
        spec = self._spec(target, stream, key, shapes, as_shapes, result.rejected, info)
        self.specs[name] = spec
        self._keep_index(spec, key, stream, info, evolved=bool(result.statements))
        topic = topic or next((s.topic for s in shapes), None)
        if stream.transforms and topic is not None:
            self.prepare_derived(name, topic, stream)

    def _reject_before_creation(self, name: str, stream: StreamSettings, unusable: dict[str, str]) -> None:
        """The spec of a table not created yet whose shapes so far are all unusable: it rejects them."""
        for sid, reason in unusable.items():
            log.warning("table %s: rejecting row shape %s: %s", name, sid, reason)
        previous = self.specs.get(name)
        rejected = dict(previous.rejected_shapes if previous else {}) | unusable
        self.specs[name] = TableSpec(
            name,
            stream.mode,
            [],
            {"type": "struct", "schema-id": 0, "fields": []},
            {"spec-id": 0, "fields": []},
            "",
            frozenset(),
            rejected,
        )

    def _create_table(self, target: _Target, stream: StreamSettings, as_shapes: list[Shape]) -> TableInfo:
        """Create the table for its first shapes: their merged columns, its key, its layout and properties."""
        from lakestream.sink.catalog.sink import create_table

        first_key = next((s.key for s in as_shapes if s.key), stream.key_columns)
        key = (stream.key_columns or first_key) if stream.mode == "upsert" else []
        layout = self.config.layout_for(target.name, stream)
        properties = dict(DEFAULT_TABLE_PROPERTIES) | layout.properties  # format v3: deletion vectors
        key_lower = {k.lower() for k in key}
        defaults = {n: v for s in as_shapes for n, v in s.defaults.items()}
        columns = [
            {
                "name": n,
                "type": t,
                "required": n.lower() in key_lower,
                **({"default": defaults[n]} if n in defaults else {}),
            }
            for n, t in merged_columns(as_shapes)
        ]
        info = create_table(
            self.spark,
            self.config.catalog.name,
            target.namespace,
            target.table,
            {
                "columns": columns,
                "identifier_fields": key,
                "partition_by": layout.partition_by,
                "sort_by": layout.sort_by,
                "properties": properties,
            },
        )
        log.info(
            "created table %s (%d columns, key %s, format v%s)",
            target.name,
            len(columns),
            key or "-",
            info.get("format_version"),
        )
        return info

    def _evolve(
        self,
        target: _Target,
        stream: StreamSettings,
        as_shapes: list[Shape],
        info: TableInfo,
        unusable: dict[str, str],
    ) -> Reconciliation:
        """Evolve the table for the shapes it can take, as the stream's settings say for incompatible types and
        dropped columns; what it did, and the shapes it rejects (logged)."""
        ns, tbl, ident = target.namespace, target.table, target.ident
        schema = self._schema(ns, tbl)
        result = reconcile(ident, schema, as_shapes)
        if result.rejected and stream.on_incompatible_type == "widen_to_string":
            if self._widen_to_string(target, as_shapes, result):
                result = reconcile(ident, self._schema(ns, tbl), as_shapes)
        if stream.on_dropped_column == "drop" and stream.mode == "upsert":
            result.statements.extend(
                dropped_column_statements(
                    ident, schema, as_shapes, stream.key_columns or info.get("identifier_fields") or []
                )
            )
        self.catalog.apply(ns, tbl, result.statements)
        result.rejected.update(unusable)
        for sid, reason in result.rejected.items():
            log.warning("table %s: rejecting row shape %s: %s", target.name, sid, reason)
        return result

    def _widen_to_string(self, target: _Target, as_shapes: list[Shape], result: Reconciliation) -> bool:
        """``on_incompatible_type: widen_to_string``: turn the non-key columns a shape was rejected for into
        strings; whether any was."""
        keys = {k.lower() for s in as_shapes for k in s.key}
        columns_to_widen = sorted({c for c in result.rejected_columns.values() if c.lower() not in keys})
        for column in columns_to_widen:
            log.warning(
                "table %s: widening column %s to string (on_incompatible_type=widen_to_string)", target.name, column
            )
            self.catalog.apply(
                target.namespace,
                target.table,
                widen_to_string_statements(target.ident, column, f"pre_string_{self.batch_id()}"),
            )
        if columns_to_widen:
            self.indexes.pop(target.name, None)
        return bool(columns_to_widen)

    def _spec(
        self,
        target: _Target,
        stream: StreamSettings,
        key: list[str],
        shapes: list[NewShape],
        as_shapes: list[Shape],
        rejected_now: dict[str, str],
        info: TableInfo,
    ) -> TableSpec:
        """What the write tasks need of the table: its key, schema, layout, shapes and offsets. Refuses a table
        whose format cannot hold the deletion vectors its key needs."""
        name = target.name
        previous = self.specs.get(name)
        accepted = set(previous.accepted_shapes if previous else ()) | {
            s.schema_id for s in shapes if s.schema_id not in rejected_now
        }
        rejected = dict(previous.rejected_shapes if previous else {}) | rejected_now
        if key and int(info.get("format_version", 2)) < 3:
            raise LakestreamError(
                f"table {name} is an Iceberg format v{info.get('format_version')} table; upserts and de-duplication "
                f"write deletion vectors, which need format v3 — fix: run `lakestream upgrade-tables <pipeline.yaml>` "
                f"once (it compacts away the old delete files and sets format-version=3)"
            )
        return TableSpec(
            name,
            stream.mode,
            list(key),
            info["schema"],
            info["spec"],
            info["data_location"],
            frozenset(accepted),
            rejected,
            dict(self.offsets.load(target.ident)),
            drop_missing=stream.on_dropped_column == "drop" and stream.mode == "upsert",
        )

    def _keep_index(
        self, spec: TableSpec, key: list[str], stream: StreamSettings, info: TableInfo, evolved: bool
    ) -> None:
        """A key index that fits the table: the one it has while that still fits, else a new (empty) one."""
        name = spec.name
        if key:
            hashed = not is_integer_key(spec.arrow_schema(), key)
            index = self.indexes.get(name)
            # A schema change (ADD COLUMN, a wider type) moves no row: the index is kept.
            if (
                not isinstance(index, DiskKeyIndex)
                or index.hashed != hashed
                or index.key_columns != tuple(key)
                or index.table_uuid != info.get("uuid")
            ):
                self.indexes[name] = DiskKeyIndex(hashed, key, info.get("uuid"))
        elif stream.mode == "upsert" and (
            not isinstance(self.indexes.get(name), KeylessIndex)
            or evolved
            or self.indexes[name].table_uuid != info.get("uuid")
        ):
            self.indexes[name] = KeylessIndex(spec.arrow_schema(), info.get("uuid"))  # no primary key: a multiset

    def prepare_derived(self, name: str, topic: str, stream: StreamSettings) -> None:
        """Create or evolve the output table of each transform of input table ``name``: its schema is
        the transform's output over an empty input in the input table's current schema."""
        index = self.config.streams.index(stream)
        derived = []
        values = topic_parts(topic) | {"field": ""}
        for j, t in enumerate(stream.transforms):
            where = f"streams[{index}].transforms[{j}]"
            out = TableName(stream.namespace, t.table.format(**values))
            try:
                validate_identifier(out.table, what="table name")
            except LakestreamError as exc:
                raise ConfigError(f"{where}.table: {exc} — fix: use a valid table name or template") from None
            refs = []
            for k, ref in enumerate(t.references):
                data = self.references.get(ref, f"{where}.references[{k}]")
                self.reference_data[data.key] = data
                refs.append((ref.name, data.key))
            d = Derived(t.name, str(out), t.sql, t.python, where, tuple(refs))
            if t.commit_interval_s is not None and t.commit_interval_s > self.config.commit_interval(stream):
                self.cadence.set_interval(str(out), t.commit_interval_s)
            try:
                views = reference_views(d, self.reference_data)
                schema = run_transform(d, empty_input(self.specs[name].arrow_schema()), views).schema
                columns = output_columns(schema)
            except Exception as exc:  # noqa: BLE001 — any failure over an empty input is the config's
                body = "sql" if t.sql is not None else "python"
                raise ConfigError(
                    f"{where}.{body} ({t.name}) fails over table {name}'s columns: "
                    f"{type(exc).__name__}: {str(exc)[:500]} — fix: the view is `batch` with the table's "
                    f"columns plus _op, _topic, _kafka_partition, _kafka_offset, _source_ts_ms, _kafka_ts_ms"
                ) from exc
            if not columns:
                raise ConfigError(f"{where}: the transform {t.name} returns no columns — fix: select at least one")
            shape_id = "derived-" + hashlib.sha1(repr(columns).encode()).hexdigest()[:16]
            out_stream = StreamSettings(
                topics=[topic], mode="append", namespace=out.namespace, table=out.table, layout=t.layout
            )
            self.catalog.ensure_namespace(out.namespace)
            self.prepare_table(str(out), [NewShape(str(out), topic, shape_id, columns, [], False)], out_stream)
            derived.append(d)
        self.derived[name] = derived
        self.derived_inputs[name] = (topic, stream)

    def refresh_references(self) -> None:
        """Before a batch: every reference table's current data, read again where its snapshot changed;
        the output tables of transforms whose reference changed shape are evolved."""
        self.references.release_retired()
        for i, stream in enumerate(self.config.streams):
            for j, t in enumerate(stream.transforms):
                for k, ref in enumerate(t.references):
                    data = self.references.get(ref, f"streams[{i}].transforms[{j}].references[{k}]")
                    self.reference_data[data.key] = data
        changed, self.references.changed = self.references.changed, set()
        for name, ds in list(self.derived.items()):
            if any(key in changed for d in ds for _, key in d.references):
                self.prepare_derived(name, *self.derived_inputs[name])

    def prepare_tables(self, shapes_by_table: dict[str, list[NewShape]]) -> None:
        todo = sorted(shapes_by_table.items())
        for namespace in sorted({TableName.parse(n).namespace for n, _ in todo}):
            self.catalog.ensure_namespace(namespace)  # once, before writers race to create it
        workers = min(self.config.engine.table_write_parallelism, len(todo))
        if workers <= 1:
            for name, shapes in todo:
                self.prepare_table(name, shapes)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="table-prep") as pool:
                list(pool.map(lambda item: self.prepare_table(*item), todo))

    def fresh_index(self, name: str, ident: str) -> DiskKeyIndex | KeylessIndex | None:
        """The table's index: as it is while valid (the commit checks it still describes the table's current
        snapshot); else brought to the current snapshot by the one refresh policy (`lakestream.sink.index.refresh`)."""
        from lakestream.sink.catalog.sink import table_info

        index = self.indexes.get(name)
        if index is None or index.valid:
            return index  # a valid index is checked by the commit itself (expect_snapshot_id)
        table = TableName.parse(name)
        info = table_info(self.spark, self.config.catalog.name, table.namespace, table.table)
        current = info.get("snapshot_id")
        if info.get("uuid") != index.table_uuid:  # dropped and created again since the table was prepared
            index.table_uuid = info.get("uuid")
            index.snapshot_id = None
        fresh: DiskKeyIndex | KeylessIndex
        if isinstance(index, KeylessIndex):
            fresh = refresh_keyless(self.spark, ident, index, current, self.index_path(name))
        else:
            store = self.index_stores.get(name)
            if store is None or store.location != store_location(info["location"]):
                store = self.index_stores[name] = IndexStore(store_location(info["location"]))
            fresh = refresh_keyed(
                self.spark,
                self.config.catalog.name,
                table.namespace,
                table.table,
                ident,
                index,
                store,
                tuple(self.specs[name].key_columns),
                current,
            )
        self.indexes[name] = fresh
        self.persist_index(name)
        return fresh

    def persist_index(self, name: str) -> None:
        """Make the table's key index durable as it is now (after each commit): a delta, or a new base. A
        failure is logged: the next start refreshes from the table's snapshots instead."""
        index = self.indexes.get(name)
        store = self.index_stores.get(name)
        if not isinstance(index, DiskKeyIndex) or store is None or not index.valid:
            return
        try:
            store.persist(index)
        except OSError as exc:
            index.rebased = True  # the chain is broken: the next write is a whole base
            log.warning(
                "table %s: key index not made durable (%s); a restart refreshes it from the table's snapshots",
                name,
                exc,
            )
