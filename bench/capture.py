"""Capture alone: Debezium's embedded engine → Kafka, snapshot and streaming, in events/s.

    .venv/bin/python bench/capture.py [--rows 300000] [--changes 300000] [--schemas on|off] [--source mariadb]

1. **Snapshot**: a table of --rows rows (10 columns) exists before capture starts; events/s is
   --rows over the time from the first event in Kafka to the last.
2. **Streaming**: with capture streaming, --changes changes are written as fast as PostgreSQL takes
   them (multi-row INSERTs, then UPDATEs, in transactions of 5,000 rows); events/s is the changes over
   the time from the first write to the last event in Kafka. The write side alone takes a fraction of it
   (printed as `write_s`).

``--source mariadb`` runs the same two phases against a private MariaDB (Debezium's MariaDB connector: its snapshot,
then the binlog), with the same table and the same writes in MariaDB's SQL. ``--snapshot parallel`` loads the table
with `lakestream snapshot` instead (Spark tasks at the pipeline's ``spark.master``, rows all the way into Iceberg;
rows/s over the whole `run_snapshot`), and capture then streams from its handover point.

Both phases report the capture process's CPU seconds per 1,000 events as well (user + system, from
/proc), which the machine's other load disturbs far less than wall time. The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg2  # noqa: E402
from _common import machine_load, pipeline_data, private_stack, quiet_logs, say, write_pipeline_yaml  # noqa: E402
from snapshot import make_source, topic_ends  # noqa: E402

from lakestream.capture import CaptureProcess  # noqa: E402

POLL_S = 0.1


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its waited-for children (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def wait_for_events(
    bootstrap: str, topic: str, target: int, timeout: float, proc: CaptureProcess, marks: dict[int, float] | None = None
) -> tuple[float, float]:
    """Poll the topic's end until it holds ``target`` events: (time of the first event, time of the last).
    ``marks``: counts → filled with the time the topic first held at least that many."""
    first = None
    deadline = time.monotonic() + timeout
    last_said = time.monotonic()
    while time.monotonic() < deadline:
        n = topic_ends(bootstrap, [topic])
        now = time.monotonic()
        if n and first is None:
            first = now
        for mark in [m for m, t in (marks or {}).items() if t is None and n >= m]:
            marks[mark] = now
        if n >= target:
            return first or now, now
        if not proc.running:
            raise RuntimeError(f"capture exited:\n{proc.log_text()[-3000:]}")
        if now - last_said > 5:
            say(f"  {n:,} / {target:,} events in Kafka")
            last_said = now
        time.sleep(POLL_S)
    raise RuntimeError(f"{topic}: fewer than {target:,} events after {timeout:.0f}s")


def write_changes(dsn: str, table: str, first_id: int, changes: int, txn_rows: int = 5000) -> float:
    """Half new rows (INSERT … SELECT), half UPDATEs of existing ones, in transactions of ``txn_rows``."""
    conn = psycopg2.connect(dsn)
    started = time.monotonic()
    inserts = changes // 2
    with conn, conn.cursor() as cur:
        for lo in range(first_id, first_id + inserts, txn_rows):
            hi = min(first_id + inserts - 1, lo + txn_rows - 1)
            cur.execute(
                f"INSERT INTO {table} (id, status, qty, note) SELECT g, 'new', 1, md5(g::text) "
                f"FROM generate_series({lo}, {hi}) g"
            )
            conn.commit()
        updates = changes - inserts
        for lo in range(1, updates + 1, txn_rows):
            hi = min(updates, lo + txn_rows - 1)
            cur.execute(f"UPDATE {table} SET qty = qty + 1, status = 'paid' WHERE id BETWEEN {lo} AND {hi}")
            conn.commit()
    conn.close()
    return time.monotonic() - started


MARIADB_DDL = """CREATE TABLE {t} (id BIGINT PRIMARY KEY, customer_id INT, status VARCHAR(20), amount DECIMAL(12,2),
    qty INT, note TEXT, created_at TIMESTAMP(6) NULL, updated_at DATETIME(6), shipped DATE, paid BOOLEAN)"""
# MariaDB's Sequence engine: seq_<first>_to_<last> is a table of those integers.
MARIADB_FILL = """INSERT INTO {t} SELECT seq, seq % 50000, ELT(seq % 3 + 1, 'new', 'paid', 'shipped'),
    (seq % 100000) / 100.0, seq % 19 + 1, CONCAT('note ', MD5(seq)), NOW(6) - INTERVAL seq SECOND,
    TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq * 1000 MICROSECOND,
    DATE'2024-01-01' + INTERVAL (seq % 365) DAY, seq % 2 = 0 FROM seq_{first}_to_{last}"""


def mariadb_connect(info, database: str | None = None):
    import pymysql

    return pymysql.connect(
        host=info.pg_host,
        port=info.mariadb_port,
        user=info.pg_user,
        password=info.pg_password,
        database=database,
        autocommit=True,
    )


def make_mariadb_source(info, name: str, table: str, rows: int) -> None:
    conn = mariadb_connect(info)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
        cur.execute(f"USE {name}")
        cur.execute(MARIADB_DDL.format(t=table))
        for first in range(1, rows + 1, 100_000):
            cur.execute(MARIADB_FILL.format(t=table, first=first, last=min(rows, first + 99_999)))
    conn.close()


def write_mariadb_changes(info, name: str, table: str, first_id: int, changes: int, txn_rows: int = 5000) -> float:
    """`write_changes` in MariaDB's SQL."""
    conn = mariadb_connect(info, name)
    started = time.monotonic()
    inserts = changes // 2
    with conn.cursor() as cur:
        for lo in range(first_id, first_id + inserts, txn_rows):
            hi = min(first_id + inserts - 1, lo + txn_rows - 1)
            cur.execute(
                f"INSERT INTO {table} (id, status, qty, note) SELECT seq, 'new', 1, MD5(seq) FROM seq_{lo}_to_{hi}"
            )
        updates = changes - inserts
        for lo in range(1, updates + 1, txn_rows):
            hi = min(updates, lo + txn_rows - 1)
            cur.execute(f"UPDATE {table} SET qty = qty + 1, status = 'paid' WHERE id BETWEEN {lo} AND {hi}")
    conn.close()
    return time.monotonic() - started


def parallel_snapshot(yaml_path: Path, rows: int) -> dict:
    """`lakestream snapshot` of the pipeline's tables in this process: its rows/s into Iceberg."""
    from lakestream.config import load_config
    from lakestream.runtime.spark import session_for
    from lakestream.snapshot import run_snapshot

    config = load_config(str(yaml_path))
    spark = session_for(config)
    try:
        say(f"parallel snapshot: {rows:,} rows")
        report = run_snapshot(config, spark=spark)
    finally:
        spark.stop()
    say(
        f"parallel snapshot: {report.rows:,} rows in {report.seconds:.2f}s = {report.rows_per_s:,.0f}/s "
        f"(handover {report.lsn})"
    )
    return {
        "snapshot_s": round(report.seconds, 2),
        "snapshot_rows_per_s": round(report.rows_per_s),
        "snapshot_chunks": sum(t.chunks_total for t in report.tables),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="rows in the table before capture starts")
    parser.add_argument("--changes", type=int, default=300_000, help="changes written while capture streams")
    parser.add_argument("--schemas", choices=["on", "off"], default="on", help="JSON with or without schemas")
    parser.add_argument(
        "--format",
        choices=["json", "avro"],
        default="json",
        help="json (--schemas), or avro through a Schema Registry (Apicurio Registry, started for the run)",
    )
    parser.add_argument(
        "--source",
        choices=["postgresql", "mariadb"],
        default="postgresql",
        help="the source database (default: %(default)s)",
    )
    parser.add_argument(
        "--snapshot",
        choices=["debezium", "parallel"],
        default="debezium",
        help="the initial load: Debezium's snapshot into Kafka, or `lakestream snapshot` into Iceberg",
    )
    parser.add_argument("--chunk-rows", type=int, default=50_000, help="--snapshot parallel: rows per chunk")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    quiet_logs()
    load_before = machine_load()
    out: dict = {
        "source": args.source,
        "rows": args.rows,
        "changes": args.changes,
        "schemas": args.schemas,
        "format": args.format,
        "snapshot": args.snapshot,
    }
    registry = None
    if args.format == "avro":
        import tempfile

        from lakestream.stack.process import free_ports
        from lakestream.stack.registry import SchemaRegistry

        registry = SchemaRegistry(
            Path(tempfile.mkdtemp(prefix="capbench-registry-")), free_ports(1)[0], compatibility="NONE"
        )
        registry.start()
    with private_stack("capture-bench", source=args.source) as (info, state_dir):
        name = "capbench"
        table = "orders"
        if args.source == "mariadb":
            make_mariadb_source(info, name, table, args.rows)
            topic = f"{name}.{name}.{table}"
            capture = {
                "database": info.source_database(name),
                "tables": [f"{name}.{table}"],
                "topic_prefix": name,
                "schemas_enabled": args.schemas == "on",
            }

            def write(first_id: int, changes: int) -> float:
                return write_mariadb_changes(info, name, table, first_id, changes)
        else:
            dsn = make_source(info, name, [(table, args.rows)])
            topic = f"{name}.public.{table}"
            capture = {
                "database": {
                    "host": info.pg_host,
                    "port": info.pg_port,
                    "dbname": name,
                    "user": info.pg_user,
                    "password": info.pg_password,
                },
                "tables": [f"public.{table}"],
                "topic_prefix": name,
                "slot_name": f"slot_{name}",
                "publication_name": f"pub_{name}",
                "schemas_enabled": args.schemas == "on",
            }

            def write(first_id: int, changes: int) -> float:
                return write_changes(dsn, table, first_id, changes)

        data = pipeline_data(
            info, state_dir / name, name, [{"topics": [topic], "namespace": name, "table": table}], capture=capture
        )
        data["state_dir"] = str(state_dir / name / "state")
        if registry is not None:
            data["capture"]["format"] = "avro"
            data["kafka"]["schema_registry"] = {"url": registry.url}
        if args.snapshot == "parallel":
            data["capture"].update(snapshot="parallel", snapshot_chunk_rows=args.chunk_rows)
        yaml_path = write_pipeline_yaml(state_dir / f"{name}.yaml", data)
        proc = CaptureProcess(yaml_path, log_path=state_dir / f"{name}.capture.log")
        try:
            if args.snapshot == "parallel":
                out.update(parallel_snapshot(yaml_path, args.rows))
                proc.start()
                proc.wait_until_streaming(timeout=300)
            else:
                started = time.monotonic()
                proc.start()
                say(f"snapshot: {args.rows:,} rows")
                first, last = wait_for_events(info.bootstrap_servers, topic, args.rows, args.timeout, proc)
                proc.wait_until_streaming(timeout=300)
                cpu_after_snapshot = cpu_seconds(proc.pid)
                out["snapshot_start_s"] = round(first - started, 2)
                out["snapshot_s"] = round(last - first, 2)
                out["snapshot_events_per_s"] = round(args.rows / max(last - first, 1e-3))
                out["snapshot_cpu_ms_per_1k"] = round(1000 * cpu_after_snapshot / args.rows * 1000, 1)
                say(
                    f"snapshot: {args.rows:,} events in {last - first:.2f}s = {out['snapshot_events_per_s']:,}/s "
                    f"(JVM start to first event {first - started:.1f}s)"
                )

            say(f"streaming: {args.changes:,} changes")
            before = topic_ends(info.bootstrap_servers, [topic])
            written: dict = {}
            cpu_before = cpu_seconds(proc.pid)
            write_started = time.monotonic()
            writer = threading.Thread(target=lambda: written.update(s=write(args.rows + 1, args.changes)), daemon=True)
            writer.start()
            # The second half apart: the capture JVM is young, and its JIT compiler takes a third of a core
            # in the first seconds; a capture that runs for days does not pay that.
            half = before + args.changes // 2
            marks: dict[int, float | None] = {half: None}
            _, last = wait_for_events(info.bootstrap_servers, topic, before + args.changes, args.timeout, proc, marks)
            writer.join()
            half_rate = (args.changes - args.changes // 2) / max(last - marks[half], 1e-3) if marks[half] else None
            out["streaming_second_half_events_per_s"] = round(half_rate) if half_rate else None
            cpu_streaming = cpu_seconds(proc.pid) - cpu_before
            elapsed = last - write_started
            out["write_s"] = round(written["s"], 2)
            out["streaming_s"] = round(elapsed, 2)
            out["streaming_events_per_s"] = round(args.changes / elapsed)
            out["streaming_cpu_ms_per_1k"] = round(1000 * cpu_streaming / args.changes * 1000, 1)
            say(
                f"streaming: {args.changes:,} events in {elapsed:.2f}s = {out['streaming_events_per_s']:,}/s "
                f"(the source took the writes in {written['s']:.2f}s); capture CPU "
                f"{out['streaming_cpu_ms_per_1k']} ms per 1,000 events; second half "
                f"{out['streaming_second_half_events_per_s'] or 0:,}/s"
            )
        finally:
            proc.stop()
    if registry is not None:
        registry.stop()
    out["load_before"] = load_before
    out["load_after"] = machine_load()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
