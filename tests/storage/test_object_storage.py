"""Object storage and the Iceberg REST catalog on the real data path: Debezium → broker → pipeline →
Iceberg tables whose files are in an S3-compatible store (Versity's S3 gateway, objects on disk), whose catalog
is a REST catalog: Apache Iceberg's own REST catalog server (RESTCatalogServer, over JDBC, vending the store's keys;
the clients authenticate with OAuth2 client credentials, which that server does not check), and for https the
server written here (`lakestream.stack.rest_catalog`).

One Debezium capture feeds three pipelines, the {jdbc, rest} × {local, s3} matrix beside the suite's own
jdbc × local: ``s3lake`` (JDBC catalog, S3 files), ``restfs`` (REST catalog, local files), ``restlake``
(REST catalog, S3 files); ``restlake``'s catalog is Apache Iceberg's server, ``restfs``'s is served over https
by a private CA (the server written here). Every scenario ends
with `lakestream verify` exact for each of them. The clients
are the real ones: Spark's and the Java committer's RESTCatalog and S3FileIO, pyarrow's S3FileSystem in
the write tasks, pyiceberg's RestCatalog, DuckDB's httpfs.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid

import pytest
import yaml
from capture_harness import start_captured_source, stop_captured_source
from conftest import storage_env, storage_section

from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.errors import ConfigError
from lakestream.read.query import read_table
from lakestream.runtime.spark import build_session
from lakestream.verify.compare import verify_tables

SETUP = [
    "CREATE TABLE public.obj_orders (id integer PRIMARY KEY, customer text, qty integer, price numeric(10,2), "
    "placed timestamptz)",
    "INSERT INTO public.obj_orders SELECT g, 'c' || (g % 7), g % 5, g * 1.5, "
    "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute' FROM generate_series(1, 300) g",
    "CREATE TABLE public.obj_items (order_id integer, line integer, sku text, PRIMARY KEY (order_id, line))",
    "INSERT INTO public.obj_items SELECT g, l, 'sku-' || (g * l) FROM generate_series(1, 100) g, "
    "generate_series(1, 2) l",
]
TABLES = ["obj_orders", "obj_items"]
CREDENTIAL_ENV = "LAKESTREAM_TEST_REST_CREDENTIAL"
# catalog name → (catalog type, storage)
MATRIX = {"s3lake": ("jdbc", "s3"), "restfs": ("rest", "local"), "restlake": ("rest", "s3")}


class Lakes:
    """The captured source and one pipeline config per catalog of the matrix."""

    def __init__(self, source, data, configs, spark, store, rest_s3):
        self.source, self.spark, self.store, self.rest_s3 = source, spark, store, rest_s3
        self.data = data  # catalog name → the config as a mapping (secrets in clear, unlike model_dump)
        self.configs = configs

    def table(self, catalog: str, name: str) -> str:
        return f"{catalog}.{self.source.namespace}.{name}"

    def sync(self, expected: dict[str, int]) -> None:
        """Wait for Debezium, then run every pipeline until it is idle."""
        self.source.wait_for_events(expected)
        for config in self.configs.values():
            run_pipeline(config, spark=self.spark, stop_when_idle=True)

    def verify_all(self) -> None:
        for name, config in self.configs.items():
            report = verify_tables(config, self.spark, tables=[f"public.{t}" for t in TABLES])
            assert report.ok, f"{name}:\n{report.to_text()}"


@pytest.fixture(scope="module")
def lakes(stack, spark, object_store, rest_catalog_factory, service_dir_factory):
    credential = f"lakestream-test:{uuid.uuid4().hex}"
    os.environ.update(storage_env(object_store))
    os.environ[CREDENTIAL_ENV] = credential
    rest_s3 = rest_catalog_factory(
        f"{object_store.warehouse}/rest", store=object_store, credential=credential, vend=True, backend="obj_rest_s3"
    )
    rest_fs = rest_catalog_factory(
        service_dir_factory("restfs").as_uri(), backend="obj_rest_fs", tls=True, credential=credential
    )
    source = start_captured_source(stack, SETUP, TABLES, "obj")
    base = yaml.safe_load((source.workdir / "pipeline.yaml").read_text())
    configs, datas = {}, {}
    for name, (kind, where) in MATRIX.items():
        data = {
            **base,
            "name": f"{base['name']}-{name}",
            "state_dir": str(source.workdir / f"state-{name}"),
            "kafka": {**base["kafka"], "group_id": f"{base['kafka']['group_id']}-{name}"},
        }
        if kind == "rest":
            rest = rest_s3 if where == "s3" else rest_fs
            data["catalog"] = {"name": name, "type": "rest", "uri": rest.uri, "warehouse": rest.warehouse}
            data["catalog"]["credential_env"] = CREDENTIAL_ENV
            if (
                rest is rest_fs
            ):  # served over https with a private CA: Spark, the committer and pyiceberg trust its bundle
                data["catalog"]["ssl_ca_bundle"] = str(rest.ca_bundle)
        else:
            data["catalog"] = {**base["catalog"], "name": name, "warehouse": f"{object_store.warehouse}/jdbc"}
        if where == "s3":
            data["storage"] = storage_section(object_store)
        datas[name] = data
        configs[name] = parse_config(data, f"<{name}>")
        build_session(configs[name].catalog, configs[name].spark)  # registers the catalog on the session
    try:
        lakes = Lakes(source, datas, configs, spark, object_store, rest_s3)
        # The snapshot lands first, in the fixture: every test of the module finds the tables in each catalog,
        # whichever runs first; the changes the first test makes then need deletion vectors.
        lakes.sync({"obj_orders": 300, "obj_items": 200})
        yield lakes
    finally:
        stop_captured_source(source)


def _rows(lakes: Lakes, catalog: str, name: str) -> list[tuple]:
    return sorted(tuple(r) for r in lakes.spark.table(lakes.table(catalog, name)).collect())


def _source_count(lakes: Lakes, table: str, where: str = "true") -> int:
    with lakes.source.conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM public.{table} WHERE {where}")
        return cur.fetchone()[0]


def test_changes_land_on_object_storage_through_each_catalog(lakes):
    start = {t: lakes.source.end_offset(t) for t in TABLES}
    # Counted in the source: the tests that run before this one may have changed the same tables.
    updates = _source_count(lakes, "obj_orders", "id <= 300 AND id % 10 = 0")
    deletes = _source_count(lakes, "obj_orders", "id <= 300 AND id % 25 = 0")
    item_deletes = _source_count(lakes, "obj_items", "order_id <= 5")
    lakes.source.sql(
        "UPDATE public.obj_orders SET qty = qty + 10 WHERE id <= 300 AND id % 10 = 0",
        "DELETE FROM public.obj_orders WHERE id <= 300 AND id % 25 = 0",
        "DELETE FROM public.obj_items WHERE order_id <= 5",
        "INSERT INTO public.obj_orders (id, customer, qty, price, placed) VALUES (1000, 'new', 1, 9.99, now())",
    )
    # A delete is two events: the delete and its tombstone.
    expected = {"obj_orders": start["obj_orders"] + updates + deletes * 2 + 1}
    lakes.sync(expected | {"obj_items": start["obj_items"] + item_deletes * 2})
    lakes.verify_all()
    for catalog in ("s3lake", "restlake"):
        paths = [
            r[0]
            for r in lakes.spark.sql(f"SELECT file_path FROM {lakes.table(catalog, 'obj_orders')}.all_files").collect()
        ]
        assert paths and all(p.startswith(f"s3://{lakes.store.settings.s3_bucket}/") for p in paths), paths
        # The deletes went in as deletion vectors (Puffin), written by the committer through S3FileIO.
        kinds = {
            r[0]
            for r in lakes.spark.sql(f"SELECT content FROM {lakes.table(catalog, 'obj_orders')}.all_files").collect()
        }
        assert kinds == {0, 1}, kinds
    # The objects are really in the store: listed by a client of its own.
    listed = lakes.store.client().list_objects_v2(Bucket=lakes.store.settings.s3_bucket, Prefix="warehouse/rest/")
    assert any(o["Key"].endswith(".parquet") for o in listed.get("Contents", []))
    assert (
        _rows(lakes, "restlake", "obj_orders")
        == _rows(lakes, "s3lake", "obj_orders")
        == _rows(lakes, "restfs", "obj_orders")
    )


def test_the_rest_lake_is_served_by_apache_icebergs_server_which_logs_no_secret(lakes):
    """``restlake`` ran through a REST catalog no one here wrote: the process is Iceberg's RESTCatalogServer from
    its published jars, and its log holds neither the JDBC password nor the store's secret key."""
    from lakestream.stack.rest_catalog import IcebergRestServer

    server = lakes.rest_s3
    assert isinstance(server, IcebergRestServer)
    cmdline = open(f"/proc/{server.pid()}/cmdline", "rb").read().split(b"\0")
    assert b"org.apache.iceberg.rest.RESTCatalogServer" in cmdline
    assert any(b"iceberg-open-api-1.11.0-test-fixtures.jar" in part for part in cmdline)
    text = server.log_path.read_text() if server.log_path.exists() else ""
    # At INFO it would log "Creating rest_backend catalog with properties: {... jdbc.password=...}".
    assert "jdbc.password" not in text and lakes.store.settings.s3_secret_key not in text
    assert server.environment()["CATALOG_JDBC_PASSWORD"]  # the password it was given, through its environment
    tables = lakes.spark.sql(f"SHOW TABLES IN restlake.{lakes.source.namespace}").collect()
    assert {r.tableName for r in tables} >= set(TABLES)


def test_spark_duckdb_and_pyiceberg_read_the_same_rows(lakes):
    rows = _source_count(lakes, "obj_orders")  # every test that changes the source syncs before it ends
    for catalog in ("restlake", "s3lake", "restfs"):
        config = lakes.configs[catalog]
        name = f"{lakes.source.namespace}.obj_orders"
        spark_rows = read_table(config, name, engine="spark", spark=lakes.spark).sort_by("id")
        for engine in ("duckdb", "pyiceberg"):
            other = read_table(config, name, engine=engine).sort_by("id")
            assert other.num_rows == spark_rows.num_rows == rows, (catalog, engine)
            assert other.column("id").to_pylist() == spark_rows.column("id").to_pylist(), (catalog, engine)
            assert other.column("qty").to_pylist() == spark_rows.column("qty").to_pylist(), (catalog, engine)


def test_schema_evolution_and_truncate(lakes):
    start = {t: lakes.source.end_offset(t) for t in TABLES}
    lakes.source.sql(
        "ALTER TABLE public.obj_orders ADD COLUMN note text",
        "UPDATE public.obj_orders SET note = 'n' || id WHERE id <= 20",
        "INSERT INTO public.obj_orders VALUES (1001, 'later', 2, 1.25, now(), 'fresh')",
        "TRUNCATE public.obj_items",
        "INSERT INTO public.obj_items VALUES (7, 1, 'after-truncate'), (8, 1, 'x')",
    )
    lakes.sync({"obj_orders": start["obj_orders"] + 20 + 1, "obj_items": start["obj_items"] + 3})
    lakes.verify_all()
    for catalog in MATRIX:
        assert "note" in lakes.spark.table(lakes.table(catalog, "obj_orders")).columns
        assert len(_rows(lakes, catalog, "obj_items")) == 2
    note = read_table(
        lakes.configs["restlake"],
        f"{lakes.source.namespace}.obj_orders",
        engine="duckdb",
        columns=["id", "note"],
        where="id = 1001",
    )
    assert note.to_pylist() == [{"id": 1001, "note": "fresh"}]


def test_offsets_commit_in_the_data_snapshot_through_rest(lakes):
    table = lakes.table("restlake", "obj_orders")
    summary = lakes.spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][
        0
    ]
    topic = lakes.source.topic("obj_orders")
    assert topic in summary["lakestream.offsets"], summary
    snapshots = lakes.spark.sql(f"SELECT count(*) FROM {table}.snapshots").collect()[0][0]
    run_pipeline(lakes.configs["restlake"], spark=lakes.spark, stop_when_idle=True)  # nothing new: no commit
    assert lakes.spark.sql(f"SELECT count(*) FROM {table}.snapshots").collect()[0][0] == snapshots


def test_fresh_read_sees_kafka_beyond_the_snapshot(lakes):
    start = lakes.source.end_offset("obj_orders")
    lakes.source.sql(
        "INSERT INTO public.obj_orders (id, customer, qty, price, placed) VALUES (2000, 'in-kafka', 3, 3.00, now())"
    )
    lakes.source.wait_for_events({"obj_orders": start + 1})
    fresh = read_table(
        lakes.configs["restlake"],
        f"{lakes.source.namespace}.obj_orders",
        engine="pyiceberg",
        fresh=True,
        columns=["id", "customer"],
        where="id = 2000",
    )
    assert fresh.to_pylist() == [{"id": 2000, "customer": "in-kafka"}]
    lakes.sync({"obj_orders": start + 1})


def test_maintenance_removes_orphans_on_object_storage(lakes):
    from lakestream.maintenance.runner import maintain_table
    from lakestream.storage import S3Options, filesystem_path

    config = lakes.configs["restlake"]
    name = f"{lakes.source.namespace}.obj_orders"
    location = (
        lakes.spark.sql(f"DESCRIBE TABLE EXTENDED {lakes.table('restlake', 'obj_orders')}")
        .where("col_name = 'Location'")
        .collect()[0][1]
    )
    # The lake's own storage settings: the process's current ones are those of whichever pipeline ran last.
    options = S3Options.from_settings(config.catalog.storage)
    fs, path = filesystem_path(f"{location}/data/orphan-{uuid.uuid4().hex}.parquet", options)
    with fs.open_output_stream(path) as out:
        out.write(b"not referenced by any snapshot")
    young_path = path.replace("orphan-", "young-orphan-")
    with fs.open_output_stream(young_path) as out:
        out.write(b"written a moment ago: may belong to a commit in flight")
    # An object's age is the store's clock, and Iceberg only removes orphans older than a day: date the
    # first one four days back (the policy keeps orphans younger than three). The gateway's POSIX backend
    # reports a file's modification time as its object's LastModified.
    bucket, key = path.split("/", 1)
    four_days_ago = time.time() - 4 * 86400
    os.utime(lakes.store.object_path(bucket, key), (four_days_ago, four_days_ago))
    before = _rows(lakes, "restlake", "obj_orders")
    results = maintain_table(lakes.spark, config, name)
    [orphans] = [r for r in results if r.action == "remove_orphans"]
    assert orphans.status == "ok" and orphans.files_before == 1, orphans
    assert fs.get_file_info(path).type.name == "NotFound"
    assert fs.get_file_info(young_path).type.name == "File"
    assert _rows(lakes, "restlake", "obj_orders") == before
    lakes.verify_all()


def test_health_measures_tables_on_object_storage(lakes):
    from lakestream.health.monitor import collect_health
    from lakestream.read.inspection import file_length, load_java_table

    name = f"{lakes.source.namespace}.obj_orders"
    report = collect_health(lakes.spark, lakes.configs["restlake"], tables=[name], measure_lag=False)
    [metrics] = report.tables
    assert metrics.error is None, metrics.error
    assert metrics.data_files > 0 and metrics.data_bytes > 0
    assert metrics.metadata_bytes > 0 and metrics.metadata_files >= 1
    # Metadata JSON files and manifest lists are sized through the table's S3FileIO, not the local disk.
    jtable = load_java_table(lakes.spark, "restlake", name)
    location = jtable.operations().current().metadataFileLocation()
    bucket, key = location.split("://", 1)[1].split("/", 1)
    size = lakes.store.client().head_object(Bucket=bucket, Key=key)["ContentLength"]
    assert file_length(jtable.io(), location) == size > 0


def test_vended_credentials_are_used_when_the_config_has_none(lakes, monkeypatch):
    """A pipeline whose storage section names no credentials, with none in the AWS chain, writes and reads
    through the credentials the REST catalog vends per table: the write tasks (pyarrow), the committer
    (S3FileIO), pyiceberg, DuckDB and Spark."""
    from lakestream.stack.objectstore import ACCESS_KEY_ENV, SECRET_KEY_ENV

    for variable in (ACCESS_KEY_ENV, SECRET_KEY_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    base = lakes.data["restlake"]
    namespace = f"{lakes.source.namespace}_vended"
    data = {
        **base,
        "name": f"{base['name']}-vended",
        "state_dir": f"{base['state_dir']}-vended",
        "kafka": {**base["kafka"], "group_id": f"{base['kafka']['group_id']}-vended"},
        "streams": [{**base["streams"][0], "namespace": namespace}],
        "catalog": {**base["catalog"], "name": "vended", "vended_credentials": True},
        "storage": {k: v for k, v in storage_section(lakes.store).items() if not k.endswith("_env")},
    }
    config = parse_config(data, "<vended>")
    build_session(config.catalog, config.spark)
    run_pipeline(config, spark=lakes.spark, stop_when_idle=True)
    report = verify_tables(config, lakes.spark, tables=[f"public.{t}" for t in TABLES])
    assert report.ok, report.to_text()
    name = f"{namespace}.obj_orders"
    expected = len(_rows(lakes, "restlake", "obj_orders"))
    for engine in ("pyiceberg", "duckdb"):
        assert read_table(config, name, engine=engine).num_rows == expected, engine
    assert lakes.spark.table(f"vended.{name}").count() == expected


def test_wrong_credentials_stop_at_once_naming_the_setting(lakes, monkeypatch):
    from lakestream.runtime.spark import session_for
    from lakestream.stack.objectstore import SECRET_KEY_ENV

    monkeypatch.setenv(SECRET_KEY_ENV, "not-the-secret")
    config = parse_config(lakes.data["s3lake"], "<wrong>")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"storage\.access_key_id_env.*storage\.secret_access_key_env"):
        session_for(config)
    assert time.monotonic() - started < 10
    monkeypatch.delenv(SECRET_KEY_ENV)
    with pytest.raises(ConfigError, match=f"storage.secret_access_key_env: environment variable {SECRET_KEY_ENV}"):
        session_for(config)


def test_an_untrusted_catalog_certificate_stops_at_once_naming_the_setting(lakes):
    """The https REST catalog (restfs) with no CA bundle, or one without its CA: a config error naming
    catalog.ssl_ca_bundle before anything starts; with its CA, the check passes."""
    from lakestream.runtime.spark import check_catalog_tls

    base = lakes.data["restfs"]
    assert base["catalog"]["uri"].startswith("https://")
    check_catalog_tls(lakes.configs["restfs"].catalog)
    without = {k: v for k, v in base["catalog"].items() if k != "ssl_ca_bundle"}
    with pytest.raises(ConfigError, match=r"not trusted.*fix: set catalog\.ssl_ca_bundle"):
        check_catalog_tls(parse_config(base | {"catalog": without}, "<no-ca>").catalog)
    other = base["catalog"] | {"ssl_ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}
    with pytest.raises(ConfigError, match=r"not trusted.*catalog\.ssl_ca_bundle must hold"):
        check_catalog_tls(parse_config(base | {"catalog": other}, "<wrong-ca>").catalog)


def test_the_https_catalog_refuses_a_wrong_client_secret(lakes):
    """The server written here checks the OAuth2 client secret (Iceberg's own server does not): a wrong one gets
    401 at the token endpoint, no token gets 401 on the catalog's routes, the right one a bearer token."""
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    server = lakes.configs["restfs"].catalog
    context = ssl.create_default_context(cafile=server.ssl_ca_bundle)
    client_id, secret = os.environ[CREDENTIAL_ENV].split(":", 1)

    def token(client_secret: str) -> int:
        body = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": client_secret,
                "scope": "catalog",
            }
        ).encode()
        try:
            with urllib.request.urlopen(f"{server.uri}/v1/oauth/tokens", body, timeout=10, context=context) as r:
                assert json.load(r)["access_token"]
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert token(secret) == 200
    assert token(secret + "x") == 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{server.uri}/v1/namespaces", timeout=10, context=context)
    assert refused.value.code == 401


def test_unreachable_endpoint_is_named_and_left_to_the_outage_wait(lakes, caplog):
    from lakestream.stack.process import free_port
    from lakestream.storage import check_storage, storage_unreachable

    section = storage_section(lakes.store) | {"endpoint": f"http://127.0.0.1:{free_port()}"}
    config = parse_config(lakes.data["s3lake"] | {"storage": section}, "<away>")
    with caplog.at_level(logging.WARNING, logger="lakestream.storage"):
        check_storage(config.catalog)  # no exception: the engine waits an outage out (engine.max_outage_s)
    assert "storage.endpoint" in caplog.text and "not reachable" in caplog.text
    # The engine's question when a batch fails with an error that names no cause (a REST catalog's 500).
    assert storage_unreachable(config.catalog)
    assert not storage_unreachable(lakes.configs["s3lake"].catalog)
    assert not storage_unreachable(lakes.configs["restfs"].catalog)  # local files: never an object store outage
