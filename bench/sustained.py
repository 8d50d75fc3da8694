"""A sustained run on a big mirror: a steady rate of Debezium changes with inline maintenance on, and one SIGKILL
of `lakestream run` in the middle (issue 21's second target).

    .venv/bin/python bench/sustained.py [--rows 100000000] [--rate 5000] [--duration 600] [--kill-at 0.5]
                                        [--state-dir DIR] [--keep] [--reuse]

The base: an upsert mirror `bench.orders` of ``--rows`` rows, created by the pipeline from real (schemas-off)
Debezium events and filled through the sink's own write path (`_common.fill_through_write_path`, as
bench/scale.py does: ``--rows-per-file`` rows a file), then one pipeline batch brings its key index up to date,
durable beside the table. At 100M rows that takes long: with ``--state-dir DIR --keep`` the stack, the table, its
index and the model of its content stay in DIR, and a later ``--state-dir DIR --reuse`` starts from them (each run
reads a topic of its own; a run that did not end with an exact mirror leaves the base marked unusable).

The run: `lakestream run` as a real subprocess (its own process group: driver and Spark JVM), inline maintenance
(`maintenance.mode: inline`, a round every ``--maintenance-interval`` s, the first ``start_delay_s`` (60 s) after each
start, compaction of the
table's one partition even while it is written — ``quiet_time_s: 0`` —, once it holds more than
``--compact-max-files`` files, into files of ``--compact-target-mb``, by default the base's median file size).
Iceberg's binpack rewrites the files below 0.75× or above 1.8× the target: with the default the base's files are
left alone and the smaller files the stream adds are compacted. That needs base files well above the stream's
(a few hundred KB a batch at 5,000 changes/s), hence ``--rows-per-file`` 200,000 by default (~2.5 MB, 500 files at
100M rows: a base whose earlier compactions are done). With scale.py's 10,000 (thousands of small files) the
stream's files are no smaller than the base's and a round compacts nothing; the output says so. A producer sends
``--rate`` changes/s for ``--duration`` s: updates of random existing keys (85%), deletes
(10%, with their tombstones) and inserts of new keys (5%), keeping the expected count and sums. At ``--kill-at``
of the duration the pipeline's process group is SIGKILLed and started again at once. The records the pipeline has
committed are deleted from the broker as the run goes (`Retention`: the local broker rewrites every record it holds
every few seconds, which took most of a core by the end of a run).

Measured:
- freshness of every change: the commit time of the first snapshot whose `lakestream.offsets` covers its offset
  minus its produce time (the snapshots are polled all along, so expiry loses none): p50/p99 over the run, and
  p99 outside the restart (without the changes produced before the restart's first commit that became visible
  after the kill);
- restart: SIGKILL → the first snapshot the new process committed, and until the changes committed are back to
  the p99 before the kill;
- maintenance: each round (the pipeline's maintenance log) with its actions, the snapshots it committed, and the
  worst batch from its start to the first batch after it (and after each of its snapshots), against the median
  batch outside rounds and the restart (batch times from the pipeline's metrics log);
- at the end, after the pipeline drained and stopped: the mirror against the model (count, sum(version),
  sum(qty)) and no duplicate key (GROUP BY id HAVING count(*) > 1); the pipeline's peak memory (its process
  group's RSS); the load averages, and the cores the pipeline, the broker and the bench itself used during the load.

Targets (issue 21): freshness p99 ≤ 5 s outside the restart; a round adds ≤ 1 s to the next batch; restart to
first commit ≤ 30 s; the mirror exact. A progress line goes to stderr every 10 s; the LAST line of stdout is one
JSON object.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents,
    FastProducer,
    OrderRow,
    fill_through_sql,
    fill_through_write_path,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
    write_pipeline_yaml,
)

from lakestream.config import CompactionPolicy  # noqa: E402
from lakestream.engine.freshness import freshness_from_metrics  # noqa: E402
from lakestream.engine.loop import metrics_path, run_pipeline  # noqa: E402
from lakestream.faults import ENV_VAR as PAUSE_ENV  # noqa: E402
from lakestream.faults import PAUSE_MARKER  # noqa: E402
from lakestream.maintenance.history import maintenance_log_path  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, decode_offsets  # noqa: E402

NAMESPACE, TABLE = "bench", "orders"
PIPELINE = "sustained"
BASE_FILE = "sustained-base.json"
MODEL_FILE = "sustained-model.npz"
DELETE_SHARE, INSERT_SHARE = 0.10, 0.05
SQL_ROWS_PER_INSERT = 2_000_000  # --grow sql


# -- the expected content of the mirror ---------------------------------------------------------------


class MirrorModel:
    """What the mirror must hold: ids 1..``base_rows`` as the fill wrote them (version 1, qty ``id % 19 + 1``),
    overlaid by every key changed since (id → (version, qty), or None once deleted)."""

    def __init__(self, base_rows: int, next_id: int, overlay: dict[int, tuple[int, int] | None] | None = None):
        self.base_rows = base_rows
        self.next_id = next_id  # the next inserted key
        self.overlay = overlay if overlay is not None else {}

    @staticmethod
    def base_qty(row_id: int) -> int:
        return row_id % 19 + 1

    def current(self, row_id: int) -> tuple[int, int] | None:
        """(version, qty) of a live key, None for a deleted or never-inserted one."""
        if row_id in self.overlay:
            return self.overlay[row_id]
        return (1, self.base_qty(row_id)) if 1 <= row_id <= self.base_rows else None

    def totals(self) -> dict[str, int]:
        """count, sum(version), sum(qty) of the rows the mirror must hold."""
        n = self.base_rows
        cycles, rest = divmod(n, 19)
        count, versions, qty = n, n, n + 171 * cycles + rest * (rest + 1) // 2  # Σ (id % 19 + 1), id = 1..n
        if self.overlay:
            ids = np.fromiter(self.overlay.keys(), np.int64, len(self.overlay))
            values = list(self.overlay.values())
            alive = np.fromiter((v is not None for v in values), bool, len(values))
            version = np.fromiter((v[0] if v else 0 for v in values), np.int64, len(values))
            qtys = np.fromiter((v[1] if v else 0 for v in values), np.int64, len(values))
            base = ids <= n
            count += int(alive.sum()) - int(base.sum())
            versions += int(version.sum()) - int(base.sum())
            qty += int(qtys.sum()) - int((ids[base] % 19 + 1).sum())
        return {"count": count, "sum_version": versions, "sum_qty": qty}

    def save(self, path: Path) -> None:
        ids = np.fromiter(self.overlay.keys(), np.int64, len(self.overlay))
        values = list(self.overlay.values())
        np.savez(
            path,
            base_rows=self.base_rows,
            next_id=self.next_id,
            ids=ids,
            alive=np.fromiter((v is not None for v in values), bool, len(values)),
            version=np.fromiter((v[0] if v else 0 for v in values), np.int64, len(values)),
            qty=np.fromiter((v[1] if v else 0 for v in values), np.int64, len(values)),
        )

    @classmethod
    def load(cls, path: Path) -> MirrorModel:
        with np.load(path) as data:
            overlay = {
                int(i): ((int(v), int(q)) if a else None)
                for i, a, v, q in zip(data["ids"], data["alive"], data["version"], data["qty"], strict=True)
            }
            return cls(int(data["base_rows"]), int(data["next_id"]), overlay)


# -- the base table -------------------------------------------------------------------------------------


@dataclass
class Base:
    """The reusable base of a state dir (``sustained-base.json``): the table as filled, and how many runs
    changed it since."""

    rows: int
    rows_per_file: int
    data_files: int
    median_file_bytes: int
    fill_s: float | None
    index_build_s: float | None
    runs: int = 0
    grown_by: str = "write-path"  # or "sql": INSERTs by Spark SQL, another writer
    clean: bool = True  # False while a run changes the table, until the run ends with the mirror exact
    reused: bool = False

    def save(self, state_dir: Path) -> None:
        fields = {k: v for k, v in self.__dict__.items() if k != "reused"}
        (state_dir / BASE_FILE).write_text(json.dumps(fields, indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> Base | None:
        path = state_dir / BASE_FILE
        return cls(**json.loads(path.read_text()), reused=True) if path.exists() else None


def build_base(info, state_dir: Path, spark, args) -> tuple[Base, MirrorModel]:
    """Create the mirror from 100 events, fill it to ``args.rows`` through the sink's write path, and run the
    one batch (one update) that brings its key index up to date, durable beside the table."""
    events = DebeziumEvents("lssust0", TABLE, schemas=False)
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            PIPELINE,
            [{"topics": [events.topic], "mode": "upsert", "namespace": NAMESPACE, "table": TABLE}],
            driver_memory=args.driver_memory,
        )
    )
    producer = FastProducer(info.bootstrap_servers)
    now = int(time.time() * 1000)
    first = min(100, args.rows)
    for row_id in range(1, first + 1):
        producer.send(
            events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, MirrorModel.base_qty(row_id), 1), "c", now)
        )
    producer.flush()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    started = time.perf_counter()
    if args.grow == "sql":
        inserts = (
            fill_through_sql(
                spark,
                f"{NAMESPACE}.{TABLE}",
                first + 1,
                args.rows + 1,
                SQL_ROWS_PER_INSERT,
                max(1, SQL_ROWS_PER_INSERT // args.rows_per_file),
            )
            if args.rows > first
            else 0
        )
        fill_s = time.perf_counter() - started
        say(f"base: {args.rows:,} rows added by {inserts} Spark SQL INSERT(s) in {fill_s:.0f}s")
    else:
        files = (
            fill_through_write_path(
                spark, config, f"{NAMESPACE}.{TABLE}", first + 1, args.rows + 1, args.rows_per_file, like_events=True
            )
            if args.rows > first
            else 0
        )
        fill_s = time.perf_counter() - started
        say(f"base: {args.rows:,} rows filled through the write path in {fill_s:.0f}s ({files:,} files)")
    model = MirrorModel(args.rows, args.rows + 1)
    producer.send(events.topic, *events.upsert(OrderRow(1, 1, 1, 2), "u", now))
    model.overlay[1] = (2, 1)
    producer.flush()
    started = time.perf_counter()
    run_pipeline(config, spark=spark, stop_when_idle=True)  # closes the pipeline: the index is durable
    index_s = time.perf_counter() - started
    row = spark.sql(
        f"SELECT count(*) AS n, percentile_approx(file_size_in_bytes, 0.5) AS median "
        f"FROM lake.{NAMESPACE}.{TABLE}.data_files"
    ).collect()[0]
    base = Base(
        rows=args.rows,
        rows_per_file=args.rows_per_file,
        data_files=int(row["n"]),
        median_file_bytes=int(row["median"]),
        fill_s=round(fill_s, 1),
        index_build_s=round(index_s, 1),
        grown_by=args.grow,
    )
    say(
        f"base: key index brought up to date in {index_s:.0f}s (a build on the executors above 2M rows); "
        f"{base.data_files:,} data files, median {base.median_file_bytes / 1e6:.2f} MB"
    )
    return base, model


def base_for_run(info, state_dir: Path, spark, args) -> tuple[Base, MirrorModel]:
    """The state dir's base when ``--reuse`` finds a clean one of ``--rows`` rows, else a new one."""
    if args.reuse:
        base = Base.load(state_dir)
        if base is None:
            raise SystemExit(f"--reuse: no {BASE_FILE} in {state_dir}: run once with --state-dir {state_dir} --keep")
        if base.rows != args.rows:
            raise SystemExit(f"--reuse: the base in {state_dir} has {base.rows:,} rows, not --rows {args.rows:,}")
        if not base.clean:
            raise SystemExit(
                f"--reuse: the last run on the base in {state_dir} did not end with an exact mirror "
                "(or was interrupted): its content is unknown — build a new base"
            )
        say(f"base: reusing {base.rows:,} rows, {base.data_files:,} files, changed by {base.runs} earlier run(s)")
        return base, MirrorModel.load(state_dir / MODEL_FILE)
    if (state_dir / BASE_FILE).exists():
        raise SystemExit(f"{state_dir} already holds a base: pass --reuse, or another --state-dir")
    return build_base(info, state_dir, spark, args)


# -- the load ---------------------------------------------------------------------------------------------


@dataclass
class Deliveries:
    """Partition → (offsets, produce times in ms) of every change record the broker acknowledged (tombstones
    left out), appended from the producer's thread."""

    offsets: dict[int, array] = field(default_factory=dict)
    produced_ms: dict[int, array] = field(default_factory=dict)
    end_offsets: dict[int, int] = field(default_factory=dict)  # partition → last acknowledged offset + 1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, msg) -> None:
        partition, offset = msg.partition(), msg.offset()
        with self.lock:
            self.end_offsets[partition] = max(self.end_offsets.get(partition, 0), offset + 1)
            if msg.value() is None:
                return
            if partition not in self.offsets:
                self.offsets[partition], self.produced_ms[partition] = array("q"), array("q")
            self.offsets[partition].append(offset)
            self.produced_ms[partition].append(msg.timestamp()[1])

    def ends(self) -> dict[int, int]:
        with self.lock:
            return dict(self.end_offsets)


class ChangeLoad(threading.Thread):
    """Debezium change events at a steady rate, in 10 ms slices: updates of random existing keys, deletes
    (and their tombstones) and inserts of new keys, applied to the model as they are sent."""

    def __init__(
        self, bootstrap: str, events: DebeziumEvents, model: MirrorModel, rate: float, duration: float, seed: int
    ):
        super().__init__(name="sustained-load", daemon=True)
        self.events, self.model, self.rate, self.duration = events, model, rate, duration
        self.rng = random.Random(seed)
        self.deliveries = Deliveries()
        self.producer = FastProducer(bootstrap, on_delivered=self.deliveries.record)
        self.counts = {"u": 0, "d": 0, "c": 0}
        self.started_ms = 0
        self.seconds = 0.0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    @property
    def changes(self) -> int:
        return sum(self.counts.values())

    def send_change(self) -> None:
        model, events, rng = self.model, self.events, self.rng
        now = int(time.time() * 1000)
        draw = rng.random()
        if draw < INSERT_SHARE:
            row_id = model.next_id
            model.next_id += 1
            qty = rng.randrange(1, 20)
            self.producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, qty, 1), "c", now), now)
            model.overlay[row_id] = (1, qty)
            self.counts["c"] += 1
            return
        while True:  # a random key that exists
            row_id = rng.randrange(1, model.next_id)
            current = model.current(row_id)
            if current is not None:
                break
        if draw < INSERT_SHARE + DELETE_SHARE:
            for key, value in events.delete(row_id, now):
                self.producer.send(events.topic, key, value, now)
            model.overlay[row_id] = None
            self.counts["d"] += 1
        else:
            version, qty = current[0] + 1, rng.randrange(1, 20)
            self.producer.send(
                events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, qty, version), "u", now), now
            )
            model.overlay[row_id] = (version, qty)
            self.counts["u"] += 1

    def run(self) -> None:
        try:
            started = time.monotonic()
            self.started_ms = int(time.time() * 1000)
            sent = 0
            while not self.stop.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= self.duration:
                    break
                due = int(elapsed * self.rate)
                while sent < due:
                    self.send_change()
                    sent += 1
                self.producer.poll()
                time.sleep(0.01)
            self.seconds = time.monotonic() - started
            self.producer.flush()
        except BaseException as exc:  # noqa: BLE001 — surfaced by the main thread
            self.error = exc


KILL_POINTS = {
    "anywhere": None,
    "landed": "commit.table.landed",
    # Inside the pipeline's own compaction (the first one after --kill-at): its files written, its commit
    # about to be made, its snapshot landed without the key index's delta.
    "compaction-written": "maintenance.rewrite.written",
    "compaction-before": "maintenance.commit.before",
    "compaction-landed": "maintenance.commit.landed",
}


# -- the pipeline process ------------------------------------------------------------------------------


class PipelineProcess:
    """`lakestream run` in its own process group (driver + Spark JVM + Python workers), output in a log file."""

    def __init__(self, config_path: Path, log_path: Path):
        self.config_path, self.log_path = config_path, log_path
        self.log_start = log_path.stat().st_size if log_path.exists() else 0  # this run's part of a kept log
        self.proc: subprocess.Popen | None = None
        self.peak_rss = 0

    def start(self, note: str, env: dict[str, str] | None = None) -> float:
        """Start it (``env`` added to this environment); returns the wall-clock time (ms) of the spawn."""
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} {note} =====\n".encode())
            out.flush()
            self.spawn_offset = out.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lakestream", "run", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.config_path.parent,
                env={**os.environ, **(env or {})},
            )
        return time.time() * 1000

    def logged_since_spawn(self, text: str) -> bool:
        """Whether this life's log holds ``text``."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.spawn_offset)
                return text.encode() in fh.read()
        except OSError:
            return False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL the whole group at once, as a machine crash would; returns the time (ms) of the kill."""
        assert self.proc is not None
        killed_ms = time.time() * 1000
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(60)
        return killed_ms

    def stop(self, timeout: float) -> bool:
        """SIGTERM (finish the batch, the maintenance round, close); SIGKILL after ``timeout``. True if clean."""
        if not self.alive:
            return False
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout) == 0
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def sample_rss(self, cpu: CpuMeter | None = None) -> None:
        """The pipeline's resident memory now (its group and every descendant: `tree_pids`), kept as the peak; its
        CPU time into ``cpu``."""
        if not self.alive:
            return
        pids, total = tree_pids(self.proc.pid), 0
        for pid in pids:
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
        self.peak_rss = max(self.peak_rss, total)
        if cpu is not None:
            cpu.sample("pipeline", pids)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class CpuMeter:
    """CPU seconds used by groups of processes over the run (``/proc/<pid>/stat``), sampled with the RSS: the pipeline
    (its process group, both lives), the broker, and this bench (producer, snapshot watcher, its Spark). On 2 cores
    the broker and the load generator share the machine with the pipeline; their share says what the pipeline had."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[int, float]] = {}  # group → pid → last cumulative CPU seconds

    def sample(self, group: str, pids: list[int]) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        seen = self.seen.setdefault(group, {})
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                seen[pid] = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
            except (OSError, ValueError, IndexError):
                continue

    def totals(self) -> dict[str, float]:
        return {group: sum(pids.values()) for group, pids in self.seen.items()}

    def cores(self, since: dict[str, float], seconds: float) -> dict[str, float]:
        """Average cores each group used over the ``seconds`` since ``totals()`` gave ``since``."""
        return (
            {group: round((total - since.get(group, 0.0)) / seconds, 2) for group, total in self.totals().items()}
            if seconds > 0
            else {}
        )


def tree_pids(root: int) -> list[int]:
    """A process's group and every descendant of it: PySpark's Python worker daemon puts itself in a group of its
    own (``os.setpgid(0, 0)`` in ``pyspark.daemon``), and Lakestream's write tasks run in its workers, so the group
    alone misses them."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = {root}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return sorted(tree | set(group_pids(root)))


def group_pids(pgid: int) -> list[int]:
    """The processes of a process group."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def broker_pids(state_dir: Path) -> list[int]:
    """The local broker serving ``state_dir`` (its data dir is in its command line)."""
    mark = str(state_dir / "kafka").encode()
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if mark in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Retention:
    """Deletes the records the pipeline has committed from the broker (Kafka's DeleteRecords), as a topic's retention
    would. The local broker keeps every record in memory and rewrites all of them into one JSON file every few
    seconds: 3M changes grow that file to ~1 GB and its rewrites to most of a core by the end of a run (measured:
    0.55 cores on average, 0.7-0.95 in the last minutes), taken from the pipeline's 2 cores. A real cluster's
    brokers run on machines of their own. Only offsets below the newest commit's go: a restart resumes from there."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        self.topic = topic
        self.trimmed: dict[int, int] = {}
        self.failures = 0

    def trim(self, covered: dict[int, int]) -> None:
        from confluent_kafka import TopicPartition

        ahead = [TopicPartition(self.topic, p, off) for p, off in covered.items() if off > self.trimmed.get(p, 0)]
        if not ahead:
            return
        for tp, future in self.admin.delete_records(ahead, request_timeout=10).items():
            try:
                future.result(timeout=15)
                self.trimmed[tp.partition] = tp.offset
            except Exception:  # noqa: BLE001 — the next poll tries again; the run does not depend on it
                self.failures += 1


# -- the table's snapshots -------------------------------------------------------------------------------


@dataclass
class Snap:
    snapshot_id: int
    sequence: int
    committed_ms: int
    operation: str
    offsets: dict[int, int] | None  # partition → next offset of this run's topic (pipeline commits only)
    summary: dict[str, str]


class SnapshotWatch:
    """Every snapshot of the mirror, polled through pyiceberg while the run goes on, so that none is lost to
    snapshot expiry before the end."""

    KEPT = (
        "added-data-files",
        "deleted-data-files",
        "added-records",
        "deleted-records",
        "added-files-size",
        "added-delete-files",
        "removed-delete-files",
        "added-dvs",
        "removed-dvs",
        "total-data-files",
        "total-delete-files",
        "lakestream.batch-id",
    )

    def __init__(self, config, topic: str):
        from lakestream.read.query import pyiceberg_catalog

        self.catalog = pyiceberg_catalog(config.catalog)
        self.topic = topic
        self.snaps: dict[int, Snap] = {}

    def poll(self) -> None:
        table = self.catalog.load_table((NAMESPACE, TABLE))
        for s in table.metadata.snapshots:
            if s.snapshot_id in self.snaps:
                continue
            summary = s.summary or {}
            raw = summary.get(OFFSETS_PROPERTY) if summary else None
            offsets = None
            if raw:
                offsets = {tp.partition: off for tp, off in decode_offsets(raw).items() if tp.topic == self.topic}
            self.snaps[s.snapshot_id] = Snap(
                s.snapshot_id,
                int(s.sequence_number or 0),
                int(s.timestamp_ms),
                summary.operation.value if summary else "?",
                offsets or None,
                {k: summary.get(k) for k in self.KEPT if summary and summary.get(k) is not None},
            )

    def ordered(self) -> list[Snap]:
        return sorted(self.snaps.values(), key=lambda s: (s.sequence, s.committed_ms))

    def commits(self) -> list[Snap]:
        """The pipeline's commits that carry this run's offsets, in commit order."""
        return [s for s in self.ordered() if s.offsets]

    def covered(self) -> dict[int, int]:
        """Partition → the next offset the newest commit holds."""
        commits = self.commits()
        return dict(commits[-1].offsets) if commits else {}


# -- the figures ------------------------------------------------------------------------------------------


def visibility(deliveries: Deliveries, commits: list[Snap]) -> tuple[np.ndarray, np.ndarray]:
    """(produce ms, visible ms) of every change record; visible is the commit time of the first commit whose
    offsets pass the record's offset (NaN if none did)."""
    produced, visible = [], []
    for partition, offsets in deliveries.offsets.items():
        offs = np.array(offsets, dtype=np.int64)
        times = np.array(deliveries.produced_ms[partition], dtype=np.float64)
        marks = [(c.offsets.get(partition, 0), c.committed_ms) for c in commits]
        # A record is visible from the first commit whose stored next offset exceeds it; offsets only grow
        # along the commits, but take the running max so a commit of another table shape cannot confuse it.
        ends = np.maximum.accumulate(np.array([m[0] for m in marks] or [0], dtype=np.int64))
        stamps = np.array([m[1] for m in marks] or [np.nan], dtype=np.float64)
        index = np.searchsorted(ends, offs, side="right")
        seen = np.full(len(offs), np.nan)
        ok = index < len(marks)
        seen[ok] = stamps[index[ok]]
        produced.append(times)
        visible.append(seen)
    if not produced:
        return np.array([]), np.array([])
    return np.concatenate(produced), np.concatenate(visible)


def quantiles(seconds: np.ndarray) -> dict[str, float | None]:
    seconds = seconds[~np.isnan(seconds)]
    if not len(seconds):
        return {"p50": None, "p99": None, "max": None}
    p50, p99 = np.percentile(seconds, [50, 99])
    return {"p50": round(float(p50), 2), "p99": round(float(p99), 2), "max": round(float(seconds.max()), 2)}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def round_windows(log_lines: list[dict[str, Any]]) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(start ms, end ms, actions) of each round in the pipeline's maintenance log. The actions of a round run one
    after the other and share its end time; its start (``round_started_ms``) comes before the tables' metrics
    read. Logs written before it was recorded: the actions' own times back from the end (a little late)."""
    by_end: dict[int, list[dict[str, Any]]] = {}
    for line in log_lines:
        by_end.setdefault(int(line["finished_ms"]), []).append(line)
    return [
        (
            min(
                (int(a["round_started_ms"]) for a in actions if a.get("round_started_ms") is not None),
                default=end - int(1000 * sum(float(a.get("seconds") or 0) for a in actions)),
            ),
            end,
            actions,
        )
        for end, actions in sorted(by_end.items())
    ]


def describe_round(
    started: int,
    finished: int,
    actions: list[dict[str, Any]],
    own: list[Snap],
    affected: list[dict[str, Any]],
    next_batch: dict[str, Any] | None,
    quiet_median_s: float | None,
) -> dict[str, Any]:
    worst = max(affected, key=lambda b: b["seconds"]) if affected else None
    return {
        "started_ms": started,
        "finished_ms": finished,
        "seconds": round((finished - started) / 1000, 1),
        "actions": [
            {
                "action": a["action"],
                "status": a["status"],
                "seconds": round(float(a.get("seconds") or 0), 1),
                "files_before": a.get("files_before"),
                "files_after": a.get("files_after"),
                **({"error": a["error"][:200]} if a.get("error") else {}),
                **{
                    k: v
                    for k, v in (a.get("detail") or {}).items()
                    if k in ("rewritten_data_files", "added_data_files")
                },
            }
            for a in actions
        ],
        "snapshots": [{"operation": s.operation, "committed_ms": s.committed_ms, **s.summary} for s in own],
        "batches_affected": len(affected),
        "next_batch_s": next_batch["seconds"] if next_batch else None,
        "worst_batch_s": worst["seconds"] if worst else None,
        "adds_s": round(worst["seconds"] - quiet_median_s, 2) if worst and quiet_median_s is not None else None,
    }


def maintenance_figures(
    log_lines: list[dict[str, Any]],
    maint_snaps: list[Snap],
    batches: list[dict[str, Any]],
    restart: tuple[float, float],
) -> dict[str, Any]:
    """Each round with the worst batch from its start to the first batch after it (and after each snapshot it
    committed: a compaction makes the next batch read the index's diff), against the median of the batches no
    round and no restart touched."""
    batches = sorted(batches, key=lambda b: b["commit_ts_ms"])
    times = [b["commit_ts_ms"] for b in batches]

    def first_after(t: float) -> int | None:
        i = bisect.bisect_right(times, t)
        return i if i < len(batches) else None

    windows = round_windows(log_lines)
    slowed: set[int] = set()
    per_round = []
    for started, finished, actions in windows:
        own = [s for s in maint_snaps if started - 1000 <= s.committed_ms <= finished + 1000]
        # A batch that ended at the round's start (the loop starts a round after a batch) ran before it.
        hit = {i for i, t in enumerate(times) if started < t <= finished}
        hit |= {i for i in (first_after(t) for t in [finished] + [s.committed_ms for s in own]) if i is not None}
        slowed |= hit
        # A round the SIGKILL cut short: the restart's batches are the restart's figures, not the round's.
        nxt = first_after(finished)
        cut = {i for i in hit if restart[0] <= times[i] <= restart[1]}
        if nxt in cut:
            nxt = None
        per_round.append((started, finished, actions, own, hit - cut, nxt))
    unlogged = [s for s in maint_snaps if not any(w[0] - 1000 <= s.committed_ms <= w[1] + 1000 for w in windows)]
    slowed |= {i for i in (first_after(s.committed_ms) for s in unlogged) if i is not None}
    quiet = [
        b["seconds"] for i, b in enumerate(batches) if i not in slowed and not restart[0] <= times[i] <= restart[1]
    ]
    median = round(statistics.median(quiet), 2) if quiet else None
    rounds = [
        describe_round(
            started,
            finished,
            actions,
            own,
            [batches[i] for i in sorted(hit)],
            batches[nxt] if nxt is not None else None,
            median,
        )
        for started, finished, actions, own, hit, nxt in per_round
    ]
    adds = [r["adds_s"] for r in rounds if r["adds_s"] is not None]
    compact_actions = [a for r in rounds for a in r["actions"] if a["action"] == "compact"]
    return {
        "batch_median_quiet_s": median,
        "maintenance_rounds": rounds,
        "maintenance_snapshots": len(maint_snaps),
        "maintenance_snapshots_unlogged": [
            {"operation": s.operation, "committed_ms": s.committed_ms, **s.summary} for s in unlogged
        ],
        "compactions_committed": len(
            [s for s in maint_snaps if s.operation == "replace" and int(s.summary.get("deleted-data-files", 0))]
        ),
        "compactions_attempted": len(compact_actions),
        "compaction_statuses": sorted({a["status"] for a in compact_actions}),
        "worst_batch_after_round_s": max(
            (r["worst_batch_s"] for r in rounds if r["worst_batch_s"] is not None), default=None
        ),
        "round_adds_s": max(adds) if adds else None,
    }


def verify_mirror(spark, model: MirrorModel) -> dict[str, Any]:
    """count, sum(version), sum(qty) and duplicate keys of the mirror against the model."""
    table = f"lake.{NAMESPACE}.{TABLE}"
    spark.sql(f"REFRESH TABLE {table}")
    started = time.perf_counter()
    row = spark.sql(f"SELECT count(*) AS n, sum(version) AS v, sum(qty) AS q FROM {table}").collect()[0]
    duplicates = spark.sql(f"SELECT count(*) FROM (SELECT id FROM {table} GROUP BY id HAVING count(*) > 1)").collect()[
        0
    ][0]
    want = model.totals()
    got = {"count": int(row["n"]), "sum_version": int(row["v"] or 0), "sum_qty": int(row["q"] or 0)}
    return {
        "exact": got == want and duplicates == 0,
        "got": got,
        "want": want,
        "duplicate_keys": int(duplicates),
        "seconds": round(time.perf_counter() - started, 1),
    }


def analyse(
    load: ChangeLoad, watch: SnapshotWatch, kill_ms: float, restart_spawn_ms: float, first_spawn_ms: float, config
) -> dict[str, Any]:
    """Freshness, restart and maintenance figures from the deliveries, the snapshots and the pipeline's logs."""
    commits = watch.commits()
    produced, visible = visibility(load.deliveries, commits)
    in_run = produced >= load.started_ms
    produced, visible = produced[in_run], visible[in_run]
    fresh = (visible - produced) / 1000
    after_kill = [c for c in commits if c.committed_ms > kill_ms]
    restart_commit_ms = after_kill[0].committed_ms if after_kill else None
    window = (visible > kill_ms) & (produced < (restart_commit_ms or np.inf))
    before_kill = visible <= kill_ms
    p99_before = quantiles(fresh[before_kill])["p99"]
    # Per commit: the changes it made visible, the oldest of them.
    per_commit = []
    for c in commits:
        mine = visible == c.committed_ms
        per_commit.append((c, int(mine.sum()), float(np.nanmax(fresh[mine])) if mine.any() else None))
    recovered_ms = None
    if p99_before is not None:
        for c, n, oldest in per_commit:
            if c.committed_ms >= (restart_commit_ms or np.inf) and n and oldest is not None and oldest <= p99_before:
                recovered_ms = c.committed_ms
                break
    first_commit = [c for c in commits if c.committed_ms >= first_spawn_ms]
    batches = [
        b
        for b in read_jsonl(metrics_path(config))
        if b.get("commit_ts_ms") and b["commit_ts_ms"] >= load.started_ms and b.get("records")
    ]
    log_lines = [a for a in read_jsonl(maintenance_log_path(config)) if a.get("finished_ms", 0) >= first_spawn_ms]
    maint_snaps = [s for s in watch.ordered() if not s.offsets and s.committed_ms >= first_spawn_ms]
    maintenance = maintenance_figures(
        log_lines, maint_snaps, batches, (kill_ms, recovered_ms or restart_commit_ms or kill_ms)
    )
    stream_files = [
        int(c.summary.get("added-files-size", 0)) // max(1, int(c.summary.get("added-data-files", 1)))
        for c in commits
        if int(c.summary.get("added-data-files", 0))
    ]
    dvs = [int(c.summary.get("added-dvs", 0)) for c in commits if c.committed_ms >= load.started_ms]
    pipeline_fresh = freshness_from_metrics(metrics_path(config), load.started_ms)
    rounds = sorted(
        start
        for start, _, actions in round_windows(log_lines)
        if any((a.get("detail") or {}).get("committed_by") != "pipeline" or a.get("status") != "ok" for a in actions)
    )  # a round, not one of the pipeline's compaction commits
    return {
        "changes_visible": int((~np.isnan(visible)).sum()),
        "changes_never_visible": int(np.isnan(visible).sum()),
        "freshness_s": quantiles(fresh),
        "freshness_outside_restart_s": quantiles(fresh[~window]),
        "freshness_before_kill_s": quantiles(fresh[before_kill]),
        "freshness_after_restart_s": quantiles(fresh[(produced >= (restart_commit_ms or np.inf))]),
        "changes_in_restart_window": int(window.sum()),
        "pipeline_reported_freshness_s": None
        if pipeline_fresh is None
        else {"p50": round(pipeline_fresh.p50_s, 2), "p99": round(pipeline_fresh.p99_s, 2)},
        "first_start_to_first_commit_s": round((first_commit[0].committed_ms - first_spawn_ms) / 1000, 1)
        if first_commit
        else None,
        "restart_to_first_commit_s": round((restart_commit_ms - kill_ms) / 1000, 1) if restart_commit_ms else None,
        "spawn_to_first_commit_s": round((restart_commit_ms - restart_spawn_ms) / 1000, 1)
        if restart_commit_ms
        else None,
        "restart_to_recovered_s": round((recovered_ms - kill_ms) / 1000, 1) if recovered_ms else None,
        "commits": len([c for c in commits if c.committed_ms >= load.started_ms]),
        "batches": len(batches),
        "batch_median_s": round(statistics.median([b["seconds"] for b in batches]), 2) if batches else None,
        "batch_max_s": max((b["seconds"] for b in batches), default=None),
        "stream_file_median_bytes": int(statistics.median(stream_files)) if stream_files else None,
        "dvs_per_commit_median": statistics.median(dvs) if dvs else None,
        "first_round_after_start_s": round((rounds[0] - first_spawn_ms) / 1000, 1) if rounds else None,
        **maintenance,
    }


# -- the run ---------------------------------------------------------------------------------------------


def maintenance_settings(args, base: Base) -> dict[str, Any]:
    """Inline maintenance; a base grown by SQL keeps the policy's default target (a user's standing configuration),
    one filled through the write path the base's median file (see the module doc)."""
    compaction: dict[str, Any] = {"quiet_time_s": 0, "max_files_per_partition": args.compact_max_files}
    if args.compact_max_rows_per_file:
        compaction["max_rows_per_file"] = args.compact_max_rows_per_file
    if args.compact_target_mb or base.grown_by != "sql":
        target = int(args.compact_target_mb * 2**20) if args.compact_target_mb else base.median_file_bytes
        compaction["target_file_size_bytes"] = max(1, target)
    return {
        "mode": "inline",
        "interval_s": args.maintenance_interval or max(10.0, args.duration / 4),
        "policies": [{"tables": ".*", "compaction": compaction}],
    }


def wait_for(predicate, what: str, timeout: float, pipeline: PipelineProcess, watch: SnapshotWatch) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if not pipeline.alive:
            raise SystemExit(
                f"the pipeline exited (code {pipeline.proc.returncode}) waiting for {what}:\n{pipeline.tail()}"
            )
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:.0f}s:\n{pipeline.tail()}")
        time.sleep(1.0)
        watch.poll()
        pipeline.sample_rss()


def run(info, state_dir: Path, spark, args, summary: dict[str, Any]) -> None:
    base, model = base_for_run(info, state_dir, spark, args)
    summary["base"] = {k: v for k, v in base.__dict__.items() if k != "clean"}
    run_no = base.runs + 1
    events = DebeziumEvents(f"lssust{run_no}", TABLE, schemas=False)
    data = pipeline_data(
        info,
        state_dir,
        PIPELINE,
        [{"topics": [events.topic], "mode": "upsert", "namespace": NAMESPACE, "table": TABLE}],
        engine={"commit_interval_s": args.commit_interval, "idle_poll_s": 0.2},
        driver_memory=args.driver_memory,
    )
    data["maintenance"] = maintenance_settings(args, base)
    summary["maintenance_config"] = data["maintenance"]
    config_path = write_pipeline_yaml(state_dir / "sustained.yaml", data)
    config = to_config(data)
    for path in (metrics_path(config), maintenance_log_path(config)):
        if path.exists():  # the previous run's kept beside, to read batch by batch
            shutil.copyfile(path, path.with_name(f"{path.stem}.previous-run{path.suffix}"))
    # The maintenance log starts empty (each run's first round lists orphans, as a first start does); the metrics
    # log stays: the pipeline reads its previous life's batch time there (`maintenance/settle.py`), and the figures
    # below read only this run's batches (by time).
    maintenance_log_path(config).unlink(missing_ok=True)
    base.clean = False  # from the first change on, until the mirror is found exact
    base.save(state_dir)

    load = ChangeLoad(info.bootstrap_servers, events, model, args.rate, args.duration, seed=run_no)
    load.send_change()  # the topic exists, and the pipeline has something to commit, before the clock starts
    load.producer.flush()
    watch = SnapshotWatch(config, events.topic)
    pipeline = PipelineProcess(config_path, state_dir / "sustained-run.log")
    # --kill-point landed: the kill waits for a table commit that has landed and whose key index delta is not
    # written (the pause point, armed by a file at the kill time): the restart then follows that one snapshot by
    # diff, the restart's worst case.
    armed = state_dir / "kill-point-armed"
    armed.unlink(missing_ok=True)
    pause_env = {PAUSE_ENV: f"{KILL_POINTS[args.kill_point]}:900@{armed}"} if KILL_POINTS.get(args.kill_point) else None
    try:
        first_spawn_ms = pipeline.start("start", pause_env)
        wait_for(lambda: bool(watch.commits()), "first commit", 900, pipeline, watch)
        say(
            f"pipeline up: first commit {(watch.commits()[0].committed_ms - first_spawn_ms) / 1000:.1f}s after "
            f"its start; load starts ({args.rate:,.0f} changes/s for {args.duration:.0f}s)"
        )
        summary["load_at_start"] = machine_load()
        cpu, retention = CpuMeter(), Retention(info.bootstrap_servers, events.topic)

        def sample_cpu() -> None:
            pipeline.sample_rss(cpu)
            broker = broker_pids(state_dir)
            cpu.sample("broker", broker)
            # This process and its descendants (its Spark, PySpark's daemon), less the broker and the pipeline's tree.
            others = set(broker) | (set(tree_pids(pipeline.proc.pid)) if pipeline.alive else set())
            cpu.sample("bench", [pid for pid in tree_pids(os.getpid()) if pid not in others])

        sample_cpu()
        cpu_start = cpu.totals()
        load.start()
        started = time.monotonic()
        kill_at = args.kill_at * args.duration
        kill_ms = restart_spawn_ms = restart_offset = None
        last_poll = last_line = 0.0
        while load.is_alive():
            time.sleep(0.5)
            now = time.monotonic()
            if kill_ms is None and now - started >= kill_at and pause_env and not armed.exists():
                armed.touch()  # the pause point holds the next table commit that lands
            if (
                kill_ms is None
                and now - started >= kill_at
                and (
                    not pause_env or pipeline.logged_since_spawn(f"{PAUSE_MARKER} {pause_env[PAUSE_ENV].split(':')[0]}")
                )
            ):
                summary["load_at_kill"] = machine_load()
                kill_ms = pipeline.kill()
                armed.unlink(missing_ok=True)
                summary["killed_at_s"] = round(now - started, 1)
                restart_spawn_ms = pipeline.start("restart after SIGKILL")
                restart_offset = pipeline.spawn_offset
                say(f"SIGKILL of `lakestream run` at {now - started:.0f}s; started again")
            if now - last_poll >= 5:
                last_poll = now
                watch.poll()
                retention.trim(watch.covered())
                sample_cpu()
            if not pipeline.alive:
                load.stop.set()
                raise SystemExit(f"the pipeline exited (code {pipeline.proc.returncode}):\n{pipeline.tail()}")
            if now - last_line >= 10:
                last_line = now
                ends, covered = load.deliveries.ends(), watch.covered()
                behind = sum(max(0, end - covered.get(p, 0)) for p, end in ends.items())
                rounds = len({line.get("finished_ms") for line in read_jsonl(maintenance_log_path(config))})
                print(
                    f"[{now - started:4.0f}s] {load.changes:,} changes sent "
                    f"({load.changes / max(1e-9, now - started):,.0f}/s)"
                    f" · {len(watch.commits()):,} commits, {behind:,} records behind"
                    f" · {rounds} maintenance round(s) · pipeline {'restarted' if kill_ms else 'up'}"
                    f" · load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        if load.error is not None:
            raise SystemExit(f"the load failed: {load.error!r}")
        summary["load_at_end_of_load"] = machine_load()
        sample_cpu()
        summary["cpu_cores_during_load"] = cpu.cores(cpu_start, time.monotonic() - started)
        summary["broker_records_deleted_to"] = dict(retention.trimmed)
        summary["broker_trim_failures"] = retention.failures
        ends = load.deliveries.ends()
        say(f"load done: {load.changes:,} changes in {load.seconds:.0f}s; waiting for the pipeline to commit them")
        wait_for(
            lambda: all(watch.covered().get(p, 0) >= end for p, end in ends.items()),
            "drain",
            max(300.0, args.duration),
            pipeline,
            watch,
        )
        clean_stop = pipeline.stop(300)
    finally:
        if pipeline.alive:
            pipeline.kill()
    watch.poll()
    if kill_ms is None:
        raise SystemExit("the run ended before the kill point")
    figures = analyse(load, watch, kill_ms, restart_spawn_ms, first_spawn_ms, config)
    verify = verify_mirror(spark, model)
    if verify["exact"]:
        base.clean, base.runs = True, run_no
        model.save(state_dir / MODEL_FILE)
        base.save(state_dir)
    summary.update(
        {
            "changes": load.changes,
            "changes_by_op": dict(load.counts),
            "offered_changes_per_s": round(load.changes / load.seconds) if load.seconds else None,
            "kill_at_s": round(kill_at, 1),
            "kill_point": args.kill_point,
            "clean_stop": clean_stop,
            **figures,
            "compaction_log": compaction_log(pipeline.log_path, pipeline.log_start),
            "write_amplification": write_amplification(watch.ordered(), first_spawn_ms),
            "restart_key_index": restart_key_index(pipeline.log_path, restart_offset),
            "verify": verify,
            "pipeline_peak_rss_mb": round(pipeline.peak_rss / 2**20),
        }
    )


def restart_key_index(log_path: Path, offset: int | None) -> dict[str, Any]:
    """How the restarted process brought the key index up to date: its diff line, or a full build."""
    if offset is None:
        return {}
    with open(log_path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    builds = [line for line in lines if "building the key index of" in line or "building it again" in line]
    diffs = [line.split("INFO lakestream.engine.registry: ")[-1] for line in lines if "refreshed by diff" in line]
    return {"full_build": bool(builds), "diff": diffs[0] if diffs else None}


def write_amplification(snaps: list[Snap], since_ms: float) -> dict[str, Any]:
    """Bytes compactions wrote (replace snapshots that removed data files) against bytes the pipeline's commits added
    (data files and deletion vectors: their summaries' added-files-size), over the run's snapshots, and per hour."""
    run = [s for s in snaps if s.committed_ms >= since_ms]
    rewritten = sum(
        int(s.summary.get("added-files-size", 0))
        for s in run
        if s.operation == "replace" and int(s.summary.get("deleted-data-files", 0)) > 0
    )
    ingested = sum(int(s.summary.get("added-files-size", 0)) for s in run if s.operation != "replace")
    hours = (max(s.committed_ms for s in run) - since_ms) / 3.6e6 if run else 0.0
    return {
        "rewritten_mb": round(rewritten / 1e6, 1),
        "ingested_mb": round(ingested / 1e6, 1),
        "rewritten_mb_per_h": round(rewritten / 1e6 / hours, 1) if hours else None,
        "ratio": round(rewritten / ingested, 2) if ingested else None,
    }


def compaction_log(log_path: Path, start: int = 0) -> dict[str, Any]:
    """Compactions planned and rewrite groups whose commit failed, from this run's part of the pipeline's own log:
    rounds cut short by the SIGKILL or the final stop never reach the maintenance log, and with partial progress on
    Iceberg only logs a failed group commit (the maintenance log then says "ok" with nothing rewritten). A mirror's
    compaction written beside the batches is committed by the pipeline (``lakestream.engine.commits``)."""
    planned = failed = by_pipeline = written = 0
    first = None
    try:
        with open(log_path, "rb") as fh:
            fh.seek(start)
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return {"planned": 0, "commits_failed": 0, "committed_by_pipeline": 0, "first_cause": None}
    for i, line in enumerate(lines):
        if "lakestream.maintenance.runner" in line and ": compaction of " in line:
            written += 1  # written beside the batches, for the pipeline to commit
        elif "lakestream.maintenance.runner" in line and ": compact " in line:
            planned += 1
        elif "lakestream.engine.commits" in line and ": compact " in line and ": ok," in line:
            by_pipeline += 1
        elif "Cannot commit groups" in line:
            failed += 1
            if first is None:
                first = next((x.strip()[:300] for x in lines[i + 1 : i + 40] if "Exception" in x), None)
    return {
        "planned": planned,
        "commits_failed": failed,
        "written_beside_batches": written,
        "committed_by_pipeline": by_pipeline,
        "first_cause": first,
    }


def targets(s: dict[str, Any]) -> dict[str, bool | None]:
    def le(value, limit):
        return None if value is None else value <= limit

    return {
        "freshness_p99_outside_restart_le_5s": le(s.get("freshness_outside_restart_s", {}).get("p99"), 5.0),
        "round_adds_le_1s": le(s.get("round_adds_s"), 1.0),
        "restart_to_first_commit_le_30s": le(s.get("restart_to_first_commit_s"), 30.0),
        "write_amplification_le_3": le(s.get("write_amplification", {}).get("ratio"), 3.0),
        "mirror_exact": s.get("verify", {}).get("exact"),
    }


def print_table(s: dict[str, Any]) -> None:
    def verdict(ok):
        return "" if ok is None else ("  ok" if ok else "  MISSED")

    t, f, fo = s["targets"], s["freshness_s"], s["freshness_outside_restart_s"]
    base = s["base"]
    say(
        f"\n  sustained: {base['rows']:,} rows ({base['data_files']:,} files), "
        f"{s['offered_changes_per_s']:,} changes/s "
        f"for {s['params']['duration']:.0f}s, SIGKILL at {s['kill_at_s']:.0f}s; {s['commits']} commits, "
        f"batch median {s['batch_median_s']} s"
    )
    say(f"  freshness p50 / p99 over the run        {f['p50']} s / {f['p99']} s (max {f['max']} s)")
    say(
        f"  freshness p50 / p99 outside the restart {fo['p50']} s / {fo['p99']} s   target p99 ≤ 5 s"
        f"{verdict(t['freshness_p99_outside_restart_le_5s'])}"
    )
    say(
        f"  restart → first commit                  {s['restart_to_first_commit_s']} s   target ≤ 30 s"
        f"{verdict(t['restart_to_first_commit_le_30s'])} (back to the pre-kill p99 "
        + (f"after {s['restart_to_recovered_s']} s)" if s["restart_to_recovered_s"] is not None else "never)")
    )
    say(
        f"  worst batch after a maintenance round   {s['worst_batch_after_round_s']} s vs median "
        f"{s['batch_median_quiet_s']} s: +{s['round_adds_s']} s   target ≤ +1 s{verdict(t['round_adds_le_1s'])}"
    )
    ri = s.get("restart_key_index") or {}
    say(
        f"  restart's key index                     {'FULL BUILD' if ri.get('full_build') else 'followed by diff'}: "
        f"{(ri.get('diff') or '-')[:150]}"
    )
    wa = s["write_amplification"]
    say(
        f"  write amplification                     {wa['rewritten_mb']} MB rewritten / {wa['ingested_mb']} MB ingested"
        f" = {wa['ratio']}× ({wa['rewritten_mb_per_h']} MB/h)   target ≤ 3×{verdict(t['write_amplification_le_3'])}"
    )
    v = s["verify"]
    say(
        f"  mirror at the end                       {'exact' if v['exact'] else 'NOT EXACT'}: {v['got']['count']:,} "
        f"rows (want {v['want']['count']:,}), {v['duplicate_keys']} duplicate keys{verdict(t['mirror_exact'])}"
    )
    cores = s.get("cpu_cores_during_load") or {}
    say(
        f"  CPU during the load (cores of {os.cpu_count()})       "
        + ", ".join(f"{group} {cores[group]}" for group in ("pipeline", "broker", "bench") if group in cores)
    )
    planned = s["compaction_log"]
    say(
        f"  pipeline peak RSS (process group)       {s['pipeline_peak_rss_mb']:,} MB; {s['compactions_committed']} "
        f"compaction snapshot(s) from {planned['planned'] + planned['written_beside_batches']} compaction(s) planned "
        f"({planned['committed_by_pipeline']} commit(s) by the pipeline: a written compaction is committed in shares)"
    )
    if not s["compactions_committed"]:
        failed = s["compaction_log"]
        target = s["maintenance_config"]["policies"][0]["compaction"].get(
            "target_file_size_bytes", CompactionPolicy().target_file_size_bytes
        )
        say(
            f"  no compaction committed: {failed['commits_failed']} rewrite commit(s) failed"
            + (f" ({failed['first_cause']})" if failed["first_cause"] else "")
            + f"; the stream's files (median {(s['stream_file_median_bytes'] or 0) / 1e3:.0f} KB) are candidates "
            f"only below 0.75 × the target ({target / 1e3:.0f} KB)"
        )
    say("\n  round  length  worst / next batch  actions")
    for i, r in enumerate(s["maintenance_rounds"], 1):
        actions = ", ".join(
            f"{a['action']} {a['status']} {a['seconds']}s"
            + (f" ({a['rewritten_data_files']} files → {a['added_data_files']})" if "rewritten_data_files" in a else "")
            for a in r["actions"]
        )
        say(f"  {i:>5}  {r['seconds']:>5.1f}s  {r['worst_batch_s']} s / {r['next_batch_s']} s  {actions}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000, help="rows of the base table")
    parser.add_argument("--rate", type=float, default=5000.0, help="changes/s")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--kill-at", type=float, default=0.5, help="SIGKILL at this fraction of the duration")
    parser.add_argument(
        "--rows-per-file",
        type=int,
        default=200_000,
        help="rows per data file of the base (500 files at 100M rows; see the module doc)",
    )
    parser.add_argument(
        "--maintenance-interval",
        type=float,
        default=None,
        help="maintenance.interval_s (default: a quarter of the duration, at least 10)",
    )
    parser.add_argument(
        "--compact-target-mb",
        type=float,
        default=None,
        help="compaction target file size (default: the base's median data file)",
    )
    parser.add_argument(
        "--compact-max-files",
        type=int,
        default=100,
        help="compaction starts above this many data files (the policy's max_files_per_partition)",
    )
    parser.add_argument(
        "--compact-max-rows-per-file",
        type=int,
        default=None,
        help="the policy's compaction.max_rows_per_file (default: the policy's)",
    )
    parser.add_argument(
        "--kill-point",
        choices=sorted(KILL_POINTS),
        default="anywhere",
        help="where the SIGKILL lands: anywhere (at --kill-at); landed (the first table commit after "
        "--kill-at, before its key index delta is written); compaction-written, -before, -landed "
        "(inside the first compaction of the pipeline's own after --kill-at)",
    )
    parser.add_argument(
        "--grow",
        choices=("write-path", "sql"),
        default="write-path",
        help="how the base is grown: through the sink's write path, or by Spark SQL INSERTs (another "
        f"writer: {SQL_ROWS_PER_INSERT:,} rows a statement, --rows-per-file rows a task's file)",
    )
    parser.add_argument("--commit-interval", type=float, default=0.0, help="engine.commit_interval_s")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="run the stack and keep the base here (never removed; default: a fresh temp dir)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the fresh temp state dir (its path is printed)")
    parser.add_argument("--reuse", action="store_true", help="start from the base kept in --state-dir")
    args = parser.parse_args()
    if args.reuse and args.state_dir is None:
        parser.error("--reuse needs --state-dir")
    if not 0 < args.kill_at < 1:
        parser.error("--kill-at is a fraction of the duration, between 0 and 1")
    quiet_logs()
    summary: dict[str, Any] = {
        "bench": "sustained",
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_start": machine_load(),
    }
    say(f"machine: {summary['load_start']}")
    with private_stack("bench-sust", keep=args.keep, state_dir=args.state_dir, discard_topics=True) as (
        info,
        state_dir,
    ):
        if args.keep or args.state_dir:
            say(f"state dir: {state_dir}")
        config = to_config(
            pipeline_data(info, state_dir, "sustained-bench", [{"topics": ["x"]}], driver_memory=args.driver_memory)
        )
        spark = session_for(config)
        try:
            run(info, state_dir, spark, args, summary)
        finally:
            spark.stop()
    summary["targets"] = targets(summary)
    summary["load_end"] = machine_load()
    print_table(summary)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
