"""Sink-side freshness: Debezium-shaped events produced at a steady rate across several tables while the
pipeline runs; how long from an event's source commit time (``source.ts_ms``, stamped when produced)
until its table's snapshot is committed.

    .venv/bin/python bench/freshness.py [--rate 5000] [--tables 10] [--duration 60] [--schemas off]

Upserts on random keys of each table (10% deletes) after a short insert phase. The lake is verified
against the produced state at the end. The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents,
    FastProducer,
    OrderRow,
    freshness,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
)

from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402


def produce(
    info,
    events: list[DebeziumEvents],
    rate: float,
    duration: float,
    stop: threading.Event,
    live: list[dict[int, OrderRow]],
    counts: dict[str, int],
) -> None:
    producer = FastProducer(info.bootstrap_servers)
    rng = random.Random(3)
    started = time.monotonic()
    sent = 0
    next_id = [1] * len(events)
    while not stop.is_set() and time.monotonic() - started < duration:
        # Pace in 10 ms slices so the offered rate is steady, not bursty.
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            t = sent % len(events)
            ev, rows = events[t], live[t]
            now = int(time.time() * 1000)
            if len(rows) < 2000 or rng.random() < 0.3:
                row = OrderRow(next_id[t], rng.randrange(1, 50_000), rng.randrange(1, 20), 1)
                next_id[t] += 1
                rows[row.id] = row
                producer.send(ev.topic, *ev.upsert(row, "c", now))
                counts["c"] += 1
            elif rng.random() < 0.1:
                row_id = rng.randrange(1, next_id[t])
                if row_id not in rows:
                    continue
                del rows[row_id]
                for key, value in ev.delete(row_id, now):
                    producer.send(ev.topic, key, value)
                counts["d"] += 1
            else:
                row_id = rng.randrange(1, next_id[t])
                row = rows.get(row_id)
                if row is None:
                    continue
                row.qty, row.version = rng.randrange(1, 20), row.version + 1
                producer.send(ev.topic, *ev.upsert(row, "u", now))
                counts["u"] += 1
            sent += 1
        producer._producer.poll(0)
        time.sleep(0.01)
    producer.flush()
    counts["seconds"] = time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="changes/s over all tables")
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--schemas", choices=["on", "off"], default="on")
    parser.add_argument("--commit-interval", type=float, default=0.0)
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="engine.overlap_commits: false (each batch's job waits for the previous commit)",
    )
    args = parser.parse_args()
    quiet_logs()
    summary = {"bench": "freshness", "load_start": machine_load(), "params": vars(args)}
    say(f"machine: {summary['load_start']}")
    with private_stack("bench-fresh") as (info, state_dir):
        events = [DebeziumEvents("lsfresh", f"t{i:02d}", schemas=args.schemas == "on") for i in range(args.tables)]
        config = to_config(
            pipeline_data(
                info,
                state_dir,
                "fresh",
                [{"topic_pattern": r"lsfresh\.public\..*", "mode": "upsert", "namespace": "fresh", "table": "{table}"}],
                engine={
                    "commit_interval_s": args.commit_interval,
                    "topic_refresh_s": 5,
                    "overlap_commits": not args.no_overlap,
                },
            )
        )
        spark = session_for(config)
        spark.sql("SELECT 1").collect()
        # Tables exist before the clock starts (creating 10 tables is the fan-out benchmark's job).
        warm = FastProducer(info.bootstrap_servers)
        live = [dict() for _ in events]
        for t, ev in enumerate(events):
            row = OrderRow(10_000_000, 1, 1, 1)
            warm.send(ev.topic, *ev.upsert(row, "c", int(time.time() * 1000)))
            live[t][row.id] = row
        warm.flush()
        run_pipeline(config, spark=spark, stop_when_idle=True)
        counts = {"c": 0, "u": 0, "d": 0}
        stop = threading.Event()
        results = []
        pipeline_thread = threading.Thread(
            target=lambda: results.extend(run_pipeline(config, stop=stop, spark=spark)), daemon=True
        )
        started_ms = int(time.time() * 1000)
        pipeline_thread.start()
        produce(info, events, args.rate, args.duration, threading.Event(), live, counts)
        # Let the pipeline drain, then stop it.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = sum(
                spark.sql(f"SELECT count(*) FROM lake.fresh.t{i:02d}").collect()[0][0] for i in range(args.tables)
            )
            if got == sum(len(rows) for rows in live):
                break
            time.sleep(1)
        stop.set()
        pipeline_thread.join(120)
        for i, rows in enumerate(live):
            row = spark.sql(f"SELECT count(*) AS n, sum(version) AS v FROM lake.fresh.t{i:02d}").collect()[0]
            want = (len(rows), sum(r.version for r in rows.values()))
            if (row["n"], row["v"]) != want:
                raise SystemExit(f"table t{i:02d}: lake has {row['n']} rows / version sum {row['v']}, want {want}")
        fresh = freshness(results, started_ms)
        changes = counts["c"] + counts["u"] + counts["d"]
        batch_s = sorted(r.seconds for r in results)
        job_s = sorted(r.read_seconds for r in results)  # plan + write job (+ alerts, windows): before the commits
        summary.update(
            {
                "changes": changes,
                "offered_changes_per_s": round(changes / counts["seconds"]),
                "batches": len(results),
                "batch_median_s": round(batch_s[len(batch_s) // 2], 2) if batch_s else None,
                "job_median_s": round(job_s[len(job_s) // 2], 2) if job_s else None,
                "overlapped": sum(r.overlapped for r in results),
                **fresh,
                "load_end": machine_load(),
            }
        )
        say(
            f"{changes:,} changes over {args.tables} tables at {summary['offered_changes_per_s']:,}/s for "
            f"{counts['seconds']:.0f}s: {len(results)} batches (median {summary['batch_median_s']}s), "
            f"freshness p50 {fresh['freshness_p50_s']}s, p99 {fresh['freshness_p99_s']}s; lake verified"
        )
        spark.stop()
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
