"""Trino reads what the pipeline writes (`make test-engines`, marker ``engines``).

One Debezium capture feeds two pipelines: into the suite's JDBC catalog and into a REST catalog (OAuth2 client
credentials), both on local files. A Trino node
(``io.trino:trino-server`` by coordinates, its Iceberg connector configured by
`lakestream.stack.trino.iceberg_catalog_properties`) opens both catalogs, and every test compares the rows
Trino returns, through the ``trino`` Python client, with the rows Spark returns for the same table and snapshot:
a CDC mirror with deletion vectors, after ADD COLUMN, after compaction, a partitioned mirror, time travel by
snapshot id, an append table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid

import pytest
import yaml
from capture_harness import start_captured_source, stop_captured_source
from conftest import produce_records

from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.spark import build_session
from lakestream.stack.process import free_port

pytestmark = pytest.mark.engines

trino = pytest.importorskip("trino")
from trino.exceptions import TrinoExternalError  # noqa: E402

SETUP = [
    "CREATE TABLE public.tr_orders (id integer PRIMARY KEY, customer text, qty integer, price numeric(10,2), "
    "placed timestamptz, day date)",
    "INSERT INTO public.tr_orders SELECT g, 'c' || (g % 7), g % 5, g * 1.5, "
    "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', date '2026-01-01' + (g % 3) "
    "FROM generate_series(1, 300) g",
    "CREATE TABLE public.tr_parts (id integer PRIMARY KEY, region text, placed timestamptz, amount double precision)",
    "INSERT INTO public.tr_parts SELECT g, 'r' || (g % 4), timestamptz '2026-01-01 00:00:00+00' + g * interval "
    "'5 hours', g / 3.0 FROM generate_series(1, 200) g",
]
TABLES = ["tr_orders", "tr_parts"]
CREDENTIAL_ENV = "LAKESTREAM_TEST_TRINO_REST_CREDENTIAL"
CATALOGS = ("lake", "trrest")  # the suite's JDBC catalog (local files), a REST catalog on S3


class Lakes:
    """The captured source, one pipeline per catalog, the Trino node reading both."""

    def __init__(self, source, configs, spark, trino_server, events_topic):
        self.source, self.configs, self.spark, self.trino = source, configs, spark, trino_server
        self.events_topic = events_topic
        self.first_snapshot: dict[str, int] = {}  # catalog → tr_orders' snapshot holding the first 300 rows

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
            return [d[0] for d in cur.description], sorted(tuple(_normal(v) for v in r) for r in rows)
        finally:
            conn.close()

    def spark_rows(self, catalog: str, table: str, suffix: str = "", columns: str = "*") -> tuple[list[str], list]:
        df = self.spark.sql(f"SELECT {columns} FROM `{catalog}`.`{self.namespace}`.`{table}` {suffix}")
        return df.columns, sorted(tuple(_normal(v) for v in r) for r in df.collect())

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
    as a naive UTC datetime, Trino as an aware one."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


@pytest.fixture(scope="module")
def lakes(stack, spark, rest_catalog_factory, service_dir_factory):
    from lakestream.stack.trino import TrinoServer, iceberg_catalog_properties

    credential = f"lakestream-trino:{uuid.uuid4().hex}"
    os.environ[CREDENTIAL_ENV] = credential
    # Local files behind the REST catalog: Trino's S3 client reads file tails with suffix ranges
    # ("Range: bytes=-4750"), which the local S3-compatible store refuses ("unsupported Range header").
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
    for name in CATALOGS:
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
        configs[name] = parse_config(data, f"<{name}>")
        build_session(configs[name].catalog, configs[name].spark)  # registers the catalog on the session
    server = TrinoServer(
        service_dir_factory("trino"),
        free_port(),
        {name: iceberg_catalog_properties(c.catalog) for name, c in configs.items()},
    )
    server.start()
    try:
        yield Lakes(source, configs, spark, server, events_topic)
    finally:
        server.stop()
        stop_captured_source(source)


@pytest.fixture(scope="module")
def mirrored(lakes):
    """Both tables mirrored; then ``tr_orders`` updated and deleted from (its mirror gains deletion vectors),
    ``tr_parts`` only inserted into (no deletes: plain data files), and events appended."""
    lakes.sync({"tr_orders": 300, "tr_parts": 200})
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
    )
    lakes.sync({"tr_orders": 300 + 30 + 12 * 2 + 1, "tr_parts": 250})
    return lakes


def _delete_file_formats(lakes: Lakes, catalog: str, table: str) -> set[str]:
    return {
        r[0]
        for r in lakes.spark.sql(
            f"SELECT file_format FROM `{catalog}`.`{lakes.namespace}`.`{table}`.delete_files"
        ).collect()
    }


# What Trino 476 (the newest trino-server on Maven Central here) says when a snapshot has deletion vectors.
TRINO_DV_ERROR = "Unexpected PUFFIN file format"


def _fails_as_trino_does_on_dvs(read) -> None:
    """Run ``read``; Trino's refusal of deletion vectors is re-raised (the strict xfail's expected failure),
    any other error fails the test."""
    try:
        read()
    except TrinoExternalError as exc:
        assert (exc.error_name, exc.message) == ("ICEBERG_BAD_DATA", TRINO_DV_ERROR), exc
        raise


@pytest.mark.xfail(
    raises=trino.exceptions.TrinoExternalError,
    strict=True,
    reason=f"Trino 476 cannot read Iceberg v3 deletion vectors: ICEBERG_BAD_DATA {TRINO_DV_ERROR!r}",
)
@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_cdc_mirror_with_deletion_vectors(mirrored, catalog):
    assert _delete_file_formats(mirrored, catalog, "tr_orders") == {"PUFFIN"}  # v3 deletion vectors
    _fails_as_trino_does_on_dvs(lambda: mirrored.assert_same_rows(catalog, "tr_orders"))


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
    initial-default: the rows already written read 'web')."""
    mirrored.source.sql(
        "ALTER TABLE public.tr_orders ADD COLUMN note text",
        "UPDATE public.tr_orders SET note = 'n' || id WHERE id % 7 = 0 AND id < 1000",
        "ALTER TABLE public.tr_parts ADD COLUMN note text",
        "ALTER TABLE public.tr_parts ADD COLUMN channel text DEFAULT 'web'",
        "INSERT INTO public.tr_parts SELECT g, 'r1', timestamptz '2026-04-01 00:00:00+00', g, "
        "'n' || g, 'shop' FROM generate_series(251, 260) g",
    )
    mirrored.sync({"tr_orders": 300 + 30 + 12 * 2 + 1 + 41, "tr_parts": 260})
    return mirrored


@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_mirror_after_add_column(columns_added, catalog):
    names, rows = columns_added.trino_rows(catalog, "tr_parts", columns="id, note")
    assert names == ["id", "note"]
    assert sum(1 for r in rows if r[1] is not None) == 10
    columns_added.assert_same_rows(catalog, "tr_parts", columns="id, region, placed, amount, note")


class InitialDefaultIgnored(AssertionError):
    """Trino read NULL where the column's initial-default gives the rows written before it a value."""


@pytest.mark.xfail(
    raises=InitialDefaultIgnored,
    strict=True,
    reason="Trino 476 ignores Iceberg v3 initial-default: rows written before the column was added "
    "read NULL, not the default (no error)",
)
@pytest.mark.parametrize("catalog", CATALOGS)
def test_trino_reads_a_column_added_with_a_default(columns_added, catalog):
    _, from_spark = columns_added.spark_rows(catalog, "tr_parts", columns="id, channel")
    assert {r[1] for r in from_spark} == {"web", "shop"}
    _, from_trino = columns_added.trino_rows(catalog, "tr_parts", columns="id, channel")
    if from_trino != from_spark:
        # Exactly the rows from before the ALTER differ, and Trino has NULL for each of them.
        # (zip not strict: a row count that differs fails the assert below)
        differ = {a[0] for a, b in zip(from_trino, from_spark, strict=False) if a != b}
        if differ == {i for i, c in from_spark if c == "web"} and all(c is None for i, c in from_trino if i in differ):
            raise InitialDefaultIgnored(f"{len(differ)} rows read NULL instead of 'web'")
    assert from_trino == from_spark


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
