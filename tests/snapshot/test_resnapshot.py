"""Re-snapshotting a table while `lakestream capture` and `lakestream run` keep streaming it, against
real PostgreSQL, Debezium, the broker, Spark and Iceberg: a mirror that drifted (rows deleted, changed,
duplicated and invented by hand) is repaired while writes go on, and ends equal to the source."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
import yaml
from conftest import run_lakestream
from test_parallel_snapshot import KINDS, TABLES, KindsWriter, Source, Writer, kinds_source, load_kinds

from lakestream.capture.handover import write_handover
from lakestream.config import parse_config
from lakestream.engine.loop import run_pipeline
from lakestream.errors import ConfigError
from lakestream.runtime.spark import jvm_helper
from lakestream.sink.catalog.sink import table_info
from lakestream.snapshot import RESNAPSHOT_PROPERTY, SnapshotError, run_snapshot
from lakestream.snapshot.resnapshot import _committed_offsets
from lakestream.source.kafka import KafkaCluster
from lakestream.verify.compare import verify_tables


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
                    ends = {
                        tp.partition: hw[1]
                        for tp, hw in kafka.watermarks(kafka.partitions_of(lambda t, topic=topic: t == topic)).items()
                    }
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


def _rows_at(spark, ident: str, snapshot_id: int) -> dict[int, list[tuple]]:
    """Each key's rows at a snapshot: (content, ``_row_id``, ``_last_updated_sequence_number``)."""
    rows: dict[int, list[tuple]] = {}
    query = f"SELECT *, _row_id, _last_updated_sequence_number FROM {ident} VERSION AS OF {snapshot_id}"
    for r in spark.sql(query).collect():
        rows.setdefault(r["id"], []).append((tuple(r[:-2]), r["_row_id"], r["_last_updated_sequence_number"]))
    return rows


def _assert_lineage_kept(spark, ident: str) -> dict[str, int]:
    """The re-snapshot's commit R against its parent P, key by key: a row R leaves equal keeps its ``_row_id`` and
    ``_last_updated_sequence_number``; a changed row keeps its ``_row_id`` and takes R's sequence number; a key new
    in R has a new id. Returns how many keys of each kind there were."""
    resnapshot, parent = spark.sql(
        f"SELECT snapshot_id, parent_id FROM {ident}.snapshots WHERE summary['{RESNAPSHOT_PROPERTY}'] IS NOT NULL "
        "ORDER BY committed_at DESC LIMIT 1"
    ).first()
    before, after = _rows_at(spark, ident, parent), _rows_at(spark, ident, resnapshot)
    sequence = max(seq for rows in after.values() for _, _, seq in rows)  # R's: the newest
    assert sequence > max(seq for rows in before.values() for _, _, seq in rows)
    old_ids = {row_id for rows in before.values() for _, row_id, _ in rows}
    keys: dict[str, set[int]] = {"equal": set(), "updated": set(), "new": set(), "duplicated": set()}
    for key, rows in after.items():
        assert len(rows) == 1, (key, rows)
        content, row_id, seq = rows[0]
        was = before.get(key, [])
        if not was:
            assert row_id not in old_ids, (key, row_id)
            keys["new"].add(key)
        elif len(was) > 1:  # duplicated by hand: the row keeps one of the copies' ids
            assert row_id in {w[1] for w in was}, (key, row_id, was)
            keys["duplicated"].add(key)
        elif was[0][0] == content:
            assert (row_id, seq) == was[0][1:], f"key {key} left equal, yet its lineage changed: {was[0]} -> {rows[0]}"
            keys["equal"].add(key)
        else:
            assert (row_id, seq) == (was[0][1], sequence), f"key {key} updated: {was[0]} -> {rows[0]}, R {sequence}"
            keys["updated"].add(key)
    assert 90_000_000 in before and 90_000_000 not in after
    # The change feed of R alone (docs/operating.md, "Change feed"): the keys R updated, added or removed, none it left
    # equal.
    from lakestream.changes import read_changes_arrow

    feed: dict[str, set[int]] = {"insert": set(), "update": set(), "delete": set()}
    for r in read_changes_arrow(spark, "lake", ident.removeprefix("lake."), parent, resnapshot).to_pylist():
        feed[r["_change_type"]].add(r["_before"]["id"] if r["_change_type"] == "delete" else r["id"])
    assert feed["update"] - keys["duplicated"] == keys["updated"]
    assert feed["insert"] == keys["new"]
    # (A key duplicated by hand whose one copy R kept and the other it removed reads as that copy's delete.)
    assert feed["delete"] - keys["duplicated"] == {k for k, w in before.items() if k not in after and len(w) == 1}
    assert not (feed["update"] | feed["insert"] | feed["delete"]) & keys["equal"]
    return {kind: len(ks) for kind, ks in keys.items()}


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
            run_snapshot(
                source.config, ["public.items"], spark, again=True, progress_interval_s=0.1, on_progress=interrupt
            )
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

        report = run_snapshot(
            source.config, ["public.items"], spark, again=True, progress_interval_s=0.5, on_progress=on_progress
        )
        _mark("resnapshot")
        assert report.resnapshot and report.tables[0].chunks_total >= 5
        assert progress_seen and progress_seen[-1] == report.tables[0].chunks_total
        state = _resnapshot_state(spark, items)
        assert state["rows"] > 10_000 and state["table"] == "public.items"
        # Keys the stream changed between the low mark and the commit kept the stream's rows.
        assert state["stream_kept"] > 0, state
        # Rows it found equal were left alone (row lineage kept), drifted ones were updated, lost ones came back.
        kinds = _assert_lineage_kept(spark, items)
        print("re-snapshot by key:", kinds, {k: state[k] for k in ("unchanged", "updated", "added", "replaced")})
        # (Besides the drift, the even ids differ: their unbounded numeric `big` reads '3024' from Debezium's
        # snapshot, which loaded this mirror, and '3024.0' from the parallel reader.)
        assert kinds["equal"] > 5_000 and kinds["updated"] > 0 and kinds["new"] > 0, kinds
        assert state["unchanged"] > 3_000 and state["updated"] > 0, state
        _mark("lineage checked")
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
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "catalog": {"warehouse": "file:///tmp/w", "type": "hadoop"},
            "streams": [{"topics": ["a"]}],
            "state_dir": str(tmp_path),
            "capture": {"database": {"dbname": "d", "user": "u"}, "tables": ["public.t"], "topic_prefix": "shop"},
        }
    )
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
        write_handover(source.config.state_dir, source.config.capture, TABLES, {"lsn": 1, "lsn_text": "0/1"})
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


@pytest.mark.snapshot_slow
def test_partitioned_and_keyless_tables_resnapshot_exactly(stack, spark):
    """A partitioned parent and both kinds of table without a primary key, loaded by the parallel snapshot and
    streamed (`load_kinds`), drifted by hand, then re-snapshotted while streaming and writes go on: `verify` exact.
    Long (a snapshot, capture, three re-snapshots): `make test-snapshot`."""
    source = kinds_source(stack)
    pipeline = writer = None
    lake = {t: f"lake.{source.prefix}.{t.split('.')[1]}" for t in KINDS}
    try:
        next_id = load_kinds(source, spark)
        _mark("kinds loaded")
        pipeline = PipelineThread(source, spark)
        # Drift by hand: rows lost, changed and invented in the parent's mirror; every copy of a row lost and
        # extra copies of another in the keyless mirrors (rows the writer does not touch while it runs).
        spark.sql(f"DELETE FROM {lake['public.events']} WHERE id % 50 = 0")
        spark.sql(f"UPDATE {lake['public.events']} SET v = 'drifted' WHERE id % 45 = 0")
        spark.sql(f"INSERT INTO {lake['public.events']} VALUES (90000000, DATE '2020-05-05', 'ghost')")
        for table, gone, twice in (("public.log_plain", "m7", "m8"), ("public.log_full", "f7", "f8")):
            spark.sql(f"DELETE FROM {lake[table]} WHERE msg = '{gone}'")
            spark.sql(f"INSERT INTO {lake[table]} SELECT * FROM {lake[table]} WHERE msg = '{twice}'")
        assert not verify_tables(source.config, spark, tables=KINDS).ok
        writer = KindsWriter(stack, source.dbname, first_id=next_id, seed=8)
        writer.start()
        report = run_snapshot(source.config, KINDS, spark)
        _mark("kinds resnapshot")
        assert report.resnapshot and len(report.tables) == 3
        for table in ("public.log_plain", "public.log_full"):  # contents the writer changed meanwhile
            assert _resnapshot_state(spark, lake[table])["stream_kept"] > 0, _resnapshot_state(spark, lake[table])
        time.sleep(1.0)
        writer.stop()
        source.wait_caught_up()
        pipeline.wait_applied(source, spark, tables=KINDS)
        pipeline.stop()
        report = verify_tables(source.config, spark, tables=KINDS)
        assert report.ok, report.to_text()
        _mark("kinds re-verified")
    finally:
        if writer is not None:
            writer.stop()
        if pipeline is not None:
            pipeline.stop_event.set()
            pipeline.thread.join(300)
        source.close()
