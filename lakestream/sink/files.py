"""Iceberg data files written from Python, and the JVM calls that create tables and commit files.

The write tasks run in Spark's Python workers, with no JVM at hand: they get a table's Iceberg
schema and partition spec as JSON, build Arrow in that schema (every field carries its Iceberg
field id, which is how Iceberg readers match Parquet columns), split rows by partition, and write
Parquet with pyarrow. The driver commits the files through `LakestreamSink` (Java), which reads
each file's footer for column metrics.
"""
from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakestream.sink.storage import filesystem_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_FIELD_ID = b"PARQUET:field_id"


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
    simple = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
              "double": pa.float64(), "date": pa.date32(), "time": pa.time64("us"),
              "timestamp": pa.timestamp("us"), "timestamptz": pa.timestamp("us", tz="UTC"),
              "string": pa.string(), "uuid": pa.binary(16), "binary": pa.binary()}
    if t in simple:
        return simple[t]
    if t.startswith("decimal("):
        p, s = t[8:-1].split(",")
        return pa.decimal128(int(p), int(s))
    if t.startswith("fixed["):
        return pa.binary(int(t[6:-1]))
    raise ValueError(f"unsupported Iceberg type {t!r}")


def _arrow_field(f: dict[str, Any]) -> pa.Field:
    return pa.field(f["name"], _arrow_type(f["type"]), nullable=not f.get("required", False),
                    metadata={_FIELD_ID: str(f["id"])})


def arrow_schema(iceberg_schema: dict[str, Any]) -> pa.Schema:
    """The Arrow schema (with Parquet field ids) of an Iceberg schema in its JSON form."""
    return pa.schema([_arrow_field(f) for f in iceberg_schema["fields"]])


# -- partition transforms (Iceberg spec: "Partition Transforms") ----------------------------------

_EPOCH = dt.date(1970, 1, 1)


def _micros(values: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_date(values.type):
        return values.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64) * 86_400_000_000
    return values.cast(pa.timestamp("us", tz=values.type.tz)).cast(pa.int64()).to_numpy(zero_copy_only=False)


def _days(values: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_date(values.type):
        return values.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.floor_divide(_micros(values), 86_400_000_000)


def _months(values: pa.ChunkedArray) -> np.ndarray:
    days = _days(values).astype("datetime64[D]")
    return (days.astype("datetime64[M]").astype(np.int64))


def _bucket_hash(value: Any, type_name: str) -> int:
    import mmh3

    if type_name in ("int", "long", "date", "time", "timestamp", "timestamptz"):
        data = int(value).to_bytes(8, "little", signed=True)
    elif type_name == "string":
        data = value.encode("utf-8")
    elif type_name.startswith("decimal("):
        unscaled = int(value.scaleb(int(type_name[8:-1].split(",")[1])).to_integral_value())
        length = max(1, (unscaled.bit_length() + 8) // 8)
        data = unscaled.to_bytes(length, "big", signed=True)
    else:
        data = bytes(value)
    return mmh3.hash(data, 0, signed=True)


def _transform(column: pa.ChunkedArray, source_type: Any, transform: str) -> list[Any]:
    """Iceberg partition values (internal form) of ``column`` under ``transform``."""
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    if transform == "identity":
        if pa.types.is_date(column.type):
            out = column.cast(pa.int32()).to_pylist()
        elif pa.types.is_timestamp(column.type):
            out = column.cast(pa.int64()).to_pylist()
        elif pa.types.is_decimal(column.type):
            out = [None if v is None else str(v) for v in column.to_pylist()]
        else:
            out = column.to_pylist()
        return out
    if transform in ("year", "month", "day", "hour"):
        filled = column.fill_null(0) if column.null_count else column
        if transform == "day":
            values = _days(filled)
        elif transform == "hour":
            values = np.floor_divide(_micros(filled), 3_600_000_000)
        elif transform == "month":
            values = _months(filled)
        else:
            values = _months(filled) // 12
        return [None if n else int(v) for v, n in zip(values.tolist(), nulls)]
    if transform.startswith("bucket["):
        n = int(transform[7:-1])
        type_name = source_type if isinstance(source_type, str) else "other"
        if type_name in ("date",):
            raw = column.cast(pa.int32()).to_pylist()
        elif type_name in ("timestamp", "timestamptz"):
            raw = column.cast(pa.int64()).to_pylist()
        else:
            raw = column.to_pylist()
        return [None if v is None else (_bucket_hash(v, type_name) & 0x7FFFFFFF) % n for v in raw]
    if transform.startswith("truncate["):
        w = int(transform[9:-1])
        out = []
        for v in column.to_pylist():
            if v is None:
                out.append(None)
            elif isinstance(v, int):
                out.append(v - (v % w))
            elif isinstance(v, str):
                out.append(v[:w])
            elif isinstance(v, bytes):
                out.append(v[:w])
            else:  # decimal: truncate the unscaled value
                exp = -v.as_tuple().exponent
                unscaled = int(v.scaleb(exp))
                out.append(str(type(v)(unscaled - (unscaled % w)).scaleb(-exp)))
        return out
    if transform == "void":
        return [None] * len(column)
    raise ValueError(f"unsupported partition transform {transform!r}")


def partition_values(spec: dict[str, Any], schema: dict[str, Any], table: pa.Table) -> list[tuple[list[Any], np.ndarray]]:
    """Rows of ``table`` grouped by partition: [(partition values, row indices)]."""
    by_id = {f["id"]: f for f in schema["fields"]}
    columns = []
    for pf in spec.get("fields", []):
        source = by_id[pf["source-id"]]
        columns.append(_transform(table.column(source["name"]), source["type"], pf["transform"]))
    groups: dict[bytes, tuple[list[Any], list[int]]] = {}
    for i, values in enumerate(zip(*columns)):
        key = orjson.dumps(values)
        group = groups.get(key)
        if group is None:
            groups[key] = (list(values), [i])
        else:
            group[1].append(i)
    return [(values, np.array(rows, dtype=np.int64)) for values, rows in groups.values()]


def write_data_file(table: pa.Table, data_location: str, schema: pa.Schema, prefix: str) -> dict[str, Any]:
    """Write ``table`` (in ``schema``) as one Parquet file under ``data_location``."""
    fs, base = filesystem_path(data_location)
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    local = f"{base.rstrip('/')}/{name}"
    fs.create_dir(base.rstrip("/"), recursive=True)
    if table.schema != schema:
        table = table.cast(schema)
    pq.write_table(table, local, filesystem=fs, compression="zstd", row_group_size=1_000_000,
                   write_statistics=True, store_schema=False)
    size = fs.get_file_info(local).size
    return {"path": f"{data_location.rstrip('/')}/{name}", "file_size": size, "record_count": table.num_rows}


# -- the JVM side ------------------------------------------------------------------------------

def _sink(spark: SparkSession):
    return spark.sparkContext._jvm.lakestream.LakestreamSink


def table_info(spark: SparkSession, catalog: str, namespace: str, table: str) -> dict[str, Any]:
    """Schema, spec, location, format version and current snapshot of a table (``exists`` False if none)."""
    return orjson.loads(_sink(spark).tableInfo(spark._jsparkSession, catalog, namespace, table))


def create_table(spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]
                 ) -> dict[str, Any]:
    """Create a table in one catalog commit (no-op if it exists); returns its `table_info`."""
    return orjson.loads(_sink(spark).createTable(spark._jsparkSession, catalog, namespace, table,
                                                 orjson.dumps(request).decode()))


def commit_files(spark: SparkSession, catalog: str, namespace: str, table: str, request: dict[str, Any]
                 ) -> dict[str, Any]:
    """Commit data files and deletion vectors with snapshot properties, in one snapshot."""
    return orjson.loads(_sink(spark).commitFiles(spark._jsparkSession, catalog, namespace, table,
                                                 orjson.dumps(request).decode()))
