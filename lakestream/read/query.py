"""Reading the lake's tables with Spark, DuckDB or pyiceberg, as Arrow (or pandas) for notebooks.

All three engines open the same tables through the pipeline's catalog: Spark through its Iceberg
SparkCatalog, pyiceberg through a ``SqlCatalog`` on the same JDBC catalog database, a ``RestCatalog``
on the same REST catalog (or the table's ``version-hint.text`` for a hadoop catalog), DuckDB through
``iceberg_scan`` of the metadata file that catalog points at. Files on object storage are read with
the pipeline's ``storage`` settings (`lakestream.storage`), or the credentials a REST catalog vends.
Before DuckDB or pyiceberg read a snapshot, its delete files are checked against what that engine
applies (pyiceberg: no equality deletes); a table it cannot read exactly is refused, never read wrong.

    from lakestream.config import load_config
    from lakestream.read.query import read_table
    orders = read_table(load_config("pipeline.yaml"), "shop.orders", engine="duckdb")  # a pyarrow.Table
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from lakestream.config import CatalogSettings, PipelineConfig
from lakestream.duckdb_extensions import duckdb_connection, load_duckdb_extension  # noqa: F401 — public here too
from lakestream.errors import QueryError
from lakestream.identifiers import (
    TableName,
    ansi_string,
    quote_ansi,
    quote_ansi_column,
    quote_column,
    quote_table,
)

if TYPE_CHECKING:
    import duckdb
    import pandas as pd
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.table.snapshots import Snapshot
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Engine = Literal["spark", "duckdb", "pyiceberg"]
ENGINES: tuple[str, ...] = ("spark", "duckdb", "pyiceberg")

# Delete-file kinds (Iceberg `content`, file format) each engine applies when it reads, as verified
# by tests/read/test_engines.py. Anything else in a snapshot makes that engine refuse the read.
# pyiceberg 0.12 does not apply equality deletes; the DuckDB 1.5.5 iceberg extension does (including
# rows re-inserted after the delete, which its sequence number must leave visible).
_APPLIES: dict[str, set[tuple[str, str]]] = {
    "pyiceberg": {("POSITION_DELETES", "PARQUET"), ("POSITION_DELETES", "PUFFIN")},
    "duckdb": {("POSITION_DELETES", "PARQUET"), ("POSITION_DELETES", "PUFFIN"), ("EQUALITY_DELETES", "PARQUET")},
}


def read_table(
    config: PipelineConfig,
    table: str,
    engine: Engine = "pyiceberg",
    *,
    columns: list[str] | None = None,
    where: str | None = None,
    snapshot_id: int | None = None,
    limit: int | None = None,
    spark: SparkSession | None = None,
    fresh: bool = False,
) -> pa.Table:
    """Rows of ``table`` (``ns.table``) as a pyarrow Table, read by ``engine``.

    ``where`` is a filter in the engine's own expression syntax (SQL for Spark and DuckDB, pyiceberg's
    row-filter syntax, which accepts the usual ``id > 3 AND region = 'eu'``); ``snapshot_id`` time
    travels. ``spark`` reuses a running session (engine ``spark`` only).

    ``fresh=True`` adds what is in Kafka beyond the offsets stored in the current snapshot, applied
    by key as the pipeline will apply it (`lakestream.read.fresh`); ``where`` is then DuckDB SQL over
    the merged rows.
    """
    ref = TableName.parse(table, config.catalog.name)
    if fresh:
        if snapshot_id is not None:
            raise QueryError("a fresh read starts from the current snapshot: it cannot time travel (drop --snapshot)")
        if engine not in ENGINES:
            raise QueryError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
        return _read_fresh(config, ref, engine, columns, where, limit, spark)
    if engine == "spark":
        return _read_spark(config, ref, columns, where, snapshot_id, limit, spark)
    if engine not in ENGINES:
        raise QueryError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    iceberg_table = load_iceberg_table(config.catalog, ref)
    snapshot = (
        iceberg_table.snapshot_by_id(snapshot_id) if snapshot_id is not None else iceberg_table.current_snapshot()
    )
    if snapshot_id is not None and snapshot is None:
        raise QueryError(f"{ref}: no snapshot {snapshot_id}")
    if snapshot is None:  # a table never written to
        return iceberg_table.schema().as_arrow().empty_table()
    refuse_unreadable(iceberg_table, snapshot.snapshot_id, engine)
    schema = _snapshot_schema(iceberg_table, snapshot)
    check_columns(ref, columns, schema.column_names)
    if engine == "pyiceberg":
        from pyiceberg.expressions import AlwaysTrue

        scan = iceberg_table.scan(
            row_filter=where or AlwaysTrue(),
            selected_fields=tuple(columns or ("*",)),
            snapshot_id=snapshot.snapshot_id,
            limit=limit,
        )
        return scan.to_arrow()
    select = ", ".join(quote_ansi_column(c) for c in columns) if columns else "*"
    sql = (
        f"SELECT {select} FROM iceberg_scan({ansi_string(iceberg_table.metadata_location)}, "
        f"snapshot_from_id => {int(snapshot.snapshot_id)})"
    )
    if where:
        sql += f" WHERE {where}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    with duckdb_connection() as con:
        configure_duckdb(con, config.catalog, iceberg_table)
        return duckdb_result(con, sql)


def read_pandas(config: PipelineConfig, table: str, engine: Engine = "pyiceberg", **options) -> pd.DataFrame:
    """`read_table` as a pandas DataFrame."""
    return read_table(config, table, engine, **options).to_pandas()


def run_sql(
    config: PipelineConfig, query: str, engine: Literal["spark", "duckdb"] = "spark", spark: SparkSession | None = None
) -> pa.Table:
    """Run one SQL statement with Spark or DuckDB; tables are named ``<catalog>.<namespace>.<table>``.

    For DuckDB every such name in the query becomes a view over ``iceberg_scan`` of the table's current
    snapshot (checked like `read_table` checks it), so the same query text runs on both engines.
    """
    if engine == "spark":
        session = spark or _session(config)
        return spark_to_arrow(session.sql(query))
    if engine != "duckdb":
        raise QueryError(
            f"engine {engine!r} does not run SQL: use spark or duckdb (pyiceberg reads one table: `read_table`)"
        )
    catalog = config.catalog.name
    with duckdb_connection() as con:
        con.execute(f"ATTACH ':memory:' AS {quote_ansi(catalog, 'catalog')}")
        for ref in _referenced_tables(query, catalog):
            iceberg_table = load_iceberg_table(config.catalog, ref)
            snapshot = iceberg_table.current_snapshot()
            if snapshot is None:
                raise QueryError(f"{ref}: the table has no snapshot yet; DuckDB cannot scan it")
            refuse_unreadable(iceberg_table, snapshot.snapshot_id, "duckdb")
            configure_duckdb(con, config.catalog, iceberg_table)
            schema = f"{quote_ansi(catalog)}.{quote_ansi(ref.namespace)}"
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            con.execute(
                f"CREATE VIEW {schema}.{quote_ansi(ref.table)} AS SELECT * FROM iceberg_scan("
                f"{ansi_string(iceberg_table.metadata_location)}, snapshot_from_id => {int(snapshot.snapshot_id)})"
            )
        return duckdb_result(con, query)


def _read_fresh(
    config: PipelineConfig,
    ref: TableName,
    engine: Engine = "pyiceberg",
    columns: list[str] | None = None,
    where: str | None = None,
    limit: int | None = None,
    spark: SparkSession | None = None,
) -> pa.Table:
    """``ref``'s current snapshot, read by ``engine``, with the uncommitted Kafka tail applied.

    The filter, columns and limit apply to the merged rows (the tail can move a row into or out of
    the filter), so ``where`` is SQL as DuckDB evaluates it, whatever the engine.
    """
    import json
    import time

    from lakestream.identifiers import quote_ansi_column
    from lakestream.read.fresh import apply_tail, read_tail, stored_offsets
    from lakestream.sink.types import arrow_schema

    started = time.monotonic()
    iceberg_table = load_iceberg_table(config.catalog, ref)
    snapshot = iceberg_table.current_snapshot()
    if snapshot is None:
        raise QueryError(f"{ref} has no snapshot yet, so no stored Kafka offsets to read on from: run the pipeline")
    offsets = stored_offsets(iceberg_table, snapshot.snapshot_id)
    stream = next((s for s in map(config.stream_for, sorted({tp.topic for tp in offsets})) if s is not None), None)
    if not offsets or stream is None:
        raise QueryError(
            f"{ref}: its snapshots store no Kafka offsets of a stream in this pipeline config, so there "
            "is no tail to read: read without --fresh"
        )
    schema = _snapshot_schema(iceberg_table, snapshot)
    check_columns(ref, columns, schema.column_names)
    if stream.mode == "upsert":
        key_columns = stream.key_columns or list(schema.identifier_field_names())
    else:
        key_columns = [stream.dedupe_field] if stream.dedupe_field else []
    if stream.mode == "upsert" and not key_columns:
        raise QueryError(f"{ref}: an upsert table without identifier fields; fresh reads need its key")
    tail = read_tail(
        config, str(ref), offsets, arrow_schema(json.loads(schema.model_dump_json(by_alias=True))), key_columns
    )
    rows = read_table(config, str(ref), engine, snapshot_id=snapshot.snapshot_id, spark=spark)
    ids = None
    if stream.mode == "append" and stream.dedupe_field and tail.table.num_rows:
        ids = rows.select([stream.dedupe_field])
    merged = apply_tail(rows, tail, stream, key_columns, ids)
    log.info(
        "fresh read of %s: snapshot %d (%d rows) + %d Kafka record(s) beyond its offsets, %d change(s) for "
        "the table, in %.2fs",
        ref,
        snapshot.snapshot_id,
        rows.num_rows,
        tail.records,
        tail.table.num_rows,
        time.monotonic() - started,
    )
    if where:
        select = ", ".join(quote_ansi_column(c) for c in columns) if columns else "*"
        with duckdb_connection() as con:
            con.register("fresh_rows", merged)
            sql = f"SELECT {select} FROM fresh_rows WHERE {where}"
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            return duckdb_result(con, sql)
    if columns:
        merged = merged.select(columns)
    return merged.slice(0, limit) if limit is not None else merged


def check_columns(ref: TableName, columns: list[str] | None, existing: list[str]) -> None:
    missing = [c for c in columns or [] if c not in existing]
    if missing:
        raise QueryError(f"{ref} has no column {', '.join(map(repr, missing))}; its columns: {', '.join(existing)}")


def _referenced_tables(query: str, catalog: str) -> list[TableName]:
    """``<catalog>.ns.table`` names in ``query`` (plain or double-quoted parts), in order of first use."""
    part = r'(?:"([A-Za-z_][A-Za-z0-9_$]*)"|([A-Za-z_][A-Za-z0-9_$]*))'
    pattern = re.compile(rf'(?<![\w."]){re.escape(catalog)}\s*\.\s*{part}\s*\.\s*{part}', re.IGNORECASE)
    found: dict[tuple[str, str], TableName] = {}
    for match in pattern.finditer(query):
        namespace, table = match.group(1) or match.group(2), match.group(3) or match.group(4)
        found.setdefault((namespace, table), TableName(namespace, table))
    return list(found.values())


# ---------------------------------------------------------------------------------------------
# Opening tables outside Spark
# ---------------------------------------------------------------------------------------------


def load_iceberg_table(catalog: CatalogSettings, ref: TableName) -> IcebergTable:
    """The pyiceberg Table for ``ref`` from the pipeline's catalog (JDBC on PostgreSQL, REST, or hadoop)."""
    from pyiceberg.exceptions import NoSuchTableError

    if catalog.type == "hadoop":
        return _load_hadoop_table(catalog, ref)
    if catalog.type not in ("jdbc", "rest"):
        raise QueryError(
            f"reading without Spark supports jdbc, rest and hadoop catalogs, not {catalog.type!r}: use --engine spark"
        )
    try:
        return pyiceberg_catalog(catalog).load_table((ref.namespace, ref.table))
    except NoSuchTableError:
        raise QueryError(f"table {ref} does not exist in catalog {catalog.name!r}") from None


def pyiceberg_catalog(catalog: CatalogSettings):
    """A pyiceberg catalog on the pipeline's catalog: a ``SqlCatalog`` on the same JDBC catalog database
    Spark uses, or a ``RestCatalog`` on the same REST catalog; with the ``storage`` settings as FileIO
    properties.

    The catalog name must be Spark's: both keep it in the ``catalog_name`` column of the shared tables.
    """
    from lakestream.storage import pyiceberg_io_properties

    io = pyiceberg_io_properties(catalog)
    if catalog.type == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        props: dict[str, Any] = {
            "uri": catalog.uri or "",
            "warehouse": catalog.warehouse,
            **io,
            **catalog.rest_client_properties(),
        }
        if not catalog.ssl_ca_bundle:
            return RestCatalog(catalog.name, **props)
        props["ssl"] = {"cabundle": catalog.ssl_ca_bundle}  # pyiceberg reads it nested, as in .pyiceberg.yaml
        return _rest_catalog_with_ca(catalog.ssl_ca_bundle)(catalog.name, **props)
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(catalog.name, uri=sqlalchemy_url(catalog), warehouse=catalog.warehouse, **io)


def _rest_catalog_with_ca(bundle: str) -> type:
    """pyiceberg's RestCatalog whose https requests verify against ``bundle`` only. pyiceberg sets the bundle as
    its session's ``verify``, but requests lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` from the environment
    override a session's ``verify``: an adapter that pins it per request does not yield."""
    from pyiceberg.catalog.rest import RestCatalog
    from requests.adapters import HTTPAdapter

    class PinnedCA(HTTPAdapter):
        def send(self, request, **kwargs):  # type: ignore[no-untyped-def]
            kwargs["verify"] = bundle
            return super().send(request, **kwargs)

    class RestCatalogWithCA(RestCatalog):
        # Mounted before the OAuth2 client-credentials exchange, which pyiceberg runs with the session while it
        # builds it (inside _create_session), and again on the finished session.
        def _create_legacy_oauth2_auth_manager(self, session):  # type: ignore[no-untyped-def]
            session.mount("https://", PinnedCA())
            return super()._create_legacy_oauth2_auth_manager(session)

        def _create_session(self):  # type: ignore[no-untyped-def]
            session = super()._create_session()
            session.mount("https://", PinnedCA())
            return session

    return RestCatalogWithCA


def configure_duckdb(con: duckdb.DuckDBPyConnection, catalog: CatalogSettings, table: IcebergTable) -> None:
    """Let DuckDB read ``table``'s files: the object storage secret (the REST catalog's vended credentials
    for the table, if it sent any, else the ``storage`` settings). Nothing for a local file system."""
    from lakestream.storage import configure_duckdb as configure
    from lakestream.storage import is_object_store

    if is_object_store(table.metadata_location):
        configure(con, catalog, dict(table.io.properties), scope=table.location())


def sqlalchemy_url(catalog: CatalogSettings) -> str:
    """``jdbc:postgresql://host:port/db?...`` as a SQLAlchemy URL with the catalog's credentials."""
    from sqlalchemy.engine import URL

    uri = catalog.uri or ""
    if not uri.startswith("jdbc:postgresql://"):
        # Only the scheme: a JDBC URI may carry credentials in its query string.
        raise QueryError(
            f"catalog.uri ({':'.join(uri.split(':', 2)[:2])}:...): reading without Spark needs a "
            "jdbc:postgresql:// catalog"
        )
    parts = urlsplit(uri[len("jdbc:") :])
    query = dict(parse_qsl(parts.query))
    user = catalog.user or query.pop("user", None)
    password = catalog.password.get_secret_value() if catalog.password else query.pop("password", None)
    url = URL.create(
        "postgresql+psycopg2",
        username=user,
        password=password,
        host=parts.hostname,
        port=parts.port,
        database=parts.path.lstrip("/") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _load_hadoop_table(catalog: CatalogSettings, ref: TableName) -> IcebergTable:
    """A hadoop-catalog table: ``<warehouse>/<ns>/<table>/metadata/v<version-hint>.metadata.json``."""
    from pyiceberg.table import StaticTable

    if not catalog.warehouse.startswith("file:"):
        raise QueryError("reading a hadoop catalog without Spark supports a file:// warehouse only: use --engine spark")
    metadata = Path(urlsplit(catalog.warehouse).path) / ref.namespace / ref.table / "metadata"
    hint = metadata / "version-hint.text"
    if not hint.exists():
        raise QueryError(f"table {ref} does not exist in catalog {catalog.name!r} (no {hint})")
    return StaticTable.from_metadata(str(metadata / f"v{hint.read_text().strip()}.metadata.json"))


def _snapshot_schema(table: IcebergTable, snapshot: Snapshot) -> Schema:
    """The schema ``snapshot`` was written with (the table's current one for a snapshot that records none)."""
    if snapshot.schema_id is None:
        return table.schema()
    return table.schemas().get(snapshot.schema_id, table.schema())


def refuse_unreadable(table: IcebergTable, snapshot_id: int, engine: str) -> None:
    """Raise QueryError when the snapshot holds delete files ``engine`` does not apply.

    Reading data files without applying their deletes would return deleted rows: refuse instead.
    """
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise QueryError(f"{table.name()}: no snapshot {snapshot_id}")
    unreadable: dict[tuple[str, str], int] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content.name != "DELETES":
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            kind = (entry.data_file.content.name, entry.data_file.file_format.name)
            if kind not in _APPLIES[engine]:
                unreadable[kind] = unreadable.get(kind, 0) + 1
    if unreadable:
        what = ", ".join(
            f"{n} {content.lower().replace('_', ' ')} file(s) in {fmt}" for (content, fmt), n in unreadable.items()
        )
        raise QueryError(
            f"{engine} cannot read {'.'.join(table.name()[-2:])} exactly at snapshot {snapshot_id}: it has "
            f"{what}, which {engine} does not apply. Read it with an engine that does: "
            f"{', '.join(e for e in ENGINES if e == 'spark' or unreadable.keys() <= _APPLIES.get(e, set()))}."
        )


def duckdb_result(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql``; DuckDB's own errors (a typo, an unknown column) become a QueryError with its message."""
    import duckdb

    try:
        return con.execute(sql).to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(f"duckdb: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------------------------


def _session(config: PipelineConfig) -> SparkSession:
    from lakestream.runtime.spark import session_for

    return session_for(config)


def _read_spark(
    config: PipelineConfig,
    ref: TableName,
    columns: list[str] | None,
    where: str | None,
    snapshot_id: int | None,
    limit: int | None,
    spark: SparkSession | None,
) -> pa.Table:
    session = spark or _session(config)
    ident = quote_table(config.catalog.name, ref.namespace, ref.table)
    # SQL time travel on either Spark: Iceberg's runtime for Spark 4 refuses its own read option `snapshot-id`
    # ("use Spark built-in `versionAsOf`").
    df = (
        session.table(ident)
        if snapshot_id is None
        else session.sql(f"SELECT * FROM {ident} VERSION AS OF {int(snapshot_id)}")
    )
    check_columns(ref, columns, df.columns)
    if where:
        df = df.where(where)
    if columns:
        df = df.select(*[quote_column(c) for c in columns])
    if limit is not None:
        df = df.limit(int(limit))
    return spark_to_arrow(df)


def spark_to_arrow(df) -> pa.Table:
    """A Spark DataFrame as a pyarrow Table (through Arrow batches, as ``toPandas`` does)."""
    import pyarrow as pa

    # pyspark 3.5 has no public DataFrame.toArrow (added in 4.0); _collect_as_arrow is what toPandas uses.
    batches = df._collect_as_arrow()
    if batches:
        return pa.Table.from_batches(batches)
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema).empty_table()
