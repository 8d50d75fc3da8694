"""capture.tables against a real PostgreSQL: any name it accepts, partitioned parents, and the start
check that every requested table will publish its changes (`lakestream.capture.publication`).

Only PostgreSQL runs here (the shared stack's); Debezium is exercised in test_source_tables.py.
"""

from __future__ import annotations

import pytest

from lakestream.capture.publication import prepare_publication
from lakestream.config import parse_config
from lakestream.errors import CaptureError

ODD_NAMES = ["Order Items", "select", "naïve", "a.b", 'say "hi"', "MixedCase"]


@pytest.fixture
def db(source_db):
    return source_db


def _capture(stack, dbname: str, tables: list[str], **extra):
    return parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "catalog": {"type": "hadoop", "warehouse": "file:///tmp/w"},
            "streams": [{"topic_pattern": r"p\..*"}],
            "capture": {
                "database": {
                    "host": stack.pg_host,
                    "port": stack.pg_port,
                    "dbname": dbname,
                    "user": stack.pg_user,
                    "password": stack.pg_password,
                },
                "tables": tables,
                "topic_prefix": "p",
                "publication_name": "lspub",
                **extra,
            },
        }
    ).capture


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _published(conn) -> set[tuple[str, str]]:
    with conn.cursor() as cur:
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = 'lspub'")
        return set(cur.fetchall())


def test_any_postgresql_name_is_published_under_its_own_name(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute('CREATE SCHEMA "My Schema"')
        for name in ODD_NAMES:
            cur.execute(f'CREATE TABLE "My Schema".{_quoted(name)} (id int PRIMARY KEY, "Value Col" text)')
    tables = ['"My Schema".' + _quoted(n) for n in ODD_NAMES]
    capture = _capture(stack, dbname, tables)
    captured = prepare_publication(conn, capture)
    assert [(t.name.schema, t.name.table) for t in captured] == [("My Schema", n) for n in ODD_NAMES]
    assert _published(conn) == {("My Schema", n) for n in ODD_NAMES}
    # each has its own exact include pattern, and its own topic
    assert len({capture.topic(t) for t in capture.source_tables}) == len(ODD_NAMES)
    prepare_publication(conn, capture)  # idempotent


def test_partitioned_parent_is_published_via_its_root(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE events (id int, ts date, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)")
        cur.execute("CREATE TABLE events_a PARTITION OF events FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')")
    captured = prepare_publication(conn, _capture(stack, dbname, ["public.events"]))
    assert captured[0].partitioned
    with conn.cursor() as cur:
        cur.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'lspub'")
        assert cur.fetchone()[0] is True
        # a partition attached later is published under the parent's name too
        cur.execute("CREATE TABLE events_b PARTITION OF events FOR VALUES FROM ('2021-01-01') TO ('2022-01-01')")
    assert _published(conn) == {("public", "events")}


def test_managed_publication_gains_publish_via_partition_root(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE plain (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE PUBLICATION lspub FOR TABLE plain")  # an earlier capture made it
    prepare_publication(conn, _capture(stack, dbname, ["public.plain", "public.parted"]))
    assert _published(conn) == {("public", "plain"), ("public", "parted")}


def test_user_publication_without_partition_root_refuses_to_start(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE PUBLICATION lspub FOR TABLE parted")
    capture = _capture(stack, dbname, ["public.parted"], manage_publication=False)
    with pytest.raises(CaptureError, match=r"publish_via_partition_root = true\)") as err:
        prepare_publication(conn, capture)
    assert "public.parted is a partitioned table" in str(err.value)
    assert "manage_publication" in str(err.value)
    with conn.cursor() as cur:
        cur.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'lspub'")
        assert cur.fetchone()[0] is False  # the user's publication is left alone


def test_user_publication_that_drops_updates_or_misses_a_table_refuses(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE b (id int PRIMARY KEY)")
        cur.execute("CREATE PUBLICATION lspub FOR TABLE a WITH (publish = 'insert')")
    with pytest.raises(CaptureError) as err:
        prepare_publication(conn, _capture(stack, dbname, ["public.a", "public.b"], manage_publication=False))
    text = str(err.value)
    assert "does not publish update or delete changes" in text
    assert 'ADD TABLE "public"."b"' in text


def test_tables_that_cannot_publish_are_refused_with_the_reason(stack, db):
    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE VIEW v AS SELECT 1 AS x")
    with pytest.raises(CaptureError) as err:
        prepare_publication(
            conn, _capture(stack, dbname, ["public.parted", "public.parted_1", "public.v", "public.Missing"])
        )
    text = str(err.value)
    assert "public.parted_1 is a partition of public.parted, and both are in capture.tables" in text
    assert "public.v is a view" in text
    assert "public.Missing does not exist" in text
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication")
        assert cur.fetchone()[0] == 0  # nothing was created for a capture that cannot start


def test_names_colliding_under_the_naming_rules_are_refused_with_both(stack):
    with pytest.raises(Exception, match=r"public\.Orders and public\.orders would both be mirrored"):
        _capture(stack, "x", ["public.Orders", "public.orders"])
    with pytest.raises(Exception, match=r"public\.Order Items and public\.Order_Items both publish to topic"):
        _capture(stack, "x", ["public.Order Items", "public.Order_Items"])


def test_kafka_connect_config_runs_the_same_start_checks(stack, db, tmp_path):
    """`lakestream capture --print-connector-config` (a Kafka Connect cluster) prepares and checks the publication
    as `lakestream capture` does, and gives a table with a dot in its name the topic lakestream reads."""
    import json
    import subprocess

    import yaml

    from lakestream.capture.connector import prepared_connect_json
    from lakestream.capture.process import LAKESTREAM_COMMAND

    dbname, conn = db
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        cur.execute('CREATE TABLE "a.b" (id int PRIMARY KEY)')
        cur.execute("CREATE PUBLICATION lspub FOR TABLE parted")
    tables = ["public.parted", 'public."a.b"']
    with pytest.raises(CaptureError, match=r"public.parted is a partitioned table.*publish_via_partition_root"):
        prepared_connect_json(_capture(stack, dbname, tables, manage_publication=False))
    doc = prepared_connect_json(_capture(stack, dbname, tables))
    config = doc["config"]
    assert config["publication.autocreate.mode"] == "disabled"  # Debezium only uses what was checked
    assert _published(conn) == {("public", "parted"), ("public", "a.b")}
    assert config["transforms"] == "lakestreamTopic0"
    assert config["transforms.lakestreamTopic0.regex"] == r"\Qp.public.a.b\E"
    assert config["transforms.lakestreamTopic0.replacement"] == "p.public.a_b"
    # The command line runs the check too, and refuses with the reason.
    with conn.cursor() as cur:
        cur.execute("ALTER PUBLICATION lspub SET (publish = 'insert')")
    data = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "catalog": {"type": "hadoop", "warehouse": "file:///tmp/w"},
        "streams": [{"topic_pattern": r"p\..*"}],
        "capture": {
            "database": {
                "host": stack.pg_host,
                "port": stack.pg_port,
                "dbname": dbname,
                "user": stack.pg_user,
                "password": stack.pg_password,
            },
            "tables": tables,
            "topic_prefix": "p",
            "publication_name": "lspub",
            "manage_publication": False,
        },
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run(
        [*LAKESTREAM_COMMAND, "capture", str(path), "--print-connector-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "does not publish update or delete changes" in out.stderr, out.stderr[-2000:]
    out = subprocess.run(
        [*LAKESTREAM_COMMAND, "capture", str(path), "--print-connector-config", "--skip-publication-check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout)["config"]["publication.autocreate.mode"] == "filtered"
