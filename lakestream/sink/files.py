"""Iceberg data files written from Python, and the JVM calls that create tables and commit files.

The write tasks run in Spark's Python workers, with no JVM at hand: they get a table's Iceberg
schema and partition spec as JSON (`table_info`), build Arrow in that schema (every field carries
its Iceberg field id, which is how Iceberg readers match Parquet columns), split rows by partition
(`partition_values`, Iceberg's transforms re-implemented here) and write Parquet with pyarrow
(`write_data_file`). The driver commits the files through `LakestreamSink` (Java), which reads each
file's footer for column metrics and writes the deletion vectors.

Partition values travel as JSON in Iceberg's internal form: day/month/year/hour/bucket -> int,
identity/truncate -> the source's internal form (int, long, string, boolean, float, date -> int days,
time/timestamp/timestamptz -> long micros, decimal -> string with the type's scale such as "12.30",
uuid -> canonical string, binary/fixed -> base64 string), null allowed.
"""
from __future__ import annotations

import base64
import decimal
import logging
import uuid
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakestream.sink.storage import canonical_location, filesystem_path
from lakestream.storage import remember_vended

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_FIELD_ID = b"PARQUET:field_id"

# -- Iceberg schema JSON -> Arrow / Spark DDL --------------------------------------------------------

_SIMPLE_ARROW = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "date": pa.date32(), "time": pa.time64("us"), "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"), "string": pa.string(), "uuid": pa.binary(16), "binary": pa.binary(),
}


def _decimal_ps(t: str) -> tuple[int, int]:
    p, s = t[t.index("(") + 1:-1].split(",")
    return int(p), int(s)


def _arrow_type(t: Any) -> pa.DataType:
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "struct":
            return pa.struct([_arrow_field(f) for f in t["fields"]])
        if kind == "list":
            element = pa.field("element", _arrow_type(t["element"]), nullable=not t.get("element-required", False),
                               metadata={_FIELD_ID: str(t["element-id"])})
            return pa.list_(element)
        if kind == "map":
            key = pa.field("key", _arrow_type(t["key"]), nullable=False, metadata={_FIELD_ID: str(t["key-id"])})
            value = pa.field("value", _arrow_type(t["value"]), nullable=not t.get("value-required", False),
                             metadata={_FIELD_ID: str(t["value-id"])})
            return pa.map_(key, value)
        raise ValueError(f"unsupported Iceberg type {t}")
    if t in _SIMPLE_ARROW:
        return _SIMPLE_ARROW[t]
    if t.startswith("decimal("):
        return pa.decimal128(*_decimal_ps(t))
    if t.startswith("fixed["):
        return pa.binary(int(t[6:-1]))
    raise ValueError(f"unsupported Iceberg type {t!r}")


DEFAULT_KEY = b"lakestream.write-default"  # field metadata: the column's write-default, Iceberg single-value JSON
DEFAULT_TYPE_KEY = b"lakestream.iceberg-type"


def _arrow_field(f: dict[str, Any]) -> pa.Field:
    metadata = {_FIELD_ID: str(f["id"])}
    if f.get("write-default") is not None and isinstance(f["type"], str):
        metadata[DEFAULT_KEY] = orjson.dumps(f["write-default"])
        metadata[DEFAULT_TYPE_KEY] = f["type"]
    return pa.field(f["name"], _arrow_type(f["type"]), nullable=not f.get("required", False), metadata=metadata)


def write_default(f: pa.Field) -> tuple[bool, Any]:
    """(has one, value in wire form) of a field's write-default (see `_arrow_field`)."""
    if not f.metadata or DEFAULT_KEY not in f.metadata:
        return False, None
    from lakestream.sink.defaults import wire_value

    return True, wire_value(f.metadata[DEFAULT_TYPE_KEY].decode(), orjson.loads(f.metadata[DEFAULT_KEY]))


def arrow_schema(iceberg_schema: dict[str, Any]) -> pa.Schema:
    """The Arrow schema of an Iceberg schema (JSON form, as `table_info` returns it), with a
    ``PARQUET:field_id`` on every field, nested ones included; required fields are not nullable."""
    return pa.schema([_arrow_field(f) for f in iceberg_schema["fields"]])


_SIMPLE_DDL = {
    "boolean": "boolean", "int": "int", "long": "bigint", "float": "float", "double": "double", "date": "date",
    "timestamp": "timestamp_ntz", "timestamptz": "timestamp", "string": "string", "uuid": "string",
    "binary": "binary",
}


def spark_ddl(iceberg_type: Any) -> str:
    """The Spark DDL type string of an Iceberg type (JSON form): long -> bigint, timestamp ->
    timestamp_ntz, timestamptz -> timestamp, fixed[L] -> binary, uuid -> string, struct fields
    back-quoted (``struct<`a`:int,`b`:string>``), ``array<...>``, ``map<k,v>``."""
    t = iceberg_type
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "struct":
            fields = ",".join(f"`{f['name'].replace('`', '``')}`:{spark_ddl(f['type'])}" for f in t["fields"])
            return f"struct<{fields}>"
        if kind == "list":
            return f"array<{spark_ddl(t['element'])}>"
        if kind == "map":
            return f"map<{spark_ddl(t['key'])},{spark_ddl(t['value'])}>"
        raise ValueError(f"unsupported Iceberg type {t}")
    if t in _SIMPLE_DDL:
        return _SIMPLE_DDL[t]
    if t.startswith("decimal("):
        p, s = _decimal_ps(t)
        return f"decimal({p},{s})"
    if t.startswith("fixed["):
        return "binary"
    raise ValueError(f"Iceberg type {t!r} has no Spark 3.5 equivalent")


_DDL_ICEBERG = {ddl: iceberg for iceberg, ddl in _SIMPLE_DDL.items() if iceberg != "uuid"}


def ddl_arrow_type(ddl: str) -> pa.DataType | None:
    """The Arrow type a table gets for a flat Spark DDL type (``bigint`` → int64, ``decimal(p,s)``,
    ``timestamp`` → UTC micros), or None for nested types."""
    if ddl in _DDL_ICEBERG:
        return _SIMPLE_ARROW[_DDL_ICEBERG[ddl]]
    if ddl.startswith("decimal("):
        p, s = ddl[8:-1].split(",")
        return pa.decimal128(int(p), int(s))
    return None


# -- partition transforms (Iceberg spec, "Partition Transforms" and "Appendix B") -----------------

_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_HOUR = 3_600_000_000


def _as_int64(values: pa.ChunkedArray) -> np.ndarray:
    """date -> days, time/timestamp -> micros, ints -> themselves; nulls as 0 (masked by the caller)."""
    if pa.types.is_date(values.type):
        values = values.cast(pa.int32())
    elif pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz=values.type.tz)).cast(pa.int64())
    elif pa.types.is_time(values.type):
        values = values.cast(pa.time64("us")).cast(pa.int64())
    return values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _days(values: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_date(values.type):
        return _as_int64(values)
    return np.floor_divide(_as_int64(values), _MICROS_PER_DAY)


def _months(values: pa.ChunkedArray) -> np.ndarray:
    return _days(values).astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)


def _fmix_mul(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return (h * k).astype(np.uint32)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return ((x << np.uint32(r)) | (x >> np.uint32(32 - r))).astype(np.uint32)


def murmur3_long(values: np.ndarray) -> np.ndarray:
    """Iceberg's 32-bit hash (murmur3_x86_32, seed 0) of int64 values as 8-byte little-endian longs,
    vectorized; returns signed int32 like Java's ``Murmur3_32.hashLong``."""
    u = values.astype(np.int64).view(np.uint64)
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
    h = np.zeros(len(u), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for block in ((u & np.uint64(0xFFFFFFFF)).astype(np.uint32), (u >> np.uint64(32)).astype(np.uint32)):
            k = _rotl(_fmix_mul(block, c1), 15)
            h ^= _fmix_mul(k, c2)
            h = (_fmix_mul(_rotl(h, 13), np.uint32(5)) + np.uint32(0xE6546B64)).astype(np.uint32)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h = _fmix_mul(h, np.uint32(0x85EBCA6B))
        h ^= h >> np.uint32(13)
        h = _fmix_mul(h, np.uint32(0xC2B2AE35))
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def _unscaled_bytes(unscaled: int) -> bytes:
    """Minimal big-endian two's complement bytes (Java's ``BigInteger.toByteArray``)."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def _unscaled(value: decimal.Decimal, scale: int) -> int:
    return int(value.scaleb(scale).to_integral_value())


def _bucket_hash_bytes(data: bytes) -> int:
    import mmh3

    return mmh3.hash(data, 0, signed=True)


def _bucket(column: pa.ChunkedArray, source_type: Any, n: int) -> pa.Array:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if isinstance(source_type, str) and source_type in ("int", "long", "date", "time", "timestamp", "timestamptz"):
        hashes = murmur3_long(_as_int64(column))
        out = (hashes.astype(np.int64) & 0x7FFFFFFF) % n
        return pa.array(out.astype(np.int32), mask=~valid)
    if source_type == "string":
        hashed = [None if v is None else _bucket_hash_bytes(v.encode("utf-8")) for v in column.to_pylist()]
    elif isinstance(source_type, str) and source_type.startswith("decimal("):
        scale = _decimal_ps(source_type)[1]
        hashed = [None if v is None else _bucket_hash_bytes(_unscaled_bytes(_unscaled(v, scale)))
                  for v in column.to_pylist()]
    elif source_type in ("binary", "uuid") or (isinstance(source_type, str) and source_type.startswith("fixed[")):
        hashed = [None if v is None else _bucket_hash_bytes(bytes(v)) for v in column.to_pylist()]
    else:
        raise ValueError(f"bucket transform does not apply to Iceberg type {source_type!r}")
    return pa.array([None if h is None else (h & 0x7FFFFFFF) % n for h in hashed], pa.int32())


def _truncate(column: pa.ChunkedArray, source_type: Any, w: int) -> pa.Array | pa.ChunkedArray:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if source_type in ("int", "long"):
        v = _as_int64(column)
        out = v - np.mod(v, w)  # floor modulo: v - (((v % W) + W) % W)
        return pa.array(out, mask=~valid).cast(column.type)
    if source_type == "string":
        return pc.utf8_slice_codeunits(column, 0, w)  # code points, like Iceberg's truncateString
    if source_type == "binary":
        return pa.array([None if v is None else v[:w] for v in column.to_pylist()], pa.binary())
    if isinstance(source_type, str) and source_type.startswith("decimal("):
        scale = _decimal_ps(source_type)[1]
        out = []
        for v in column.to_pylist():
            if v is None:
                out.append(None)
            else:
                u = _unscaled(v, scale)
                out.append(decimal.Decimal(u - (u % w)).scaleb(-scale))
        return pa.array(out, column.type)
    raise ValueError(f"truncate transform does not apply to Iceberg type {source_type!r}")


def _temporal(column: pa.ChunkedArray, transform: str) -> pa.Array:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if transform == "day":
        values = _days(column)
    elif transform == "hour":
        values = np.floor_divide(_as_int64(column), _MICROS_PER_HOUR)
    elif transform == "month":
        values = _months(column)
    else:
        values = np.floor_divide(_months(column), 12)
    return pa.array(values.astype(np.int32), mask=~valid)


def _transform_array(column: pa.ChunkedArray, source_type: Any, transform: str) -> pa.Array | pa.ChunkedArray:
    """The partition values of ``column`` under ``transform``, as an Arrow array (for grouping)."""
    if transform == "identity":
        return column
    if transform in ("year", "month", "day", "hour"):
        return _temporal(column, transform)
    if transform.startswith("bucket["):
        return _bucket(column, source_type, int(transform[7:-1]))
    if transform.startswith("truncate["):
        return _truncate(column, source_type, int(transform[9:-1]))
    if transform == "void":
        return pa.nulls(len(column), pa.int32())
    raise ValueError(f"unsupported partition transform {transform!r}")


def _json_value(value: Any, source_type: Any, transform: str) -> Any:
    """One partition value (as Arrow's to_pylist gives it) in the JSON form `commit_files` takes."""
    if value is None:
        return None
    if transform not in ("identity",) and not transform.startswith("truncate["):
        return int(value)
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return f"{value:f}"
    if isinstance(value, bytes):
        if source_type == "uuid":
            return str(uuid.UUID(bytes=value))
        return base64.b64encode(value).decode()
    raise ValueError(f"cannot express partition value {value!r} of type {source_type!r}")


def _find_column(table: pa.Table, schema: dict[str, Any], source_id: int) -> tuple[pa.ChunkedArray, Any]:
    """The column (top-level or nested in structs) with Iceberg field id ``source_id``, and its type."""
    def walk(fields: list[dict[str, Any]], path: list[str]):
        for f in fields:
            if f["id"] == source_id:
                return path + [f["name"]], f["type"]
            if isinstance(f["type"], dict) and f["type"]["type"] == "struct":
                found = walk(f["type"]["fields"], path + [f["name"]])
                if found:
                    return found
        return None

    found = walk(schema["fields"], [])
    if found is None:
        raise ValueError(f"partition source field id {source_id} is not in the schema")
    names, source_type = found
    column = table.column(names[0])
    for name in names[1:]:
        column = pc.struct_field(column, name)
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    return column, source_type


def partition_values(spec: dict[str, Any], schema: dict[str, Any], table: pa.Table
                     ) -> list[tuple[list[Any], np.ndarray]]:
    """Rows of ``table`` grouped by partition: ``[(partition values, row indices)]``, groups in order
    of first appearance. Values are one per spec field in the JSON form `commit_files` takes (see the
    module docstring); an unpartitioned spec gives one group ``([], all rows)``."""
    fields = spec.get("fields", [])
    if not fields:
        return [([], np.arange(table.num_rows, dtype=np.int64))] if table.num_rows else []
    keys: dict[str, Any] = {}
    meta = []
    for i, pf in enumerate(fields):
        column, source_type = _find_column(table, schema, pf["source-id"])
        transform = pf["transform"]
        values = _transform_array(column, source_type, transform)
        if transform == "identity" and source_type in ("date", "time", "timestamp", "timestamptz"):
            # internal form: date -> int days, time/timestamps -> long micros
            internal = _as_int64(values)
            values = pa.array(internal.astype(np.int32) if source_type == "date" else internal,
                              mask=~values.is_valid().to_numpy(zero_copy_only=False))
        keys[f"p{i}"] = values
        meta.append((source_type, transform))
    keys["__row"] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    grouped = pa.table(keys).group_by([f"p{i}" for i in range(len(fields))], use_threads=False) \
        .aggregate([("__row", "list")])
    rows = grouped.column("__row_list").to_pylist()
    columns = [grouped.column(f"p{i}").to_pylist() for i in range(len(fields))]
    out = []
    for g, indices in enumerate(rows):
        values = [_json_value(columns[i][g], *meta[i]) for i in range(len(fields))]
        out.append((values, np.asarray(indices, dtype=np.int64)))
    out.sort(key=lambda item: item[1][0])
    return out


# -- writing data files --------------------------------------------------------------------------

def write_data_file(table: pa.Table, data_location: str, arrow_schema: pa.Schema, file_name_prefix: str,
                    *, row_group_rows: int = 1_000_000) -> dict[str, Any]:
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
        columns = [table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                   for f in arrow_schema]
        table = pa.Table.from_arrays(columns, names=arrow_schema.names).cast(arrow_schema)
    pq.write_table(table, target, filesystem=fs, compression="zstd", row_group_size=row_group_rows,
                   write_statistics=True, store_schema=False)
    size = fs.get_file_info(target).size
    return {"path": f"{canonical_location(data_location).rstrip('/')}/{name}", "file_size": size,
            "record_count": table.num_rows}


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
    groups = partition_values(spec.partition_spec, spec.schema, table) if spec.partition_spec.get("fields") \
        else [([], list(range(table.num_rows)))]
    files = []
    for values, rows in groups:
        part = table if len(rows) == table.num_rows else table.take(pa.array(rows, pa.int64()))
        written = write_data_file(part, spec.data_location, spec.arrow_schema(), file_name_prefix)
        files.append({"path": written["path"], "file_size": written["file_size"],
                      "record_count": written["record_count"], "partition": list(values)})
    return files


def delete_quietly(paths: list[str]) -> None:
    """Remove data files no snapshot references (written by a job whose output was discarded)."""
    for path in paths:
        try:
            fs, local = filesystem_path(path)
            fs.delete_file(local)
        except Exception as exc:  # noqa: BLE001 — an orphan left behind is harmless; orphan cleanup removes it
            log.debug("could not remove unreferenced file %s: %s", path, exc)


# -- the JVM side (driver only) ----------------------------------------------------------------

class TableInfo(TypedDict, total=False):
    """What `LakestreamSink.tableInfo` answers about a table (always its latest metadata)."""

    exists: bool
    location: str
    data_location: str
    format_version: int
    snapshot_id: int | None
    schema: dict[str, Any]  # Iceberg schema JSON
    spec: dict[str, Any]  # Iceberg partition spec JSON
    identifier_fields: list[str]
    properties: dict[str, str]


class DataFileEntry(TypedDict, total=False):
    """A data file to commit: where it is, its size, its rows, its partition values (`partition_values`)."""

    path: str
    file_size: int
    record_count: int
    partition: list[Any]
    spec_id: int


class CommitRequest(TypedDict, total=False):
    """One `commit_files` call: data files and deletion vectors with snapshot properties, in one snapshot."""

    base_snapshot_id: int | None
    expect_snapshot_id: int | None  # the commit is refused (``stale``) unless the table is still there
    data_files: list[DataFileEntry]
    deletes: list[dict[str, Any]]  # {data_file, positions}
    properties: dict[str, str]


class CommitResult(TypedDict, total=False):
    """What `commit_files` committed (``stale`` instead when ``expect_snapshot_id`` no longer held)."""

    snapshot_id: int | None
    parent_snapshot_id: int | None
    sequence_number: int
    data_files: int
    delete_files: int
    removed_delete_files: int
    previous_deletes_loaded: int  # data files whose earlier deletes the new DVs merged
    timings_ms: dict[str, float]  # the commit's steps in order (load_table, ..., iceberg_commit, ...)
    stale: bool


def _sink(spark: SparkSession):
    return spark.sparkContext._jvm.lakestream.LakestreamSink


def table_info(spark: SparkSession, catalog: str, namespace: str, table: str) -> TableInfo:
    """``{"exists": false}`` or ``{"exists": true, location, data_location, format_version,
    snapshot_id, schema, spec, identifier_fields, properties}`` (always the latest metadata)."""
    info = orjson.loads(_sink(spark).tableInfo(spark._jsparkSession, catalog, namespace, table))
    vended = info.pop("io", None)  # storage credentials a REST catalog vended: for the writers, never shown
    if vended:
        remember_vended(info["location"], vended)
    return info


def create_table(spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]
                 ) -> TableInfo:
    """Create a table (and its namespace) in one catalog commit, no-op if it exists; returns its
    `table_info`. ``request``: ``{columns: [{name, type (Spark DDL), required?, comment?}],
    identifier_fields?, partition_by?, sort_by?, properties?}``."""
    return orjson.loads(_sink(spark).createTable(spark._jsparkSession, catalog, namespace, table,
                                                 orjson.dumps(request).decode()))


def add_column_with_default(spark: SparkSession, catalog: str, namespace: str, table: str, column: str, ddl: str,
                            default_json: str) -> TableInfo:
    """Add ``column`` (Spark DDL type) whose existing rows read ``default_json`` (Iceberg v3
    initial-default and write-default, single-value JSON); returns `table_info`."""
    return orjson.loads(_sink(spark).addColumnWithDefault(spark._jsparkSession, catalog, namespace, table, column,
                                                          ddl, default_json))


def commit_files(spark: SparkSession, catalog: str, namespace: str, table: str, request: CommitRequest
                 ) -> CommitResult:
    """Commit data files and deletion vectors with snapshot properties in one snapshot.

    ``request``: ``{base_snapshot_id, data_files: [{path, file_size, record_count, spec_id?,
    partition: [...]}], deletes: [{data_file, positions}], properties: {k: v}}``; returns
    ``{snapshot_id, parent_snapshot_id, sequence_number, data_files, delete_files,
    removed_delete_files}``. Iceberg's exceptions surface as py4j errors carrying the Java class."""
    return orjson.loads(_sink(spark).commitFiles(spark._jsparkSession, catalog, namespace, table,
                                                 orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY).decode()))


def deleted_positions(spark: SparkSession, catalog: str, namespace: str, table: str, paths: list[str],
                      nice: int = 0) -> dict[str, Any]:
    """The positions deleted in each of the data files ``paths`` at the table's current snapshot:
    ``{snapshot_id, files: {path: {records, positions}}, missing: [paths not live]}``. With ``nice`` the deletion
    vectors are read on a JVM thread at that nice value (work beside the batches)."""
    return orjson.loads(_sink(spark).deletedPositions(spark._jsparkSession, catalog, namespace, table,
                                                      orjson.dumps(paths).decode(), nice))


def commit_rewrite(spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]
                   ) -> dict[str, Any]:
    """Replace data files by files holding their live rows, in one ``replace`` snapshot
    (`LakestreamSink.commitRewrite`): ``{expect_snapshot_id, groups: [{inputs, output: {path, file_size,
    record_count}, deletes}], properties}``; ``{stale: true}`` when the table moved on."""
    return orjson.loads(_sink(spark).commitRewrite(spark._jsparkSession, catalog, namespace, table,
                                                   orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY).decode()))
