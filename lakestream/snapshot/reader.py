"""The snapshot task: read one chunk (a key range, or a block range of a table without a key) under the
exported snapshot and write it as Parquet data files of the table, in the table's Arrow schema and
partition layout.

PostgreSQL renders the chunk as CSV (``COPY ... TO STDOUT``) and pyarrow's CSV reader parses it
straight into typed columns: no Python object per value, which is what makes a task fast. Values
are then cast strictly into the table's schema (`lakestream.sink.write.files`), split by partition and
written like the streaming write tasks write theirs.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from lakestream.errors import LakestreamError
from lakestream.snapshot.source import Chunk, SourceTable, chunk_query
from lakestream.storage import StorageContext, active_options, use_options


@dataclass(frozen=True)
class ChunkTarget:
    """Where a chunk's rows go: the table's schema, partition spec and data location (from TableSpec)."""

    table: str  # namespace.table in the lake
    schema: dict[str, Any]
    partition_spec: dict[str, Any]
    data_location: str
    # also report each file's index keys (a keyless table's: row content hashes), in row order (a re-snapshot
    # needs them)
    report_keys: bool = False
    # The driver's object storage (credentials included): the task writes the chunk's files through it.
    storage: StorageContext = field(default_factory=active_options, repr=False)


@dataclass
class ChunkResult:
    """What a task reports for one chunk: its data files and how long the read took."""

    table: str  # source schema.table
    chunk_id: int
    rows: int
    files: list[dict[str, Any]]
    seconds: float
    keys: list[np.ndarray] | None = None  # per file, `lakestream.sink.index.keys.index_keys` of its rows
    # per file of a keyed table, `lakestream.sink.index.keys.row_keys` of its rows: their contents' digests, by which
    # a re-snapshot leaves the mirror's equal rows alone (`lakestream.snapshot.compare`)
    digests: list[np.ndarray] | None = None


_HEX_VALUES = np.full(256, 0, np.uint8)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def hex_to_binary(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A string column of hex text (``encode(bytea, 'hex')``) as binary, vectorized."""
    text = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if text.offset:  # a slice: rare, not worth the buffer arithmetic
        return pa.array([None if v is None else bytes.fromhex(v) for v in text.to_pylist()], pa.binary())
    if len(text) == 0:
        return pa.array([], pa.binary())
    validity, offsets_buf, data_buf = text.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, len(text) + 1)
    chars = np.frombuffer(data_buf, np.uint8, int(offsets[-1])) if offsets[-1] else np.empty(0, np.uint8)
    nibbles = _HEX_VALUES[chars]
    data = (nibbles[0::2] << 4) | nibbles[1::2]
    return pa.Array.from_buffers(
        pa.binary(),
        len(text),
        [validity, pa.py_buffer((offsets // 2).astype(np.int32)), pa.py_buffer(data.tobytes())],
        null_count=text.null_count,
    )


def parse_chunk(data: bytes, source: SourceTable, arrow_schema: pa.Schema) -> pa.Table:
    """The CSV text of a chunk as a table in ``arrow_schema`` (strict: a value that does not parse fails)."""
    read_schema = pa.schema([(c.name, c.read_type) for c in source.columns])
    if not data:
        return arrow_schema.empty_table()
    parsed = pcsv.read_csv(
        io.BytesIO(data),
        read_options=pcsv.ReadOptions(column_names=read_schema.names, block_size=16 << 20),
        parse_options=pcsv.ParseOptions(newlines_in_values=True),
        # COPY's CSV writes NULL unquoted and empty, and an empty string as "": keep them apart.
        convert_options=pcsv.ConvertOptions(
            column_types=read_schema,
            true_values=["t"],
            false_values=["f"],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    columns = []
    hex_columns = {c.name for c in source.columns if c.hex_bytes}
    for f in arrow_schema:
        if f.name not in read_schema.names:  # a column the lake table has and the source no longer does
            columns.append(pa.nulls(parsed.num_rows, f.type))
            continue
        column = parsed.column(f.name)
        if f.name in hex_columns:
            column = hex_to_binary(column)
        columns.append(column.cast(f.type, safe=True))
    return pa.Table.from_arrays(columns, schema=arrow_schema)


def read_chunk(dsn: str, snapshot_name: str, source: SourceTable, chunk: Chunk, target: ChunkTarget) -> ChunkResult:
    """Read ``chunk`` in a REPEATABLE READ transaction on ``snapshot_name`` and write its data files."""
    import psycopg2

    started = time.monotonic()
    buffer = io.BytesIO()
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            cur.execute(
                "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL extra_float_digits = 3"
            )
            cur.copy_expert(chunk_query(source, chunk).as_string(conn), buffer)
        conn.rollback()
    finally:
        conn.close()
    return write_chunk(buffer.getvalue(), parse_chunk, source, chunk, target, started)


def write_chunk(
    data: bytes,
    parse: Callable[[bytes, SourceTable, pa.Schema], pa.Table],
    source: SourceTable,
    chunk: Chunk,
    target: ChunkTarget,
    started: float,
) -> ChunkResult:
    """Parse a chunk's rows (``data``, as the source rendered them) with ``parse`` into the table's schema and
    write them as the table's data files."""
    from lakestream.sink.index.keys import index_keys, row_keys
    from lakestream.sink.types import arrow_schema
    from lakestream.sink.write.files import write_data_file
    from lakestream.sink.write.partitioning import partition_values

    use_options(target.storage)
    schema = arrow_schema(target.schema)
    try:
        table = parse(data, source, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        # Nothing of the chunk is committed: the snapshot stops here and resumes from this chunk.
        raise LakestreamError(
            f"{source.name} {chunk.describe(source)} do not fit the lake table {target.table}: "
            f"{str(exc).splitlines()[0][:300]} — fix: correct those source values (or the lake column type), then run "
            f"`lakestream snapshot` again to resume"
        ) from None
    files = []
    keys: list[np.ndarray] | None = [] if target.report_keys else None
    digests: list[np.ndarray] | None = [] if target.report_keys and not source.keyless else None
    for values, rows in partition_values(target.partition_spec, target.schema, table):
        part = table.take(pa.array(rows)) if len(rows) != table.num_rows else table
        written = write_data_file(part, target.data_location, schema, f"snapshot-{chunk.chunk_id:05d}")
        files.append({**written, "partition": values})
        if keys is not None:
            # A table without a key is a row multiset: a row's identity is its whole content.
            keys.append(row_keys(part, schema) if source.keyless else index_keys(part, source.key))
        if digests is not None:
            digests.append(row_keys(part, schema))
    return ChunkResult(source.name, chunk.chunk_id, table.num_rows, files, time.monotonic() - started, keys, digests)
