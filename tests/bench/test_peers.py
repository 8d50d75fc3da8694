"""The peers of `make bench-peers` still start and write (bench/peers/): Flink SQL's Iceberg upsert sink and the
Spark Structured Streaming + MERGE job, each on a few Debezium events of the bench's own input, the table checked
against them. Both writers run at once (each starts a JVM: ~30 s either way). The bench itself is hours long; this
keeps its writers' configs from rotting between its runs."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]

from conftest import catalog_settings  # noqa: E402
from probe import SnapshotProbe  # noqa: E402
from sustained import MirrorModel  # noqa: E402
from workload import ChangeLoad, OrderEvents, create_topic, produce_base  # noqa: E402
from writers import writer_for  # noqa: E402

from lakestream.query import pyiceberg_catalog  # noqa: E402

ROWS = 3


@pytest.mark.bench
@pytest.mark.parametrize("systems", [("flink", "spark")])
def test_peer_writers_start_and_write(stack, spark, tmp_path, systems):
    runs = []
    for system in systems:
        events = OrderEvents(f"peertest_{system}_{int(time.time())}")
        create_topic(stack.bootstrap_servers, events.topic)
        produce_base(stack.bootstrap_servers, events, ROWS)
        model = MirrorModel(ROWS, ROWS + 1)
        load = ChangeLoad(stack.bootstrap_servers, events, model, random.Random(1), 0, 0)
        marker_ms = int(time.time() * 1000)
        load.send_change(marker_ms, force_update=True)  # one update of a base row: the row the probe waits for
        load.producer.flush()
        writer = writer_for(system, stack, tmp_path / system, events.topic, f"peertest_{system}")
        probe = SnapshotProbe(pyiceberg_catalog(catalog_settings(stack)), writer.qualified, interval=0.5)
        runs.append((writer, probe, model, marker_ms))
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
        for writer, _, model, _ in runs:
            got = (
                spark.sql(
                    f"SELECT count(*) AS count, sum(version) AS sum_version, sum(qty) AS sum_qty "
                    f"FROM lake.{writer.qualified}"
                )
                .collect()[0]
                .asDict()
            )
            assert {k: int(v) for k, v in got.items()} == model.totals(), writer.system
    finally:
        for writer, probe, _, _ in runs:
            probe.halt.set()
            writer.kill()
