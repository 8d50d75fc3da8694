"""`verify` for a MariaDB source: each column of the source and of its mirror in one canonical form.

The source is read with PyMySQL in one ``START TRANSACTION WITH CONSISTENT SNAPSHOT``, every column rendered by
MariaDB itself into the canonical text (floats as doubles), and handed to Spark; `canonical` renders the mirror's
column into the same form. `lakestream.verify.compare` then hashes the rows and joins them on the primary key exactly as
for PostgreSQL. The normalisations, per MariaDB type:

| MariaDB | canonical form (both sides) |
|---|---|
| TINYINT(1), BOOLEAN, BIT(1) | ``true`` / ``false`` (any non-zero TINYINT(1) is true: the mirror holds a boolean) |
| other integers, signed and unsigned, YEAR | decimal text (``18446744073709551615``) |
| DECIMAL(p, s), p ≤ 38 | the decimal at scale s; p > 38: text without trailing fractional zeros |
| FLOAT, DOUBLE | the double value (a FLOAT widened exactly, as the mirror's float is) |
| DATE, DATETIME(n) | ``YYYY-MM-DD`` / ``YYYY-MM-DD HH:MM:SS.ffffff`` |
| TIMESTAMP(n) | the UTC instant as ``YYYY-MM-DD HH:MM:SS.ffffff`` |
| TIME(n) | ``[-]HH:MM:SS.ffffff`` (hours up to 838) |
| BINARY, VARBINARY, BLOB | lower-case hex |
| BIT(n > 1) | lower-case hex, most significant byte first (the mirror holds Debezium's, least significant first) |
| GEOMETRY, POINT, ... | lower-case hex of the standard WKB (the mirror: the ``wkb`` of Debezium's geometry JSON) |
| CHAR, VARCHAR, TEXT, ENUM, SET, JSON | the text as MariaDB returns it |

Reading through the driver keeps the source side free of a JDBC driver on Spark's class path; it suits tables that
fit a driver's memory comfortably (the rows are hashed in Spark, not collected there twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakestream.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_INTEGERS = {"tinyint", "smallint", "mediumint", "int", "bigint", "year"}
_FLOATS = {"float", "double"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_SPATIAL = {
    "geometry",
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
}
_TS_FORMAT_SPARK = "yyyy-MM-dd HH:mm:ss.SSSSSS"


@dataclass(frozen=True)
class MariaDBColumn:
    name: str
    data_type: str  # information_schema.COLUMNS.DATA_TYPE (``bigint``)
    column_type: str  # COLUMN_TYPE (``bigint(20) unsigned``, ``tinyint(1)``, ``bit(16)``)
    precision: int | None
    scale: int | None

    @property
    def is_boolean(self) -> bool:
        return self.column_type.startswith("tinyint(1)") or self.column_type == "bit(1)"

    @property
    def bounded_decimal(self) -> bool:
        return self.data_type == "decimal" and self.precision is not None and self.precision <= 38


def connect(config: PipelineConfig) -> Any:
    import pymysql

    db = config.capture.database
    return pymysql.connect(
        host=db.host,
        port=db.port,
        user=db.user,
        password=db.password.get_secret_value() if db.password else "",
        database=db.dbname,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=10,
    )


def source_columns(conn: Any, schema: str, table: str) -> list[MariaDBColumn]:
    with conn.cursor() as cur:
        cur.execute(
            """SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE
                       FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
                       ORDER BY ORDINAL_POSITION""",
            (schema, table),
        )
        return [
            MariaDBColumn(name, str(kind).lower(), str(ctype).lower(), precision, scale)
            for name, kind, ctype, precision, scale in cur.fetchall()
        ]


def primary_key(conn: Any, schema: str, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            """SELECT COLUMN_NAME FROM information_schema.STATISTICS
                       WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY'
                       ORDER BY SEQ_IN_INDEX""",
            (schema, table),
        )
        return [row[0] for row in cur.fetchall()]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _source_expression(column: MariaDBColumn) -> str:
    """The column rendered by MariaDB into its canonical form."""
    c = _quote(column.name)
    kind = column.data_type
    if column.is_boolean:
        return f"IF({c} IS NULL, NULL, IF({c} <> 0, 'true', 'false'))"
    if kind in _INTEGERS or kind == "decimal":
        return f"CAST({c} AS CHAR)"
    if kind in _FLOATS:
        return f"CAST({c} AS DOUBLE)"
    if kind == "date":
        return f"DATE_FORMAT({c}, '%Y-%m-%d')"
    if kind in ("datetime", "timestamp"):  # the session's time zone is UTC
        return f"DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')"
    if kind == "time":
        return f"TIME_FORMAT({c}, '%H:%i:%s.%f')"
    if kind == "bit":
        width = ((int(column.precision or 1) + 7) // 8) * 2
        return f"LOWER(LPAD(HEX({c}), {width}, '0'))"
    if kind in _BINARY:
        return f"LOWER(HEX({c}))"
    if kind in _SPATIAL:
        return f"LOWER(HEX(ST_AsWKB({c})))"
    return f"CAST({c} AS CHAR CHARACTER SET utf8mb4)"


def read_source(spark: SparkSession, conn: Any, schema: str, table: str, columns: list[MariaDBColumn]) -> DataFrame:
    """The table's rows in canonical form, read in one consistent snapshot."""
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    query = f"SELECT {', '.join(_source_expression(c) for c in columns)} FROM {_quote(schema)}.{_quote(table)}"
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            cur.execute(query)
            rows = [
                tuple(v.decode() if isinstance(v, (bytes, bytearray)) else v for v in row) for row in cur.fetchall()
            ]
        finally:
            cur.execute("COMMIT")
    fields = [
        StructField(f"s{i}", DoubleType() if c.data_type in _FLOATS else StringType()) for i, c in enumerate(columns)
    ]
    return spark.createDataFrame(rows, StructType(fields))


def canonical(column: MariaDBColumn, value: Column, lake_type: Any, side: str) -> Column:
    """``value`` (a source or lake column) in the canonical form of ``column``'s MariaDB type."""
    from pyspark.sql import functions as F

    kind = column.data_type
    if kind in _FLOATS:
        return value.cast("double").cast("string")
    if side == "source":
        return value
    if column.is_boolean:
        return value.cast("boolean").cast("string")
    if kind in _INTEGERS:
        return value.cast("decimal(20,0)").cast("string")
    if column.bounded_decimal:
        return value.cast(f"decimal({column.precision},{column.scale})").cast("string")
    if kind == "decimal":
        text = F.regexp_replace(value.cast("string"), r"(\.\d*?)0+$", "$1")
        return F.regexp_replace(text, r"\.$", "")
    if kind == "date":
        return F.date_format(value.cast("date"), "yyyy-MM-dd")
    if kind in ("datetime", "timestamp"):
        return F.date_format(value.cast("timestamp"), _TS_FORMAT_SPARK)
    if kind == "bit":
        # Debezium's bytes are least significant first: reverse them, two hex digits at a time
        little_endian = F.lower(F.hex(value.cast("binary")))
        return F.array_join(F.reverse(F.regexp_extract_all(little_endian, F.lit("(..)"), 1)), "")
    if kind in _BINARY:
        return F.lower(F.hex(value.cast("binary")))
    if kind in _SPATIAL:
        return F.lower(F.hex(F.unbase64(F.get_json_object(value.cast("string"), "$.wkb"))))
    return value.cast("string")
