"""Re-snapshotting a table while `lakestream capture` and `lakestream run` keep streaming it, against
real PostgreSQL, Debezium, the broker, Spark and Iceberg: a mirror that drifted (rows deleted, changed,
duplicated and invented by hand) is repaired while writes go on, and ends equal to the source."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import orjson
import pytest

from conftest import run_lakestream
from lakestream.capture.process import LAKESTREAM_COMMAND
from lakestream.config import parse_config
from lakestream.errors import ConfigError
from lakestream.snapshot import RESNAPSHOT_PROPERTY, SnapshotError, run_snapshot
from lakestream.snapshot.resnapshot import KILL_BEFORE_COMMIT_ENV, _committed_offsets
from lakestream.source.kafka import KafkaCluster
from lakestream.spark import jvm_helper
from lakestream.verify import verify_tables
from test_parallel_snapshot import TABLES, Source, Writer


class PipelineProcess:
    """`lakestream run` in its own process, as deployed."""

    def __init__(self, source: Source):
        self.log_path = source.workdir / "run.log"
        self.proc = subprocess.Popen([*LAKESTREAM_COMMAND, "run", str(source.yaml)], stdin=subprocess.DEVNULL,
                                     stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_applied(self, source: Source, spark, timeout: float = 240.0) -> None:
        """Wait until each table's committed offsets reach its topic's end (every change applied)."""
        kafka = KafkaCluster(source.config.kafka)
        try:
            deadline = time.monotonic() + timeout
            for table in TABLES:
                topic = f"{source.prefix}.{table}"
                ident = f"lake.{source.prefix}.{table.split('.')[1]}"
                while True:
                    ends = {tp.partition: hw[1] for tp, hw in
                            kafka.watermarks(kafka.partitions_of(lambda t, topic=topic: t == topic)).items()}
                    done = _committed_offsets(spark, ident, topic)
                    # A trailing tombstone is never committed on its own: one short is applied.
                    if all(done.get(p, 0) >= end - 1 for p, end in ends.items()):
                        break
                    assert self.proc.poll() is None, self.log_text()[-3000:]
                    assert time.monotonic() < deadline, f"pipeline behind {ends} vs {done}:\n{self.log_text()[-3000:]}"
                    time.sleep(1.0)
            time.sleep(3.0)  # the tombstone case above: let a last batch land
        finally:
            kafka.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def test_resnapshot_while_streaming_repairs_drift_exactly(stack, spark):
    source = Source(stack, "resnap")
    writer = Writer(stack, source.dbname)
    pipeline = None
    items = f"lake.{source.prefix}.items"
    try:
        _mark('snapshot')
        run_snapshot(source.config, spark=spark)
        _mark('capture')
        source.start_capture()
        pipeline = PipelineProcess(source)
        writer.burst(200)
        source.wait_caught_up()
        _mark('caught-up')
        pipeline.wait_applied(source, spark)
        _drift(spark, items)
        _mark("drifted")
        drifted = verify_tables(source.config, spark, tables=["public.items"])
        assert not drifted.ok and drifted.tables[0].duplicate_keys > 0, drifted.to_text()

        _mark("verified drift")
        # A crash before the commit leaves the mirror as it was; running it again repairs it.
        killed = subprocess.run([*LAKESTREAM_COMMAND, "snapshot", str(source.yaml), "public.items"],
                                capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                                env={**os.environ, KILL_BEFORE_COMMIT_ENV: "1"})
        _mark('killed')
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert spark.sql(f"SELECT count(*) FROM {items} WHERE id = 90000000").first()[0] == 1
        assert not _resnapshot_state(spark, items)

        writer.start()  # writes go on during the whole re-snapshot
        progress_seen: list[int] = []
        report = run_snapshot(source.config, ["public.items"], spark, progress_interval_s=0.5,
                              on_progress=lambda tables: progress_seen.append(tables[0].chunks_done))
        _mark('resnapshot')
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
        _mark('applied')
        pipeline.stop()
        report = verify_tables(source.config, spark, tables=TABLES)
        assert report.ok, report.to_text()
        _mark('verified')
        assert all(t.duplicate_keys == 0 for t in report.tables)
        assert spark.sql(f"SELECT count(*) FROM {items} WHERE id = 90000000").first()[0] == 0
    finally:
        writer.stop()
        if pipeline is not None:
            pipeline.stop()
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
    finally:
        source.close()


def _yaml(tmp_path, config):
    import yaml

    data = config.model_dump(mode="json", exclude_none=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
