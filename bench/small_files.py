"""Small-files benchmark: 500 small commits into a table partitioned by days(ts), region; a fixed
analytical query before and after one automated maintenance round (`maintain_tables`).

Prints files per partition and query seconds before/after; the LAST line is one JSON object.

    .venv/bin/python bench/small_files.py [--commits 500] [--pipeline PIPELINE_YAML]

Without --pipeline a private PostgreSQL (JDBC catalog) + broker stack is started on free ports and
removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakestream.config import MaintenanceSettings, PipelineConfig, load_config, parse_config  # noqa: E402
from lakestream.maintenance import maintain_tables  # noqa: E402
from lakestream.read.inspection import collect_table_metrics  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402

NAMESPACE, TABLE = "bench", "small_files"
REGIONS = ("eu", "us", "apac")
DAYS = 4
ROWS_PER_REGION = 20
QUIET_S = 5
QUERY = f"""
SELECT region, date(ts) AS day, count(*) AS n, round(sum(amount), 2) AS total, round(avg(amount), 4) AS mean,
       count(DISTINCT customer) AS customers
FROM lake.{NAMESPACE}.{TABLE}
WHERE ts >= TIMESTAMP '2024-01-01 00:00:00' AND amount > 10
GROUP BY region, date(ts) ORDER BY region, day
"""


def bench_config(pipeline: str | None, stack_dir: Path | None) -> tuple[PipelineConfig, object | None]:
    maintenance = {
        "policies": [{"compaction": {"quiet_time_s": QUIET_S}, "snapshot_retention_s": 0, "retain_last_snapshots": 10}]
    }
    if pipeline:
        config = load_config(pipeline)
        config.maintenance = MaintenanceSettings.model_validate(maintenance)
        return config, None
    from lakestream.stack import Stack, StackSettings
    from lakestream.stack.process import free_ports

    pg_port, kafka_port = free_ports(2)
    stack = Stack(StackSettings(state_dir=stack_dir, pg_port=pg_port, kafka_port=kafka_port))
    info = stack.up()
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": info.bootstrap_servers},
            "catalog": {
                "name": "lake",
                "uri": info.catalog_jdbc_uri(),
                "user": info.pg_user,
                "password": info.pg_password,
                "warehouse": info.warehouse,
            },
            "streams": [{"topics": ["unused"]}],
            "spark": {"master": "local[2]", "driver_memory": "1500m"},
            "maintenance": maintenance,
        },
        "<bench>",
    )
    return config, stack


def time_query(spark, runs: int = 3) -> float:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        spark.sql(QUERY).collect()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def files_per_partition(spark) -> dict[str, int]:
    rows = spark.sql(
        f"SELECT partition.ts_day AS day, partition.region AS region, file_count "
        f"FROM lake.{NAMESPACE}.{TABLE}.partitions ORDER BY day, region"
    ).collect()
    return {f"{r.day}/{r.region}": int(r.file_count) for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--pipeline", help="use this pipeline's catalog instead of a private stack")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)

    stack_dir = None if args.pipeline else Path(tempfile.mkdtemp(prefix="lakestream-bench-"))
    if stack_dir:
        stack_dir.chmod(0o711)
    config, stack = bench_config(args.pipeline, stack_dir)
    try:
        spark = session_for(config)
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NAMESPACE}")
        spark.sql(f"DROP TABLE IF EXISTS lake.{NAMESPACE}.{TABLE} PURGE")
        spark.sql(
            f"CREATE TABLE lake.{NAMESPACE}.{TABLE} "
            "(id BIGINT, ts TIMESTAMP, region STRING, customer INT, amount DOUBLE) "
            f"USING iceberg PARTITIONED BY (days(ts), region) TBLPROPERTIES ('format-version'='2')"
        )

        rng = random.Random(7)
        start_day = datetime(2024, 1, 1, tzinfo=UTC)
        started = time.perf_counter()
        next_id = 0
        for commit in range(args.commits):
            # Like a stream: each commit lands in the current day, which moves on every commits/DAYS commits.
            day = start_day + timedelta(days=commit * DAYS // args.commits)
            values = []
            for region in REGIONS:
                for _ in range(ROWS_PER_REGION):
                    ts = day + timedelta(seconds=rng.randrange(86400))
                    values.append(
                        f"({next_id}, TIMESTAMP '{ts:%Y-%m-%d %H:%M:%S}', '{region}', "
                        f"{rng.randrange(1000)}, {rng.uniform(0, 100):.2f})"
                    )
                    next_id += 1
            spark.sql(f"INSERT INTO lake.{NAMESPACE}.{TABLE} VALUES {', '.join(values)}")
            if (commit + 1) % 100 == 0:
                print(f"{commit + 1} commits, {time.perf_counter() - started:.0f}s", flush=True)
        ingest_s = time.perf_counter() - started

        name = f"{NAMESPACE}.{TABLE}"
        before = collect_table_metrics(spark, "lake", name)
        parts_before = files_per_partition(spark)
        expected = spark.sql(QUERY).collect()
        query_before = time_query(spark)

        time.sleep(QUIET_S + 1)  # let the last day go quiet, as a stream that moved on would
        started = time.perf_counter()
        results = maintain_tables(spark, config, [name])
        maintenance_s = time.perf_counter() - started
        for result in results:
            print(result.describe())

        after = collect_table_metrics(spark, "lake", name)
        parts_after = files_per_partition(spark)
        assert spark.sql(QUERY).collect() == expected, "maintenance changed the query result"
        query_after = time_query(spark)

        print(f"{'partition':<20} {'files before':>12} {'files after':>12}")
        for key in parts_before:
            print(f"{key:<20} {parts_before[key]:>12} {parts_after.get(key, 0):>12}")
        print(f"query: {query_before:.3f}s before, {query_after:.3f}s after ({query_before / query_after:.1f}x)")
        summary = {
            "bench": "small_files",
            "commits": args.commits,
            "rows": next_id,
            "ingest_s": round(ingest_s, 1),
            "partitions": len(parts_before),
            "data_files_before": before.data_files,
            "data_files_after": after.data_files,
            "files_per_partition_max_before": before.files_per_partition_max,
            "files_per_partition_max_after": after.files_per_partition_max,
            "snapshots_before": before.snapshots,
            "snapshots_after": after.snapshots,
            "metadata_bytes_before": before.metadata_bytes,
            "metadata_bytes_after": after.metadata_bytes,
            "maintenance_s": round(maintenance_s, 1),
            "query_s_before": round(query_before, 3),
            "query_s_after": round(query_after, 3),
            "query_speedup": round(query_before / query_after, 2),
        }
        print(json.dumps(summary))
        return 0
    finally:
        if stack is not None:
            stack.down()
        if stack_dir is not None:
            shutil.rmtree(stack_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
