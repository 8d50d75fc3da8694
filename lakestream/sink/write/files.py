"""Iceberg data files written from Python (executor side, and the driver's own small files): Arrow in the
table's schema (`lakestream.sink.types`), split by partition (`lakestream.sink.write.partitioning`), written as
zstd Parquet with pyarrow. The driver commits them through `lakestream.sink.catalog.sink.commit_files`."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakestream.sink.write.partitioning import partition_values
from lakestream.storage import canonical_location, filesystem_path

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    from lakestream.sink.catalog.sink import DataFileEntry

# -- writing data files --------------------------------------------------------------------------


def write_data_file(
    table: pa.Table,
    data_location: str,
    arrow_schema: pa.Schema,
    file_name_prefix: str,
    *,
    row_group_rows: int = 1_000_000,
) -> dict[str, Any]:
    """Write ``table`` (cast to ``arrow_schema``) as one zstd Parquet file
    ``<data_location>/<file_name_prefix>-<uuid>.parquet``; returns ``{path, file_size, record_count}``.

    ``path`` is ``data_location`` joined with the file name in the form Spark/Iceberg use for the
    files they write (`canonical_location`: ``file:/...`` for a ``file:///...`` warehouse)."""
    fs, base = filesystem_path(data_location)
    name = f"{file_name_prefix}-{uuid.uuid4().hex}.parquet"
    target = f"{base.rstrip('/')}/{name}"
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(base.rstrip("/"), recursive=True)
    if not table.schema.equals(arrow_schema, check_metadata=True):
        columns = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in arrow_schema
        ]
        table = pa.Table.from_arrays(columns, names=arrow_schema.names).cast(arrow_schema)
    pq.write_table(
        table,
        target,
        filesystem=fs,
        compression="zstd",
        row_group_size=row_group_rows,
        write_statistics=True,
        store_schema=False,
    )
    size = fs.get_file_info(target).size
    return {
        "path": f"{canonical_location(data_location).rstrip('/')}/{name}",
        "file_size": size,
        "record_count": table.num_rows,
    }


def read_data_files(paths: list[str]) -> pa.Table:
    """The rows of data files a batch wrote (not yet committed), as one table."""
    tables = []
    for path in paths:
        fs, local = filesystem_path(path)
        tables.append(pq.read_table(local, filesystem=fs))
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def write_driver_files(table: pa.Table, spec: Any, file_name_prefix: str) -> list[DataFileEntry]:
    """Rows the driver produced (dead letters, alerts), written as one data file per partition of ``spec``
    (a `TableSpec`); the `commit_files` entries for them."""
    groups: list[tuple[list[Any], Any]] = (
        partition_values(spec.partition_spec, spec.schema, table)
        if spec.partition_spec.get("fields")
        else [([], list(range(table.num_rows)))]
    )
    files: list[DataFileEntry] = []
    for values, rows in groups:
        part = table if len(rows) == table.num_rows else table.take(pa.array(rows, pa.int64()))
        written = write_data_file(part, spec.data_location, spec.arrow_schema(), file_name_prefix)
        files.append(
            {
                "path": written["path"],
                "file_size": written["file_size"],
                "record_count": written["record_count"],
                "partition": list(values),
            }
        )
    return files


def delete_quietly(paths: list[str]) -> None:
    """Remove data files no snapshot references (written by a job whose output was discarded)."""
    for path in paths:
        try:
            fs, local = filesystem_path(path)
            fs.delete_file(local)
        except Exception as exc:  # noqa: BLE001 — an orphan left behind is harmless; orphan cleanup removes it
            log.debug("could not remove unreferenced file %s: %s", path, exc)
