"""How a source column arrives in the lake, per kind of source database: the table type (Spark DDL) Debezium's
events give its type, and how the parallel snapshot renders and parses it to match (`SourceColumn`).

The types must match what `lakestream.decode.types` makes of Debezium's schemas (schemas on, default
``time.precision.mode``, ``decimal.handling.mode=precise``, ``interval.handling.mode=numeric``; for MariaDB also
``bigint.unsigned.handling.mode=precise`` and ``TINYINT(1)`` as boolean): the table the snapshot creates is the
table the streamed changes then land in, and the type a column record names (`lakestream.capture.columns`) is the
one the column's next row would bring. A type the mapping does not know is `UnsupportedColumn`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from lakestream.errors import LakestreamError


class UnsupportedColumn(LakestreamError):
    """A column type the parallel snapshot cannot render exactly as Debezium would."""


@dataclass(frozen=True)
class SourceColumn:
    """One source column: its name, the table type (Spark DDL), how the snapshot renders it, how it is parsed."""

    name: str
    pg_type: str  # the source's data type (PostgreSQL's or, lower-cased, MariaDB's)
    ddl: str
    expression: str  # SQL over the quoted column name, {c}
    read_type: pa.DataType  # what the snapshot's reader parses the rendered text as
    hex_bytes: bool = False  # rendered as hex text, decoded to bytes after parsing


_POSTGRESQL_INTS = {
    "smallint": ("int", pa.int32()),
    "integer": ("int", pa.int32()),
    "bigint": ("bigint", pa.int64()),
}
# The PostgreSQL types of an integer key (split evenly between its min and max).
POSTGRESQL_INTEGER_TYPES = frozenset(_POSTGRESQL_INTS)
_POSTGRESQL_TEXT = {
    "text",
    "character varying",
    "character",
    "json",
    "jsonb",
    "uuid",
    "xml",
    "inet",
    "cidr",
    "macaddr",
    "citext",
    "ltree",
}


def postgresql_source_column(
    name: str, data_type: str, udt_type: str, precision: int | None, scale: int | None
) -> SourceColumn:
    """A PostgreSQL column (``information_schema.columns``' ``data_type``, ``pg_type.typtype``, numeric precision
    and scale) as the snapshot's COPY renders it to CSV."""
    c = "{c}"
    if data_type in _POSTGRESQL_INTS:
        ddl, arrow = _POSTGRESQL_INTS[data_type]
        return SourceColumn(name, data_type, ddl, c, arrow)
    if data_type == "real":
        return SourceColumn(name, data_type, "float", c, pa.float32())
    if data_type == "double precision":
        return SourceColumn(name, data_type, "double", c, pa.float64())
    if data_type == "boolean":
        return SourceColumn(name, data_type, "boolean", c, pa.bool_())
    if data_type == "numeric":
        if precision is not None and scale is not None and precision <= 38:
            return SourceColumn(name, data_type, f"decimal({precision},{scale})", c, pa.decimal128(precision, scale))
        # Debezium's VariableScaleDecimal: the lake keeps every digit as text.
        return SourceColumn(name, data_type, "string", f"{c}::text", pa.string())
    if data_type == "date":
        return SourceColumn(name, data_type, "date", c, pa.date32())
    if data_type == "timestamp without time zone":
        return SourceColumn(name, data_type, "timestamp_ntz", c, pa.timestamp("us"))
    if data_type == "timestamp with time zone":
        # The session runs in UTC, so the text is "... +00", which the reader takes as UTC.
        return SourceColumn(name, data_type, "timestamp", c, pa.timestamp("us", tz="UTC"))
    if data_type == "time without time zone":
        # MicroTime → "HH:MM:SS.ffffff", as lakestream.decode.types renders it.
        return SourceColumn(
            name, data_type, "string", f"to_char('2000-01-01'::date + {c}, 'HH24:MI:SS.US')", pa.string()
        )
    if data_type == "interval":
        # MicroDuration counts a month as 30.4375 days, as extract(epoch) does.
        return SourceColumn(name, data_type, "bigint", f"(extract(epoch from {c}) * 1000000)::int8", pa.int64())
    if data_type == "bytea":
        return SourceColumn(name, data_type, "binary", f"encode({c}, 'hex')", pa.string(), hex_bytes=True)
    if data_type in _POSTGRESQL_TEXT or (data_type == "USER-DEFINED" and udt_type == "e"):
        return SourceColumn(name, data_type, "string", f"{c}::text", pa.string())
    raise UnsupportedColumn(
        f"column {name!r} has type {data_type} ({udt_type}), which the parallel snapshot does not read yet — fix: "
        f"snapshot this table with Debezium (capture.snapshot: debezium), or leave it out of `lakestream snapshot`"
    )


_MARIADB_INT = {"tinyint", "smallint", "mediumint", "int"}
# The MariaDB types of an integer key (split evenly between its min and max).
MARIADB_INTEGER_TYPES = frozenset(_MARIADB_INT | {"bigint"})
_MARIADB_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_MARIADB_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


def mariadb_source_column(
    name: str, data_type: str, column_type: str, precision: int | None, scale: int | None
) -> SourceColumn:
    """A MariaDB column (``information_schema.COLUMNS``' ``DATA_TYPE``, ``COLUMN_TYPE``, numeric precision and
    scale): the lake type Debezium's MariaDB events give it (docs/sources.md's type table) and the SQL rendering it
    inside the snapshot row's JSON object."""
    data_type, column_type = data_type.lower(), column_type.lower()
    unsigned = "unsigned" in column_type
    if (data_type == "tinyint" and column_type.startswith("tinyint(1)")) or column_type == "bit(1)":
        return SourceColumn(name, data_type, "boolean", "{c} + 0", pa.int64())
    if data_type in _MARIADB_INT:
        wide = data_type == "int" and unsigned
        return SourceColumn(name, data_type, "bigint" if wide else "int", "{c}", pa.int64())
    if data_type == "bigint":
        if unsigned:  # bigint.unsigned.handling.mode=precise: above 2^63 it must not wrap
            return SourceColumn(name, data_type, "decimal(20,0)", "CAST({c} AS CHAR)", pa.string())
        return SourceColumn(name, data_type, "bigint", "{c}", pa.int64())
    if data_type == "decimal":
        p, s = int(precision or 10), int(scale or 0)
        return SourceColumn(
            name, data_type, f"decimal({p},{s})" if p <= 38 else "string", "CAST({c} AS CHAR)", pa.string()
        )
    if data_type in ("float", "double"):
        return SourceColumn(name, data_type, data_type, "{c}", pa.float64())
    if data_type == "date":
        return SourceColumn(name, data_type, "date", "DATE_FORMAT({c}, '%Y-%m-%d')", pa.string())
    if data_type == "datetime":
        return SourceColumn(name, data_type, "timestamp_ntz", "DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')", pa.string())
    if data_type == "timestamp":  # the session's time_zone is UTC
        return SourceColumn(name, data_type, "timestamp", "DATE_FORMAT({c}, '%Y-%m-%dT%H:%i:%s.%fZ')", pa.string())
    if data_type == "time":  # a duration, -838:59:59 .. 838:59:59, as Debezium's string
        return SourceColumn(name, data_type, "string", "TIME_FORMAT({c}, '%H:%i:%s.%f')", pa.string())
    if data_type == "year":
        return SourceColumn(name, data_type, "int", "{c} + 0", pa.int64())
    if data_type in _MARIADB_TEXT:
        # CAST: a JSON column (longtext) as the text it stores, not nested into the row's object
        return SourceColumn(name, data_type, "string", "CAST({c} AS CHAR)", pa.string())
    if data_type in _MARIADB_BINARY:
        return SourceColumn(name, data_type, "binary", "HEX({c})", pa.string(), hex_bytes=True)
    raise UnsupportedColumn(
        f"column {name!r} has type {column_type}, which the parallel snapshot of MariaDB does not read yet — fix: "
        "snapshot this table with Debezium (capture.snapshot: debezium)"
    )
