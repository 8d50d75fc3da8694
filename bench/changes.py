"""Does reading a range's changes cost what the range touched, whatever the table size?

    .venv/bin/python bench/changes.py [--sizes 1000000,20000000] [--batches 24] [--changes 2000]
                                      [--rows-per-file 100000] [--minute 12] [--workload recent|uniform]

For each size N: a mirror created by the pipeline from Debezium events (schemas off), filled to N rows through the
sink's write path (files of ``--rows-per-file`` rows, not timed), then ``--batches`` batches of ``--changes``
random-key changes (10% deletes) through the pipeline, one commit each: ``--workload recent`` (default) draws the
keys from the newest ``--recent-fraction`` of the table (an orders table: recent rows change, old ones rest),
``uniform`` from all of it (every data file is touched by a few commits: the feed then reads the whole table once,
its worst case). Then the change feed
(`lakestream.changes.read_changes`, collected and counted) of the last commit, of the last ``--minute`` commits
(a minute of commits at a 5-s commit interval) and of every batch, each timed; and, for the widest range, the
full-table diff the feed replaces (both snapshots read whole and joined by key), timed too, and compared with
the feed by the count of each change type. Per range: seconds, files and rows the feed read, changes found.
The LAST line is one JSON object; ``ratio_*`` compare the largest size with the smallest.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents,
    FastProducer,
    OrderRow,
    fill_through_write_path,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
)

from lakestream.changes import plan_range, read_changes  # noqa: E402
from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.engine.pipeline import Pipeline  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402
from lakestream.sink.catalog.sink import table_info  # noqa: E402


def _feed(spark, name: str, since: int, until: int) -> dict:
    started = time.perf_counter()
    plan = plan_range(spark, "lake", name, since, until)
    counts = {
        r["_change_type"]: r["count"]
        for r in read_changes(spark, "lake", name, since, until).groupBy("_change_type").count().collect()
    }
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "commits": len(plan.commits),
        "files_read": plan.before_files + plan.after_files,
        "rows_read": plan.before_records + plan.after_records,
        "changes": counts,
    }


def _full_diff(spark, table: str, since: int, until: int) -> dict:
    """The diff the feed replaces: both snapshots read whole, joined by key, rows compared."""
    started = time.perf_counter()
    before = spark.sql(f"SELECT * FROM {table} VERSION AS OF {since}")
    after = spark.sql(f"SELECT * FROM {table} VERSION AS OF {until}")
    cols = [c for c in after.columns if c != "id"]
    b = before.selectExpr("id", f"struct({', '.join(cols)}) AS b")
    a = after.selectExpr("id", f"struct({', '.join(cols)}) AS a")
    joined = b.join(a, "id", "full_outer").where("NOT (b <=> a)")
    kind = "CASE WHEN b IS NULL THEN 'insert' WHEN a IS NULL THEN 'delete' ELSE 'update' END"
    counts = {r[0]: r[1] for r in joined.selectExpr(f"{kind} AS k").groupBy("k").count().collect()}
    return {"seconds": round(time.perf_counter() - started, 2), "changes": counts}


def one_size(info, state_dir, spark, size: int, args) -> dict:
    events = DebeziumEvents(f"lschanges{size}", f"orders_{size}", schemas=False)
    name = f"bench.changes_{size}"
    table = f"lake.{name}"
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            f"changes{size}",
            [{"topics": [events.topic], "mode": "upsert", "namespace": "bench", "table": f"changes_{size}"}],
        )
    )
    producer = FastProducer(info.bootstrap_servers)
    now = int(time.time() * 1000)
    for row_id in range(1, 101):
        producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, row_id % 19 + 1, 1), "c", now))
    producer.flush()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    started = time.perf_counter()
    files = fill_through_write_path(spark, config, name, 101, size + 1, args.rows_per_file)
    say(f"{size:,} rows: filled in {time.perf_counter() - started:.1f}s, {files:,} files (not timed)")
    rng = random.Random(size)
    deleted: set[int] = set()
    snapshots = [int(table_info(spark, "lake", "bench", f"changes_{size}")["snapshot_id"])]
    pipeline = Pipeline(config, spark)
    try:
        for b in range(args.batches):
            low = 1 if args.workload == "uniform" else max(1, int(size * (1 - args.recent_fraction)))
            for _ in range(args.changes):
                row_id = rng.randrange(low, size + 1)
                if row_id in deleted:
                    continue
                if rng.random() < 0.1:
                    for key, value in events.delete(row_id, now):
                        producer.send(events.topic, key, value)
                    deleted.add(row_id)
                else:
                    producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, 3, b + 2), "u", now))
            producer.flush()
            pipeline.run_batch()
            snapshots.append(int(table_info(spark, "lake", "bench", f"changes_{size}")["snapshot_id"]))
            say(f"{size:,} rows: batch {b + 1}/{args.batches} committed")
    finally:
        pipeline.close()
    ranges = {"last_commit": 1, "last_minute": min(args.minute, args.batches), "all_batches": args.batches}
    out: dict = {"size": size, "data_files": files, "ranges": {}}
    for label, n in ranges.items():
        out["ranges"][label] = _feed(spark, name, snapshots[-1 - n], snapshots[-1])
        say(f"{size:,} rows: feed of {label} ({n} commits): {out['ranges'][label]}")
    out["full_diff"] = _full_diff(spark, table, snapshots[-1 - args.batches], snapshots[-1])
    say(f"{size:,} rows: full-table diff of all_batches: {out['full_diff']}")
    out["feed_equals_full_diff"] = out["full_diff"]["changes"] == out["ranges"]["all_batches"]["changes"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,20000000")
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--minute", type=int, default=12, help="commits in the 'last minute' range (5-s commits)")
    parser.add_argument("--changes", type=int, default=2000)
    parser.add_argument("--rows-per-file", type=int, default=100_000)
    parser.add_argument("--workload", choices=["recent", "uniform"], default="recent")
    parser.add_argument("--recent-fraction", type=float, default=0.01, help="recent: keys from the newest fraction")
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args()
    quiet_logs()
    summary: dict = {"bench": "changes", "load_start": machine_load(), "params": vars(args), "sizes": []}
    with private_stack("bench-changes") as (info, state_dir):
        config = to_config(
            pipeline_data(info, state_dir, "changes", [{"topics": ["x"]}], driver_memory=args.driver_memory)
        )
        spark = session_for(config)
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                summary["sizes"].append(one_size(info, state_dir, spark, size, args))
        finally:
            spark.stop()
    small, large = summary["sizes"][0], summary["sizes"][-1]
    for label in ("last_commit", "last_minute", "all_batches"):
        summary[f"ratio_{label}"] = round(large["ranges"][label]["seconds"] / small["ranges"][label]["seconds"], 2)
    summary["ratio_full_diff"] = round(large["full_diff"]["seconds"] / small["full_diff"]["seconds"], 2)
    summary["load_end"] = machine_load()
    say("\n  rows          files   last commit   last minute   all batches   full-table diff   feed = diff")
    for s in summary["sizes"]:
        r = s["ranges"]
        say(
            f"  {s['size']:>11,}  {s['data_files']:>6,}   {r['last_commit']['seconds']:>8.2f} s"
            f"   {r['last_minute']['seconds']:>8.2f} s   {r['all_batches']['seconds']:>8.2f} s"
            f"   {s['full_diff']['seconds']:>12.2f} s   {s['feed_equals_full_diff']}"
        )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
