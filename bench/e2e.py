"""End-to-end benchmark: sink-only upserts from a pre-filled topic, then PostgreSQL → Debezium → Kafka →
Spark → Iceberg under a live insert/update/delete load, with freshness.

    .venv/bin/python bench/e2e.py [--records 200000] [--duration 60] [--batch N] [--skip-sink] [--skip-e2e]
    .venv/bin/python bench/e2e.py --only steady --only append     # the sink's parts alone

Parts: `steady` (upserts with 10% deletes into a table of --base-rows, schemas off and on), `append` (plain
JSON events into a new append table; Debezium inserts into a new upsert table), `sink` (a pre-filled topic
of mixed changes), `e2e` (PostgreSQL and Debezium included).

A private PostgreSQL + Apache Kafka stack is started on free ports in a fresh state directory and removed
afterwards. Both parts verify the final Iceberg table against what must be there (row count, distinct
keys, column sums) and fail loudly otherwise. Human-readable figures first; the LAST line is one JSON
object (`sink_upserts_per_s`, `e2e_changes_per_s`, `freshness_p50_s`, `freshness_p99_s`, load, parameters).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    ORDERS_DDL,
    STATUSES,
    DebeziumEvents,
    FastProducer,
    OrderRow,
    bulk_fill,
    driver_memory,
    freshness,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
    write_pipeline_yaml,
)

from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402

NAMESPACE = "bench"


class BenchmarkFailure(Exception):
    """The lake does not hold what it must: the figures would be meaningless."""


def lake_totals(spark, table: str) -> dict[str, int]:
    row = spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT id) AS keys, coalesce(sum(qty), 0) AS qty, "
        f"coalesce(sum(version), 0) AS version FROM lake.{NAMESPACE}.{table}"
    ).collect()[0]
    return {k: int(row[k]) for k in ("n", "keys", "qty", "version")}


# -- sink only ------------------------------------------------------------------------------------


def send_change(
    producer: FastProducer,
    events: DebeziumEvents,
    live: dict[int, OrderRow],
    row_id: int,
    delete: bool,
    rng: random.Random,
    now: int,
    ops: dict[str, int],
) -> None:
    """An update (new qty, version + 1) or a delete (+ tombstone) of a live row, mirrored in ``live``."""
    if delete:
        del live[row_id]
        for key, value in events.delete(row_id, now):
            producer.send(events.topic, key, value)
        ops["d"] += 1
    else:
        row = live[row_id]
        row.qty, row.version = rng.randrange(1, 20), row.version + 1
        producer.send(events.topic, *events.upsert(row, "u", now))
        ops["u"] += 1


def fill_topic(
    bootstrap: str, events: DebeziumEvents, records: int, delete_share: float, rng: random.Random
) -> tuple[dict[int, OrderRow], dict[str, int], int]:
    """Half inserts, then updates of existing keys with some deletes (each delete + tombstone)."""
    producer = FastProducer(bootstrap)
    live: dict[int, OrderRow] = {}
    ops = {"c": 0, "u": 0, "d": 0}
    inserts = records // 2
    now = int(time.time() * 1000)
    for row_id in range(1, inserts + 1):
        row = OrderRow(row_id, rng.randrange(1, 50_000), rng.randrange(1, 20), 1)
        live[row_id] = row
        producer.send(events.topic, *events.upsert(row, "c", now))
        ops["c"] += 1
    for _ in range(records - inserts):
        row_id = rng.randrange(1, inserts + 1)
        while row_id not in live:  # a deleted key cannot be updated at the source either
            row_id = rng.randrange(1, inserts + 1)
        send_change(producer, events, live, row_id, rng.random() < delete_share and len(live) > 1, rng, now, ops)
    producer.flush()
    return live, ops, producer.sent


def sink_benchmark(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    table = "orders_sink"
    events = DebeziumEvents("lssink", table)
    say(f"\n== sink only: {args.records:,} Debezium change events (schemas on) → {NAMESPACE}.{table}")
    started = time.perf_counter()
    live, ops, sent = fill_topic(info.bootstrap_servers, events, args.records, args.delete_share, random.Random(42))
    fill_s = time.perf_counter() - started
    say(
        f"topic {events.topic}: {sent:,} records ({ops['c']:,} c, {ops['u']:,} u, {ops['d']:,} d + tombstones) "
        f"produced in {fill_s:.1f}s"
    )

    engine = {"max_records_per_batch": args.batch} if args.batch else {}
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            "bench_sink",
            [{"topics": [events.topic], "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"}],
            engine=engine,
        )
    )
    spark = ensure_spark(spark_box, config)
    load_before = machine_load()
    started = time.perf_counter()
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    seconds = time.perf_counter() - started
    memory = driver_memory(spark)

    got = lake_totals(spark, table)
    want = {
        "n": len(live),
        "keys": len(live),
        "qty": sum(r.qty for r in live.values()),
        "version": sum(r.version for r in live.values()),
    }
    dead = sum(r.dead_letters for r in results)
    changes = sum(r.changes for r in results)
    for r in results:
        say(
            f"  batch {r.batch_id}: {r.records:,} records, {r.changes:,} changes, {r.seconds:.2f}s "
            f"(read+decode {r.read_seconds:.2f}s, write {r.seconds - r.read_seconds:.2f}s) {r.tables}"
        )
    if got != want or dead or changes != args.records:
        raise BenchmarkFailure(
            f"sink: lake {got}, expected {want}; {changes:,} changes of {args.records:,} written, {dead} dead letters"
        )
    rate = args.records / seconds
    say(
        f"sink: {args.records:,} changes in {seconds:.1f}s = {rate:,.0f} changes/s over {len(results)} batch(es); "
        f"verified {got['n']:,} rows, sums match; driver JVM RSS {memory['jvm_rss_mb']} MB"
    )
    return {
        "sink_upserts_per_s": round(rate),
        "sink_seconds": round(seconds, 2),
        "sink_changes": args.records,
        "sink_records": sent,
        "sink_ops": ops,
        "sink_fill_s": round(fill_s, 1),
        "sink_rows_final": got["n"],
        "sink_batches": [
            {
                "records": r.records,
                "seconds": round(r.seconds, 2),
                "read_seconds": round(r.read_seconds, 2),
                "kinds": r.tables,
            }
            for r in results
        ],
        "sink_memory": memory,
        "sink_load_before": load_before,
        "sink_load_after": machine_load(),
    }


def steady_upserts(info, state_dir: Path, args, spark_box: list, schemas: bool) -> dict[str, Any]:
    """Steady-state upserts (10% deletes) into a table that already holds ``--base-rows`` rows."""
    label = "schemas_on" if schemas else "schemas_off"
    table = f"steady_{label}"
    events = DebeziumEvents(f"lssteady{'on' if schemas else 'off'}", table, schemas=schemas)
    rng = random.Random(7)
    now = int(time.time() * 1000)
    engine = {"max_records_per_batch": args.batch} if args.batch else {}
    if args.per_task:
        engine["max_records_per_task"] = args.per_task
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            f"bench_{table}",
            [{"topics": [events.topic], "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"}],
            engine=engine,
        )
    )
    spark = ensure_spark(spark_box, config)
    say(f"\n== steady-state upserts, {label}: base table of {args.base_rows:,} rows")
    producer = FastProducer(info.bootstrap_servers)
    live: dict[int, OrderRow] = {}
    for row_id in range(1, 1001):  # the pipeline creates the table from real events
        live[row_id] = OrderRow(row_id, rng.randrange(1, 50_000), rng.randrange(1, 20), 1)
        producer.send(events.topic, *events.upsert(live[row_id], "c", now))
    producer.flush()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    started = time.perf_counter()
    bulk_fill(spark, f"lake.{NAMESPACE}.{table}", 1001, args.base_rows + 1)
    say(f"base filled by Spark SQL to {args.base_rows:,} rows in {time.perf_counter() - started:.1f}s (not timed)")
    for row_id in range(1001, args.base_rows + 1):
        live[row_id] = OrderRow(row_id, row_id % 50000, row_id % 19 + 1, 1)
    # One small batch rebuilds the key index (the bulk fill was another writer): timed apart.
    producer.send(events.topic, *events.upsert(live[1], "u", now))
    producer.flush()
    started = time.perf_counter()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    rebuild_s = time.perf_counter() - started
    ops = {"u": 0, "d": 0}
    keys = list(live)
    for _ in range(args.records):
        row_id = keys[rng.randrange(len(keys))]
        if row_id not in live:
            continue
        send_change(producer, events, live, row_id, rng.random() < args.delete_share, rng, now, ops)
    producer.flush()
    changes = ops["u"] + ops["d"]
    load_before = machine_load()
    started = time.perf_counter()
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    seconds = time.perf_counter() - started
    got = lake_totals(spark, table)
    want = {
        "n": len(live),
        "keys": len(live),
        "qty": sum(r.qty for r in live.values()),
        "version": sum(r.version for r in live.values()),
    }
    for r in results:
        steps = r.table_steps_ms.get(f"{NAMESPACE}.{table}", {})
        say(
            f"  batch {r.batch_id}: {r.changes:,} changes, {r.seconds:.2f}s (tasks {r.read_seconds:.2f}s, "
            f"commit {r.seconds - r.read_seconds:.2f}s: resolve {steps.get('write.resolve', 0):.0f} ms, row lineage "
            f"{steps.get('write.lineage', 0):.0f} ms, jvm {steps.get('write.jvm', 0):.0f} ms)"
        )
    if got != want:
        raise BenchmarkFailure(f"steady {label}: lake {got}, expected {want}")
    rate = changes / seconds
    say(
        f"steady {label}: {changes:,} changes ({ops['d']:,} deletes) into {args.base_rows:,} rows in {seconds:.1f}s "
        f"= {rate:,.0f} changes/s; index rebuild batch {rebuild_s:.1f}s; verified {got['n']:,} rows, sums match"
    )
    return {
        f"steady_{label}_changes_per_s": round(rate),
        f"steady_{label}_seconds": round(seconds, 2),
        f"steady_{label}_changes": changes,
        f"steady_{label}_base_rows": args.base_rows,
        f"steady_{label}_index_rebuild_batch_s": round(rebuild_s, 2),
        f"steady_{label}_batches": [round(r.seconds, 2) for r in results],
        f"steady_{label}_load_before": load_before,
    }


def append_path(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    """Plain JSON events (an append stream with an event-time field) into a new table: the append path."""
    table = "append_events"
    topic = "lsevents.clicks"
    producer = FastProducer(info.bootstrap_servers)
    base_ms = int(time.time() * 1000) - 3_600_000
    for i in range(1, args.append_rows + 1):
        producer.send(
            topic,
            None,
            orjson.dumps(
                {
                    "event_id": i,
                    "user_id": i % 50_000,
                    "kind": STATUSES[i % len(STATUSES)],
                    "amount": (i % 1000) * 0.25,
                    "qty": i % 19 + 1,
                    "mobile": i % 3 == 0,
                    "page": f"/p/{i % 400}",
                    "ts": base_ms + i,
                }
            ),
        )
    producer.flush()
    say(f"\n== append path: {args.append_rows:,} JSON events into a new append table")
    spark, seconds, results, load_before = timed_load(
        info,
        state_dir,
        spark_box,
        "bench_append",
        {"topics": [topic], "mode": "append", "namespace": NAMESPACE, "table": table, "event_time_field": "ts"},
    )
    got = spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT event_id) AS ids, coalesce(sum(qty), 0) AS qty, "
        f"min(ts) = timestamp_millis({base_ms + 1}) AS first_ts FROM lake.{NAMESPACE}.{table}"
    ).first()
    want_qty = sum(i % 19 + 1 for i in range(1, args.append_rows + 1))
    if (got["n"], got["ids"], got["qty"], got["first_ts"]) != (args.append_rows, args.append_rows, want_qty, True):
        raise BenchmarkFailure(f"append path: lake {got.asDict()}, expected {args.append_rows} events, qty {want_qty}")
    return load_figures(
        "append",
        "append path",
        args.append_rows,
        seconds,
        results,
        load_before,
        "verified count, ids, sums, event time",
    )


def timed_load(
    info, state_dir: Path, spark_box: list, name: str, stream: dict[str, Any]
) -> tuple[Any, float, list, dict]:
    """Run a pipeline of one stream over its topic's backlog in large batches: (spark, seconds, batch results,
    machine load before)."""
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            name,
            [stream],
            engine={"max_records_per_batch": 1_000_000, "max_records_per_task": 250_000},
        )
    )
    spark = ensure_spark(spark_box, config)
    load_before = machine_load()
    started = time.perf_counter()
    results = run_pipeline(config, spark=spark, stop_when_idle=True)
    return spark, time.perf_counter() - started, results, load_before


def mirror_insert_path(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    """Inserts (Debezium ``c`` events, schemas off) into a new upsert table: an initial load through Kafka."""
    table = "insert_path"
    events = DebeziumEvents("lsinsert", table, schemas=False)
    producer = FastProducer(info.bootstrap_servers)
    now = int(time.time() * 1000)
    for row_id in range(1, args.append_rows + 1):
        producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, row_id % 19 + 1, 1), "c", now))
    producer.flush()
    say(f"\n== mirror inserts: {args.append_rows:,} Debezium inserts (schemas off) into a new upsert table")
    spark, seconds, results, load_before = timed_load(
        info,
        state_dir,
        spark_box,
        "bench_insert",
        {"topics": [events.topic], "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"},
    )
    got = lake_totals(spark, table)
    if got["n"] != args.append_rows or got["keys"] != args.append_rows:
        raise BenchmarkFailure(f"mirror inserts: lake {got}, expected {args.append_rows} rows")
    return load_figures(
        "mirror_insert", "mirror inserts", args.append_rows, seconds, results, load_before, "verified count and keys"
    )


def load_figures(
    key: str, label: str, rows: int, seconds: float, results: list, load_before: dict, verified: str
) -> dict[str, Any]:
    rate = rows / seconds
    say(
        f"{label}: {rows:,} rows in {seconds:.1f}s = {rate:,.0f} rows/s over {len(results)} batch(es) "
        f"(the first creates the table); {verified}"
    )
    return {
        f"{key}_rows_per_s": round(rate),
        f"{key}_seconds": round(seconds, 2),
        f"{key}_batches": [round(r.seconds, 2) for r in results],
        f"{key}_load_before": load_before,
    }


def ensure_spark(spark_box: list, config):
    """One SparkSession for both parts; its start-up is never part of a timing."""
    if not spark_box:
        started = time.perf_counter()
        spark = session_for(config)
        spark.sql("SELECT 1").collect()
        spark_box.append(spark)
        say(f"spark session started in {time.perf_counter() - started:.1f}s (not timed)")
    return spark_box[0]


# -- end to end -----------------------------------------------------------------------------------


class LoadGenerator:
    """A few PostgreSQL connections running insert/update/delete transactions on disjoint keys."""

    INSERTS, UPDATES, DELETES = 10, 8, 2  # per transaction

    def __init__(self, dsn: str, table: str, connections: int, first_id: int, seeded: int, rate: float):
        self.dsn, self.table, self.connections, self.rate = dsn, table, connections, rate
        self.first_id, self.seeded = first_id, seeded
        self.stop = threading.Event()
        self.changes = [0] * connections
        self.transactions = [0] * connections
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(connections)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)
        if self.errors:
            raise self.errors[0]

    @property
    def total_changes(self) -> int:
        return sum(self.changes)

    def _run(self, index: int) -> None:
        import psycopg2
        from psycopg2.extras import execute_values

        try:
            rng = random.Random(index)
            live = [i for i in range(1, self.seeded + 1) if i % self.connections == index]
            next_id = self.first_id + index
            per_txn = self.INSERTS + self.UPDATES + self.DELETES
            interval = per_txn * self.connections / self.rate if self.rate > 0 else 0.0
            conn = psycopg2.connect(self.dsn)
            cur = conn.cursor()
            deadline = time.monotonic()
            while not self.stop.is_set():
                rows = []
                for _ in range(self.INSERTS):
                    rows.append(
                        (
                            next_id,
                            rng.randrange(1, 50_000),
                            STATUSES[0],
                            rng.randrange(1, 20) * 19.99,
                            rng.randrange(1, 20),
                            19.99,
                            next_id % 3 == 0,
                            1,
                            f"order {next_id}",
                        )
                    )
                    live.append(next_id)
                    next_id += self.connections
                execute_values(
                    cur,
                    f"INSERT INTO {self.table} (id, customer_id, status, amount, qty, price, express, "
                    f"version, note, created_day, created_at, updated_at) VALUES %s",
                    rows,
                    template="(%s, %s, %s, %s, %s, %s, %s, %s, %s, current_date, localtimestamp, now())",
                )
                changed = cur.rowcount
                targets = rng.sample(live, self.UPDATES + self.DELETES)
                cur.execute(
                    f"UPDATE {self.table} SET qty = qty %% 19 + 1, version = version + 1, status = %s, "
                    f"updated_at = now() WHERE id = ANY(%s)",
                    (rng.choice(STATUSES), targets[: self.UPDATES]),
                )
                changed += cur.rowcount
                gone = set(targets[self.UPDATES :])
                cur.execute(f"DELETE FROM {self.table} WHERE id = ANY(%s)", (list(gone),))
                changed += cur.rowcount
                conn.commit()
                _remove(live, gone)
                self.changes[index] += changed
                self.transactions[index] += 1
                if interval:
                    deadline += interval
                    self.stop.wait(max(0.0, deadline - time.monotonic()))
            conn.close()
        except BaseException as exc:  # noqa: BLE001 — reported by finish()
            self.errors.append(exc)


def _remove(live: list[int], gone: set[int]) -> None:
    # Swap-remove: order does not matter for random picks.
    for row_id in gone:
        i = live.index(row_id)
        live[i] = live[-1]
        live.pop()


def source_totals(dsn: str, table: str) -> dict[str, int]:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(
            f"SELECT count(*), count(DISTINCT id), coalesce(sum(qty), 0), coalesce(sum(version), 0) FROM {table}"
        )
        n, keys, qty, version = cur.fetchone()
    conn.close()
    return {"n": int(n), "keys": int(keys), "qty": int(qty), "version": int(version)}


def e2e_benchmark(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    import psycopg2

    from lakestream.capture.process import CaptureProcess

    table, prefix = "bench_orders", "lse2e"
    say(
        f"\n== end to end: PostgreSQL → Debezium → Kafka → Spark → Iceberg, {args.duration:.0f}s of load "
        f"({args.connections} connections, rate {'unlimited' if not args.rate else f'{args.rate:,.0f}/s'})"
    )
    dsn = info.pg_dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS public.{table}")
        cur.execute(f"CREATE TABLE public.{table} ({ORDERS_DDL.format(price_type=args.price_type)})")
        cur.execute(
            f"INSERT INTO public.{table} (id, customer_id, status, amount, qty, price, express, version, "
            f"created_day, created_at, updated_at, note) SELECT i, i %% 50000, 'new', i %% 19 * 19.99, i %% 19 + 1, "
            f"19.99, i %% 3 = 0, 1, current_date, localtimestamp, now(), 'seed ' || i "
            f"FROM generate_series(1, %s) AS i",
            (args.seed_rows,),
        )
    conn.close()

    capture = {
        "database": {
            "host": info.pg_host,
            "port": info.pg_port,
            "dbname": info.source_db,
            "user": info.pg_user,
            "password": info.pg_password,
        },
        "tables": [f"public.{table}"],
        "topic_prefix": prefix,
        "slot_name": "lsbench_e2e",
        "publication_name": "lsbench_e2e_pub",
    }
    engine = {
        "commit_interval_s": args.commit_interval,
        **({"max_records_per_batch": args.batch} if args.batch else {}),
    }
    data = pipeline_data(
        info,
        state_dir,
        "bench_e2e",
        [{"topics": [f"{prefix}.public.{table}"], "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"}],
        engine=engine,
        capture=capture,
    )
    config = to_config(data)
    yaml_path = write_pipeline_yaml(state_dir / "e2e-pipeline.yaml", data)
    spark = ensure_spark(spark_box, config)

    capture_proc = CaptureProcess(yaml_path, log_path=state_dir / "capture.log")
    stop = threading.Event()
    results: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            run_pipeline(config, spark=spark, stop=stop, on_batch=results.append)
        except BaseException as exc:  # noqa: BLE001 — re-raised by the main thread
            failure.append(exc)

    pipeline_thread = threading.Thread(target=run, name="pipeline", daemon=True)
    try:
        started = time.perf_counter()
        capture_proc.start()
        capture_proc.wait_until_streaming(timeout=300)
        say(f"capture streaming after {time.perf_counter() - started:.1f}s (snapshot of {args.seed_rows:,} rows)")
        pipeline_thread.start()
        wait_for_lake(spark, table, source_totals(dsn, table), pipeline_thread, failure, timeout=args.catchup_timeout)
        say(f"snapshot in the lake after {time.perf_counter() - started:.1f}s; starting the load")

        load = LoadGenerator(dsn, f"public.{table}", args.connections, args.seed_rows + 1, args.seed_rows, args.rate)
        load_before = machine_load()
        load_start_ms = int(time.time() * 1000)
        load_start = time.time()
        load.start()
        next_report = time.monotonic() + 10
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            check_alive(pipeline_thread, failure)
            if load.errors:
                break
            if time.monotonic() >= next_report:
                lag = results[-1].lag if results else None
                say(
                    f"  t+{time.time() - load_start:.0f}s: {load.total_changes:,} source changes, "
                    f"{sum(r.changes for r in results if r.commit_ts_ms >= load_start_ms):,} in the lake, "
                    f"{len(results)} batches, lag {lag}"
                )
                next_report += 10
        load.finish()
        load_s = time.time() - load_start
        load_during = machine_load()
        source_changes = load.total_changes
        want = source_totals(dsn, table)
        say(
            f"load: {source_changes:,} changes in {sum(load.transactions):,} transactions over {load_s:.1f}s "
            f"= {source_changes / load_s:,.0f} changes/s at the source; source has {want['n']:,} rows"
        )

        got, done_ms = wait_for_lake(
            spark, table, want, pipeline_thread, failure, timeout=args.catchup_timeout, results=results
        )
        e2e_s = done_ms / 1000 - load_start
        memory = driver_memory(spark)
    finally:
        stop.set()
        if pipeline_thread.is_alive():
            pipeline_thread.join(180)
        capture_proc.stop()

    streaming = [r for r in results if r.commit_ts_ms >= load_start_ms]
    fresh = freshness(streaming)
    lake_changes = sum(r.changes for r in streaming)
    batch_s = sorted(r.seconds for r in streaming)
    rate = source_changes / e2e_s
    say(
        f"e2e: all {source_changes:,} source changes in the lake {e2e_s:.1f}s after the load started "
        f"({e2e_s - load_s:.1f}s after it ended) = {rate:,.0f} changes/s; verified {got['n']:,} rows, sums match"
    )
    say(
        f"     {len(streaming)} batches, median {batch_s[len(batch_s) // 2] if batch_s else 0:.2f}s, "
        f"{lake_changes:,} change events read (≥ source changes: Debezium is at-least-once)"
    )
    say(
        f"     freshness (source commit → visible in Iceberg): p50 {fresh['freshness_p50_s']}s, "
        f"p99 {fresh['freshness_p99_s']}s over {fresh['freshness_batches']} batches"
    )
    return {
        "e2e_changes_per_s": round(rate),
        "e2e_seconds": round(e2e_s, 2),
        "e2e_source_changes": source_changes,
        "e2e_source_changes_per_s": round(source_changes / load_s),
        "e2e_load_seconds": round(load_s, 1),
        "e2e_catchup_after_load_s": round(e2e_s - load_s, 2),
        "e2e_lake_change_events": lake_changes,
        "e2e_rows_final": got["n"],
        "e2e_batches": len(streaming),
        "e2e_batch_seconds_p50": round(batch_s[len(batch_s) // 2], 2) if batch_s else None,
        "e2e_batch_seconds_max": round(batch_s[-1], 2) if batch_s else None,
        **fresh,
        "e2e_memory": memory,
        "e2e_load_before": load_before,
        "e2e_load_during": load_during,
    }


def check_alive(thread: threading.Thread, failure: list[BaseException]) -> None:
    if failure:
        raise BenchmarkFailure(f"the pipeline failed: {failure[0]!r}") from failure[0]
    if not thread.is_alive():
        raise BenchmarkFailure("the pipeline thread stopped")


def wait_for_lake(
    spark,
    table: str,
    want: dict[str, int],
    thread: threading.Thread,
    failure: list[BaseException],
    timeout: float,
    results: list | None = None,
) -> tuple[dict[str, int], int]:
    """Poll the Iceberg table until it equals the source totals; BenchmarkFailure on timeout.

    Returns the totals and the commit time (ms) of the last batch committed before the matching
    read: that batch is the one that made the lake complete.
    """
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        check_alive(thread, failure)
        committed_ms = max((r.commit_ts_ms for r in list(results or [])), default=0)
        try:
            got = lake_totals(spark, table)
        except Exception as exc:  # noqa: BLE001 — the table appears with the first batch
            if "TABLE_OR_VIEW_NOT_FOUND" not in str(exc) and "cannot be found" not in str(exc):
                raise
            got = {}
        if got == want:
            return got, committed_ms
        time.sleep(1.0)
    raise BenchmarkFailure(f"the lake does not match the source after {timeout:.0f}s: lake {got}, source {want}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="sink-only change events (default 200000)")
    parser.add_argument("--delete-share", type=float, default=0.1, help="share of deletes among the non-inserts")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of source load (default 60)")
    parser.add_argument("--batch", type=int, default=None, help="engine.max_records_per_batch (default: engine's)")
    parser.add_argument(
        "--per-task",
        type=int,
        default=None,
        help="engine.max_records_per_task for the steady parts (default: engine's)",
    )
    parser.add_argument("--connections", type=int, default=3, help="load generator connections (default 3)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="target source changes/s (default: as fast as PG allows)"
    )
    parser.add_argument("--seed-rows", type=int, default=10_000, help="rows in the source table before capture starts")
    parser.add_argument("--commit-interval", type=float, default=1.0, help="engine.commit_interval_s for e2e")
    parser.add_argument(
        "--price-type",
        default="double precision",
        help="PostgreSQL type of the price column in the e2e table (default: double precision)",
    )
    parser.add_argument("--catchup-timeout", type=float, default=600.0)
    parser.add_argument("--base-rows", type=int, default=1_000_000, help="rows in the steady-state upsert tables")
    parser.add_argument(
        "--append-rows",
        type=int,
        default=1_000_000,
        help="events for the append-path figure, and inserts for the mirror-insert one (default 1M)",
    )
    parser.add_argument("--skip-steady", action="store_true", help="skip the steady-state upsert and append parts")
    parser.add_argument("--skip-sink", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument(
        "--only",
        choices=["steady", "append", "sink", "e2e"],
        action="append",
        default=None,
        help="run only this part (repeatable); overrides the --skip-* flags",
    )
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs, warehouse)")
    parser.add_argument(
        "--storage",
        choices=["local", "s3"],
        default="local",
        help="the warehouse: a local directory, or a local S3-compatible store (versitygw) (default local)",
    )
    parser.add_argument(
        "--catalog",
        choices=["jdbc", "rest"],
        default="jdbc",
        help="JDBC catalog in PostgreSQL, or a local REST catalog over it (default jdbc)",
    )
    args = parser.parse_args()
    parts = (
        set(args.only)
        if args.only
        else {
            part
            for part, skipped in (
                ("steady", args.skip_steady),
                ("append", args.skip_steady),
                ("sink", args.skip_sink),
                ("e2e", args.skip_e2e),
            )
            if not skipped
        }
    )
    quiet_logs()

    summary: dict[str, Any] = {
        "bench": "e2e",
        "load_start": machine_load(),
        "params": {k: v for k, v in vars(args).items()},
    }
    say(f"machine: {summary['load_start']}")
    spark_box: list = []
    status = 0
    with private_stack("bench-e2e", keep=args.keep, storage=args.storage, catalog=args.catalog) as (info, state_dir):
        say(f"private stack in {state_dir}: kafka {info.bootstrap_servers}, postgres :{info.pg_port}")
        try:
            if "steady" in parts:
                summary.update(steady_upserts(info, state_dir, args, spark_box, schemas=False))
                summary.update(steady_upserts(info, state_dir, args, spark_box, schemas=True))
            if "append" in parts:
                summary.update(append_path(info, state_dir, args, spark_box))
                summary.update(mirror_insert_path(info, state_dir, args, spark_box))
            if "sink" in parts:
                summary.update(sink_benchmark(info, state_dir, args, spark_box))
            if "e2e" in parts:
                summary.update(e2e_benchmark(info, state_dir, args, spark_box))
        except Exception as exc:  # noqa: BLE001 — still print the JSON line, with the error
            traceback.print_exc()
            say(f"FAILED: {exc}")
            summary["error"] = str(exc)
            status = 1
        finally:
            for spark in spark_box:
                spark.stop()
    summary["load_end"] = machine_load()
    print(json.dumps(summary), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
