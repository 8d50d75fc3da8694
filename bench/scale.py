"""Does an upsert batch cost what its changes cost, whatever the table size?

    .venv/bin/python bench/scale.py [--sizes 100000,4000000,20000000] [--batches 7] [--changes 5000]

For each size N: the pipeline creates an upsert table from real Debezium events (schemas off), Spark
SQL fills it to N rows (not timed), one small batch rebuilds the key index (timed apart), then
``--batches`` batches of ``--changes`` random-key changes (10% deletes) run one at a time. The
median batch per size and the ratio of the largest to the smallest size are printed; the table is
verified (count, distinct keys, sum of versions) after the last batch. The LAST line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents, FastProducer, bulk_fill, OrderRow, machine_load, pipeline_data, private_stack, quiet_logs, say, to_config,
)

from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.engine.pipeline import Pipeline  # noqa: E402
from lakestream.spark import session_for  # noqa: E402

def one_size(info, state_dir: Path, spark, size: int, args) -> dict:
    events = DebeziumEvents(f"lsscale{size}", f"orders_{size}", schemas=False)
    table = f"lake.bench.orders_{size}"
    config = to_config(pipeline_data(info, state_dir, f"scale{size}", [
        {"topics": [events.topic], "mode": "upsert", "namespace": "bench", "table": "{table}"}]))
    producer = FastProducer(info.bootstrap_servers)
    now = int(time.time() * 1000)
    for row_id in range(1, 101):
        producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, row_id % 19 + 1, 1), "c", now))
    producer.flush()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    started = time.perf_counter()
    bulk_fill(spark, table, 101, size + 1)
    say(f"{size:,} rows: filled in {time.perf_counter() - started:.1f}s (not timed)")
    rng = random.Random(size)
    versions = {}  # id → version for ids changed (others stay 1); None = deleted
    pipeline = Pipeline(config, spark)
    try:
        producer.send(events.topic, *events.upsert(OrderRow(1, 1, 1, 2), "u", now))
        versions[1] = 2
        producer.flush()
        started = time.perf_counter()
        pipeline.run_batch()
        rebuild_s = time.perf_counter() - started
        index = pipeline.indexes[f"bench.orders_{size}"]
        say(f"{size:,} rows: index rebuild batch {rebuild_s:.1f}s ({len(index):,} keys, {index.nbytes / 1e6:.0f} MB)")
        seconds = []
        for b in range(args.batches):
            for _ in range(args.changes):
                row_id = rng.randrange(1, size + 1)
                if versions.get(row_id, 1) is None:
                    continue
                if rng.random() < 0.1:
                    for key, value in events.delete(row_id, now):
                        producer.send(events.topic, key, value)
                    versions[row_id] = None
                else:
                    version = versions.get(row_id, 1) + 1
                    producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, 3, version), "u", now))
                    versions[row_id] = version
            producer.flush()
            result = pipeline.run_batch()
            seconds.append(result.seconds)
            say(f"  batch {b + 1}: {result.changes:,} changes in {result.seconds:.2f}s "
                f"(tasks {result.read_seconds:.2f}s, commit {result.seconds - result.read_seconds:.2f}s)")
    finally:
        pipeline.close()
    deleted = sum(1 for v in versions.values() if v is None)
    want_rows = size - deleted
    want_version = (size - len(versions)) + sum(v for v in versions.values() if v is not None)
    row = spark.sql(f"SELECT count(*) AS n, count(DISTINCT id) AS k, sum(version) AS v FROM {table}").collect()[0]
    if (row["n"], row["k"], row["v"]) != (want_rows, want_rows, want_version):
        raise SystemExit(f"{size:,}: lake has {row['n']} rows / {row['k']} keys / {row['v']} version sum, "
                         f"expected {want_rows} / {want_rows} / {want_version}")
    median = statistics.median(seconds)
    say(f"{size:,} rows: median batch {median:.2f}s over {len(seconds)} batches; verified {want_rows:,} rows")
    return {"size": size, "median_batch_s": round(median, 3), "batches_s": [round(s, 3) for s in seconds],
            "index_rebuild_batch_s": round(rebuild_s, 2), "index_mb": round(index.nbytes / 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,4000000,20000000")
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--changes", type=int, default=5000)
    args = parser.parse_args()
    quiet_logs()
    sizes = [int(s) for s in args.sizes.split(",")]
    summary = {"bench": "scale", "load_start": machine_load(), "params": vars(args), "sizes": []}
    with private_stack("bench-scale") as (info, state_dir):
        config = to_config(pipeline_data(info, state_dir, "scale", [{"topics": ["x"]}], driver_memory="4g"))
        spark = session_for(config)
        try:
            for size in sizes:
                summary["sizes"].append(one_size(info, state_dir, spark, size, args))
        finally:
            spark.stop()
    medians = {s["size"]: s["median_batch_s"] for s in summary["sizes"]}
    summary["ratio_largest_to_smallest"] = round(medians[max(medians)] / medians[min(medians)], 3)
    summary["load_end"] = machine_load()
    say("\n  rows         median batch   index rebuild   index MB")
    for s in summary["sizes"]:
        say(f"  {s['size']:>11,}   {s['median_batch_s']:>9.2f} s   {s['index_rebuild_batch_s']:>10.1f} s   "
            f"{s['index_mb']:>7.1f}")
    say(f"  median at {max(medians):,} rows / median at {min(medians):,} rows = {summary['ratio_largest_to_smallest']}")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
