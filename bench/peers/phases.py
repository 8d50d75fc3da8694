"""Each configuration through the phases of a day's work, one configuration per invocation: the base, a steady rate
with an ADD COLUMN half-way, a SIGKILL of the writer and its restart, an optional backlog, and a rate ramp to the first
rate it misses. The comparison `make bench-peers` runs is bench/peers/run.py (runs repeated and alternated, drains
detected on every partition, compaction and reads): this is the longer look at one writer's behaviour under load.

    .venv/bin/python bench/peers/phases.py [--rows 10000000] [--quick] [--systems lakestream,flink-changelog,...]
        [--ramp 2000,5000,10000,20000] [--step-s 300] [--rate 2000] [--duration 600] [--kill-duration 120]
        [--results FILE] [--report FILE]

Per configuration (configs.py), each on a topic and a table of its own:

1. **base**: ``--rows`` snapshot events, read from the start: the time and CPU the mirror takes to build;
2. **steady**: ``--rate`` changes/s for ``--duration`` s with the ADD COLUMN half-way; freshness p50/p99 and
   CPU-seconds per million changes; the table's files; a point lookup and a full-table aggregate by Spark and DuckDB;
   exactness against the model; what the ADD COLUMN did;
3. **kill**: ``--rate`` for ``--kill-duration`` s with a SIGKILL of the writer's process group half-way and a start
   at once; exact after the restart or not;
4. **backlog** (``--backlog N``, off by default): the writer paused while N changes are produced, then let go;
5. **ramp**: changes at each ``--ramp`` rate for ``--step-s`` s; a rate is kept up with when the marker sent after
   the step's records is visible within ``--lag-bound-s``; the ramp stops at the first rate missed.

A phase's end here is a marker update becoming visible (the probe), not every partition's offsets: run.py's drains
are the ones the comparison's figures come from. ``--results FILE`` appends each configuration's result as one JSON
line; ``--report FILE`` builds the table from the latest line per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import (  # noqa: E402
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
    write_pipeline_yaml,
)
from probe import SnapshotProbe  # noqa: E402
from sustained import CpuMeter, broker_pids, tree_pids  # noqa: E402
from workload import ADDED_COLUMN, Generator, LoadResult, OrderEvents, create_topic  # noqa: E402
from writers import SYSTEMS, Writer, writer_for  # noqa: E402

SEED = 36


def versions() -> dict[str, str]:
    import duckdb
    import pyspark

    from lakestream.runtime import jars

    out = {
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "iceberg_spark": next(c.version for c in jars.group(jars.spark_group()).artifacts),
        "kafka": next(c.version for c in jars.group("kafka").artifacts),
        "spark_sql_kafka": jars.group("bench-spark-kafka").artifacts[0].version,
    }
    for c in jars.group("bench-flink").artifacts:
        if c.artifact.startswith("iceberg-flink-runtime"):
            out["iceberg_flink"] = f"{c.artifact} {c.version}"
        if c.artifact == "flink-sql-connector-kafka":
            out["flink_sql_connector_kafka"] = c.version
    flink = HERE.parent.parent / ".venv-peers"
    dist = list(flink.glob("lib/python*/site-packages/pyflink/lib/flink-dist-*.jar"))
    out["flink"] = dist[0].stem.removeprefix("flink-dist-") if dist else None
    return out


class Run:
    """One system's run: its writer, its probe, its CPU, its input (a generator process that models the mirror)."""

    def __init__(self, system: str, info, work: Path, spark, config, args):
        self.system, self.info, self.args, self.spark, self.config = system, info, args, spark, config
        self.events = OrderEvents(f"peers_{system.replace('-', '_')}")
        # The freshness setting: a 2-s commit interval for every configuration (Lakestream's default).
        self.writer: Writer = writer_for(
            system, info, work / system, self.events.topic, f"orders_{system.replace('-', '_')}", interval_s=2.0
        )
        self.generator = Generator(info.bootstrap_servers, self.events.prefix, args.rows, SEED)
        self.cpu = CpuMeter()
        from lakestream.read.query import pyiceberg_catalog

        self.probe = SnapshotProbe(pyiceberg_catalog(config.catalog), self.writer.qualified)
        self.work = work
        self.reader_config = work / "reader.yaml"  # the bench's catalog, for the DuckDB reads' own process
        self.out: dict[str, Any] = {"system": system, "table": self.writer.qualified}

    # -- the loop that watches while a phase runs --

    def sample(self) -> None:
        if self.writer.alive:
            self.cpu.sample("writer", tree_pids(self.writer.proc.pid))
        self.cpu.sample("broker", broker_pids(self.work))
        self.cpu.sample("bench", [os.getpid()])
        if self.generator.pid is not None:
            self.cpu.sample("generator", [self.generator.pid])

    def watch(self, until, timeout: float, label: str, kill_at: float | None = None) -> float:
        """Sample CPU and report until ``until()`` or ``timeout`` s; SIGKILL and restart at ``kill_at`` s.
        Returns the seconds it took (raises if the writer died)."""
        started = last = time.monotonic()
        while not until():
            now = time.monotonic()
            if now - started > timeout:
                raise TimeoutError(f"{self.system}: {label} not done after {timeout:.0f}s")
            if kill_at is not None and now - started >= kill_at:
                kill_at = None
                self.out["kill"] = {"load_at_kill": machine_load(), "killed_at_s": round(now - started, 1)}
                self.sample()
                self.writer.kill()
                self.writer.start("restart after SIGKILL")
                say(f"  {self.system}: SIGKILL of the writer's process group at {now - started:.0f}s; started again")
            if not self.writer.alive:
                raise RuntimeError(
                    f"{self.system}: the writer exited ({self.writer.proc.returncode}):\n{self.writer.tail()}"
                )
            self.sample()
            if now - last >= 10:
                last = now
                print(
                    f"  [{self.system} {label} {now - started:4.0f}s] lag {self.probe.lag_s():.1f}s · "
                    f"{len(self.probe.commits)} commits · load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(1.0)
        return time.monotonic() - started

    def load(
        self, rate: float, seconds: float, label: str, add_column_at: float | None = None, kill_at: float | None = None
    ) -> tuple[LoadResult, float, float]:
        """Changes at ``rate`` for ``seconds``, then one update as the marker; returns (load, start ms, marker ms)."""
        start_ms = time.time() * 1000
        self.generator.start_load(rate, seconds, add_column_at)
        # The load may run late (its generator short of CPU); the rate it really offered is what the results record.
        self.watch(self.generator.load_done, max(2 * seconds, seconds + 120), label, kill_at)
        load = self.generator.load_result()
        return load, start_ms, self.generator.marker()

    def caught_up(self, marker_ms: float, timeout: float, label: str) -> float:
        return self.watch(lambda: self.probe.visible(marker_ms), timeout, label)

    # -- the phases --

    def base(self) -> None:
        create_topic(self.info.bootstrap_servers, self.events.topic)
        produced_s = self.generator.produce_base()
        marker_ms = self.generator.marker()
        say(f"  {self.system}: {self.args.rows:,} base events in {produced_s:.0f}s; writer starting")
        before = self.cpu.totals().get("writer", 0.0)
        self.probe.start()
        self.writer.start()
        seconds = self.caught_up(marker_ms, self.args.base_timeout, "base")
        cpu = self.cpu.totals().get("writer", 0.0) - before
        self.out["base"] = {
            "rows": self.args.rows,
            "seconds": round(seconds, 1),
            "writer_cpu_s": round(cpu, 1),
            "rows_per_cpu_s": round(self.args.rows / cpu) if cpu else None,
        }
        say(f"  {self.system}: base visible after {seconds:.0f}s ({cpu:.0f} CPU-s)")

    def backlog(self) -> None:
        n = self.args.backlog
        paused_at = time.monotonic()
        self.writer.pause(True)
        try:
            self.generator.start_load(n, 1.0)  # n changes due at once: as fast as the generator goes
            self.watch(self.generator.load_done, self.args.base_timeout, "backlog produced")
            load = self.generator.load_result()
            marker_ms = self.generator.marker()
        finally:
            self.writer.pause(False)
        paused_s = time.monotonic() - paused_at
        before = self.cpu.totals().get("writer", 0.0)
        seconds = self.caught_up(marker_ms, self.args.base_timeout, "backlog drain")
        cpu = self.cpu.totals().get("writer", 0.0) - before
        changes = load.changes + 1
        self.out["backlog"] = {
            "changes": changes,
            "paused_s": round(paused_s, 1),
            "drain_s": round(seconds, 1),
            "writer_cpu_s": round(cpu, 1),
            "changes_per_s": round(changes / seconds) if seconds else None,
            "changes_per_cpu_s": round(changes / cpu) if cpu else None,
            "writer_cores": round(cpu / seconds, 2) if seconds else None,
        }
        say(
            f"  {self.system}: {changes:,} changes produced while paused ({paused_s:.0f}s), drained in {seconds:.1f}s "
            f"with {cpu:.0f} writer CPU-s"
        )

    def ramp(self) -> None:
        # Recorded as each step ends: a run that fails in a later step keeps the steps before it.
        steps: list[dict[str, Any]] = []
        self.out["ramp"] = {"steps": steps, "step_s": self.args.step_s, "lag_bound_s": self.args.lag_bound_s}
        for rate in self.args.ramp:
            cpu0 = self.cpu.totals()
            load, start_ms, marker_ms = self.load(rate, self.args.step_s, f"ramp {rate:g}/s")
            lag = self.probe.lag_s(marker_ms)
            half = start_ms + self.args.step_s * 500
            # The marker is sent after the load's last record was delivered: the time it takes to become visible is
            # the writer's own backlog, not the producer's (a generator short of CPU delivers late, in bursts).
            catch_up = self.caught_up(marker_ms, self.args.base_timeout, "catch-up")
            fresh = self.probe.freshness(half, marker_ms)
            kept = catch_up <= self.args.lag_bound_s
            cpu = self.cpu.totals().get("writer", 0.0) - cpu0.get("writer", 0.0)
            steps.append(
                {
                    "rate": rate,
                    "offered": round(load.changes / load.seconds) if load.seconds else None,
                    "lag_at_end_s": round(lag, 1),
                    "catch_up_s": round(catch_up, 1),
                    "freshness_second_half_s": fresh,
                    "kept_up": kept,
                    "writer_cores": round(cpu / (load.seconds + catch_up), 2),
                    "generator_nice": load.nice,
                }
            )
            kept_steps = [s for s in steps if s["kept_up"]]
            # The rate the load really offered (the generator is one Python thread); capped: the writer kept up with
            # every step, so its limit is above the ramp's top.
            self.out["ramp"]["max_sustained_rate"] = kept_steps[-1]["offered"] if kept_steps else None
            self.out["ramp"]["capped_by_ramp"] = len(kept_steps) == len(steps)
            say(
                f"  {self.system}: {rate:g} changes/s (offered {steps[-1]['offered']}) → visible {catch_up:.1f}s after "
                f"the load ({'kept up' if kept else 'MISSED'}); lag at its end {lag:.1f}s; "
                f"{steps[-1]['writer_cores']} writer cores"
            )
            if not kept:
                break

    def steady(self) -> None:
        cpu0 = self.cpu.totals()
        load, start_ms, marker_ms = self.load(
            self.args.rate, self.args.duration, "steady", add_column_at=self.args.duration / 2
        )
        drain_s = self.caught_up(marker_ms, self.args.base_timeout, "steady drain")
        cpu = {g: round(t - cpu0.get(g, 0.0), 1) for g, t in self.cpu.totals().items()}
        changes = load.changes + 1
        self.out["steady"] = {
            "rate": self.args.rate,
            "seconds": round(load.seconds, 1),
            "changes": changes,
            "changes_by_op": dict(load.counts),
            "drain_after_load_s": round(drain_s, 1),
            "generator_nice": load.nice,
            "freshness_s": self.probe.freshness(start_ms, marker_ms + 1),
            "cpu_s": cpu,
            "writer_cpu_s_per_million_changes": round(cpu.get("writer", 0.0) / changes * 1e6, 1),
            "load_at_end": machine_load(),
        }
        self.out["add_column"] = self.add_column_outcome()
        self.out["table"] = self.table_stats()
        self.out["reads"] = self.reads()
        self.out["exact_after_steady"] = self.exactness()

    def kill_run(self) -> None:
        seconds = self.args.kill_duration
        load, start_ms, marker_ms = self.load(self.args.rate, seconds, "kill", kill_at=seconds / 2)
        recovered = self.caught_up(marker_ms, self.args.base_timeout, "after restart")
        self.out.setdefault("kill", {}).update(
            {
                "changes": load.changes + 1,
                "generator_nice": load.nice,
                "caught_up_after_load_s": round(recovered, 1),
                "freshness_s": self.probe.freshness(start_ms, marker_ms + 1),
                "exact": self.exactness(),
            }
        )

    # -- what is measured on the table --

    def add_column_outcome(self) -> dict[str, Any]:
        t = f"lake.{self.writer.qualified}"
        columns = [f.name for f in self.spark.table(t).schema.fields]
        out = {"writer_up": self.writer.alive, "restarts": 0, "column_in_table": ADDED_COLUMN in columns}
        if out["column_in_table"]:
            out["rows_with_value"] = self.spark.sql(f"SELECT count({ADDED_COLUMN}) AS n FROM {t}").collect()[0]["n"]
        out["outcome"] = (
            "ran on; column added"
            if out["column_in_table"] and out.get("rows_with_value")
            else "ran on; column dropped"
            if self.writer.alive
            else "failed"
        )
        return out

    def table_stats(self) -> dict[str, Any]:
        # A Puffin file holds many deletion vectors, each listed with the whole file's size: files and bytes are
        # counted once per file; ``entries`` is the number of data files' DVs (or delete files) in the table.
        rows = self.spark.sql(
            f"SELECT content, file_format, count(DISTINCT file_path) AS files, count(*) AS entries, "
            f"sum(record_count) AS records "
            f"FROM lake.{self.writer.qualified}.files GROUP BY content, file_format"
        ).collect()
        sizes = {
            (r["content"], r["file_format"]): r["bytes"]
            for r in self.spark.sql(
                f"SELECT content, file_format, sum(file_size_in_bytes) AS bytes FROM (SELECT DISTINCT content, "
                f"file_format, file_path, file_size_in_bytes FROM lake.{self.writer.qualified}.files) "
                f"GROUP BY content, file_format"
            ).collect()
        }
        rows = [{**r.asDict(), "bytes": sizes[(r["content"], r["file_format"])]} for r in rows]
        kinds = {0: "data", 1: "position_deletes", 2: "equality_deletes"}
        out: dict[str, Any] = {"data_files": 0, "delete_files": 0, "bytes": 0, "by_kind": {}}
        for r in rows:
            kind = kinds[r["content"]] + ("_dv" if r["file_format"] == "PUFFIN" else "")
            out["by_kind"][kind] = {
                "files": r["files"],
                "entries": r["entries"],
                "bytes": r["bytes"],
                "records": r["records"],
            }
            out["data_files" if r["content"] == 0 else "delete_files"] += r["files"]
            out["bytes"] += r["bytes"]
        out["snapshots"] = self.spark.sql(
            f"SELECT count(*) AS n FROM lake.{self.writer.qualified}.snapshots"
        ).collect()[0]["n"]
        return out

    def reads(self) -> dict[str, Any]:
        """A point lookup and a full-table aggregate, by Spark (this bench's session) and by DuckDB (a process of
        its own, so that a read past ``--read-timeout`` can be ended): the median of ``--read-repeats``, or
        ``"> N s"`` for a read cut off (its repeats are then skipped)."""
        t = f"lake.{self.writer.qualified}"
        key = self.generator.last_live_key()
        queries = {
            "point_lookup": f"SELECT id, version, qty FROM {t} WHERE id = {key}",
            "full_aggregate": f"SELECT count(*) AS n, sum(qty) AS q, sum(amount) AS a, max(updated_at) AS u FROM {t}",
        }
        out: dict[str, Any] = {}
        for engine in ("spark", "duckdb"):
            for name, sql in queries.items():
                times = []
                for _ in range(self.args.read_repeats):
                    seconds = self.spark_read(sql) if engine == "spark" else self.duckdb_read(sql)
                    if seconds is None:
                        times = [f"> {self.args.read_timeout:.0f} s"]
                        break
                    times.append(seconds)
                out[f"{engine}_{name}_s"] = (
                    times[0] if isinstance(times[0], str) else round(sorted(times)[len(times) // 2], 3)
                )
                say(f"  {self.system}: {engine} {name} {out[f'{engine}_{name}_s']}")
        return out

    def spark_read(self, sql: str) -> float | None:
        started = time.perf_counter()
        return None if self.collect(sql, self.args.read_timeout) is None else time.perf_counter() - started

    def collect(self, sql: str, timeout: float) -> list | None:
        """The rows of ``sql`` by the bench's Spark, or None when it ran past ``timeout`` s (its jobs cancelled)."""
        import threading

        context = self.spark.sparkContext
        context.setJobGroup("peers-read", "bench read", interruptOnCancel=True)
        timer = threading.Timer(timeout, context.cancelJobGroup, ["peers-read"])
        timer.start()
        try:
            return self.spark.sql(sql).collect()
        except Exception:  # noqa: BLE001 — cancelled by the timer (or failed: either way no rows to report)
            return None
        finally:
            timer.cancel()
            context.setLocalProperty("spark.jobGroup.id", None)

    def duckdb_read(self, sql: str) -> float | None:
        import subprocess

        code = (
            "import sys, time, yaml; from lakestream.config import parse_config; "
            "from lakestream.read.query import run_sql; config = parse_config(yaml.safe_load(open(sys.argv[1])), "
            "sys.argv[1]); started = time.perf_counter(); run_sql(config, sys.argv[2], engine='duckdb'); "
            "print(time.perf_counter() - started)"
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, str(self.reader_config), sql],
                capture_output=True,
                text=True,
                timeout=self.args.read_timeout,
                check=True,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            return None
        return float(done.stdout.strip().splitlines()[-1])

    def exactness(self) -> dict[str, Any]:
        """The table against the model, by Spark; ``exact`` None when the reads ran past ``--exact-timeout``."""
        t = f"lake.{self.writer.qualified}"
        got = self.collect(
            f"SELECT count(*) AS count, coalesce(sum(version), 0) AS sum_version, "
            f"coalesce(sum(qty), 0) AS sum_qty FROM {t}",
            self.args.exact_timeout,
        )
        dups = (
            self.collect(
                f"SELECT count(*) AS n FROM (SELECT id FROM {t} GROUP BY id HAVING count(*) > 1)",
                self.args.exact_timeout,
            )
            if got is not None
            else None
        )
        want = self.generator.totals()
        if got is None or dups is None:
            return {"exact": None, "want": want, "note": f"the check ran past {self.args.exact_timeout:.0f} s"}
        got_row, dup_count = got[0].asDict(), int(dups[0]["n"])
        return {
            "exact": dup_count == 0 and all(int(got_row[k]) == want[k] for k in want),
            "got": {k: int(v) for k, v in got_row.items()},
            "want": want,
            "duplicate_keys": dup_count,
        }

    def run(self) -> dict[str, Any]:
        try:
            # The ramp comes last: its length depends on the writer (it stops at the first rate missed), and the
            # steady and kill phases must get the same records on every system.
            self.base()
            if self.args.duration > 0:
                self.steady()
            if self.args.kill_duration > 0:
                self.kill_run()
            if self.args.backlog:
                self.backlog()
            if self.args.ramp:
                self.ramp()
            self.out["clean_stop"] = self.writer.stop()
        except (RuntimeError, TimeoutError) as exc:
            self.out["error"] = str(exc)[:2000]
            say(f"  {self.system}: FAILED: {str(exc)[:500]}")
        finally:
            self.probe.halt.set()
            self.generator.close()
            if self.writer.alive:
                self.writer.kill()
        self.out["cpu_s_total"] = {g: round(v, 1) for g, v in self.cpu.totals().items()}
        return self.out


def rate_per_core(result: dict[str, Any]) -> int | None:
    """Changes per second per writer core at the highest ramp step the writer kept up with: the offered rate over
    the cores its processes used in that step (the issue's "sustained change rate per core")."""
    kept = [s for s in (result.get("ramp") or {}).get("steps", []) if s.get("kept_up")]
    if not kept or not kept[-1].get("offered") or not kept[-1].get("writer_cores"):
        return None
    return round(kept[-1]["offered"] / kept[-1]["writer_cores"])


def figure(result: dict[str, Any], path: tuple[str, ...] | Callable[[dict[str, Any]], Any]) -> Any:
    """A figure of a system's result: the value at ``path`` (None where absent), or what ``path`` derives from it."""
    if callable(path):
        return path(result)
    value: Any = result
    for p in path:
        value = value.get(p) if isinstance(value, dict) else None
    return value


def print_table(results: list[dict[str, Any]]) -> None:
    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    def megabytes(r: dict[str, Any]) -> str | None:
        size = figure(r, ("table", "bytes"))
        return f"{size / 1e6:.1f}" if isinstance(size, int) else None

    def base(r: dict[str, Any]) -> str:
        return f"{shown(figure(r, ('base', 'seconds')))} / {shown(figure(r, ('base', 'rows_per_cpu_s')))}"

    rows = [
        ("max sustained changes/s", ("ramp", "max_sustained_rate")),
        ("  per writer core", rate_per_core),
        ("base: s / rows per CPU-s", base),
        ("CPU-s per 1M changes", ("steady", "writer_cpu_s_per_million_changes")),
        ("backlog drain changes/s", ("backlog", "changes_per_s")),
        ("  per writer CPU-s", ("backlog", "changes_per_cpu_s")),
        ("freshness p50 s", ("steady", "freshness_s", "p50")),
        ("freshness p99 s", ("steady", "freshness_s", "p99")),
        ("data files", ("table", "data_files")),
        ("delete files", ("table", "delete_files")),
        ("MB", megabytes),
        ("Spark point lookup s", ("reads", "spark_point_lookup_s")),
        ("Spark full aggregate s", ("reads", "spark_full_aggregate_s")),
        ("DuckDB point lookup s", ("reads", "duckdb_point_lookup_s")),
        ("DuckDB full aggregate s", ("reads", "duckdb_full_aggregate_s")),
        ("exact after steady", ("exact_after_steady", "exact")),
        ("ADD COLUMN", ("add_column", "outcome")),
        ("exact after SIGKILL", ("kill", "exact", "exact")),
    ]
    width = 26
    say("\n  " + "".ljust(width) + "".join(r["system"].rjust(24) for r in results))
    for label, path in rows:
        cells = [shown(figure(r, path))[:23] for r in results]
        say("  " + label.ljust(width) + "".join(c.rjust(24) for c in cells))


def chart(results: list[dict[str, Any]], path: Path) -> None:
    """Bars per figure (each scaled to its largest value), one colour per system, as SVG."""
    figures = [
        ("max changes/s", ("ramp", "max_sustained_rate")),
        ("changes/s per core", rate_per_core),
        ("CPU-s / 1M changes", ("steady", "writer_cpu_s_per_million_changes")),
        ("freshness p99 s", ("steady", "freshness_s", "p99")),
        ("Spark full agg s", ("reads", "spark_full_aggregate_s")),
        ("DuckDB full agg s", ("reads", "duckdb_full_aggregate_s")),
    ]
    colours = {"lakestream": "#1f77b4", "flink": "#d62728", "spark": "#2ca02c"}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="760" height="{40 + 70 * len(figures)}" '
        'font-family="sans-serif" font-size="12">'
    ]
    for i, (label, keys) in enumerate(figures):
        values = []
        for r in results:
            v = figure(r, keys)
            values.append(v if isinstance(v, (int, float)) else None)
        top = max((v for v in values if v), default=1) or 1
        y = 30 + 70 * i
        parts.append(f'<text x="10" y="{y + 12}">{label}</text>')
        for j, (r, v) in enumerate(zip(results, values, strict=True)):
            w = 0 if v is None else 480 * v / top
            parts.append(
                f'<rect x="160" y="{y + j * 18}" width="{w:.0f}" height="14" '
                f'fill="{colours.get(r["system"], "#888")}"/>'
            )
            parts.append(
                f'<text x="{165 + w:.0f}" y="{y + j * 18 + 11}">{r["system"]} {"-" if v is None else v}</text>'
            )
    parts.append("</svg>")
    path.write_text("\n".join(parts))


# The parameters that make two systems' results comparable (the ones that shape the records each writer gets).
COMPARABLE = ("rows", "rate", "duration", "kill_duration", "backlog", "ramp", "step_s", "lag_bound_s")


def git_commit() -> str | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def append_result(path: Path, summary: dict[str, Any], result: dict[str, Any]) -> None:
    """One system's run as one JSON line: its result beside what it ran under."""
    line = {k: summary[k] for k in ("params", "versions", "commit", "started")}
    line.update({"load_start": summary["load_start"], "load_end": machine_load(), "result": result})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(line) + "\n")


def latest_results(path: Path) -> list[dict[str, Any]]:
    """The latest line per system in ``path``, in the order systems were first run (its ``result`` is the system's
    result). Raises
    ValueError when the kept lines were run with different comparable parameters: a table of them would mislead."""
    if not path.exists():
        raise ValueError(f"{path}: no results file; run a system with --results {path} first")
    latest: dict[str, dict[str, Any]] = {}
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            system = line["result"]["system"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a result line ({exc})") from exc
        latest[system] = line
    if not latest:
        raise ValueError(f"{path}: holds no result")
    kept = list(latest.values())
    first = kept[0]["params"]
    for line in kept[1:]:
        differ = [k for k in COMPARABLE if line["params"].get(k) != first.get(k)]
        if differ:
            raise ValueError(
                f"{path}: {line['result']['system']} ran with other {', '.join(differ)} than "
                f"{kept[0]['result']['system']}; rerun one of them with the same parameters"
            )
    return kept


def report(path: Path, chart_path: Path | None) -> int:
    try:
        lines = latest_results(path)
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    summary: dict[str, Any] = {"bench": "peers", "params": lines[0]["params"], "runs": []}
    for line in lines:
        summary["runs"].append({k: line.get(k) for k in ("started", "commit", "versions", "load_start", "load_end")})
        summary["runs"][-1]["system"] = line["result"]["system"]
    results = [line["result"] for line in lines]
    summary["systems"] = results
    summary["rate_per_core"] = {r["system"]: rate_per_core(r) for r in results}
    for line in lines:
        say(
            f"{line['result']['system']}: started {line.get('started')} at commit {line.get('commit')}; "
            f"load {line['load_start']['loadavg_1m']} → {line['load_end']['loadavg_1m']}"
        )
    print_table(results)
    if chart_path:
        chart(results, chart_path)
        say(f"chart: {chart_path}")
    print(json.dumps(summary), flush=True)
    return 0 if all("error" not in r for r in results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="1M rows and short phases (a check, not a result)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--ramp", default="2000,5000,10000,20000,40000", help="comma-separated rates; '' skips")
    parser.add_argument("--step-s", type=float, default=300.0)
    parser.add_argument("--lag-bound-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="the common rate of the steady and kill phases")
    parser.add_argument("--duration", type=float, default=600.0, help="of the steady phase; 0 skips it")
    parser.add_argument("--kill-duration", type=float, default=120.0, help="0 skips the SIGKILL run")
    parser.add_argument(
        "--backlog", type=int, default=None, help="changes produced while the writer is paused, then drained (off)"
    )
    parser.add_argument("--base-timeout", type=float, default=3600.0)
    parser.add_argument("--read-repeats", type=int, default=3)
    parser.add_argument("--read-timeout", type=float, default=900.0, help="a read is cut off after this many s")
    parser.add_argument(
        "--exact-timeout",
        type=float,
        default=1800.0,
        help="each query of the exactness check is cut off after this many s",
    )
    parser.add_argument("--chart", type=Path, default=None, help="write an SVG chart here")
    parser.add_argument("--keep", action="store_true", help="keep the state dir (its path is printed)")
    parser.add_argument("--results", type=Path, default=None, help="append each system's result here (JSON lines)")
    parser.add_argument(
        "--report", type=Path, default=None, help="run nothing: the table and chart from this results file"
    )
    args = parser.parse_args()
    if args.report:
        return report(args.report, args.chart)
    if args.quick:
        args.rows, args.step_s, args.duration, args.kill_duration = 1_000_000, 60.0, 120.0, 60.0
        args.read_timeout, args.exact_timeout = min(args.read_timeout, 120.0), min(args.exact_timeout, 300.0)
    args.ramp = [float(r) for r in args.ramp.split(",") if r.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    quiet_logs()
    summary: dict[str, Any] = {
        "bench": "peers",
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "versions": versions(),
        "load_start": machine_load(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit(),
    }
    say(f"machine: {summary['load_start']}; versions: {summary['versions']}")
    results = []
    with private_stack("bench-peers", keep=args.keep, discard_topics=True) as (info, state_dir):
        if args.keep:
            say(f"state dir: {state_dir}")
        from lakestream.runtime.spark import session_for

        reader = pipeline_data(info, state_dir, "peers-reader", [{"topics": ["x"]}])
        write_pipeline_yaml(state_dir / "reader.yaml", reader)
        config = to_config(reader)
        spark = session_for(config)
        try:
            for system in systems:
                say(f"\n== {system}")
                result = Run(system, info, state_dir, spark, config, args).run()
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.results:
                    append_result(args.results, summary, result)
        finally:
            spark.stop()
    summary["systems"] = results
    summary["load_end"] = machine_load()
    print_table(results)
    if args.chart:
        chart(results, args.chart)
        say(f"chart: {args.chart}")
    print(json.dumps(summary), flush=True)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
