"""The write task alone, without Spark: how fast one executor core turns Kafka records into Parquet.

    .venv/bin/python bench/task.py [--records 100000] [--profile] [--events peers]

A private broker (and PostgreSQL, unused) is started; ``--records`` Debezium changes (updates of
random keys, 10% deletes with their tombstones) are produced to a one-partition topic, schemas
off and then schemas on. One in-process `run_write_task` then reads them all, as the first job of
a new table does (the shape pass), and again with the table known (decode, latest per key,
Parquet). Both wall and CPU seconds are reported: CPU seconds are what the task costs whatever
the machine's load; the broker runs on the same cores. The LAST line is one JSON object.

``--events peers``: the peers' input instead (`bench/peers/workload.py`: schemas on, full ``before``
images from REPLICA IDENTITY FULL, doubles for the amount; 85% updates, 10% deletes with their
tombstones, 5% inserts), the write task the peers bench's backlog drain runs in Spark.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DebeziumEvents, FastProducer, OrderRow, machine_load, pipeline_data, private_stack, say, to_config  # noqa: E402

from lakestream.routing import Router  # noqa: E402
from lakestream.sink import report as rp  # noqa: E402
from lakestream.sink.spec import TableSpec  # noqa: E402
from lakestream.sink.write.task import WriteContext, run_write_task  # noqa: E402
from lakestream.source.planner import OffsetRange  # noqa: E402

_ICEBERG = {
    "int": "int",
    "bigint": "long",
    "string": "string",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "date": "date",
    "timestamp_ntz": "timestamp",
    "timestamp": "timestamptz",
    "binary": "binary",
}


def iceberg_schema(shape: rp.NewShape) -> dict:
    fields = []
    for i, (name, ddl) in enumerate(shape.columns, start=1):
        kind = f"decimal({ddl[8:-1].replace(',', ', ')})" if ddl.startswith("decimal(") else _ICEBERG[ddl]
        fields.append({"id": i, "name": name, "required": name in shape.key, "type": kind})
    return {"type": "struct", "schema-id": 0, "fields": fields}


def fill_peers(bootstrap: str, prefix: str, records: int, rng: random.Random) -> tuple[str, int]:
    """The peers' changes over a 1M-row table (`ChangeStream`, the generator of bench/peers) on one partition."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
    from sustained import MirrorModel
    from workload import ChangeStream, OrderEvents

    events = OrderEvents(prefix)
    stream = ChangeStream(bootstrap, events, MirrorModel(1_000_000, 1_000_001), rng)
    now = int(time.time() * 1000)
    for _ in range(records):
        stream.send_change(now)
    stream.producer.flush()
    return events.topic, stream.producer.sent


def fill(bootstrap: str, events: DebeziumEvents, records: int, rng: random.Random) -> int:
    producer = FastProducer(bootstrap)
    now = int(time.time() * 1000)
    sent = 0
    while sent < records:
        row_id = rng.randrange(1, 1_000_000)
        if rng.random() < 0.1:
            for key, value in events.delete(row_id, now):
                producer.send(events.topic, key, value)
        else:
            producer.send(
                events.topic, *events.upsert(OrderRow(row_id, row_id % 5000, rng.randrange(1, 20), 2), "u", now)
            )
        sent += 1
    producer.flush()
    return producer.sent


def timed(
    label: str, ranges: list[OffsetRange], ctx: WriteContext, profile: bool
) -> tuple[float, float, rp.BatchReport]:
    profiler = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    batches = list(run_write_task(ranges, ctx))
    if profiler:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    report = rp.BatchReport()
    import pyarrow as pa

    report.add(pa.Table.from_batches(batches))
    if profiler:
        say(f"-- profile: {label}")
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    return wall, cpu, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary of each task to stderr")
    parser.add_argument(
        "--events",
        choices=("orders", "peers"),
        default="orders",
        help="orders: bench/_common.py's events, schemas off and on; peers: bench/peers' (full before images)",
    )
    args = parser.parse_args()
    result: dict = {"bench": "task", "events": args.events, "records": args.records, "load_start": machine_load()}
    with private_stack("task") as (info, state_dir):
        for schemas in (False, True) if args.events == "orders" else (True,):
            label = "schemas_on" if schemas else "schemas_off"
            if args.events == "peers":
                topic, messages = fill_peers(info.bootstrap_servers, "lstaskpeers", args.records, random.Random(3))
            else:
                events = DebeziumEvents(f"lstask{label[8:]}", f"orders_{label}", schemas=schemas)
                topic, messages = events.topic, fill(info.bootstrap_servers, events, args.records, random.Random(3))
            config = to_config(
                pipeline_data(
                    info,
                    state_dir,
                    f"task_{label}",
                    [{"topics": [topic], "mode": "upsert", "namespace": "bench", "table": "{table}"}],
                )
            )
            router = Router.from_config(config)
            consumer = config.kafka.consumer_config()
            ranges = [OffsetRange(topic, 0, 0, messages, messages, messages)]
            wall, cpu, report = timed(f"{label} shape pass", ranges, WriteContext(consumer, router, {}), args.profile)
            ((name, table),) = report.tables.items()
            shape = next(iter(table.shapes.values()))
            say(
                f"{label}: {messages:,} messages ({args.records:,} changes); new table, shape pass: "
                f"{wall:.2f}s wall, {cpu:.2f}s cpu = {args.records / cpu:,.0f} changes per cpu-second"
            )
            result[f"{label}_shape_pass_changes_per_cpu_s"] = round(args.records / cpu)
            spec = TableSpec(
                name,
                "upsert",
                ["id"],
                iceberg_schema(shape),
                {"spec-id": 0, "fields": []},
                str(state_dir / "data" / label),
                accepted_shapes=frozenset(table.shapes),
            )
            wall, cpu, report = timed(
                f"{label} write", ranges, WriteContext(consumer, router, {name: spec}), args.profile
            )
            files = report.tables[name].files
            if not files or report.dead_letters:
                raise SystemExit(f"{label}: the task wrote {len(files)} files, {len(report.dead_letters)} dead letters")
            say(
                f"{label}: write task: {wall:.2f}s wall, {cpu:.2f}s cpu = {args.records / cpu:,.0f} changes per "
                f"cpu-second, {args.records / wall:,.0f} per wall-second; {sum(f.record_count for f in files):,} rows "
                f"in {len(files)} file(s)"
            )
            result[f"{label}_changes_per_cpu_s"] = round(args.records / cpu)
            result[f"{label}_changes_per_wall_s"] = round(args.records / wall)
    result["load_end"] = machine_load()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
