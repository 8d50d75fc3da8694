"""Re-snapshotting a table while `lakestream capture` and `lakestream run` keep streaming it, against
real PostgreSQL, Debezium, the broker, Spark and Iceberg: a mirror that drifted (rows deleted, changed,
duplicated and invented by hand) is repaired while writes go on, and ends equal to the source."""
from __future__ import annotations

import random
import threading
import time

import orjson
import pytest
import yaml

from conftest import run_lakestream
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.errors import ConfigError
from lakestream.snapshot import RESNAPSHOT_PROPERTY, SnapshotError, run_snapshot
from lakestream.sink.files import table_info
from lakestream.snapshot.resnapshot import _committed_offsets
from lakestream.snapshot.slot import write_handover
from lakestream.source.kafka import KafkaCluster
from lakestream.spark import jvm_helper
from lakestream.verify import verify_tables
from lakestream.snapshot.runner import read_snapshot_state
from test_parallel_snapshot import TABLES, Source, Writer


class PipelineThread:
    """`run_pipeline` on the test's Spark session in a thread, until stopped (as `lakestream run`)."""

    def __init__(self, source: Source, spark):
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.batches: list = []

        def run() -> None:
            try:
                run_pipeline(source.config, spark=spark, stop=self.stop_event, on_batch=self.batches.append)
            except BaseException as exc:  # noqa: BLE001 — surfaced by the assertions
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, name="pipeline", daemon=True)
        self.thread.start()

    def wait_applied(self, source: Source, spark, timeout: float = 300.0, tables: list[str] = TABLES) -> None:
        """Wait until each table's committed offsets reach its topic's end (every change applied)."""
        kafka = KafkaCluster(source.config.kafka)
        try:
            deadline = time.monotonic() + timeout
            for table in tables:
                topic = f"{source.prefix}.{table}"
                ident = f"lake.{source.prefix}.{table.split('.')[1]}"
                while True:
                    assert not self.errors, self.errors
                    ends = {tp.partition: hw[1] for tp, hw in
                            kafka.watermarks(kafka.partitions_of(lambda t, topic=topic: t == topic)).items()}
                    done = _committed_offsets(spark, ident, topic) if spark.catalog.tableExists(ident) else {}
                    # A trailing tombstone is not committed on its own: one short is all applied.
                    if ends and all(done.get(p, 0) >= end - 1 for p, end in ends.items()):
                        break
                    assert time.monotonic() < deadline, f"pipeline behind: {ends} vs {done}"
                    time.sleep(1.0)
        finally:
            kafka.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(300)
        assert not self.errors, self.errors


def _mark(label: str, started: list[float] = []) -> None:  # noqa: B006 — a clock shared by the calls
    started.append(time.monotonic())
    print(f"MARK {label} +{started[-1] - started[0]:.1f}s", flush=True)


def _drift(spark, ident: str) -> None:
    """Damage the mirror by hand, the ways a re-snapshot must repair."""
    spark.sql(f"DELETE FROM {ident} WHERE id % 97 = 0")  # lost rows
    spark.sql(f"UPDATE {ident} SET qty = -1, name = 'drifted' WHERE id % 89 = 0")  # wrong values
    spark.sql(f"INSERT INTO {ident} SELECT * FROM {ident} WHERE id IN (3, 4, 5)")  # duplicate keys
    from pyspark.sql import functions as F

    ghost = spark.table(ident).where("id = 6").withColumn("id", F.lit(90_000_000).cast("bigint"))
    ghost.writeTo(ident).append()  # a row the source never had


def _resnapshot_state(spark, ident: str) -> dict:
    raw = jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, RESNAPSHOT_PROPERTY)
    return orjson.loads(raw) if raw else {}


def _count(spark, sql: str) -> int:
    return spark.sql(sql).first()[0]


def test_resnapshot_while_streaming_repairs_drift_exactly(stack, spark):
    source = Source(stack, "resnap")
    # Debezium's own snapshot fills the mirror: the re-snapshot does not need the parallel handover.
    source.data["capture"]["snapshot"] = "debezium"
    source.config = parse_config(source.data, "<resnapshot test>")
    source.yaml.write_text(yaml.safe_dump(source.data))
    writer = Writer(stack, source.dbname)
    pipeline = None
    items = f"lake.{source.prefix}.items"
    try:
        source.start_capture()
        _mark("capture")
        pipeline = PipelineThread(source, spark)
        writer.burst(200)
        source.wait_caught_up()
        pipeline.wait_applied(source, spark)
        _mark("caught-up")
        _drift(spark, items)
        assert _count(spark, f"SELECT count(*) - count(DISTINCT id) FROM {items}") == 3
        assert _count(spark, f"SELECT count(*) FROM {items} WHERE id = 90000000") == 1
        _mark("drifted")

        # Interrupted midway (here by its progress callback): nothing is committed, the mirror is as it was.
        def interrupt(_tables) -> None:
            raise KeyboardInterrupt("interrupted re-snapshot")

        with pytest.raises(KeyboardInterrupt):
            run_snapshot(source.config, ["public.items"], spark, again=True, progress_interval_s=0.1,
                         on_progress=interrupt)
        assert _count(spark, f"SELECT count(*) FROM {items} WHERE id = 90000000") == 1
        assert not _resnapshot_state(spark, items)
        _mark("interrupted")

        writer.start()  # writes go on during the whole re-snapshot
        progress_seen: list[int] = []

        def on_progress(tables) -> None:
            if not progress_seen:
                # Changes to drifted keys while the re-snapshot runs: a duplicated key updated (3) and one
                # deleted (5), a key deleted from the lake (97) and one changed there (89) updated.
                with source.conn.cursor() as cur:
                    cur.execute("UPDATE items SET qty = qty + 1000 WHERE id IN (3, 89, 97)")
                    cur.execute("DELETE FROM items WHERE id = 5")
            progress_seen.append(tables[0].chunks_done)

        report = run_snapshot(source.config, ["public.items"], spark, again=True, progress_interval_s=0.5,
                              on_progress=on_progress)
        _mark("resnapshot")
        assert report.resnapshot and report.tables[0].chunks_total >= 5
        assert progress_seen and progress_seen[-1] == report.tables[0].chunks_total
        state = _resnapshot_state(spark, items)
        assert state["rows"] > 10_000 and state["table"] == "public.items"
        # Keys the stream changed between the low mark and the commit kept the stream's rows.
        assert state["stream_kept"] > 0, state
        time.sleep(1.0)
        writer.stop()
        source.wait_caught_up()
        pipeline.wait_applied(source, spark)
        pipeline.stop()
        _mark("applied")
        report = verify_tables(source.config, spark, tables=TABLES)
        assert report.ok, report.to_text()
        assert all(t.duplicate_keys == 0 for t in report.tables)
        assert _count(spark, f"SELECT count(*) FROM {items} WHERE id = 90000000") == 0
        assert "lakestream.commit-hold" not in table_info(spark, "lake", source.prefix, "items")["properties"]
        _mark("verified")
    finally:
        writer.stop()
        if pipeline is not None:
            pipeline.stop_event.set()
            pipeline.thread.join(300)
        source.close()


def test_resnapshot_misuse_is_refused_with_the_fix(stack, spark, tmp_path):
    config = parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "catalog": {"warehouse": "file:///tmp/w", "type": "hadoop"},
        "streams": [{"topics": ["a"]}], "state_dir": str(tmp_path),
        "capture": {"database": {"dbname": "d", "user": "u"}, "tables": ["public.t"], "topic_prefix": "shop"}})
    with pytest.raises(ConfigError, match=r"\['public.nope'\] not in capture.tables.*fix"):
        run_snapshot(config, ["public.nope"], again=True)
    out = run_lakestream("snapshot", str(_yaml(tmp_path, config)), "--again")
    assert out.returncode != 0 and "--again re-snapshots the tables you name" in out.stderr
    # A captured table whose capture never started: no slot streams it.
    source = Source(stack, "resnapx")
    try:
        with pytest.raises(SnapshotError, match=r"slot .* does not exist.*lakestream capture"):
            run_snapshot(source.config, ["public.items"], spark, again=True)
        # After a parallel snapshot's handover, naming a table is a re-snapshot (no --again needed).
        write_handover(source.config.state_dir, source.config.capture, 1, TABLES)
        with pytest.raises(SnapshotError, match=r"slot .* does not exist"):
            run_snapshot(source.config, ["public.items"], spark)
    finally:
        source.close()


def _yaml(tmp_path, config):
    import yaml

    data = config.model_dump(mode="json", exclude_none=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


KINDS_SETUP = [
    # a partitioned parent: a range partition, a sub-partitioned one (by hash) and a DEFAULT partition
    "CREATE TABLE events (id int, ts date, v text, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)",
    "CREATE TABLE events_2020 PARTITION OF events FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')",
    "CREATE TABLE events_2021 PARTITION OF events FOR VALUES FROM ('2021-01-01') TO ('2022-01-01') PARTITION BY HASH (id)",
    "CREATE TABLE events_2021_h0 PARTITION OF events_2021 FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
    "CREATE TABLE events_2021_h1 PARTITION OF events_2021 FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
    "CREATE TABLE events_other PARTITION OF events DEFAULT",
    "INSERT INTO events SELECT g, date '2020-01-01' + (g % 1000), 'v' || g FROM generate_series(1, 3000) g",
    # without a primary key: insert-only, and REPLICA IDENTITY FULL; many rows are equal
    "CREATE TABLE log_plain (msg text, n int)",
    "INSERT INTO log_plain SELECT 'm' || (g % 40), g % 7 FROM generate_series(1, 2000) g",
    "CREATE TABLE log_full (msg text, n int, at date)",
    "ALTER TABLE log_full REPLICA IDENTITY FULL",
    "INSERT INTO log_full SELECT 'f' || (g % 60), g % 3, date '2024-01-01' + g % 5 FROM generate_series(1, 2000) g",
    "ANALYZE",
]
KINDS = ["public.events", "public.log_plain", "public.log_full"]


class KindsWriter(Writer):
    """Changes of every kind on the partitioned and keyless tables, one per transaction: rows moved between
    partitions, deleted, inserted into each partition; equal rows inserted; one of several equal rows updated."""

    def __init__(self, stack, dbname: str, first_id: int = 10_000, seed: int = 7):
        super().__init__(stack, dbname)
        self.next_id = first_id
        self.rng = random.Random(seed)

    def step(self, cur) -> None:
        r = self.rng.random()
        key = self.rng.randint(1, 3000)
        if r < 0.2:
            cur.execute("INSERT INTO events VALUES (%s, date '2020-01-01' + %s, 'new')",
                        (self.next_id, self.rng.randint(0, 1200)))
            self.next_id += 1
        elif r < 0.35:  # the partition key changes: the row moves to another partition
            cur.execute("UPDATE events SET ts = ts + 400, v = v || '>' WHERE id = %s", (key,))
        elif r < 0.45:
            cur.execute("DELETE FROM events WHERE id = %s", (key,))
        elif r < 0.7:
            cur.execute("INSERT INTO log_plain VALUES ('w', %s)", (self.rng.randint(0, 2),))
        elif r < 0.9:
            cur.execute("UPDATE log_full SET n = n + 10 WHERE ctid = (SELECT ctid FROM log_full WHERE msg = %s LIMIT 1)",
                        (f"f{self.rng.randint(1, 5)}",))
        else:
            cur.execute("DELETE FROM log_full WHERE ctid = (SELECT ctid FROM log_full WHERE msg = 'f6' LIMIT 1)")


def _verify_exact(source: Source, spark) -> None:
    report = verify_tables(source.config, spark, tables=KINDS)
    assert report.ok, report.to_text()


def test_partitioned_and_keyless_tables_snapshot_and_resnapshot_exactly(stack, spark):
    """The parallel snapshot of a partitioned parent (read leaf by leaf into its one mirror) and of tables without
    a primary key (read by block ranges, equal rows kept), handed over to the stream while writes go on; then all
    three re-snapshotted while streaming, repairing drift made by hand. `verify` is exact after each."""
    source = Source(stack, "kinds", KINDS_SETUP, KINDS)
    source.data["capture"]["snapshot_chunk_rows"] = 400
    source.config = parse_config(source.data, "<kinds test>")
    source.yaml.write_text(yaml.safe_dump(source.data))
    writer = KindsWriter(stack, source.dbname)
    pipeline = None
    lake = {t: f"lake.{source.prefix}.{t.split('.')[1]}" for t in KINDS}
    try:
        writer.start()  # writes go on during the snapshot and its handover
        report = run_snapshot(source.config, spark=spark)
        _mark("kinds snapshot")
        assert writer.changes > 0, "no write happened during the snapshot"
        by_name = {t.source: t for t in report.tables}
        state = read_snapshot_state(spark, lake["public.events"])
        leaves = {tuple(c["relation"]) for c in state["chunks"]}
        assert leaves == {("public", "events_2020"), ("public", "events_2021_h0"), ("public", "events_2021_h1"),
                          ("public", "events_other")}, state["chunks"]
        assert by_name["public.events"].chunks_total > len(leaves)
        for keyless in ("public.log_plain", "public.log_full"):
            assert by_name[keyless].chunks_total >= 3, by_name[keyless]  # block ranges, read in parallel
        # One commit for a table without a key (a crash cannot leave part of it to a later snapshot).
        assert len(spark.sql(f"SELECT * FROM {lake['public.log_plain']}.snapshots").collect()) == 1
        assert spark.sql(f"SELECT count(*) FROM {lake['public.log_plain']} WHERE msg = 'm1'").first()[0] >= 50
        source.start_capture()
        _mark("kinds capture")
        pipeline = PipelineThread(source, spark)
        time.sleep(1.0)
        writer.stop()
        source.wait_caught_up()
        pipeline.wait_applied(source, spark, tables=KINDS)
        _mark("kinds streamed")
        _verify_exact(source, spark)
        _mark("kinds verified")

        # Drift by hand: rows lost, changed and invented in the parent's mirror; every copy of a row lost and
        # extra copies of another in the keyless mirrors (rows the writer does not touch while it runs).
        spark.sql(f"DELETE FROM {lake['public.events']} WHERE id % 50 = 0")
        spark.sql(f"UPDATE {lake['public.events']} SET v = 'drifted' WHERE id % 45 = 0")
        spark.sql(f"INSERT INTO {lake['public.events']} VALUES (90000000, DATE '2020-05-05', 'ghost')")
        for table, gone, twice in (("public.log_plain", "m7", "m8"), ("public.log_full", "f7", "f8")):
            spark.sql(f"DELETE FROM {lake[table]} WHERE msg = '{gone}'")
            spark.sql(f"INSERT INTO {lake[table]} SELECT * FROM {lake[table]} WHERE msg = '{twice}'")
        assert not verify_tables(source.config, spark, tables=KINDS).ok
        writer = KindsWriter(stack, source.dbname, first_id=writer.next_id, seed=8)
        writer.start()
        report = run_snapshot(source.config, KINDS, spark)
        _mark("kinds resnapshot")
        assert report.resnapshot and len(report.tables) == 3
        assert _resnapshot_state(spark, lake["public.log_plain"])["stream_kept"] > 0  # 'w' rows streamed meanwhile
        time.sleep(1.0)
        writer.stop()
        source.wait_caught_up()
        pipeline.wait_applied(source, spark, tables=KINDS)
        pipeline.stop()
        _verify_exact(source, spark)
        _mark("kinds re-verified")
    finally:
        writer.stop()
        if pipeline is not None:
            pipeline.stop_event.set()
            pipeline.thread.join(300)
        source.close()
