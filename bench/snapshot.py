"""Initial load: Debezium's snapshot (through Kafka and the pipeline) against the parallel snapshot
(`lakestream snapshot`: Spark tasks straight from PostgreSQL into Iceberg), side by side, each with a
concurrent write load, each followed by the handover to streaming and `verify`.

    .venv/bin/python bench/snapshot.py [--rows 5000000] [--mix-tables 20] [--write-rate 200] [--skip-debezium]

Scenarios: one table of --rows rows, and --mix-tables tables totalling --rows rows. Rows/s is rows
loaded into Iceberg per second of wall time: for Debezium, from the capture's start until the
pipeline has written the snapshot events (capture first, then the pipeline over the backlog); for the
parallel path, the whole `run_snapshot` (tables created, chunks read, written and committed).
The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg2  # noqa: E402
from _common import machine_load, pipeline_data, private_stack, quiet_logs, say, to_config, write_pipeline_yaml  # noqa: E402

from lakestream.capture import CaptureProcess  # noqa: E402
from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402
from lakestream.snapshot import run_snapshot  # noqa: E402
from lakestream.verify.compare import verify_tables  # noqa: E402

TABLE_DDL = """CREATE TABLE {t} (id bigint PRIMARY KEY, customer_id int, status text, amount numeric(12,2),
    qty int, note text, created_at timestamptz, updated_at timestamp, shipped date, paid boolean)"""
FILL_SQL = """INSERT INTO {t} SELECT g, g % 50000, (ARRAY['new','paid','shipped'])[g % 3 + 1], (g % 100000) / 100.0,
    g % 19 + 1, 'note ' || md5(g::text), now() - g * interval '1 second', timestamp '2024-01-01' + g * interval '1 ms',
    date '2024-01-01' + (g % 365), g % 2 = 0 FROM generate_series({first}, {last}) g"""


class Writer(threading.Thread):
    """Updates, inserts and deletes at ``rate`` changes/s on random tables until stopped."""

    def __init__(self, dsn: str, tables: list[tuple[str, int]], rate: float):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.tables, self.rate = tables, rate
        self.stop_event = threading.Event()
        self.changes = 0
        self.rng = random.Random(11)
        self.next_id = {t: n + 1 for t, n in tables}

    def run(self) -> None:
        started = time.monotonic()
        with self.conn.cursor() as cur:
            while not self.stop_event.is_set():
                if self.changes >= (time.monotonic() - started) * self.rate:
                    time.sleep(0.005)
                    continue
                table, rows = self.rng.choice(self.tables)
                r = self.rng.random()
                if r < 0.3:
                    cur.execute(f"INSERT INTO {table} (id, status, qty) VALUES (%s, 'new', 1)", (self.next_id[table],))
                    self.next_id[table] += 1
                elif r < 0.9:
                    cur.execute(
                        f"UPDATE {table} SET qty = qty + 1, status = 'paid' WHERE id = %s", (self.rng.randint(1, rows),)
                    )
                else:
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (self.rng.randint(1, rows),))
                self.changes += 1

    def stop(self) -> int:
        self.stop_event.set()
        self.join(30)
        self.conn.close()
        return self.changes


def make_source(info, name: str, tables: list[tuple[str, int]]) -> str:
    admin = psycopg2.connect(info.pg_dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    conn = psycopg2.connect(info.pg_dsn(name))
    conn.autocommit = True
    with conn.cursor() as cur:
        for table, rows in tables:
            cur.execute(TABLE_DDL.format(t=table))
            step = 1_000_000
            for first in range(1, rows + 1, step):
                cur.execute(FILL_SQL.format(t=table, first=first, last=min(rows, first + step - 1)))
        cur.execute("VACUUM ANALYZE")
    conn.close()
    return info.pg_dsn(name)


def topic_ends(bootstrap: str, topics: list[str]) -> int:
    """Records in ``topics`` so far (sum of the partitions' high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        return sum(
            consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
            for t in topics
            if t in metadata
            for p in metadata[t].partitions
        )
    finally:
        consumer.close()


def caught_up(dsn: str, slot: str, timeout: float = 600) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            target = cur.fetchone()[0]
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                cur.execute(
                    "SELECT coalesce(confirmed_flush_lsn >= %s::pg_lsn, false) FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (target, slot),
                )
                row = cur.fetchone()
                if row and row[0]:
                    return
                time.sleep(0.5)
    finally:
        conn.close()
    raise RuntimeError(f"slot {slot} did not catch up in {timeout}s")


def run_path(
    info,
    state_dir: Path,
    spark,
    label: str,
    path: str,
    tables: list[tuple[str, int]],
    write_rate: float,
    chunk_rows: int,
) -> dict:
    name = f"{label}_{path}"
    dsn = make_source(info, name, tables)
    capture = {
        "database": {
            "host": info.pg_host,
            "port": info.pg_port,
            "dbname": name,
            "user": info.pg_user,
            "password": info.pg_password,
        },
        "tables": [f"public.{t}" for t, _ in tables],
        "topic_prefix": name,
        "slot_name": f"slot_{name}",
        "publication_name": f"pub_{name}",
        "snapshot": "parallel" if path == "parallel" else "debezium",
        "snapshot_chunk_rows": chunk_rows,
        "connector": {"heartbeat.interval.ms": "1000"},
    }
    data = pipeline_data(
        info,
        state_dir / name,
        name,
        [{"topic_pattern": rf"{name}\.public\..*", "namespace": name, "table": "{table}"}],
        capture=capture,
    )
    data["state_dir"] = str(state_dir / name / "state")
    config = to_config(data)
    yaml_path = write_pipeline_yaml(state_dir / f"{name}.yaml", data)
    rows = sum(n for _, n in tables)
    writer = Writer(dsn, tables, write_rate)
    writer.start()
    out: dict = {"rows": rows}
    proc = CaptureProcess(yaml_path, log_path=state_dir / f"{name}.capture.log")
    try:
        started = time.monotonic()
        if path == "parallel":
            report = run_snapshot(config, spark=spark, progress_interval_s=10)
            out["load_s"] = round(time.monotonic() - started, 2)
            out["handover_lag_bytes"] = report.handover_lag_bytes
            say(report.to_text())
            proc.start()
            proc.wait_until_streaming(timeout=600)
        else:
            proc.start()
            proc.wait_until_streaming(timeout=3600)
            out["capture_snapshot_s"] = round(time.monotonic() - started, 2)
            # Debezium's snapshot events come first in the topics: once the pipeline has committed that
            # many records, every snapshot row is in the lake (the writes keep it from ever going idle).
            snapshot_events = topic_ends(info.bootstrap_servers, [f"{name}.public.{t}" for t, _ in tables])
            seen, loaded = [0], threading.Event()

            def on_batch(result) -> None:
                seen[0] += result.records
                if seen[0] >= snapshot_events:
                    loaded.set()

            run_pipeline(config, stop=loaded, spark=spark, on_batch=on_batch)
            out["pipeline_records"] = seen[0]
            out["load_s"] = round(time.monotonic() - started, 2)
        out["rows_per_s"] = round(rows / out["load_s"])
        out["writes_during_load"] = writer.changes
        writer.stop()
        caught_up(dsn, f"slot_{name}")
        run_pipeline(config, spark=spark, stop_when_idle=True)
        verified = verify_tables(config, spark)
        out["verify_ok"] = verified.ok
        out["duplicate_keys"] = sum(t.duplicate_keys for t in verified.tables)
        if not verified.ok:
            say(verified.to_text())
    finally:
        if writer.is_alive():
            writer.stop()
        proc.stop()
    say(
        f"{label} / {path}: {rows:,} rows in {out['load_s']}s = {out['rows_per_s']:,} rows/s, "
        f"verify {'OK' if out['verify_ok'] else 'FAILED'}"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--mix-tables", type=int, default=20)
    parser.add_argument("--write-rate", type=float, default=200.0, help="source changes/s during the load")
    parser.add_argument("--chunk-rows", type=int, default=250_000)
    parser.add_argument("--skip-debezium", action="store_true")
    parser.add_argument("--only", choices=["single", "mix"], default=None)
    args = parser.parse_args()
    quiet_logs()
    scenarios = {
        "single": [("orders", args.rows)],
        "mix": [(f"t{i:02d}", args.rows // args.mix_tables) for i in range(args.mix_tables)],
    }
    if args.only:
        scenarios = {args.only: scenarios[args.only]}
    load_before = machine_load()
    results: dict = {}
    with private_stack("bench-snapshot") as (info, state_dir):
        data = pipeline_data(info, state_dir, "bench", [{"topics": ["unused"]}])
        spark = session_for(to_config(data))
        for label, tables in scenarios.items():
            for path in ["parallel"] if args.skip_debezium else ["debezium", "parallel"]:
                results[f"{label}_{path}"] = run_path(
                    info, state_dir, spark, label, path, tables, args.write_rate, args.chunk_rows
                )
        spark.stop()
    say("")
    say(f"{'scenario':<10} {'debezium rows/s':>16} {'parallel rows/s':>16}")
    for label in scenarios:
        dbz = results.get(f"{label}_debezium", {}).get("rows_per_s")
        par = results.get(f"{label}_parallel", {}).get("rows_per_s")
        say(f"{label:<10} {dbz if dbz is not None else '-':>16} {par:>16}")
    results["rows"] = args.rows
    results["load_before"], results["load_after"] = load_before, machine_load()
    print(json.dumps(results))
    return 0 if all(v.get("verify_ok") for k, v in results.items() if isinstance(v, dict) and "verify_ok" in v) else 1


if __name__ == "__main__":
    sys.exit(main())
