"""Fan-out benchmark: one pipeline over T Debezium topics → T Iceberg tables. The first batch creates
every table; then each batch brings new changes to only 3 topics. Prints the batch time and the driver's
memory against T; the LAST line is one JSON object.

    .venv/bin/python bench/fanout.py [--tables 3,10,50,200] [--rounds 4] [--changes 200]

The point it shows: a batch touching 3 of 200 tables costs about what it costs with 3 tables.
A private PostgreSQL (JDBC catalog) + Apache Kafka stack is started on free ports and removed afterwards;
each T runs in its own Python process (its own Spark driver JVM), so memory figures do not mix.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents,
    FastProducer,
    OrderRow,
    driver_memory,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
)

ACTIVE = 3  # topics with new data per batch after the first


def worker(args) -> dict[str, Any]:
    """One T: pre-fill, first batch (creates T tables), then ``rounds`` batches touching ACTIVE topics."""
    from lakestream.engine.pipeline import Pipeline
    from lakestream.runtime.spark import session_for

    count = args.worker
    base = json.loads(Path(args.base_config).read_text())
    prefix = f"fan{count}"
    events = [DebeziumEvents(prefix, f"t{i:03d}") for i in range(count)]
    data = {
        **base,
        "name": f"fanout_{count}",
        "kafka": {**base["kafka"], "group_id": f"bench-fanout-{count}"},
        "streams": [
            {"topic_pattern": rf"{prefix}\.public\..*", "mode": "upsert", "namespace": prefix, "table": "{table}"}
        ],
    }
    config = to_config(data)

    producer = FastProducer(config.kafka.bootstrap_servers)
    now = int(time.time() * 1000)
    rows: list[dict[int, OrderRow]] = []
    for ev in events:
        table_rows = {i: OrderRow(i, i, 1, 1) for i in range(1, args.rows_per_table + 1)}
        for row in table_rows.values():
            producer.send(ev.topic, *ev.upsert(row, "c", now))
        rows.append(table_rows)
    producer.flush()

    started = time.perf_counter()
    spark = session_for(config)
    spark.sql("SELECT 1").collect()
    spark_s = time.perf_counter() - started
    memory_idle = driver_memory(spark)
    pipeline = Pipeline(config, spark)
    try:
        first = pipeline.run_batch()
        if first is None or len(first.tables) != count or first.changes != count * args.rows_per_table:
            raise RuntimeError(
                f"first batch wrote {0 if first is None else len(first.tables)} tables "
                f"({0 if first is None else first.changes} changes), expected {count}"
            )
        memory_first = driver_memory(spark)
        say(
            f"  T={count} first batch: {first.records} records → {len(first.tables)} new tables, {first.seconds:.2f}s "
            f"(read {first.read_seconds:.2f}s)"
        )

        batches = []
        for rnd in range(args.rounds):
            active = sorted({(rnd * ACTIVE + j * max(count // ACTIVE, 1)) % count for j in range(ACTIVE)})
            now = int(time.time() * 1000)
            for i in active:
                ev, table_rows = events[i], rows[i]
                for n in range(args.changes):
                    if n % 2 == 0 and table_rows:  # update an existing key...
                        row = table_rows[1 + (n * 7919 + rnd) % len(table_rows)]
                        row.qty, row.version = row.qty % 19 + 1, row.version + 1
                        producer.send(ev.topic, *ev.upsert(row, "u", now))
                    else:  # ...or insert a new one
                        row = OrderRow(len(table_rows) + 1, n, 1, 1)
                        table_rows[row.id] = row
                        producer.send(ev.topic, *ev.upsert(row, "c", now))
            producer.flush()
            result = pipeline.run_batch()
            want = {f"{prefix}.t{i:03d}" for i in active}
            if result is None or set(result.tables) != want or result.changes != len(active) * args.changes:
                raise RuntimeError(f"round {rnd}: wrote {None if result is None else result.tables}, expected {want}")
            batches.append(
                {
                    "tables": sorted(want),
                    "seconds": round(result.seconds, 3),
                    "read_seconds": round(result.read_seconds, 3),
                    "kinds": sorted(set(result.tables.values())),
                }
            )
            say(
                f"  T={count} round {rnd}: {len(active)} tables, {result.records} records, {result.seconds:.2f}s "
                f"(read {result.read_seconds:.2f}s)"
            )
            for i in active:  # the lake must hold exactly the rows produced
                got = spark.sql(f"SELECT count(*) AS n, sum(version) AS v FROM lake.{prefix}.t{i:03d}").collect()[0]
                want_v = sum(r.version for r in rows[i].values())
                if (got["n"], got["v"]) != (len(rows[i]), want_v):
                    raise RuntimeError(
                        f"{prefix}.t{i:03d}: lake has {got['n']} rows / version sum {got['v']}, "
                        f"expected {len(rows[i])} / {want_v}"
                    )
        memory_after = driver_memory(spark)
        spark.sparkContext._jvm.java.lang.System.gc()
        memory_gc = driver_memory(spark)
    finally:
        pipeline.close()
        spark.stop()
    seconds = [b["seconds"] for b in batches]
    return {
        "tables": count,
        "spark_start_s": round(spark_s, 1),
        "first_batch_s": round(first.seconds, 2),
        "first_batch_records": first.records,
        "first_batch_s_per_table": round(first.seconds / count, 3),
        "batch_s_median": round(statistics.median(seconds), 3) if seconds else None,
        "batch_s_median_after_first": round(statistics.median(seconds[1:]), 3) if len(seconds) > 1 else None,
        "batch_s_min": min(seconds, default=None),
        "batch_s_max": max(seconds, default=None),
        "read_s_median": round(statistics.median(b["read_seconds"] for b in batches), 3) if batches else None,
        "batches": batches,
        "jvm_rss_mb_idle": memory_idle["jvm_rss_mb"],
        "jvm_rss_mb_after_first": memory_first["jvm_rss_mb"],
        "jvm_rss_mb": memory_after["jvm_rss_mb"],
        "jvm_heap_used_mb": memory_after["jvm_heap_used_mb"],
        "jvm_heap_after_gc_mb": memory_gc["jvm_heap_used_mb"],
        "python_rss_mb": memory_after["python_rss_mb"],
        "load": machine_load(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="3,10,50,200", help="comma-separated numbers of topics/tables")
    parser.add_argument("--rounds", type=int, default=4, help="batches touching 3 topics, after the first")
    parser.add_argument("--changes", type=int, default=200, help="changes per active topic per batch")
    parser.add_argument("--rows-per-table", type=int, default=5, help="rows each table starts with")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logs()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0

    counts = [int(x) for x in args.tables.split(",") if x.strip()]
    summary: dict[str, Any] = {
        "bench": "fanout",
        "load_start": machine_load(),
        "params": {
            "tables": counts,
            "rounds": args.rounds,
            "changes": args.changes,
            "rows_per_table": args.rows_per_table,
            "active_tables": ACTIVE,
        },
    }
    say(f"machine: {summary['load_start']}")
    runs: list[dict[str, Any]] = []
    status = 0
    with private_stack("bench-fanout") as (info, state_dir):
        base = pipeline_data(info, state_dir, "fanout", [], driver_memory="2g")
        base_path = state_dir / "fanout-base.json"
        fd = os.open(base_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the stack password
        with os.fdopen(fd, "w") as fh:
            json.dump(base, fh)
        for count in counts:
            say(
                f"\n== T={count}: {count} topics × {args.rows_per_table} rows, then {args.rounds} batches "
                f"touching {min(ACTIVE, count)} topics"
            )
            proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(count),
                    "--base-config",
                    str(base_path),
                    "--rounds",
                    str(args.rounds),
                    "--changes",
                    str(args.changes),
                    "--rows-per-table",
                    str(args.rows_per_table),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            lines = []
            for line in proc.stdout:  # progress as it happens; the worker's last line is its JSON
                if line.strip():
                    lines.append(line.rstrip("\n"))
                    if not line.startswith("{"):
                        say(line.rstrip("\n"))
            proc.wait()
            if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
                say(f"FAILED: T={count} exited {proc.returncode}")
                summary.setdefault("errors", []).append(f"T={count}: exit {proc.returncode}")
                status = 1
                continue
            runs.append(json.loads(lines[-1]))

    say(
        "\n  T  first batch (creates T tables)  batch touching 3 (median)  read part  driver JVM RSS  heap after GC"
        "  python RSS"
    )
    for r in runs:
        say(
            f"{r['tables']:>4}  {r['first_batch_s']:>8.2f}s ({r['first_batch_s_per_table']:.3f}s/table)"
            f"  {r['batch_s_median']:>18.2f}s  {r['read_s_median']:>16.2f}s  {r['jvm_rss_mb']:>10.0f} MB"
            f"  {r['jvm_heap_after_gc_mb']:>10.0f} MB  {r['python_rss_mb']:>7.0f} MB"
        )
    if len(runs) >= 2:
        lo, hi = runs[0], runs[-1]
        ratio = hi["batch_s_median"] / lo["batch_s_median"] if lo["batch_s_median"] else None
        summary["batch_s_ratio_max_vs_min_tables"] = None if ratio is None else round(ratio, 2)
        say(f"a batch touching 3 of {hi['tables']} tables costs {ratio:.2f}× one touching 3 of {lo['tables']}")
    summary["runs"] = runs
    summary["load_end"] = machine_load()
    print(json.dumps(summary), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
