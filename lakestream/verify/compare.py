"""Source-vs-lake verification: is every captured PostgreSQL or MariaDB table mirrored exactly in Iceberg?

For each captured PostgreSQL table the source (read through Spark's JDBC reader, one consistent snapshot) and
its Iceberg mirror are brought to the same canonical form column by column — decimals at the
source's scale, timestamps as UTC text, json as PostgreSQL's text, bytea as hex — hashed per row,
and joined on the primary key inside Spark. One Spark action per table yields the row counts, the
missing / extra / differing / duplicated keys and a few sample keys of each. A MariaDB table is read and
rendered as `lakestream.verify.mariadb` describes, then compared the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg2
from psycopg2 import sql as pgsql

from lakestream.config import PipelineConfig
from lakestream.errors import ConfigError
from lakestream.identifiers import SourceTableName, TableName, quote_table
from lakestream.routing import Router

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

PASS_MARKER = "verify: OK"
FAIL_MARKER = "verify: FAILED"

_INT_TYPES = {"smallint", "integer", "bigint", "oid"}
_TEXT_TYPES = {"json", "jsonb", "uuid", "text", "character varying", "character", "name", "xml", "inet", "cidr"}
_TS_FORMAT_PG = "YYYY-MM-DD HH24:MI:SS.US"
_TS_FORMAT_SPARK = "yyyy-MM-dd HH:mm:ss.SSSSSS"


@dataclass
class TableVerification:
    """The comparison of one source table with its Iceberg mirror."""

    source_table: str
    lake_table: str
    key_columns: list[str] = field(default_factory=list)
    source_rows: int = 0
    lake_rows: int = 0
    missing: int = 0
    extra: int = 0
    differing: int = 0
    duplicate_keys: int = 0
    missing_columns: list[str] = field(default_factory=list)
    lake_table_exists: bool = True
    error: str | None = None
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and not self.missing_columns
            and self.missing == self.extra == self.differing == self.duplicate_keys == 0
            and self.source_rows == self.lake_rows
        )

    def problems(self) -> str:
        """A short description of what differs ('' when the table matches)."""
        if self.error:
            return self.error
        parts = []
        if self.missing_columns:
            parts.append(f"lake lacks columns {', '.join(self.missing_columns)}")
        for label in ("missing", "extra", "differing", "duplicate_keys"):
            keys = self.samples.get(label) or []
            if getattr(self, label):
                parts.append(
                    f"{label.replace('_', ' ')}: {', '.join(keys)}" + (" …" if getattr(self, label) > len(keys) else "")
                )
        return "; ".join(parts)


@dataclass
class VerifyReport:
    """The result of `verify_tables`: one `TableVerification` per captured table."""

    tables: list[TableVerification]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tables": [asdict(t) | {"ok": t.ok} for t in self.tables]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary_line(self) -> str:
        """``verify: OK — …`` or ``verify: FAILED — …``: the line scripts and tests look for."""
        rows = sum(t.source_rows for t in self.tables)
        if self.ok:
            return f"{PASS_MARKER} — {len(self.tables)} table(s), {rows:,} source rows match the lake"
        bad = [t.source_table for t in self.tables if not t.ok]
        return f"{FAIL_MARKER} — {len(bad)} of {len(self.tables)} table(s) differ: {', '.join(bad)}"

    def to_text(self) -> str:
        """An aligned table, the problems of each failing table, and the summary line."""
        header = ("SOURCE", "LAKE", "SOURCE ROWS", "LAKE ROWS", "MISSING", "EXTRA", "DIFFERING", "DUP KEYS", "STATUS")
        rows = [header]
        for t in self.tables:
            rows.append(
                (
                    t.source_table,
                    t.lake_table,
                    f"{t.source_rows:,}",
                    f"{t.lake_rows:,}",
                    f"{t.missing:,}",
                    f"{t.extra:,}",
                    f"{t.differing:,}",
                    f"{t.duplicate_keys:,}",
                    "ok" if t.ok else "MISMATCH",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        numeric = set(range(2, 8))
        lines = [
            "  ".join(
                cell.rjust(w) if i in numeric else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        for t in self.tables:
            if not t.ok:
                lines.append(f"  {t.source_table}: {t.problems()}")
        lines.append(self.summary_line())
        return "\n".join(lines)


@dataclass(frozen=True)
class _SourceColumn:
    name: str
    data_type: str  # information_schema.columns.data_type (domains resolved to their base type)
    precision: int | None
    scale: int | None


def verify_tables(
    config: PipelineConfig, spark: SparkSession, tables: list[str] | None = None, samples: int = 5
) -> VerifyReport:
    """Compare every captured table (or only ``tables``, "schema.table") with its Iceberg mirror."""
    if config.capture is None:
        raise ConfigError(
            "verify needs a `capture:` section naming the source database and tables — fix: add capture.tables"
        )
    selected = list(config.capture.tables)
    if tables:
        tables = [str(SourceTableName.parse(t)) for t in tables]
        unknown = sorted(set(tables) - set(selected))
        if unknown:
            raise ConfigError(f"{unknown} are not captured tables; choose among {selected}")
        selected = [t for t in selected if t in tables]
    router = Router.from_config(config)
    access = _SOURCE_ACCESS[config.capture.database.kind]()
    conn = access.connect(config)
    try:
        return VerifyReport([_verify_one(config, spark, conn, router, name, samples, access) for name in selected])
    finally:
        conn.close()


@dataclass(frozen=True)
class _SourceAccess:
    """How verify reads one kind of source database: its columns, primary key and rows in canonical form, and
    the same canonical form of a mirror's column."""

    connect: Callable[[PipelineConfig], Any]
    columns: Callable[[Any, str, str], list[Any]]
    primary_key: Callable[[Any, str, str], list[str]]
    read: Callable[[PipelineConfig, SparkSession, Any, str, str, list[Any]], DataFrame]
    canonical: Callable[[Any, Column, Any, str], Column]


def _postgresql_access() -> _SourceAccess:
    return _SourceAccess(_pg_connect, _source_columns, _primary_key, _read_source, _canonical)


def _mariadb_access() -> _SourceAccess:
    from lakestream.verify import mariadb as m

    return _SourceAccess(
        m.connect,
        m.source_columns,
        m.primary_key,
        lambda config, spark, conn, schema, table, columns: m.read_source(spark, conn, schema, table, columns),
        m.canonical,
    )


_SOURCE_ACCESS: dict[str, Callable[[], _SourceAccess]] = {"postgresql": _postgresql_access, "mariadb": _mariadb_access}


def _pg_connect(config: PipelineConfig) -> Any:
    db = config.capture.database
    conn = psycopg2.connect(
        host=db.host,
        port=db.port,
        dbname=db.dbname,
        user=db.user,
        password=db.password.get_secret_value() if db.password else None,
    )
    conn.autocommit = True
    return conn


def _verify_one(
    config: PipelineConfig, spark: SparkSession, conn, router: Router, name: str, samples: int, access: _SourceAccess
) -> TableVerification:
    parsed = SourceTableName.parse(name)
    schema, table = parsed.schema, parsed.table
    topic = config.capture.topic(parsed)
    _, lake_name = router.route(topic)
    result = TableVerification(source_table=name, lake_table=str(lake_name))
    columns = access.columns(conn, schema, table)
    if not columns:
        result.error = "source table not found"
        return result
    clash = _case_clash(columns)
    if clash is not None:
        result.error = (
            f"source columns {clash[0]!r} and {clash[1]!r} differ only by case: no mirror can hold both "
            "(Spark's column names are case-insensitive), so this table's changes are dead letters — fix: "
            "rename one of them at the source"
        )
        return result
    primary_key = access.primary_key(conn, schema, table)
    # Without a primary key, whole rows are the keys: the comparison becomes one of row multisets.
    keys = primary_key or [c.name for c in columns]
    result.key_columns = keys
    source = access.read(config, spark, conn, schema, table, columns)
    lake = _read_lake(config, spark, lake_name)
    if lake is None:
        result.lake_table_exists = False
        result.source_rows = source.count()
        if result.source_rows:
            result.missing = result.source_rows
            result.error = f"lake table {config.catalog.name}.{lake_name} does not exist"
        return result
    lake_fields = _match_lake_columns(columns, lake.schema.fields)
    result.missing_columns = [c.name for c in columns if c.name not in lake_fields]
    _compare(result, columns, keys, bool(primary_key), source, lake, lake_fields, samples, access.canonical)
    return result


def _case_clash(columns: list[_SourceColumn]) -> tuple[str, str] | None:
    seen: dict[str, str] = {}
    for c in columns:
        if c.name.lower() in seen:
            return seen[c.name.lower()], c.name
        seen[c.name.lower()] = c.name
    return None


def _match_lake_columns(columns: list[_SourceColumn], fields: list[Any]) -> dict[str, tuple[int, Any]]:
    """Source column name → (position, field) of the mirror's column: the one of the same name, else the one
    equal but for case (Spark resolves names case-insensitively; the source has no two such columns)."""
    exact = {f.name: (i, f) for i, f in enumerate(fields)}
    folded: dict[str, list[tuple[int, Any]]] = {}
    for i, f in enumerate(fields):
        folded.setdefault(f.name.lower(), []).append((i, f))
    out = {}
    for c in columns:
        if c.name in exact:
            out[c.name] = exact[c.name]
        elif len(folded.get(c.name.lower(), [])) == 1:
            out[c.name] = folded[c.name.lower()][0]
    return out


def _source_columns(conn, schema: str, table: str) -> list[_SourceColumn]:
    with conn.cursor() as cur:
        cur.execute(
            """SELECT column_name, data_type, numeric_precision, numeric_scale
               FROM information_schema.columns WHERE table_schema = %s AND table_name = %s
               ORDER BY ordinal_position""",
            (schema, table),
        )
        return [_SourceColumn(*row) for row in cur.fetchall()]


def _primary_key(conn, schema: str, table: str) -> list[str]:
    """The primary key columns in key order (from pg_index), or [] when the table has none."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT a.attname
               FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
               WHERE i.indisprimary AND n.nspname = %s AND c.relname = %s
               ORDER BY array_position(i.indkey::int2[], a.attnum)""",
            (schema, table),
        )
        return [row[0] for row in cur.fetchall()]


# Each column is brought to one canonical Spark value on both sides: the source query renders it
# in PostgreSQL (text where Spark's JDBC mapping would be lossy or time-zone dependent), and
# `_canonical` renders the lake column into the same form.


def _source_expression(column: _SourceColumn) -> pgsql.Composable:
    ident = pgsql.Identifier(column.name)
    kind = column.data_type
    if kind in _INT_TYPES:
        out = pgsql.SQL("{}::int8").format(ident)
    elif kind == "numeric":
        # Unbounded numeric lands as text in the lake; bounded numeric keeps its scale on both sides.
        out = ident if _bounded_numeric(column) else pgsql.SQL("{}::text").format(ident)
    elif kind in ("real", "double precision", "boolean", "bytea", "ARRAY"):
        out = ident
    elif kind == "date":
        out = pgsql.SQL("to_char({}, 'YYYY-MM-DD')").format(ident)
    elif kind == "timestamp without time zone":
        out = pgsql.SQL("to_char({}, {})").format(ident, pgsql.Literal(_TS_FORMAT_PG))
    elif kind == "timestamp with time zone":
        out = pgsql.SQL("to_char({} AT TIME ZONE 'UTC', {})").format(ident, pgsql.Literal(_TS_FORMAT_PG))
    elif kind == "time without time zone":
        out = pgsql.SQL("to_char({}, 'HH24:MI:SS.US')").format(ident)
    elif kind == "interval":
        # Debezium's MicroDuration counts a month as 30.4375 days, as extract(epoch) does.
        out = pgsql.SQL("(extract(epoch from {}) * 1000000)::int8").format(ident)
    elif kind == "money":
        out = pgsql.SQL("{}::numeric::text").format(ident)
    else:
        out = pgsql.SQL("{}::text").format(ident)
    return pgsql.SQL("{} AS {}").format(out, ident)


def _bounded_numeric(column: _SourceColumn) -> bool:
    return column.precision is not None and column.precision <= 38 and column.scale is not None


def _canonical(column: _SourceColumn, value: Column, lake_type: Any, side: str) -> Column:
    """``value`` (a source or lake column) in the canonical form for ``column``'s PostgreSQL type."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    kind = column.data_type
    if kind in _INT_TYPES or kind == "interval":
        return value.cast("bigint").cast("string")
    if kind == "numeric":
        if _bounded_numeric(column):
            return value.cast(f"decimal({column.precision},{column.scale})").cast("string")
        # Text of an unbounded numeric: compare without trailing fractional zeros.
        text = F.regexp_replace(value.cast("string"), r"(\.\d*?)0+$", "$1")
        return F.regexp_replace(text, r"\.$", "")
    if kind in ("real", "double precision"):
        return value.cast("double").cast("string")
    if kind == "boolean":
        return value.cast("boolean").cast("string")
    if kind == "bytea":
        return F.lower(F.hex(value.cast("binary")))
    if kind == "ARRAY":
        if lake_type is not None and not isinstance(lake_type, StringType):
            return F.to_json(value.cast(lake_type))
        return F.to_json(value) if side == "source" else value.cast("string")
    if side == "source":
        return value
    if kind in ("timestamp without time zone", "timestamp with time zone"):
        return F.date_format(value.cast("timestamp"), _TS_FORMAT_SPARK)
    if kind == "date":
        return F.date_format(value.cast("date"), "yyyy-MM-dd")
    if kind == "uuid":
        return F.lower(value.cast("string"))
    if kind == "character":
        # PostgreSQL drops char(n)'s padding when it becomes text; the change event may carry it.
        return F.rtrim(value.cast("string"))
    return value.cast("string")


def _read_source(
    config: PipelineConfig, spark: SparkSession, conn, schema: str, table: str, columns: list[_SourceColumn]
) -> DataFrame:
    db = config.capture.database
    query = (
        pgsql.SQL("SELECT {} FROM {}")
        .format(pgsql.SQL(", ").join(_source_expression(c) for c in columns), pgsql.Identifier(schema, table))
        .as_string(conn)
    )
    reader = (
        spark.read.format("jdbc")
        .option("url", f"jdbc:postgresql://{db.host}:{db.port}/{db.dbname}")
        .option("driver", "org.postgresql.Driver")
        .option("query", query)
        .option("user", db.user)
        .option("fetchsize", "10000")
    )
    if db.password:
        reader = reader.option("password", db.password.get_secret_value())
    return reader.load()


def _read_lake(config: PipelineConfig, spark: SparkSession, name: TableName) -> DataFrame | None:
    from pyspark.sql.utils import AnalysisException

    try:
        return spark.table(quote_table(config.catalog.name, name.namespace, name.table))
    except AnalysisException as exc:
        if "TABLE_OR_VIEW_NOT_FOUND" in str(exc) or "not found" in str(exc).lower():
            return None
        raise


def _compare(
    result: TableVerification,
    columns: list[Any],
    keys: list[str],
    has_primary_key: bool,
    source: DataFrame,
    lake: DataFrame,
    lake_fields: dict[str, Any],
    samples: int,
    canonical: Callable[[Any, Column, Any, str], Column] | None = None,
) -> None:
    canonical = canonical or _canonical
    from pyspark.sql import functions as F

    def side_frame(df: DataFrame, side: str) -> DataFrame:
        # Columns are addressed by position (renamed s0.. / l0..): a name never has to be resolved by Spark,
        # whose resolution ignores case, nor quoted.
        df = df.toDF(*[f"{side[0]}{i}" for i in range(len(df.columns))])
        values = []
        for i, c in enumerate(columns):
            matched = lake_fields.get(c.name)
            lake_field = matched[1] if matched else None
            if side == "lake" and matched is None:
                values.append(F.lit(None).cast("string"))
                continue
            position = i if side == "source" else matched[0]
            values.append(
                canonical(c, F.col(f"{side[0]}{position}"), lake_field.dataType if lake_field else None, side)
            )
        names = [c.name for c in columns]
        key_values = [values[names.index(k)] for k in keys]
        return df.select(
            *[v.alias(f"k{i}") for i, v in enumerate(key_values)],
            F.sha2(F.to_json(F.array(*values)), 256).alias("h"),
        )

    key_cols = [f"k{i}" for i in range(len(keys))]
    src = side_frame(source, "source")
    if has_primary_key:
        # The source enforces uniqueness: no need to group it.
        src = src.select(*key_cols, F.lit(1).alias("src_n"), F.col("h").alias("src_h"))
    else:
        src = src.groupBy(*key_cols).agg(F.count(F.lit(1)).alias("src_n"), F.min("h").alias("src_h"))
    lk = (
        side_frame(lake, "lake")
        .groupBy(*key_cols)
        .agg(F.count(F.lit(1)).alias("lake_n"), F.min("h").alias("lake_h_min"), F.max("h").alias("lake_h_max"))
    )
    condition = [src[k].eqNullSafe(lk[k]) for k in key_cols]
    joined = src.join(lk, condition, "full_outer").select(
        *[F.coalesce(src[k], lk[k]).alias(k) for k in key_cols], "src_n", "src_h", "lake_n", "lake_h_min", "lake_h_max"
    )
    display = _key_display(keys, key_cols)
    src_n = F.coalesce(F.col("src_n"), F.lit(0))
    lake_n = F.coalesce(F.col("lake_n"), F.lit(0))
    flags = {
        "missing": (src_n > 0) & (lake_n == 0),
        "extra": (src_n == 0) & (lake_n > 0),
        "duplicate_keys": lake_n > F.greatest(src_n, F.lit(1)),
        "differing": (src_n > 0)
        & (lake_n > 0)
        & ((F.col("src_h") != F.col("lake_h_min")) | (F.col("lake_h_min") != F.col("lake_h_max"))),
    }
    aggregates = [F.sum(src_n).alias("source_rows"), F.sum(lake_n).alias("lake_rows")]
    for label, flag in flags.items():
        aggregates.append(F.sum(flag.cast("int")).alias(label))
        aggregates.append(F.slice(F.collect_list(F.when(flag, display)), 1, max(samples, 1)).alias(f"{label}_samples"))
    row = joined.agg(*aggregates).collect()[0]
    result.source_rows = int(row["source_rows"] or 0)
    result.lake_rows = int(row["lake_rows"] or 0)
    for label in flags:
        setattr(result, label, int(row[label] or 0))
        result.samples[label] = list(row[f"{label}_samples"] or [])[:samples]


def _key_display(keys: list[str], key_cols: list[str]) -> Column:
    """``id=5`` or ``order_id=5,line=2``: how sample keys are shown."""
    from pyspark.sql import functions as F

    parts = []
    for i, (name, col) in enumerate(zip(keys, key_cols, strict=True)):
        prefix = ("," if i else "") + name + "="
        parts.append(F.concat(F.lit(prefix), F.coalesce(F.col(col), F.lit("NULL"))))
    return F.concat(*parts)
