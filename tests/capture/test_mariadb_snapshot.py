"""The parallel snapshot of a MariaDB source (`lakestream snapshot`, `capture.snapshot: parallel`) against a real
MariaDB, Spark, Iceberg and Debezium's MariaDB connector: tables loaded in chunks under one consistent snapshot while
writes go on, Debezium streaming from that snapshot's binlog position, then `verify` exact (marker ``mariadb_slow``,
`make test-mariadb`); and, in `make test`, the sessions lined up at one binlog position and a value the server
cannot render."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
import yaml
from conftest import catalog_settings, mariadb_database
from test_mariadb_capture import EXPECTED_TYPES, EXPECTED_TYPES_ROW, MariaDBCapture

from lakestream.capture import CaptureProcess
from lakestream.capture.handover import handover_properties, read_handover
from lakestream.capture.process import LAKESTREAM_COMMAND
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.errors import CaptureError
from lakestream.runtime.spark import jvm_helper
from lakestream.snapshot import RESNAPSHOT_PROPERTY, SnapshotError, run_snapshot
from lakestream.snapshot.chunks import KILL_AFTER_CHUNKS_ENV, read_snapshot_state

# The types of test_mariadb_capture's table that the parallel snapshot reads (BIT(n > 1) and spatial types are
# refused, naming Debezium's snapshot as the fix).
SNAP_TYPES_DDL = """CREATE TABLE types (
 id INT PRIMARY KEY,
 b1 TINYINT(1), bo BOOLEAN, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
 mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
 de DECIMAL(12,3), de65 DECIMAL(65,10), f FLOAT, d DOUBLE,
 dt DATE, dtm0 DATETIME, dtm3 DATETIME(3), dtm6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL,
 tm TIME, tm6 TIME(6), y YEAR,
 c CHAR(5), vc VARCHAR(50), tx TEXT, bn BINARY(4), vb VARBINARY(10), bl BLOB, bit1 BIT(1),
 en ENUM('a','b','c'), st SET('x','y','z'), js JSON,
 gen BIGINT AS (i * 2) VIRTUAL, gens VARCHAR(60) AS (CONCAT(vc, '!')) STORED
)"""
SNAP_COLUMNS = (
    "id,b1,bo,ti,tiu,si,siu,mi,miu,i,iu,bi,biu,de,de65,f,d,dt,dtm0,dtm3,dtm6,ts,ts6,tm,tm6,y,c,vc,tx,bn,"
    "vb,bl,bit1,en,st,js"
)
SNAP_VALUES = """(%s, 1, 0, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
 -9223372036854775808, 18446744073709551615, 123456789.123,
 12345678901234567890123456789012345678901234567890.0123456789, 1.5, 2.25,
 '2024-02-29', '2024-02-29 13:14:15', '2024-02-29 13:14:15.123', '2024-02-29 13:14:15.123456',
 '2024-02-29 13:14:15', '2024-02-29 13:14:15.654321', '-838:59:59', '12:34:56.789012', 2024,
 'ab', 'héllo 🚀', 'long text ✓', x'00010203', x'ff00', x'deadbeef', b'1',
 'b', 'x,z', '{"a": [1, 2, {"b": null}]}')"""
SNAP_EXPECTED = {k: v for k, v in EXPECTED_TYPES.items() if k not in ("bit5", "bit16", "bit64", "g", "pt")}
ORDERS = 6_000


class Writes(threading.Thread):
    """Inserts, updates and deletes of ``orders`` and ``nokey`` as fast as one connection goes, until stopped."""

    def __init__(self, mariadb, dbname: str, first_id: int = ORDERS + 1):
        super().__init__(daemon=True)
        self.conn = mariadb.connect(dbname)
        self.stop, self.changes, self.error, self.first_id = threading.Event(), 0, None, first_id

    def _some_id(self, rng: random.Random, next_id: int) -> int:
        """A key of the loaded rows or of this writer's own inserts."""
        if next_id > self.first_id and rng.random() < 0.5:
            return rng.randrange(self.first_id, next_id)
        return rng.randrange(1, ORDERS + 1)

    def run(self) -> None:
        rng, next_id = random.Random(self.first_id), self.first_id
        try:
            with self.conn.cursor() as cur:
                while not self.stop.is_set():
                    roll = rng.random()
                    if roll < 0.4:
                        cur.execute("INSERT INTO orders VALUES (%s, %s, %s)", (next_id, f"c{next_id}", next_id % 97))
                        next_id += 1
                    elif roll < 0.75:
                        cur.execute(
                            "UPDATE orders SET amount = amount + 1, customer = CONCAT(customer, '+') WHERE id = %s",
                            (self._some_id(rng, next_id),),
                        )
                    elif roll < 0.9:
                        cur.execute("DELETE FROM orders WHERE id = %s", (self._some_id(rng, next_id),))
                    else:
                        cur.execute("INSERT INTO nokey VALUES (%s, 'w')", (rng.randrange(5),))
                    self.changes += 1
                    time.sleep(0.002)
        except Exception as exc:  # noqa: BLE001 — reported by the test
            self.error = exc
        finally:
            self.conn.close()


def _pipeline(stack, mariadb, service_dir_factory, label: str, tables: list[str]) -> tuple[str, str, Path, dict]:
    """A fresh MariaDB database with the test's tables, and a pipeline capturing ``tables`` with the parallel
    snapshot: (database, topic prefix, work dir, config data)."""
    uid = uuid.uuid4().hex[:6]
    dbname, prefix = f"{label}_{uid}", f"{label}{uid}"
    mariadb.run_as_root(f"CREATE DATABASE `{dbname}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn = mariadb.connect(dbname)
    with conn.cursor() as cur:
        cur.execute(SNAP_TYPES_DDL)
        cur.execute(f"INSERT INTO types ({SNAP_COLUMNS}) VALUES {SNAP_VALUES}", (1,))
        cur.execute("INSERT INTO types (id) VALUES (2)")
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(40) NOT NULL, amount DECIMAL(10,2))")
        cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", [(i, f"c{i}", i % 89) for i in range(1, ORDERS + 1)])
        cur.execute("CREATE TABLE nokey (a INT, b VARCHAR(10))")
        cur.execute("INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (2, 'y')")
        cur.execute("CREATE TABLE marker (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE gis (id INT PRIMARY KEY, g POINT)")
    conn.close()
    workdir = service_dir_factory(label)
    data = {
        "name": prefix,
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-{prefix}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topic_pattern": rf"{prefix}\..*", "namespace": dbname, "table": "{table}"}],
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(workdir / "state"),
        "capture": {
            "database": mariadb_database(mariadb, dbname),
            "topic_prefix": prefix,
            "snapshot": "parallel",
            "snapshot_chunk_rows": 1000,
            "tables": [f"{dbname}.{t}" for t in tables],
            "connector": {"heartbeat.interval.ms": "1000"},
        },
    }
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(data))
    return dbname, prefix, workdir, data


@pytest.mark.mariadb_slow  # ~50 s beyond the shared fixtures: `make test-mariadb`
def test_parallel_snapshot_under_writes_hands_over_exactly(stack, mariadb, service_dir_factory, spark):
    dbname, prefix, workdir, data = _pipeline(
        stack, mariadb, service_dir_factory, "mps", ["types", "orders", "nokey", "marker"]
    )
    conn = mariadb.connect(dbname)
    config = parse_config(data, "<test>")
    writes = Writes(mariadb, dbname)
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    try:
        # A spatial column is refused before anything is loaded, naming the fix.
        gis = parse_config({**data, "capture": {**data["capture"], "tables": [f"{dbname}.gis"]}}, "<test>")
        with pytest.raises(Exception, match=r"column 'g' has type point.*capture.snapshot: debezium"):
            run_snapshot(gis, spark=spark)

        writes.start()
        time.sleep(1)
        report = run_snapshot(config, spark=spark)
        assert [t.chunks_total for t in report.tables] == [1, 6, 1, 1], report.to_text()
        assert writes.changes > 0 and writes.error is None, writes.error
        handover = read_handover(config.state_dir, config.capture)
        assert handover["binlog"]["file"] and handover["binlog"]["pos"] > 4 and report.lsn == handover["lsn_text"]

        # the tables are the ones Debezium's events would have created (streamed rows land without a change)
        schema = {f.name: f.dataType.simpleString() for f in spark.table(f"lake.{dbname}.types").schema}
        assert schema == SNAP_EXPECTED
        row = {r["id"]: r for r in (x.asDict() for x in spark.table(f"lake.{dbname}.types").collect())}
        assert {k: row[1][k] for k in EXPECTED_TYPES_ROW if k in SNAP_EXPECTED} == {
            k: v for k, v in EXPECTED_TYPES_ROW.items() if k in SNAP_EXPECTED
        }
        assert all(v is None for k, v in row[2].items() if k != "id"), row[2]

        capture.start()
        capture.wait_until_streaming(timeout=180)
        time.sleep(2)
        writes.stop.set()
        writes.join(30)
        assert writes.error is None, writes.error
        with conn.cursor() as cur:  # a streamed row of every type
            cur.execute(f"INSERT INTO types ({SNAP_COLUMNS}) VALUES {SNAP_VALUES}", (3,))
        source = MariaDBCapture(mariadb, dbname, conn, workdir, config, capture, prefix)
        source.sync(spark)
        schema = {f.name: f.dataType.simpleString() for f in spark.table(f"lake.{dbname}.types").schema}
        assert schema == SNAP_EXPECTED
        assert (
            not spark.catalog.tableExists("lake.lakestream.dead_letter")
            or spark.sql(f"SELECT count(*) FROM lake.lakestream.dead_letter WHERE topic LIKE '{prefix}.%'").first()[0]
            == 0
        )
        result = source.verify(spark, ("types", "orders", "nokey"))
        assert result.ok, result.to_text()
        assert [t.source_rows for t in result.tables][0] == 3

        # a table changed since the handover: a capture started afresh from it refuses to read the binlog
        capture.stop()
        with conn.cursor() as cur:
            cur.execute("ALTER TABLE orders ADD COLUMN late INT")
        (Path(config.state_dir) / "capture" / f"{config.capture.slot_name}.offsets").unlink()
        with pytest.raises(CaptureError, match=rf"{dbname}.orders changed \(DDL\) since the parallel snapshot"):
            handover_properties(config, {})
    finally:
        writes.stop.set()
        capture.stop()
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")


def test_sessions_share_one_snapshot_at_its_binlog_position(mariadb, mariadb_source, tmp_path):
    """Several sessions at one binlog position read one state: a row committed after they started is in none of
    them, and the position is the one the binlog had then."""
    from lakestream.identifiers import SourceTableName
    from lakestream.snapshot.mariadb import ConsistentSnapshot

    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
        cur.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "catalog": {"type": "hadoop", "warehouse": f"file://{tmp_path}/warehouse"},
            "streams": [{"topic_pattern": r"mdb\..*"}],
            "state_dir": str(tmp_path / "state"),
            "capture": {
                "database": mariadb_database(mariadb, dbname),
                "tables": [f"{dbname}.t"],
                "topic_prefix": "mdb",
            },
        },
        "<test>",
    )
    with ConsistentSnapshot(config, [SourceTableName.parse(f"{dbname}.t")], sessions=3) as snapshot:
        assert (snapshot.sessions, snapshot.file, snapshot.pos) == (3, file, int(pos))
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (3, 'late')")
            cur.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        source, _ = snapshot.describe(SourceTableName.parse(f"{dbname}.t"))
        plan = snapshot.plan(source, 1)
        reads = [snapshot.task(type("W", (), {"source": source, "target": None})(), c)[1][0] for c in plan.chunks * 3]
        # every session read every chunk (the free sessions are taken in turn)
        assert sorted(reads) == sorted([b'{"id": 1, "v": "a"}', b'{"id": 2, "v": "b"}'] * 3), reads


def test_a_value_the_server_cannot_render_fails_the_chunk(mariadb, mariadb_source, tmp_path):
    """HEX() of a BLOB longer than max_allowed_packet / 2 is NULL with a warning: the chunk fails, naming the
    setting, instead of loading a NULL."""
    from lakestream.identifiers import SourceTableName
    from lakestream.snapshot import SnapshotError
    from lakestream.snapshot.mariadb import ConsistentSnapshot

    dbname, conn = mariadb_source
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE b (id INT PRIMARY KEY, bl LONGBLOB)")
        cur.execute("INSERT INTO b VALUES (1, REPEAT('x', 9000000))")  # HEX(): 18 MB, over the default 16 MB
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "catalog": {"type": "hadoop", "warehouse": f"file://{tmp_path}/warehouse"},
            "streams": [{"topic_pattern": r"mdb\..*"}],
            "state_dir": str(tmp_path / "state"),
            "capture": {
                "database": mariadb_database(mariadb, dbname),
                "tables": [f"{dbname}.b"],
                "topic_prefix": "mdb",
            },
        },
        "<test>",
    )
    name = SourceTableName.parse(f"{dbname}.b")
    with ConsistentSnapshot(config, [name]) as snapshot:
        source, _ = snapshot.describe(name)
        (chunk,) = snapshot.plan(source, 1000).chunks
        with pytest.raises(SnapshotError, match=r"could not render every value .*max_allowed_packet"):
            snapshot.task(type("W", (), {"source": source, "target": None})(), chunk)


@pytest.mark.mariadb_slow
def test_snapshot_killed_midway_resumes_and_resnapshot_repairs_drift(stack, mariadb, service_dir_factory, spark):
    """`lakestream snapshot` SIGKILLed after two chunks: the resumed run keeps them and reads the rest under a new
    snapshot, later; the stream still starts at the first run's position, the mirror converges. A keyless table
    not finished by the first run is refused on resume (its rows would be doubled). Then the mirror, drifted by
    hand, is re-snapshotted while capture, the pipeline and writes go on, and ends exact."""
    dbname, prefix, workdir, data = _pipeline(stack, mariadb, service_dir_factory, "mpk", ["orders", "marker"])
    conn = mariadb.connect(dbname)
    config = parse_config(data, "<test>")
    writes = Writes(mariadb, dbname)
    capture = CaptureProcess(workdir / "pipeline.yaml", log_path=workdir / "capture.log")
    try:
        writes.start()
        env = {**os.environ, KILL_AFTER_CHUNKS_ENV: "2"}
        killed = subprocess.run(
            [*LAKESTREAM_COMMAND, "snapshot", str(workdir / "pipeline.yaml")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        state = read_snapshot_state(spark, f"lake.{dbname}.orders")
        done = sum(b - a + 1 for a, b in state["done"])
        assert 0 < done < len(state["chunks"]) and not state["complete"] and state["lsn"]["file"]
        with pytest.raises(CaptureError, match="no snapshot finished"):
            handover_properties(config, {})

        # a keyless table the first run did not finish: refused on resume
        with_nokey = parse_config(
            {**data, "capture": {**data["capture"], "tables": [*data["capture"]["tables"], f"{dbname}.nokey"]}},
            "<test>",
        )
        with pytest.raises(SnapshotError, match=rf"had not finished {dbname}.nokey, without a primary key"):
            run_snapshot(with_nokey, spark=spark)

        report = run_snapshot(config, spark=spark)
        orders = report.tables[0]
        assert report.resumed and orders.resumed_chunks == done and orders.chunks_done == orders.chunks_total
        assert read_handover(config.state_dir, config.capture)["binlog"] == state["lsn"]  # the first run's position
        capture.start()
        capture.wait_until_streaming(timeout=180)
        time.sleep(2)
        writes.stop.set()
        writes.join(30)
        assert writes.error is None and writes.changes > 0, writes.error
        source = MariaDBCapture(mariadb, dbname, conn, workdir, config, capture, prefix)
        source.sync(spark)
        result = source.verify(spark, ("orders",))
        assert result.ok, result.to_text()

        # The re-snapshot while capture and the pipeline stream: a mirror drifted by hand is repaired exactly, with
        # writes going on (the keys they change between the low mark and the commit keep the stream's rows).
        mirror = f"lake.{dbname}.orders"
        spark.sql(f"DELETE FROM {mirror} WHERE id % 97 = 0")
        spark.sql(f"UPDATE {mirror} SET customer = 'drifted' WHERE id % 89 = 0")
        spark.sql(f"INSERT INTO {mirror} SELECT * FROM {mirror} WHERE id IN (3, 4)")
        assert not source.verify(spark, ("orders",)).ok
        stop, errors = threading.Event(), []

        def pipeline() -> None:
            try:
                run_pipeline(config, spark=spark, stop=stop)
            except BaseException as exc:  # noqa: BLE001 — asserted below
                errors.append(exc)

        runner = threading.Thread(target=pipeline, daemon=True)
        runner.start()
        writes = Writes(mariadb, dbname, first_id=100_000)
        writes.start()
        report = run_snapshot(config, [f"{dbname}.orders"], spark, progress_interval_s=0.5, wait_timeout_s=120)
        assert report.resnapshot and report.tables[0].chunks_total >= 6 and report.lsn.startswith("binlog."), report
        state = orjson.loads(jvm_helper(spark).latestSummaryValue(spark._jsparkSession, mirror, RESNAPSHOT_PROPERTY))
        assert state["table"] == f"{dbname}.orders" and state["high_lsn"].startswith("binlog."), state
        # Rows equal to the source were left alone (the digests of MariaDB's chunk rows match the mirror's).
        assert state["unchanged"] > state["updated"] > 0, state
        time.sleep(1)
        writes.stop.set()
        writes.join(30)
        assert writes.error is None and writes.changes > 0, writes.error
        stop.set()
        runner.join(120)
        assert not errors, errors
        source.sync(spark)
        result = source.verify(spark, ("orders",))
        assert result.ok, result.to_text()
    finally:
        writes.stop.set()
        capture.stop()
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{dbname}`")
