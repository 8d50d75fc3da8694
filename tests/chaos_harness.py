"""The chaos harness: a private stack (PostgreSQL + Apache Kafka), a captured source under a write load,
`lakestream capture` and `lakestream run` as their own processes, and the faults tests/engine/test_chaos.py
inflicts on them, with `lakestream maintain --watch` running beside the pipeline: SIGKILLs of the pipeline (some
parked at a pause point inside the commit), a broker outage (frozen, stopped, SIGKILLed), a SIGKILL of capture, a
restart of the PostgreSQL that holds the JDBC catalog.

After each fault the load stops, a marker row is written to every table, the pipeline must catch up
with the topics by itself, and `lakestream verify` must pass (no missing, extra, differing or
duplicated key).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import yaml
from confluent_kafka import Consumer, TopicPartition
from conftest import catalog_settings, run_lakestream

from lakestream.capture import CaptureProcess
from lakestream.faults import ENV_VAR as PAUSE_ENV_VAR
from lakestream.stack import Stack

log = logging.getLogger(__name__)

BATCH_LINE = re.compile(r"INFO lakestream\.engine\.loop: batch (\d+): ([\d,]+) records")
MAINTENANCE_OK = re.compile(r"INFO lakestream\.maintenance\.actions: (\w+) \S+: (ok|partial)")
SEED_ACCOUNTS = 300
TABLES = ("accounts", "transfers")
SETUP_SQL = [
    "CREATE TABLE public.accounts "
    "(id integer PRIMARY KEY, balance bigint NOT NULL, note text, version integer NOT NULL)",
    "CREATE TABLE public.transfers "
    "(id bigint PRIMARY KEY, account_id integer NOT NULL, amount bigint NOT NULL, memo text)",
    f"INSERT INTO public.accounts SELECT g, g * 10, 'seed ' || g, 0 FROM generate_series(1, {SEED_ACCOUNTS}) g",
]
# PostgreSQL connection errors while the cluster restarts: the load reconnects and goes on.
_PG_DOWN = (psycopg2.OperationalError, psycopg2.InterfaceError)


# ---------------------------------------------------------------------------------------------
# The write load
# ---------------------------------------------------------------------------------------------


class WriteLoad(threading.Thread):
    """Inserts, updates, deletes and primary-key changes at about ``rate`` changes/s in transactions of
    1-8 statements, until stopped. Survives a PostgreSQL restart: it reconnects and re-reads its keys
    (the reference is the source table itself, so an in-doubt transaction needs no bookkeeping)."""

    def __init__(self, dsn: str, rate: int, seed: int) -> None:
        super().__init__(daemon=True, name="write-load")
        self.dsn, self.rate, self.rng = dsn, rate, random.Random(seed)
        self.stop_event = threading.Event()
        self.changes = 0
        self.reconnects = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        conn = None
        try:
            while not self.stop_event.is_set():
                try:
                    if conn is None:
                        conn = psycopg2.connect(self.dsn, connect_timeout=3)
                        self._load_keys(conn)
                    with conn, conn.cursor() as cur:
                        for _ in range(self.rng.choice([1, 1, 1, 3, 8])):
                            self._one_change(cur)
                except _PG_DOWN:
                    self.reconnects += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.stop_event.wait(0.5)
                    continue
                while not self.stop_event.is_set() and self.changes >= self.rate * (time.monotonic() - started):
                    self.stop_event.wait(0.02)
        except BaseException as exc:  # noqa: BLE001 — surfaced by the test
            self.error = exc
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "the write load did not stop"
        assert self.error is None, self.error

    def _load_keys(self, conn) -> None:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM accounts WHERE id > 0")
            self.accounts = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT coalesce(max(id), 0) + 1 FROM accounts")
            self.next_account = cur.fetchone()[0]
            cur.execute("SELECT id FROM transfers WHERE id > 0")
            self.transfers = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT coalesce(max(id), 0) + 1 FROM transfers")
            self.next_transfer = cur.fetchone()[0]

    def _one_change(self, cur) -> None:
        r, rng = self.rng.random(), self.rng
        self.changes += 1
        if r < 0.35 and self.accounts:
            key = rng.choice(self.accounts)
            cur.execute(
                "UPDATE accounts SET balance = balance + %s, version = version + 1, note = %s WHERE id = %s",
                (rng.randint(-500, 500), f"u{rng.randint(0, 10**6)}", key),
            )
        elif r < 0.50:
            key, self.next_account = self.next_account, self.next_account + 1
            cur.execute("INSERT INTO accounts VALUES (%s, %s, %s, 0)", (key, rng.randint(0, 10**6), f"new {key}"))
            self.accounts.append(key)
        elif r < 0.58 and len(self.accounts) > 50:
            key = self.accounts.pop(rng.randrange(len(self.accounts)))
            cur.execute("DELETE FROM accounts WHERE id = %s", (key,))
        elif r < 0.60 and self.accounts:
            # A primary-key change: Debezium emits delete(old) + tombstone + create(new).
            old = self.accounts.pop(rng.randrange(len(self.accounts)))
            new, self.next_account = self.next_account, self.next_account + 1
            cur.execute("UPDATE accounts SET id = %s, version = version + 1 WHERE id = %s", (new, old))
            self.accounts.append(new)
        elif r < 0.92:
            key, self.next_transfer = self.next_transfer, self.next_transfer + 1
            memo = None if rng.random() < 0.2 else f"t{key}-{rng.randint(0, 999)}"
            cur.execute(
                "INSERT INTO transfers VALUES (%s, %s, %s, %s)",
                (key, rng.choice(self.accounts) if self.accounts else 0, rng.randint(1, 10**5), memo),
            )
            self.transfers.append(key)
        elif self.transfers:
            key = self.transfers.pop(rng.randrange(len(self.transfers)))
            cur.execute("DELETE FROM transfers WHERE id = %s", (key,))


class EventLoad(threading.Thread):
    """Plain JSON events (``event_id`` unique, counting on from ``first``) at about ``rate``/s to ``topic``
    with an idempotent producer, until stopped; ``acked`` counts the ones the broker acknowledged (a
    broker outage holds them back; they are delivered once it returns)."""

    def __init__(self, bootstrap: str, topic: str, rate: int, first: int) -> None:
        super().__init__(daemon=True, name="event-load")
        from confluent_kafka import Producer

        self.topic, self.rate, self.next_id, self.sent = topic, rate, first, 0
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, "message.timeout.ms": 600000}
        )
        self.stop_event = threading.Event()
        self.acked = 0
        self.failed: list[str] = []

    def _delivered(self, err, _msg) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(str(err))

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop_event.is_set():
            event = {"event_id": self.next_id, "account": self.next_id % 97, "amount": self.next_id * 3}
            self.producer.produce(self.topic, json.dumps(event).encode(), on_delivery=self._delivered)
            self.next_id += 1
            self.sent += 1
            self.producer.poll(0)
            while not self.stop_event.is_set() and self.sent >= self.rate * (time.monotonic() - started):
                self.stop_event.wait(0.05)
                self.producer.poll(0)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)
        left = self.producer.flush(600)
        assert left == 0 and not self.failed, f"{left} events undelivered, failures: {self.failed[:5]}"


def count_values(bootstrap: str, topic: str) -> int:
    """Records of ``topic`` (partition 0) that carry a value (tombstones excluded)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        count, position = 0, 0
        deadline = time.monotonic() + 300
        while position < end and time.monotonic() < deadline:
            # Asks for what is left: consume() returns when it has that many, where asking for more than the
            # partition holds would wait out its whole timeout at the end.
            for msg in consumer.consume(min(1000, end - position), timeout=2):
                if msg.error():
                    continue
                position = msg.offset() + 1
                count += msg.value() is not None
        assert position >= end, f"{topic}: read up to {position} of {end}"
        return count
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------------
# The pipeline process
# ---------------------------------------------------------------------------------------------


class PipelineProcess:
    """``python -m lakestream <command>`` (default ``run``) in its own process group (driver + Spark JVM),
    its log in a file."""

    def __init__(self, config_path: Path, log_path: Path, command: tuple[str, ...] = ("run",)) -> None:
        self.config_path, self.log_path, self.command = config_path, log_path, command
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0
        self.started_at = 0.0

    def start(self, pause_at: str | None = None) -> None:
        assert not self.alive
        env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV_VAR}
        if pause_at:
            env[PAUSE_ENV_VAR] = pause_at
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== start {time.strftime('%H:%M:%S')} pause_at={pause_at} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lakestream", self.command[0], str(self.config_path), *self.command[1:]],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                cwd=self.config_path.parent,
            )
        self.started_at = time.monotonic()

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._offset)
            return f.read().decode("utf-8", errors="replace")

    def batches(self) -> list[tuple[int, int]]:
        """(batch id, records) of every batch this run logged."""
        return [(int(b), int(n.replace(",", ""))) for b, n in BATCH_LINE.findall(self.log_text())]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.alive, f"pipeline exited (code {self.proc.returncode}) waiting for {what}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"pipeline: no {what} within {timeout:.0f}s:\n{self.tail()}"
            # Not faster: scanning the log holds the GIL, which the write load's thread needs.
            time.sleep(0.5)

    def kill_group(self) -> None:
        """SIGKILL the driver and its Spark JVM at once, as a machine crash would."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def tail(self, lines: int = 60) -> str:
        return "\n".join([line for line in self.log_text().splitlines() if not line.startswith("%")][-lines:])

    def stacks(self) -> str:
        """The Python stacks of every thread of a running pipeline (`lakestream run` dumps them on SIGUSR1)."""
        if not self.alive or self.command[0] != "run":
            return ""
        before = len(self.log_text())
        os.kill(self.proc.pid, signal.SIGUSR1)
        time.sleep(2)
        return self.log_text()[before:][-6000:]


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------


@dataclass
class ChaosFigures:
    """What the scenarios did, for the report (`make chaos` prints it)."""

    kills: int = 0
    kills_in_commit: dict[str, int] = field(default_factory=dict)  # pause point → kills landed there
    random_kills: int = 0
    capture_kills: int = 0
    capture_resent: int = 0
    broker_outage_s: float = 0.0  # frozen + stopped + killed
    broker_resent: int = 0  # change events capture published twice across the broker outage
    catalog_outage_s: float = 0.0
    catalog_capture_restarts: int = 0
    load_changes: int = 0
    load_reconnects: int = 0
    rows_checked: int = 0
    verifies: int = 0
    maintenance_ok: dict[str, int] = field(default_factory=dict)
    scenarios: dict[str, float] = field(default_factory=dict)  # name → seconds
    seed: int = 0  # of every random choice of the run (the write load's, the kills')
    events_sent: int = 0  # plain events acknowledged by the broker (the append table must hold each once)
    append_rows_checked: int = 0  # rows of the append table and the transform outputs counted exactly
    faults_observed: dict[str, int] = field(default_factory=dict)  # scenario → failures the pipeline met


class ChaosEnv:
    """A private stack with a captured source database, capture and the pipeline running."""

    def __init__(self, stack: Stack, workdir: Path, rate: int, seed: int) -> None:
        self.stack, self.workdir, self.rate = stack, workdir, rate
        self.rng = random.Random(seed)
        self.info = stack.up()
        self.dbname = "chaos"
        self.dsn = self.info.pg_dsn(self.dbname)
        self.figures = ChaosFigures()
        admin = psycopg2.connect(self.info.pg_dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.dbname}")
        admin.close()
        self._execute(*SETUP_SQL)
        self.prefix, self.namespace = "chaos", "chaos"
        self.topics = [f"{self.prefix}.public.{t}" for t in TABLES]
        self.events_topic = f"{self.prefix}.events"  # plain JSON events, not captured: an append table
        self.figures.seed = seed
        self.config = {
            "name": "chaos",
            "state_dir": str(workdir / "state"),
            "kafka": {
                "bootstrap_servers": self.info.bootstrap_servers,
                "group_id": "lakestream-chaos",
                "client": {"session.timeout.ms": 6000},
            },
            "catalog": catalog_settings(self.info).model_dump(mode="json") | {"password": self.info.pg_password},
            "streams": [
                {
                    "topics": self.topics,
                    "namespace": self.namespace,
                    "table": "{table}",
                    "layout": {"partition_by": ["bucket(4, id)"]},
                    # Every change as a row: a double apply shows in its count (a mirror hides it).
                    "transforms": [
                        {
                            "name": "changes",
                            "table": "changes_{table}",
                            "sql": "SELECT id, _op, _kafka_offset FROM batch",
                        }
                    ],
                },
                {"topics": [self.events_topic], "mode": "append", "namespace": self.namespace, "table": "events"},
            ],
            "engine": {"commit_interval_s": 0.5, "max_records_per_batch": 20000, "idle_poll_s": 0.2},
            "spark": {"master": "local[2]", "driver_memory": "1g", "conf": {"spark.ui.enabled": "false"}},
            # Maintenance in its own process beside the pipeline (`lakestream maintain --watch`),
            # aggressive enough to compact, rewrite and expire under every fault: its commits race the
            # pipeline's.
            "maintenance": {
                "mode": "separate",
                "interval_s": 10,
                "policies": [
                    {
                        "tables": ".*",
                        "compaction": {"max_files_per_partition": 4, "quiet_time_s": 0},
                        "max_delete_files": 2,
                        "snapshot_retention_s": 0,
                        "retain_last_snapshots": 3,
                        "max_manifests": 4,
                        "orphan_min_age_s": 86400 * 3,
                        "orphan_dry_run": True,
                    }
                ],
            },
            "capture": {
                "database": {
                    "host": self.info.pg_host,
                    "port": self.info.pg_port,
                    "dbname": self.dbname,
                    "user": self.info.pg_user,
                    "password": self.info.pg_password,
                },
                "tables": [f"public.{t}" for t in TABLES],
                "topic_prefix": self.prefix,
                "slot_name": "slot_chaos",
                "publication_name": "pub_chaos",
            },
        }
        self.config_path = workdir / "pipeline.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.capture = CaptureProcess(self.config_path, workdir / "capture.log")
        self.pipeline = PipelineProcess(self.config_path, workdir / "pipeline.log")
        self.maintenance = PipelineProcess(self.config_path, workdir / "maintain.log", ("maintain", "--watch"))
        self.marker = 0

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.capture.start()
        self.capture.wait_until_streaming(300)
        self.pipeline.start()
        self.pipeline.wait_for(lambda: self.pipeline.batches(), "first batch", 300)
        self.maintenance.start()

    def close(self) -> None:
        self.pipeline.kill_group()
        self.maintenance.kill_group()
        self.capture.stop()
        text = self.maintenance.log_path.read_text(errors="replace") if self.maintenance.log_path.exists() else ""
        for action, _ in MAINTENANCE_OK.findall(text):
            self.figures.maintenance_ok[action] = self.figures.maintenance_ok.get(action, 0) + 1

    def freeze_broker(self, seconds: float) -> float:
        """SIGSTOP the broker for ``seconds``, then SIGCONT: its connections stay open and every request
        hangs, as with a hung broker or a network partition (not a refusal). Returns the seconds frozen."""
        pid = self.stack.broker.pid()
        assert pid is not None, "the broker is not running"
        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        return time.monotonic() - frozen

    def load(self) -> WriteLoad:
        load = WriteLoad(self.dsn, self.rate, self.rng.randint(0, 2**31))
        load.events = EventLoad(
            self.info.bootstrap_servers, self.events_topic, max(1, self.rate // 3), self.figures.events_sent
        )
        load.start()
        load.events.start()
        return load

    def stop_load(self, load: WriteLoad) -> None:
        load.stop()
        load.events.stop()
        self.figures.load_changes += load.changes
        self.figures.load_reconnects += load.reconnects
        self.figures.events_sent += load.events.acked

    def failed_batches(self) -> int:
        """Batches the running pipeline reported as failed so far (its log)."""
        return self.pipeline.log_text().count("batch failed (")

    def broker_errors(self) -> int:
        """Failures to reach the broker the running pipeline met so far: failed batches, and librdkafka's
        own connection failures (a client waits out a short outage inside its timeouts without failing)."""
        text = self.pipeline.log_text()
        return text.count("batch failed (") + len(
            re.findall(
                r"FAIL\|rdkafka#[^|]+\|.*(?:Connection refused|"
                r"timed out|Disconnected)",
                text,
            )
        )

    def _execute(self, *statements: str) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn, conn.cursor() as cur:
                for stmt in statements:
                    cur.execute(stmt)
        finally:
            conn.close()

    # -- checks -----------------------------------------------------------------------------
    def settle_and_verify(self, timeout: float = float(os.environ.get("LAKESTREAM_CHAOS_SETTLE_S", 600))) -> dict:
        """Write a marker row to every table; once Debezium has published it (so everything before it),
        wait until the running pipeline has consumed every topic to its end; then `lakestream verify`."""
        self.marker += 1
        mark = -self.marker
        self._execute(
            f"INSERT INTO accounts VALUES ({mark}, 0, 'marker', 0)",
            f"INSERT INTO transfers VALUES ({mark}, 0, 0, 'marker')",
        )
        deadline = time.monotonic() + timeout
        consumer = Consumer(
            {
                "bootstrap.servers": self.info.bootstrap_servers,
                "group.id": "lakestream-chaos",
                "enable.auto.commit": False,
            }
        )
        try:
            ends: dict[str, int] = {}
            while True:
                assert self.pipeline.alive, (
                    f"pipeline exited (code {self.pipeline.proc.returncode}):\n{self.pipeline.tail()}"
                )
                assert time.monotonic() < deadline, (
                    f"pipeline did not catch up ({ends}):\n{self.pipeline.tail()}\n"
                    f"--- its threads ---\n{self.pipeline.stacks()}"
                )
                every = [*self.topics, self.events_topic]
                parts = [TopicPartition(t, 0) for t in every]
                ends = {
                    t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10, cached=False)[1] for t in every
                }
                committed = {p.topic: p.offset for p in consumer.committed(parts, timeout=10)}
                if all(_holds_marker(self.info.bootstrap_servers, t, ends[t], mark) for t in self.topics) and all(
                    committed[t] >= ends[t] for t in every
                ):
                    break
                time.sleep(1.0)
        finally:
            consumer.close()
        assert self.maintenance.alive, f"maintenance exited:\n{self.maintenance.tail()}"
        caught_up = time.monotonic()
        log.info("caught up with the topics in %.1fs; verifying", caught_up - (deadline - timeout))
        result = run_lakestream("verify", str(self.config_path), "--json", timeout=600)
        log.info("verify took %.1fs", time.monotonic() - caught_up)
        assert result.returncode == 0, f"lakestream verify failed:\n{result.stdout}\n{result.stderr[-3000:]}"
        report = json.loads(result.stdout)
        assert report["ok"] and all(t["duplicate_keys"] == 0 for t in report["tables"]), result.stdout
        self.figures.verifies += 1
        self.figures.rows_checked += sum(t["source_rows"] for t in report["tables"])
        self.check_exact_counts()
        return report

    def _counts(self, distinct: dict[str, str]) -> dict[str, tuple[int, int]]:
        """(rows, distinct values of the column) of each table of ``distinct`` (table → column), by one `lakestream
        sql` process: each process costs an interpreter start and DuckDB's Iceberg extension load."""
        query = " UNION ALL ".join(
            f"SELECT '{table}' AS t, count(*) AS n, count(DISTINCT {column}) AS d FROM lake.{self.namespace}.{table}"
            for table, column in distinct.items()
        )
        result = run_lakestream(
            "sql", str(self.config_path), query, "--engine", "duckdb", "--format", "json", timeout=300
        )
        assert result.returncode == 0, f"counting {list(distinct)} failed:\n{result.stdout}\n{result.stderr[-3000:]}"
        rows = json.loads(result.stdout)
        rows = rows if isinstance(rows, list) else rows["rows"]
        counts = {}
        for row in rows:
            t, n, d = (row["t"], row["n"], row["d"]) if isinstance(row, dict) else row
            counts[t] = (int(n), int(d))
        assert counts.keys() == distinct.keys(), counts
        return counts

    def check_exact_counts(self) -> None:
        """The append table holds each acknowledged event once; each transform output holds one row per
        change record of its topic (tombstones carry no row), each Kafka offset once."""
        counts = self._counts({"events": "event_id", **{f"changes_{t}": "_kafka_offset" for t in TABLES}})
        n, d = counts["events"]
        assert (n, d) == (self.figures.events_sent, self.figures.events_sent), (
            f"append table: {n} rows / {d} distinct events, {self.figures.events_sent} sent"
        )
        self.figures.append_rows_checked += n
        for table, topic in zip(TABLES, self.topics, strict=True):
            want = count_values(self.info.bootstrap_servers, topic)
            n, d = counts[f"changes_{table}"]
            assert (n, d) == (want, want), f"changes_{table}: {n} rows / {d} distinct offsets, {want} change records"
            self.figures.append_rows_checked += n


def _holds_marker(bootstrap: str, topic: str, end: int, mark: int) -> bool:
    """Whether one of the last records before ``end`` in ``topic`` is the marker row's create event."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, max(0, end - 50))])
        seen, last = 0, min(end, 50)
        while seen < last:
            msgs = consumer.consume(last - seen, timeout=5)  # what is left: asking for more waits out the timeout
            if not msgs:
                return False
            for msg in msgs:
                if msg.error() is not None:
                    continue
                seen += 1
                if msg.key() and json.loads(msg.key()).get("payload", {}).get("id") == mark:
                    return True
        return False
    finally:
        consumer.close()


def count_resent(bootstrap: str, topics: list[str], starts: dict[str, int]) -> int:
    """Change events from ``starts`` on that repeat an earlier one (same LSN, key and op): Debezium's re-sends."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    seen: set[tuple] = set()
    repeats = 0
    try:
        present = consumer.list_topics(timeout=10).topics
        for topic in topics:
            if topic not in present:
                continue  # nothing published to it yet: nothing re-sent
            # Up to the end listed now: while capture and the load go on, Kafka may never answer with
            # end-of-partition (each fetch finds a few new records), and a read waiting for it never ends.
            end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
            position = starts.get(topic, 0)
            consumer.assign([TopicPartition(topic, 0, position)])
            while position < end:
                msgs = consumer.consume(1000, timeout=5)
                if not msgs:
                    break
                for msg in msgs:
                    if msg.error() is not None:
                        continue  # partition EOF
                    position = msg.offset() + 1
                    if msg.value() is None:
                        continue
                    payload = json.loads(msg.value()).get("payload") or {}
                    ident = (topic, msg.key(), (payload.get("source") or {}).get("lsn"), payload.get("op"))
                    repeats += ident in seen
                    seen.add(ident)
    finally:
        consumer.close()
    return repeats


def end_offsets(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """The end offset of each topic; 0 for one capture has not created yet (``transfers`` has no seed rows: its
    topic appears with the write load's first transfer)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        present = consumer.list_topics(timeout=10).topics
        return {
            t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10, cached=False)[1] if t in present else 0
            for t in topics
        }
    finally:
        consumer.close()
