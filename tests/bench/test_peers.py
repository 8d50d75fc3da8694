"""The peers of `make bench-peers` still start and write (bench/peers/): Flink SQL's Iceberg upsert sink and the
Spark Structured Streaming + MERGE job, each on a few Debezium events of the bench's own input, the table checked
against them. Both writers run at once (each starts a JVM: ~30 s either way). The bench itself is hours long; this
keeps its writers' configs from rotting between its runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]

from conftest import catalog_settings  # noqa: E402
from probe import SnapshotProbe  # noqa: E402
from workload import Generator, create_topic  # noqa: E402
from writers import writer_for  # noqa: E402

from lakestream.read.query import pyiceberg_catalog  # noqa: E402

ROWS = 3


@pytest.mark.bench
@pytest.mark.parametrize("systems", [("flink", "spark")])
def test_peer_writers_start_and_write(stack, spark, tmp_path, systems):
    runs = []
    for system in systems:
        # The bench's own generator process: the base, then one update of a base row (the row the probe waits for).
        generator = Generator(stack.bootstrap_servers, f"peertest_{system}_{int(time.time())}", ROWS, seed=1)
        try:
            create_topic(stack.bootstrap_servers, generator.topic)
            generator.produce_base()
            marker_ms = generator.marker()
            want = generator.totals()
        finally:
            generator.close()
        writer = writer_for(system, stack, tmp_path / system, generator.topic, f"peertest_{system}")
        probe = SnapshotProbe(pyiceberg_catalog(catalog_settings(stack)), writer.qualified, interval=0.5)
        runs.append((writer, probe, want, marker_ms))
    try:
        for writer, probe, _, _ in runs:
            writer.start()
            probe.start()
        deadline = time.monotonic() + 150
        while not all(probe.visible(marker) for _, probe, _, marker in runs):
            for writer, _, _, _ in runs:
                assert writer.alive, f"{writer.system} exited ({writer.proc.returncode}):\n{writer.tail()}"
            assert time.monotonic() < deadline, "not written in 150 s: " + "; ".join(
                f"{w.system}: {len(p.commits)} commits\n{w.tail(15)}" for w, p, _, _ in runs
            )
            time.sleep(0.5)
        for writer, _, want, _ in runs:
            got = (
                spark.sql(
                    f"SELECT count(*) AS count, sum(version) AS sum_version, sum(qty) AS sum_qty "
                    f"FROM lake.{writer.qualified}"
                )
                .collect()[0]
                .asDict()
            )
            assert {k: int(v) for k, v in got.items()} == want, writer.system
    finally:
        for writer, probe, _, _ in runs:
            probe.halt.set()
            writer.kill()
