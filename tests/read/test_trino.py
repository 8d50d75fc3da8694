"""Trino reads what the pipeline writes (`make test-engines`, marker ``engines``).

One Debezium capture of PostgreSQL feeds two pipelines: into the suite's JDBC catalog and into a REST catalog
(OAuth2 client credentials), both on local files; a third into a JDBC catalog whose files are in the stack's
S3-compatible store, when that store serves what Trino's S3 client asks for. A Debezium capture of MariaDB feeds
a fourth. A Trino node (assembled from Trino's modules by coordinates, `lakestream.stack.trino_install`; its
Iceberg connector configured by `lakestream.stack.trino.iceberg_catalog_properties`) opens every catalog, and each
test compares the rows Trino returns, through the ``trino`` Python client, with the rows Spark returns for the same
table and snapshot: a CDC mirror with deletion vectors (before and after compaction), a column added with a
default (Iceberg v3's initial-default), a widened column, a keyless (multiset) mirror, a partitioned mirror, the
MariaDB type table, an append table, time travel by snapshot id, and the v3 row-lineage columns. Last,
`lakestream sql --engine trino` prints the same rows as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid

import pytest
import yaml
from capture_harness import start_captured_source, stop_captured_source
from conftest import catalog_settings, mariadb_database, produce_records, run_lakestream, storage_env, storage_section
from mariadb_types import TYPES_COLUMNS, TYPES_DDL, TYPES_VALUES

from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.runtime.spark import build_session
from lakestream.stack.process import free_port

pytestmark = pytest.mark.engines

trino = pytest.importorskip("trino")

SETUP = [
    "CREATE TABLE public.tr_orders (id integer PRIMARY KEY, customer text, qty integer, price numeric(10,2), "
    "placed timestamptz, day date)",
    "INSERT INTO public.tr_orders SELECT g, 'c' || (g % 7), g % 5, g * 1.5, "
    "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', date '2026-01-01' + (g % 3) "
    "FROM generate_series(1, 300) g",
    "CREATE TABLE public.tr_parts (id integer PRIMARY KEY, region text, placed timestamptz, amount double precision)",
    "INSERT INTO public.tr_parts SELECT g, 'r' || (g % 4), timestamptz '2026-01-01 00:00:00+00' + g * interval "
    "'5 hours', g / 3.0 FROM generate_series(1, 200) g",
    # No primary key, every column the replica identity: a row multiset, updated and deleted one row at a time.
    "CREATE TABLE public.tr_log (k text, n integer, at date)",
    "ALTER TABLE public.tr_log REPLICA IDENTITY FULL",
    "INSERT INTO public.tr_log SELECT 'k' || (g % 5), g % 3, date '2026-01-01' + (g % 4) FROM generate_series(1, 60) g",
]
TABLES = ["tr_orders", "tr_parts", "tr_log"]
CREDENTIAL_ENV = "LAKESTREAM_TEST_TRINO_REST_CREDENTIAL"
CATALOGS = ("lake", "trrest")  # the suite's JDBC catalog, a REST catalog (both on local files)
S3_CATALOG = "trs3"  # a JDBC catalog on the stack's object store


class Lakes:
    """The captured source, one pipeline per catalog, the Trino node reading both."""

    def __init__(self, source, configs, spark, trino_server, events_topic, s3_refusal):
        self.source, self.configs, self.spark, self.trino = source, configs, spark, trino_server
        self.events_topic = events_topic
        self.first_snapshot: dict[str, int] = {}  # catalog → tr_orders' snapshot holding the first 300 rows
        self.s3_refusal = s3_refusal  # why Trino cannot read the object store (None: it can; the S3 catalog runs)

    @property
    def namespace(self) -> str:
        return self.source.namespace

    def sync(self, expected: dict[str, int]) -> None:
        self.source.wait_for_events(expected)
        for config in self.configs.values():
            run_pipeline(config, spark=self.spark, stop_when_idle=True)

    def trino_rows(self, catalog: str, table: str, suffix: str = "", columns: str = "*") -> tuple[list[str], list]:
        conn = trino.dbapi.connect(
            host="127.0.0.1", port=self.trino.port, user="lakestream", catalog=catalog, schema=self.namespace
        )
        try:
            cur = conn.cursor()
            cur.execute(f'SELECT {columns} FROM "{catalog}"."{self.namespace}"."{table}" {suffix}')
            rows = cur.fetchall()
            return [d[0] for d in cur.description], _sorted(rows)
        finally:
            conn.close()

    def spark_rows(self, catalog: str, table: str, suffix: str = "", columns: str = "*") -> tuple[list[str], list]:
        df = self.spark.sql(f"SELECT {columns} FROM `{catalog}`.`{self.namespace}`.`{table}` {suffix}")
        return df.columns, _sorted(df.collect())

    def assert_same_rows(
        self, catalog: str, table: str, trino_suffix: str = "", spark_suffix: str = "", columns: str = "*"
    ) -> int:
        names, from_trino = self.trino_rows(catalog, table, trino_suffix, columns)
        spark_names, from_spark = self.spark_rows(catalog, table, spark_suffix, columns)
        assert names == spark_names, (catalog, table)
        assert from_trino == from_spark, (catalog, table)
        return len(from_spark)


def _normal(value):
    """A value as both engines' Python clients can agree on: Spark (session time zone UTC) gives a timestamptz
    as a naive UTC datetime, Trino as an aware one; Spark gives a binary as a bytearray, Trino as bytes."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _sorted(rows) -> list[tuple]:
    """Rows in one order whatever the engine: equal rows of a multiset stay as many, NULLs sort first."""
    normal = [tuple(_normal(v) for v in r) for r in rows]
    return sorted(normal, key=lambda r: [(v is not None, repr(v)) for v in r])


def _s3_refusal(store) -> str | None:
    """Why Trino cannot read tables in ``store``, or None. Trino's S3 client reads a file's tail with a suffix range
    (``Range: bytes=-N``, e.g. the Parquet footer); a store that refuses one fails every Trino read."""
    import boto3
    from botocore.exceptions import ClientError

    s = store.settings
    client = boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        region_name=s.s3_region,
        aws_access_key_id=s.s3_access_key,
        aws_secret_access_key=s.s3_secret_key,
    )
    key = f"trino-probe/{uuid.uuid4().hex}"
    client.put_object(Bucket=s.s3_bucket, Key=key, Body=b"0123456789")
    try:
        body = client.get_object(Bucket=s.s3_bucket, Key=key, Range="bytes=-4")["Body"].read()
    except ClientError as exc:
        return f"the stack's object store refuses suffix range requests (Range: bytes=-4 answered {exc})"
    finally:
        client.delete_object(Bucket=s.s3_bucket, Key=key)
    assert body == b"6789", body  # a store that answers must answer right
    return None


@pytest.fixture(scope="module")
def lakes(stack, spark, object_store, rest_catalog_factory, service_dir_factory):
    from lakestream.stack.trino import TrinoServer, iceberg_catalog_properties

    credential = f"lakestream-trino:{uuid.uuid4().hex}"
    os.environ[CREDENTIAL_ENV] = credential
    os.environ.update(storage_env(object_store))
    s3_refusal = _s3_refusal(object_store)
    rest = rest_catalog_factory(
        service_dir_factory("trino-rest").as_uri(), credential=credential, backend="trino_rest_fs"
    )
    source = start_captured_source(stack, SETUP, TABLES, "tr")
    events_topic = f"{source.prefix}.events"
    base = yaml.safe_load((source.workdir / "pipeline.yaml").read_text())
    base["streams"].append(
        {"topics": [events_topic], "mode": "append", "namespace": source.namespace, "table": "tr_events"}
    )
    base["table_layouts"] = [
        {"tables": rf"{source.namespace}\.tr_parts", "partition_by": ["bucket(4, id)", "days(placed)"]}
    ]
    configs = {}
    for name in CATALOGS if s3_refusal else (*CATALOGS, S3_CATALOG):
        data = {
            **base,
            "name": f"{base['name']}-{name}",
            "state_dir": str(source.workdir / f"state-{name}"),
            "kafka": {**base["kafka"], "group_id": f"{base['kafka']['group_id']}-{name}"},
        }
        if name != "lake":
            data["catalog"] = {
                "name": name,
                "type": "rest",
                "uri": rest.uri,
                "warehouse": rest.warehouse,
                "credential_env": CREDENTIAL_ENV,
            }
        if name == S3_CATALOG:
            data["catalog"] = {**base["catalog"], "name": name, "warehouse": f"{object_store.warehouse}/trino"}
            data["storage"] = storage_section(object_store)
        configs[name] = parse_config(data, f"<{name}>")
        build_session(configs[name].catalog, configs[name].spark)  # registers the catalog on the session
    server = TrinoServer(
        service_dir_factory("trino"),
        free_port(),
        {name: iceberg_catalog_properties(c.catalog) for name, c in configs.items()},
    )
    server.start()
    try:
        yield Lakes(source, configs, spark, server, events_topic, s3_refusal)
    finally:
        server.stop()
        stop_captured_source(source)


@pytest.fixture(scope="module")
def mirrored(lakes):
    """The tables mirrored; then ``tr_orders`` updated and deleted from (its mirror gains deletion vectors),
    ``tr_parts`` only inserted into (no deletes: plain data files), one of several equal rows of ``tr_log`` updated
    and another deleted, and events appended."""
    lakes.sync({"tr_orders": 300, "tr_parts": 200, "tr_log": 60})
    for catalog in CATALOGS:
        lakes.first_snapshot[catalog] = lakes.spark.sql(
            f"SELECT snapshot_id FROM `{catalog}`.`{lakes.namespace}`.`tr_orders`.snapshots "
            "ORDER BY committed_at DESC LIMIT 1"
        ).first()[0]
    events = [
        (
            None,
            json.dumps(
                {
                    "event_id": f"e{i}",
                    "kind": "click" if i % 3 else "view",
                    "n": i,
                    "ts": f"2026-02-01T00:{i % 60:02d}:00Z",
                }
            ),
        )
        for i in range(120)
    ]
    produce_records(lakes.source.stack.bootstrap_servers, lakes.events_topic, events)
    lakes.source.sql(
        "UPDATE public.tr_orders SET qty = qty + 10 WHERE id % 10 = 0",
        "DELETE FROM public.tr_orders WHERE id % 25 = 0",
        "INSERT INTO public.tr_orders VALUES (1000, 'new', 1, 9.99, now(), current_date)",
        "INSERT INTO public.tr_parts SELECT g, 'r' || (g % 4), timestamptz '2026-03-01 00:00:00+00' "
        "+ g * interval '1 hour', g FROM generate_series(201, 250) g",
        # one row of each of several equal ones (ctid picks it): the mirror must change exactly one
        "UPDATE public.tr_log SET n = n + 100 WHERE ctid = (SELECT min(ctid) FROM public.tr_log WHERE k = 'k1')",
        "DELETE FROM public.tr_log WHERE ctid = (SELECT min(ctid) FROM public.tr_log WHERE k = 'k2')",
        "INSERT INTO public.tr_log VALUES ('k1', 1, date '2026-01-02'), ('k1', 1, date '2026-01-02')",
    )
    lakes.sync({"tr_orders": 300 + 30 + 12 * 2 + 1, "tr_parts": 250, "tr_log": 64})
    return lakes


def _delete_file_formats(lakes: Lakes, catalog: str, table: str) -> set[str]:
    return {
        r[0]
        for r in lakes.spark.sql(
            f"SELECT file_format FROM `{catalog}`.`{lakes.namespace}`.`{table}`.delete_files"
        ).collect()
    }


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_cdc_mirror_with_deletion_vectors(mirrored, catalog):
    assert _delete_file_formats(mirrored, catalog, "tr_orders") == {"PUFFIN"}  # v3 deletion vectors
    assert mirrored.assert_same_rows(catalog, "tr_orders") == 300 - 12 + 1
    _, gone = mirrored.trino_rows(catalog, "tr_orders", "WHERE id % 25 = 0 AND id < 1000", "id")
    assert gone == []  # deleted at the source, hidden by the deletion vectors


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_keyless_mirror(mirrored, catalog):
    assert _delete_file_formats(mirrored, catalog, "tr_log") == {"PUFFIN"}
    names, from_trino = mirrored.trino_rows(catalog, "tr_log")
    assert names[:3] == ["k", "n", "at"]
    assert mirrored.assert_same_rows(catalog, "tr_log") == 61
    # Equal rows stay as many as the source has: k1 had 12 rows, one updated away to n+100, two more inserted.
    with mirrored.source.conn.cursor() as cur:
        cur.execute("SELECT k, n, at FROM public.tr_log")
        source_rows = _sorted(cur.fetchall())
    assert _sorted(r[:3] for r in from_trino) == source_rows


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_the_row_lineage_columns(mirrored, catalog):
    """Iceberg v3 row lineage: Trino's hidden ``$row_id`` and ``$last_updated_sequence_number`` are Spark's
    ``_row_id`` and ``_last_updated_sequence_number``, and an updated key keeps its row id in Trino's reading of
    the snapshot before the update and after it."""
    lineage = 'id, "$row_id", "$last_updated_sequence_number"'
    _, from_trino = mirrored.trino_rows(catalog, "tr_orders", columns=lineage)
    _, from_spark = mirrored.spark_rows(catalog, "tr_orders", columns="id, _row_id, _last_updated_sequence_number")
    assert from_trino == from_spark and len(from_trino) == 300 - 12 + 1
    assert None not in {r[1] for r in from_trino}
    first = mirrored.first_snapshot[catalog]
    _, then = mirrored.trino_rows(catalog, "tr_orders", f"FOR VERSION AS OF {first}", lineage)
    now, before = {r[0]: r[1:] for r in from_trino}, {r[0]: r[1:] for r in then}
    # qty + 10 (less those deleted since: id % 50 == 0); 1000 is new since
    updated = [i for i in now if i % 10 == 0 and i < 1000]
    untouched = [i for i in now if i % 10 and i < 1000]
    assert len(updated) == 30 - 6 and len(untouched) > 200
    assert all(now[i][0] == before[i][0] for i in updated)  # the same row id after the update
    assert all(now[i][1] > before[i][1] for i in updated)  # a later sequence number
    assert all(now[i] == before[i] for i in untouched)
    assert len({now[i][0] for i in now}) == len(now)  # and row ids stay unique


def test_trino_logs_no_catalog_secret(mirrored):
    """The catalog files hold the REST catalog's OAuth2 secret (owner-only); Trino's log, which lists every
    catalog property at start, shows it redacted."""
    secret = os.environ[CREDENTIAL_ENV].split(":", 1)[1]
    catalog_file = mirrored.trino.dir / "etc" / "catalog" / "trrest.properties"
    assert secret in catalog_file.read_text() and catalog_file.stat().st_mode & 0o077 == 0
    log = mirrored.trino.log_path.read_text()
    assert "iceberg.rest-catalog.oauth2.credential" in log and "[REDACTED]" in log
    assert secret not in log


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_by_snapshot_id(mirrored, catalog):
    first = mirrored.first_snapshot[catalog]  # before the updates and deletes: the first load, no DVs yet
    assert (
        mirrored.assert_same_rows(catalog, "tr_orders", f"FOR VERSION AS OF {first}", f"VERSION AS OF {first}") == 300
    )


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_partitioned_mirror(mirrored, catalog):
    partitions = mirrored.spark.sql(f"SELECT partition FROM `{catalog}`.`{mirrored.namespace}`.`tr_parts`.partitions")
    assert len(partitions.collect()) > 4  # bucket(4, id) × days(placed)
    assert _delete_file_formats(mirrored, catalog, "tr_parts") == set()
    assert mirrored.assert_same_rows(catalog, "tr_parts") == 250
    _, few = mirrored.trino_rows(catalog, "tr_parts", "WHERE placed < TIMESTAMP '2026-01-02 00:00:00 UTC'", "id")
    assert [r[0] for r in few] == list(range(1, 5))


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_an_append_table(mirrored, catalog):
    assert mirrored.assert_same_rows(catalog, "tr_events") == 120


@pytest.fixture(scope="module")
def columns_added(mirrored):
    """``note`` added to both tables; ``channel`` added to ``tr_parts`` with a default (Iceberg v3's
    initial-default: the rows already written read 'web'); ``tr_orders.qty`` widened from integer to bigint."""
    mirrored.source.sql(
        "ALTER TABLE public.tr_orders ADD COLUMN note text",
        "UPDATE public.tr_orders SET note = 'n' || id WHERE id % 7 = 0 AND id < 1000",
        "ALTER TABLE public.tr_orders ALTER COLUMN qty TYPE bigint",
        "UPDATE public.tr_orders SET qty = 5000000000 WHERE id = 3",
        "ALTER TABLE public.tr_parts ADD COLUMN note text",
        "ALTER TABLE public.tr_parts ADD COLUMN channel text DEFAULT 'web'",
        "INSERT INTO public.tr_parts SELECT g, 'r1', timestamptz '2026-04-01 00:00:00+00', g, "
        "'n' || g, 'shop' FROM generate_series(251, 260) g",
    )
    mirrored.sync({"tr_orders": 300 + 30 + 12 * 2 + 1 + 41 + 1, "tr_parts": 260})
    return mirrored


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_mirror_after_add_column(columns_added, catalog):
    names, rows = columns_added.trino_rows(catalog, "tr_parts", columns="id, note")
    assert names == ["id", "note"]
    assert sum(1 for r in rows if r[1] is not None) == 10
    columns_added.assert_same_rows(catalog, "tr_parts", columns="id, region, placed, amount, note")


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_column_added_with_a_default(columns_added, catalog):
    _, from_spark = columns_added.spark_rows(catalog, "tr_parts", columns="id, channel")
    assert {r[1] for r in from_spark} == {"web", "shop"}
    assert sum(1 for r in from_spark if r[1] == "web") == 250  # the rows from before the ALTER: initial-default
    assert columns_added.assert_same_rows(catalog, "tr_parts") == 260


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_widened_column(columns_added, catalog):
    conn = trino.dbapi.connect(host="127.0.0.1", port=columns_added.trino.port, user="lakestream", catalog=catalog)
    try:
        cur = conn.cursor()
        cur.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = ? AND table_name = 'tr_orders' "
            "AND column_name = 'qty'",
            [columns_added.namespace],
        )
        assert cur.fetchall() == [["bigint"]]  # int widened to long by the ALTER at the source
    finally:
        conn.close()
    qty = dict(columns_added.spark_rows(catalog, "tr_orders", columns="id, qty")[1])
    assert qty[3] == 5_000_000_000 and qty[1] == 1  # beyond int, beside a value written as int
    assert columns_added.assert_same_rows(catalog, "tr_orders") == 300 - 12 + 1


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_mirror_after_compaction(columns_added, catalog):
    table = f"{columns_added.namespace}.tr_orders"
    assert _delete_file_formats(columns_added, catalog, "tr_orders") == {"PUFFIN"}
    columns_added.spark.sql(
        f"CALL `{catalog}`.system.rewrite_data_files(table => '{table}', options => map('rewrite-all', 'true'))"
    ).collect()
    # The rewrite applied the deletion vectors: the live snapshot has none, and Trino reads it.
    assert _delete_file_formats(columns_added, catalog, "tr_orders") == set()
    names, _ = columns_added.trino_rows(catalog, "tr_orders", "LIMIT 1")
    assert names[-1] == "note"
    assert columns_added.assert_same_rows(catalog, "tr_orders") == 300 - 12 + 1


def test_trino_reads_a_mirror_in_s3(mirrored):
    """The S3 catalog's tables read through Trino's native S3 file system on the stack's object store (Versity's S3
    gateway serves the suffix ranges Trino reads file tails with)."""
    assert not mirrored.s3_refusal, f"the object store refuses what Trino sends: {mirrored.s3_refusal}"
    assert (
        mirrored.spark.sql(f"SELECT file_path FROM `{S3_CATALOG}`.`{mirrored.namespace}`.`tr_orders`.files LIMIT 1")
        .first()[0]
        .startswith("s3://")
    )
    assert _delete_file_formats(mirrored, S3_CATALOG, "tr_orders") == {"PUFFIN"}
    assert mirrored.assert_same_rows(S3_CATALOG, "tr_orders") == 300 - 12 + 1
    assert mirrored.assert_same_rows(S3_CATALOG, "tr_parts") == 250
    assert mirrored.assert_same_rows(S3_CATALOG, "tr_log") == 61


def test_lakestream_sql_on_trino_prints_clean_json(columns_added):
    lakes = columns_added
    pipeline = str(lakes.source.workdir / "pipeline.yaml")  # the `lake` catalog's config
    table = f"lake.{lakes.namespace}.tr_orders"
    query = f"SELECT id, customer, qty, price, placed, note FROM {table} WHERE id <= 20 ORDER BY id"
    out = run_lakestream(
        "sql", pipeline, query, "--engine", "trino", "--trino-uri", lakes.trino.uri, "--format", "json"
    )
    assert out.returncode == 0, out.stderr
    from lakestream.cli.sql import plain_value

    want = [{k: plain_value(v) for k, v in r.asDict().items()} for r in lakes.spark.sql(query).collect()]
    got = json.loads(out.stdout)  # stdout is the JSON document alone
    assert len(got) == len(want) == 20  # none of 1..20 deleted (id % 25 == 0)
    # Trino's timestamptz carries its zone (+00:00); Spark's session (UTC) gives it naive: the instant is the same.
    for row in got:
        row["placed"] = dt.datetime.fromisoformat(row["placed"]).astimezone(dt.UTC).replace(tzinfo=None).isoformat()
    assert got == want

    failed = run_lakestream("sql", pipeline, "SELECT 1", "--engine", "trino", "--trino-uri", "http://127.0.0.1:9")
    assert failed.returncode != 0 and failed.stdout == ""
    assert "no Trino answers at http://127.0.0.1:9" in failed.stderr and "stack up --trino" in failed.stderr
    bad_sql = run_lakestream(
        "sql", pipeline, f"SELECT nope FROM {table}", "--engine", "trino", "--trino-uri", lakes.trino.uri
    )
    assert bad_sql.returncode != 0 and "COLUMN_NOT_FOUND" in bad_sql.stderr


# ---------------------------------------------------------------------------------------------
# A MariaDB source: Debezium's MariaDB connector, its type table
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def maria_lake(lakes, mariadb, service_dir_factory):
    """The MariaDB type table (every column type the capture maps) and a keyless table, captured by Debezium's
    MariaDB connector into the suite's `lake` catalog, then changed (a deletion vector each); namespace, config."""
    from lakestream.capture import CaptureProcess

    uid = uuid.uuid4().hex[:6]
    dbname, prefix, namespace = f"trm_{uid}", f"trm{uid}", f"trm_{uid}"
    mariadb.run_as_root(f"CREATE DATABASE `{dbname}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn = mariadb.connect(dbname)

    def sql(*statements, args=None):
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args)

    sql(TYPES_DDL, "CREATE TABLE nokey (a INT, b VARCHAR(10))")
    sql(f"INSERT INTO types ({TYPES_COLUMNS}) VALUES {TYPES_VALUES}", args=(1,))
    sql("INSERT INTO types (id) VALUES (2)", "INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (2, 'y')")
    stack = lakes.source.stack
    workdir = service_dir_factory("trmdb")
    data = {
        "name": f"trm{uid}",
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "group_id": f"lakestream-trm{uid}"},
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topic_pattern": rf"{prefix}\..*", "namespace": namespace, "table": "{table}"}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": mariadb_database(mariadb, dbname),
            "topic_prefix": prefix,
            "tables": [f"{dbname}.types", f"{dbname}.nokey"],
            "connector": {"heartbeat.interval.ms": "1000"},
        },
    }
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(data))
    config = parse_config(data, "<mariadb>")
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    capture.start()
    try:
        capture.wait_until_streaming(timeout=180)
        topics = {"types": f"{prefix}.{dbname}.types", "nokey": f"{prefix}.{dbname}.nokey"}
        _wait_for_topics(stack.bootstrap_servers, {topics["types"]: 2, topics["nokey"]: 3})
        run_pipeline(config, spark=lakes.spark, stop_when_idle=True)  # the snapshot: the changes need DVs
        sql(f"INSERT INTO types ({TYPES_COLUMNS}) VALUES {TYPES_VALUES}", args=(3,))
        sql(
            "INSERT INTO types (id) VALUES (4)",
            "UPDATE types SET vc = 'changed', i = 7 WHERE id = 1",
            "DELETE FROM types WHERE id = 2",
            "DELETE FROM nokey WHERE a = 2",
            "INSERT INTO nokey VALUES (1, 'x')",
        )
        _wait_for_topics(stack.bootstrap_servers, {topics["types"]: 6, topics["nokey"]: 5})
        run_pipeline(config, spark=lakes.spark, stop_when_idle=True)
        yield namespace
    finally:
        capture.stop()
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")


def _wait_for_topics(bootstrap: str, expected: dict[str, int], timeout: float = 180) -> None:
    """Block until each topic's end offset reaches its count (Debezium published every change so far)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            have = {}
            for topic in expected:
                try:
                    have[topic] = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
                except KafkaException:
                    have[topic] = 0
            if all(have[t] >= n for t, n in expected.items()):
                return
            assert time.monotonic() < deadline, f"Debezium did not publish in {timeout:.0f}s: {have} < {expected}"
            time.sleep(0.5)
    finally:
        consumer.close()


def test_trino_reads_a_mariadb_mirror_and_its_type_table(lakes, maria_lake):
    namespace = maria_lake
    for name in ("types", "nokey"):
        formats = lakes.spark.sql(f"SELECT file_format FROM `lake`.`{namespace}`.`{name}`.delete_files").collect()
        assert {r[0] for r in formats} == {"PUFFIN"}, name
    conn = trino.dbapi.connect(host="127.0.0.1", port=lakes.trino.port, user="lakestream", catalog="lake")
    try:
        for name, count in (("types", 3), ("nokey", 3)):
            cur = conn.cursor()
            cur.execute(f'SELECT * FROM "lake"."{namespace}"."{name}"')
            from_trino = _sorted(cur.fetchall())
            names = [d[0] for d in cur.description]
            df = lakes.spark.table(f"`lake`.`{namespace}`.`{name}`")
            assert names == df.columns, name
            from_spark = _sorted(df.collect())
            assert len(from_trino) == len(from_spark) == count, name
            for got, want in zip(from_trino, from_spark, strict=True):
                # column by column, so that a difference names its column
                assert dict(zip(names, got, strict=True)) == dict(zip(names, want, strict=True)), name
    finally:
        conn.close()
