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
from cpu_groups import ProcessGroups, per_thousand, thread_delta  # noqa: E402
from loadgen import LoadGenerator, MariadbSource, PostgresSource, SourceDatabase  # noqa: E402

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


class LiveRun:
    """PostgreSQL → Debezium → Kafka → Spark → Iceberg, running: a seeded source table, the capture process
    streaming, the pipeline in a thread, and the snapshot in the lake. Used by the ``e2e`` and ``ramp`` parts."""

    TABLE, PREFIX = "bench_orders", "lse2e"

    def __init__(self, info, state_dir: Path, args, spark_box: list) -> None:
        self.info, self.state_dir, self.args = info, state_dir, args
        self.results: list = []
        self.failure: list[BaseException] = []
        self.stop = threading.Event()
        if args.source == "mariadb":
            database = info.source_database("lsbench")
            self.source: SourceDatabase = MariadbSource(
                {
                    "host": database["host"],
                    "port": database["port"],
                    "user": database["user"],
                    "password": database["password"],
                    "database": database["dbname"],
                },
                self.TABLE,
            )
            self._create_mariadb_database(database)
            self.topic = f"{self.PREFIX}.{database['dbname']}.{self.TABLE}"
            capture: dict[str, Any] = {"database": database, "tables": [f"{database['dbname']}.{self.TABLE}"]}
        else:
            params = {
                "host": info.pg_host,
                "port": info.pg_port,
                "dbname": info.source_db,
                "user": info.pg_user,
                "password": info.pg_password,
            }
            self.source = PostgresSource(params, f"public.{self.TABLE}")
            self.topic = f"{self.PREFIX}.public.{self.TABLE}"
            capture = {
                "database": params,
                "tables": [f"public.{self.TABLE}"],
                "slot_name": "lsbench_e2e",
                "publication_name": "lsbench_e2e_pub",
            }
        self.source.create(args.seed_rows)
        data = pipeline_data(
            info,
            state_dir,
            "bench_e2e",
            [{"topics": [self.topic], "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"}],
            engine={
                "commit_interval_s": args.commit_interval,
                **({"max_records_per_batch": args.batch} if args.batch else {}),
            },
            capture={**capture, "topic_prefix": self.PREFIX},
        )
        self.config = to_config(data)
        self.yaml_path = write_pipeline_yaml(state_dir / "e2e-pipeline.yaml", data)
        self.spark = ensure_spark(spark_box, self.config)
        self.thread = threading.Thread(target=self._run_pipeline, name="pipeline", daemon=True)
        self.capture = None

    def _create_mariadb_database(self, database: dict[str, Any]) -> None:
        import pymysql

        conn = pymysql.connect(
            host=database["host"], port=database["port"], user=database["user"], password=database["password"]
        )
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {database['dbname']}")
        conn.close()

    def _run_pipeline(self) -> None:
        try:
            run_pipeline(self.config, spark=self.spark, stop=self.stop, on_batch=self.results.append)
        except BaseException as exc:  # noqa: BLE001 — re-raised by the main thread
            self.failure.append(exc)

    def __enter__(self) -> LiveRun:
        from lakestream.capture.process import CaptureProcess

        started = time.perf_counter()
        self.capture = CaptureProcess(self.yaml_path, log_path=self.state_dir / "capture.log")
        try:
            self.capture.start()
            self.capture.wait_until_streaming(timeout=300)
            took = time.perf_counter() - started
            say(f"capture streaming after {took:.1f}s (snapshot of {self.args.seed_rows:,} rows)")
            self.thread.start()
            self.wait_for_source()
            say(f"snapshot in the lake after {time.perf_counter() - started:.1f}s; starting the load")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(180)
        if self.capture is not None:
            self.capture.stop()

    def load_generator(self, rate: float) -> LoadGenerator:
        seeded = self.args.seed_rows
        return LoadGenerator(self.source, self.args.connections, seeded + 1, seeded, rate)

    def check(self) -> None:
        check_alive(self.thread, self.failure)

    def lake_changes_since(self, since_ms: int) -> int:
        return sum(r.changes for r in self.results if r.commit_ts_ms >= since_ms)

    def wait_for_source(self) -> tuple[dict[str, int], int]:
        """Until the lake equals the source (row count, keys, sums): the totals and the commit time (ms) of the
        batch that made it so."""
        return wait_for_lake(
            self.spark,
            self.TABLE,
            self.source.totals(),
            self.thread,
            self.failure,
            timeout=self.args.catchup_timeout,
            results=self.results,
        )

    def kafka_records(self) -> int:
        """Records in the capture topic (its partitions' high watermarks): what capture has published so far."""
        from confluent_kafka import Consumer, TopicPartition

        topic = self.topic
        consumer = Consumer({"bootstrap.servers": self.info.bootstrap_servers, "group.id": "bench-watermarks"})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
        finally:
            consumer.close()

    def process_groups(self, load: LoadGenerator) -> ProcessGroups:
        pids = self.state_dir / "pids"

        def pid_of(name: str) -> int | None:
            path = pids / f"{name}.pid"
            return int(path.read_text().split()[0]) if path.exists() else None

        broker = next((p.stem for p in pids.glob("*.pid") if "kafka" in p.stem or "broker" in p.stem), None)
        return ProcessGroups(
            source_db_pid=pid_of("mariadb" if self.args.source == "mariadb" else "postgres"),
            broker_pid=pid_of(broker) if broker else None,
            capture_pid=self.capture.pid if self.capture else None,
            load_pids=load.pids,
        )


def e2e_benchmark(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    say(
        f"\n== end to end: PostgreSQL → Debezium → Kafka → Spark → Iceberg, {args.duration:.0f}s of load "
        f"({args.connections} connections, rate {'unlimited' if not args.rate else f'{args.rate:,.0f}/s'})"
    )
    with LiveRun(info, state_dir, args, spark_box) as live:
        load = live.load_generator(args.rate)
        load_before = machine_load()
        load_start_ms = int(time.time() * 1000)
        load_start = time.time()
        load.start()
        groups = live.process_groups(load)
        cpu_before = groups.sample()
        next_report = time.monotonic() + 10
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            live.check()
            if load.error:
                break
            if time.monotonic() >= next_report:
                say(
                    f"  t+{time.time() - load_start:.0f}s: {load.total_changes:,} source changes, "
                    f"{live.lake_changes_since(load_start_ms):,} in the lake, {len(live.results)} batches"
                )
                next_report += 10
        # Sampled while the generator's processes live: once ended, nothing sampled has their CPU.
        cpu_after = groups.sample()
        load.finish()
        load_s = time.time() - load_start
        load_during = machine_load()
        source_changes = load.total_changes
        got, done_ms = live.wait_for_source()
        cpu = per_thousand(cpu_before, cpu_after, source_changes)
        say(
            f"load: {source_changes:,} changes in {sum(load.transactions):,} transactions over {load_s:.1f}s "
            f"= {source_changes / load_s:,.0f} changes/s at the source; source has {got['n']:,} rows"
        )
        e2e_s = done_ms / 1000 - load_start
        memory = driver_memory(live.spark)
        results = live.results

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
    say(f"     CPU seconds per 1,000 changes: {cpu_line(cpu)}")
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
        "e2e_cpu_s_per_1000_changes": cpu,
        "e2e_memory": memory,
        "e2e_load_before": load_before,
        "e2e_load_during": load_during,
    }


def cpu_line(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()) + f"; total {sum(cpu.values()):.3f}"


def ramp_benchmark(info, state_dir: Path, args, spark_box: list) -> dict[str, Any]:
    """Raise the source rate step by step, each held ``--hold`` seconds, until the lake's freshness p99 over a
    step passes ``--knee-p99`` or the source cannot reach the step's rate: the knee is the last step that held."""
    rates = (
        [int(r) for r in args.ramp_rates.split(",")]
        if args.ramp_rates
        else list(range(args.ramp_start, args.ramp_max + 1, args.ramp_step))
    )
    source = "MariaDB" if args.source == "mariadb" else "PostgreSQL"
    say(
        f"\n== ramp: {source} → Debezium → Kafka → Spark → Iceberg at {', '.join(f'{r:,}' for r in rates)} "
        f"changes/s, {args.hold:.0f}s each; a step holds while freshness p99 ≤ {args.knee_p99:g}s"
    )
    steps: list[dict[str, Any]] = []
    knee = None
    ended_by = "the last step held"
    with LiveRun(info, state_dir, args, spark_box) as live:
        load = live.load_generator(rates[0])
        load.start()
        groups = live.process_groups(load)
        warmup = None
        try:
            if args.warmup > 0:
                # The JVMs' JIT compilers and caches warm up in the first minute after a start: measured apart.
                warmup = ramp_step(live, load, groups, rates[0], args, hold=args.warmup)
                say(
                    f"  warm-up at {rates[0]:,}/s for {args.warmup:.0f}s: freshness p50/p99 "
                    f"{warmup['freshness_p50_s']}/{warmup['freshness_p99_s']} s, capture threads (cores) "
                    f"{warmup['capture_thread_cores']}"
                )
                settled_s = settle(live, load, args.knee_p99 / 2)
                warmup["settle_s"] = settled_s
                say(
                    f"  caught up with the source {settled_s:.0f}s after the warm-up"
                    if settled_s is not None
                    else "  NOT caught up with the source 300s after the warm-up"
                )
            for rate in rates:
                step = ramp_step(live, load, groups, rate, args)
                steps.append(step)
                say(
                    f"  {rate:>6,}/s: source {step['source_changes_per_s']:>6,}/s, "
                    f"kafka {step['kafka_records_per_s']:>6,} records/s, lake {step['lake_changes_per_s']:>6,}/s, "
                    f"{step['batches']} batches (p50 {step['batch_seconds_p50']}s, Kafka lag max "
                    f"{step['pipeline_kafka_lag_max']:,}), "
                    f"freshness p50/p99 {step['freshness_p50_s']}/{step['freshness_p99_s']} s, "
                    f"load {step['loadavg_1m']}; CPU s/1,000 changes: {cpu_line(step['cpu_s_per_1000_changes'])}"
                )
                say(f"           capture threads (cores): {step['capture_thread_cores']}")
                if step["source_changes_per_s"] < 0.9 * rate:
                    ended_by = f"the source reached only {step['source_changes_per_s']:,}/s of {rate:,}/s"
                    break
                p99 = step["freshness_p99_s"]
                if p99 is None or p99 > args.knee_p99:
                    ended_by = f"freshness p99 {p99}s > {args.knee_p99:g}s at {rate:,}/s"
                    break
                knee = rate
        finally:
            load.finish()
        got, _ = live.wait_for_source()
        say(f"ramp: the lake matches the source after the load ({got['n']:,} rows, sums match)")
    say(f"knee: {f'{knee:,} changes/s' if knee else 'below the first step'} ({ended_by})")
    print_ramp_table(steps)
    return {
        "ramp_knee_changes_per_s": knee,
        "ramp_ended_by": ended_by,
        "ramp_knee_p99_s": args.knee_p99,
        "ramp_hold_s": args.hold,
        "ramp_warmup": warmup,
        "ramp_steps": steps,
        "ramp_rows_final": got["n"],
    }


def settle(live: LiveRun, load, p99_s: float, timeout: float = 300.0) -> float | None:
    """Wait, at the load's current rate, until three batches in a row commit with their p99 freshness within
    ``p99_s``: the backlog a warm-up left is drained before the first step is measured. Returns the seconds it took,
    None if it did not within ``timeout`` (the first step then starts behind, and shows it)."""
    started = time.monotonic()
    since_ms = int(time.time() * 1000)
    while time.monotonic() - started < timeout:
        live.check()
        if load.error:
            raise BenchmarkFailure(f"load generator: {load.error}")
        recent = [r for r in live.results if r.commit_ts_ms >= since_ms and r.source_ts_quantiles][-3:]
        if len(recent) == 3 and all(r.commit_ts_ms - r.source_ts_quantiles[0] <= p99_s * 1000 for r in recent):
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def ramp_step(live: LiveRun, load, groups: ProcessGroups, rate: int, args, hold: float | None = None) -> dict[str, Any]:
    load.rate = rate
    start_ms = int(time.time() * 1000)
    changes_before = load.total_changes
    kafka_before = live.kafka_records()
    cpu_before = groups.sample()
    threads_before = groups.capture_threads()
    end = time.monotonic() + (hold or args.hold)
    next_report = time.monotonic() + 30
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        live.check()
        if load.error:
            raise BenchmarkFailure(f"load generator: {load.error}")
        if time.monotonic() >= next_report:
            elapsed = time.time() - start_ms / 1000
            say(f"    t+{elapsed:.0f}s: {live.lake_changes_since(start_ms):,} in the lake")
            next_report += 30
    end_ms = int(time.time() * 1000)
    source = load.total_changes - changes_before
    kafka = live.kafka_records() - kafka_before
    cpu = per_thousand(cpu_before, groups.sample(), source)
    seconds = (end_ms - start_ms) / 1000
    capture_threads = thread_delta(threads_before, groups.capture_threads(), seconds)
    in_step = [r for r in live.results if start_ms <= r.commit_ts_ms < end_ms]
    batch_s = sorted(r.seconds for r in in_step) or [0.0]
    steps_s: dict[str, float] = {}
    for r in in_step:
        for name, ms in r.steps_ms.items():
            steps_s[name] = steps_s.get(name, 0.0) + ms / 1000
        for name, ms in r.table_steps_ms.get(f"{NAMESPACE}.{LiveRun.TABLE}", {}).items():
            steps_s[f"commit.{name}"] = steps_s.get(f"commit.{name}", 0.0) + ms / 1000
    return {
        "rate": rate,
        "source_changes_per_s": round(source / seconds),
        # Kafka records: a delete is two (the change and its tombstone).
        "kafka_records_per_s": round(kafka / seconds),
        "lake_changes_per_s": round(sum(r.changes for r in in_step) / seconds),
        **freshness(in_step),
        "batches": len(in_step),
        "batch_seconds_p50": round(batch_s[len(batch_s) // 2], 2),
        "batch_seconds_max": round(batch_s[-1], 2),
        # Records in Kafka beyond the pipeline's offsets after each batch: small means the pipeline keeps up with
        # what capture has published, and the freshness is spent before Kafka.
        "pipeline_kafka_lag_max": max((r.lag or 0 for r in in_step), default=0),
        "pipeline_steps_s": {k: round(v, 2) for k, v in sorted(steps_s.items(), key=lambda kv: -kv[1])},
        "cpu_s_per_1000_changes": cpu,
        # Cores each of capture's busiest threads used over the step: where capture's time goes.
        "capture_thread_cores": capture_threads,
        **{k: v for k, v in machine_load().items() if k == "loadavg_1m"},
    }


def print_ramp_table(steps: list[dict[str, Any]]) -> None:
    if not steps:
        return
    groups = list(steps[0]["cpu_s_per_1000_changes"])
    say("\n| target/s | source/s | lake/s | p50 s | p99 s | " + " | ".join(groups) + " | CPU s/1k total | load 1m |")
    say("|" + "---|" * (7 + len(groups)))
    for s in steps:
        cpu = s["cpu_s_per_1000_changes"]
        say(
            f"| {s['rate']:,} | {s['source_changes_per_s']:,} | {s['lake_changes_per_s']:,} | {s['freshness_p50_s']} "
            f"| {s['freshness_p99_s']} | "
            + " | ".join(f"{cpu.get(g, 0):.3f}" for g in groups)
            + f" | {sum(cpu.values()):.3f} | {s['loadavg_1m']} |"
        )


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
    parser.add_argument("--catchup-timeout", type=float, default=600.0)
    parser.add_argument("--ramp-start", type=int, default=3000, help="ramp: the first step's changes/s (default 3000)")
    parser.add_argument("--ramp-step", type=int, default=1000, help="ramp: changes/s added a step (default 1000)")
    parser.add_argument("--ramp-max", type=int, default=14000, help="ramp: the last step's changes/s (default 14000)")
    parser.add_argument("--hold", type=float, default=120.0, help="ramp: seconds each step is held (default 120)")
    parser.add_argument(
        "--ramp-rates",
        default=None,
        help="ramp: the steps' changes/s as a list, e.g. 3000,5000,7000 (overrides the range)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="ramp: seconds at the first rate before the steps, reported apart (default 60; 0: none)",
    )
    parser.add_argument(
        "--knee-p99", type=float, default=5.0, help="ramp: the freshness p99 a step must keep (default 5 s)"
    )
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
        choices=["steady", "append", "sink", "e2e", "ramp"],
        action="append",
        default=None,
        help="run only this part (repeatable); overrides the --skip-* flags",
    )
    parser.add_argument(
        "--source",
        choices=["postgresql", "mariadb"],
        default="postgresql",
        help="the e2e and ramp parts' source database (default postgresql; MariaDB's binlog with 'mariadb')",
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
    with private_stack("bench-e2e", keep=args.keep, storage=args.storage, catalog=args.catalog, source=args.source) as (
        info,
        state_dir,
    ):
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
            if "ramp" in parts:
                summary.update(ramp_benchmark(info, state_dir, args, spark_box))
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
