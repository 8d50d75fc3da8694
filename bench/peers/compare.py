"""The comparison `make bench-peers` runs: every named configuration (configs.py) draining the same CDC backlog, on
each input (workload.INPUTS), ``--runs`` times, in one invocation.

One run of one configuration on one input (`ConfigRun`):

1. **base**: ``--base-rows`` snapshot events on a topic of its own (two partitions), then the writer starts; the base
   is drained when the system's own written offsets reach the topic's end on every partition (drain.py);
2. **backlog**: the writer paused (SIGSTOP of its whole tree), ``--backlog`` changes produced as fast as the generator
   goes, the writer let go (SIGCONT); drained as above. Changes per writer CPU-second: the backlog's changes over the
   CPU its process tree used from the SIGCONT to the drain's end;
3. **steady** (``--steady-s``, off by default): ``--rate`` changes/s; freshness p50/p99 from the probe;
4. **exactness**: the table against the generator's model of the source (row count, sum of versions, sum of
   quantities, no key twice), at the end of the run;
5. **compaction**: the writer stopped, the table compacted by its own system's maintenance (writers.py), with that
   process tree's time, CPU and peak RSS; exactness again;
6. **reads**: a point lookup and a full-table aggregate, by Spark and by DuckDB, on the compacted table.

The order of the configurations alternates from one run to the next (forward, backward, forward, ...), so that no
configuration always runs first on a cool machine or last on a warm one. CPU and RSS are each configuration's own
process tree, sampled from /proc every ``SAMPLE_S`` (measure.py): nothing is summed across systems. Each run is one
JSON line in ``--results`` with the invocation it belongs to, the load average at its start and end, and the
parameters; `report` builds the medians and spreads from the lines of one invocation.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import machine_load, say
from drain import drained, end_offsets, group_offsets, spark_offsets
from measure import MemoryCap, TreeMeter
from probe import SnapshotProbe
from workload import INPUTS, Generator, create_topic
from writers import Writer, writer_for

SAMPLE_S = 0.5
SEED = 56


def run_order(configs: list[str], run_index: int) -> list[str]:
    """The configurations' order in run ``run_index``: forward on even runs, backward on odd ones."""
    return list(configs) if run_index % 2 == 0 else list(reversed(configs))


class ConfigRun:
    """One run of one configuration on one input."""

    def __init__(self, name: str, input_name: str, run_index: int, info, work: Path, spark, reader_config, args):
        self.name, self.input_name, self.run_index, self.args = name, input_name, run_index, args
        self.info, self.spark, self.reader_config = info, spark, reader_config
        schemas, keys = INPUTS[input_name]
        slug = f"{name}_{input_name}_{run_index}".replace("-", "_")
        self.work = work / slug
        self.generator = Generator(
            info.bootstrap_servers, f"peers_{slug}", args.base_rows, SEED + run_index, schemas, keys
        )
        self.topic = self.generator.topic
        self.writer: Writer = writer_for(
            name, info, self.work, self.topic, f"t_{slug}", schemas=schemas, interval_s=args.commit_interval_s
        )
        from lakestream.read.query import pyiceberg_catalog

        self.probe = SnapshotProbe(
            pyiceberg_catalog(reader_config.catalog),
            self.writer.qualified,
            interval=SAMPLE_S,
            read_rows=args.steady_s > 0,  # the rows' produce times only for the freshness of a steady phase
        )
        self.meter: TreeMeter | None = None
        self.cap: MemoryCap | None = None
        self.out: dict[str, Any] = {
            "config": name,
            "input": input_name,
            "run": run_index,
            "table_name": self.writer.qualified,
            "load_start": machine_load(),
        }

    # -- watching --

    def written(self) -> dict[int, int]:
        """partition → the offset the system records as written (drain.py)."""
        kind = self.writer.kind
        if kind == "lakestream":
            return self.probe.offsets(self.topic)
        if kind == "spark":
            return spark_offsets(self.writer.checkpoint, self.topic)
        return group_offsets(self.info.bootstrap_servers, self.writer.group_id, self.topic)

    def watch(self, done, timeout: float, label: str) -> float:
        """Sample the writer's tree until ``done()``; the seconds it took. Raises when the writer died or timed out."""
        started = last = time.monotonic()
        while True:
            if self.meter is not None:
                self.meter.sample()
            if done():
                return time.monotonic() - started
            now = time.monotonic()
            if now - started > timeout:
                raise TimeoutError(f"{self.name}: {label} not done after {timeout:.0f}s")
            if not self.writer.alive:
                raise RuntimeError(
                    f"{self.name}: the writer exited ({self.writer.proc.returncode}):\n{self.writer.tail()}"
                )
            if now - last >= 15:
                last = now
                print(
                    f"  [{self.name} {label} {now - started:4.0f}s] written {self.written()}",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(SAMPLE_S)

    def drain(self, label: str) -> dict[str, Any]:
        """Wait until the topic's end is written on every partition; the seconds and writer CPU it took."""
        end = end_offsets(self.info.bootstrap_servers, self.topic)
        self.meter.sample()  # the CPU up to now is not this drain's
        cpu0 = self.meter.cpu_s()
        seconds = self.watch(lambda: drained(self.written(), end), self.args.timeout, label)
        return {"end_offsets": end, "seconds": round(seconds, 2), "writer_cpu_s": round(self.meter.cpu_s() - cpu0, 2)}

    def settle(self) -> None:
        """Wait for the table to stop changing (``2 × interval`` without a new snapshot, at most ``6 ×``): Flink's
        group offsets are committed in the same checkpoint notification as its Iceberg commit, not after it."""
        quiet, limit = 2 * self.args.commit_interval_s, time.monotonic() + 6 * self.args.commit_interval_s
        seen, since = len(self.probe.seen), time.monotonic()
        while time.monotonic() < limit and time.monotonic() - since < quiet:
            time.sleep(SAMPLE_S)
            self.meter.sample()
            if len(self.probe.seen) != seen:
                seen, since = len(self.probe.seen), time.monotonic()

    # -- the phases --

    def start_writer(self) -> None:
        self.writer.start()
        self.meter = TreeMeter(self.writer.proc.pid)
        if self.args.memory_cap:
            self.cap = MemoryCap(f"lakestream-peers-{os.getpid()}-{self.writer.table}", self.args.memory_cap)
            self.cap.add(self.writer.proc.pid)  # at once: the JVM and workers it starts are in it

    def base(self) -> None:
        create_topic(self.info.bootstrap_servers, self.topic)
        produced = self.generator.produce_base()
        self.probe.start()
        self.start_writer()
        self.out["base"] = {"rows": self.args.base_rows, "produced_s": round(produced, 1), **self.drain("base")}
        say(f"  {self.name}: base of {self.args.base_rows:,} rows written in {self.out['base']['seconds']:.1f}s")

    def backlog(self) -> None:
        self.writer.pause(True)
        try:
            self.generator.start_load(self.args.backlog, 1.0)  # all due at once: as fast as the generator goes
            while not self.generator.load_done():
                time.sleep(0.2)
            load = self.generator.load_result()
        finally:
            self.writer.pause(False)
        drain = self.drain("backlog")
        cpu = drain["writer_cpu_s"]
        self.out["backlog"] = {
            "changes": load.changes,
            "changes_by_op": dict(load.counts),
            **drain,
            "changes_per_s": round(load.changes / drain["seconds"]) if drain["seconds"] else None,
            "changes_per_cpu_s": round(load.changes / cpu) if cpu else None,
            "load_at_end": machine_load(),
        }
        say(
            f"  {self.name}: {load.changes:,} changes drained in {drain['seconds']:.1f}s with {cpu:.1f} writer CPU-s"
            f" → {self.out['backlog']['changes_per_cpu_s']} changes per CPU-s"
        )

    def steady(self) -> None:
        start_ms = time.time() * 1000
        self.generator.start_load(self.args.rate, self.args.steady_s)
        self.watch(self.generator.load_done, 2 * self.args.steady_s + 120, "steady")
        load = self.generator.load_result()
        end_ms = time.time() * 1000
        drain = self.drain("steady drain")
        self.out["steady"] = {
            "rate": self.args.rate,
            "offered": round(load.changes / load.seconds) if load.seconds else None,
            "seconds": round(load.seconds, 1),
            "drain_after_load_s": drain["seconds"],
            "freshness_s": self.probe.freshness(start_ms, end_ms),
        }

    def exactness(self) -> dict[str, Any]:
        t = f"lake.{self.writer.qualified}"
        got = self.spark.sql(
            f"SELECT count(*) AS count, coalesce(sum(version), 0) AS sum_version, coalesce(sum(qty), 0) AS sum_qty "
            f"FROM {t}"
        ).collect()[0]
        dups = self.spark.sql(f"SELECT count(*) AS n FROM (SELECT id FROM {t} GROUP BY id HAVING count(*) > 1)")
        dup_count = int(dups.collect()[0]["n"])
        want = self.generator.totals()
        got_row = {k: int(v) for k, v in got.asDict().items()}
        return {"exact": dup_count == 0 and got_row == want, "got": got_row, "want": want, "duplicate_keys": dup_count}

    def compaction(self) -> None:
        """The system's own compaction of its table, with the writer stopped: time, CPU and peak RSS."""
        started = time.monotonic()
        proc = self.writer.start_compaction()
        meter = TreeMeter(proc.pid)
        while proc.poll() is None:
            meter.sample()
            if time.monotonic() - started > self.args.timeout:
                os.killpg(proc.pid, 9)
                break
            time.sleep(SAMPLE_S)
        self.out["compaction"] = {
            "seconds": round(time.monotonic() - started, 2),
            "cpu_s": round(meter.cpu_s(), 2),
            "peak_rss_mb": round(meter.peak_rss / 2**20),
            "exit": proc.wait(),
        }
        if self.out["compaction"]["exit"] != 0:
            self.out["compaction"]["log"] = self.writer.tail(15)
        say(f"  {self.name}: compaction {self.out['compaction']}")

    def table_stats(self) -> dict[str, Any]:
        rows = self.spark.sql(
            f"SELECT content, count(DISTINCT file_path) AS files, sum(record_count) AS records "
            f"FROM lake.{self.writer.qualified}.files GROUP BY content"
        ).collect()
        kinds = {0: "data_files", 1: "position_delete_files", 2: "equality_delete_files"}
        return {kinds[r["content"]]: r["files"] for r in rows}

    def reads(self) -> dict[str, Any]:
        """A point lookup and a full-table aggregate, by Spark (the bench's session) and DuckDB (a process of its
        own): the median of ``--read-repeats``."""
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
                        break
                    times.append(seconds)
                out[f"{engine}_{name}_s"] = round(statistics.median(times), 3) if times else None
        return out

    def spark_read(self, sql: str) -> float | None:
        started = time.perf_counter()
        context = self.spark.sparkContext
        context.setJobGroup("peers-read", "bench read", interruptOnCancel=True)
        timer = threading.Timer(self.args.read_timeout, context.cancelJobGroup, ["peers-read"])
        timer.start()
        try:
            self.spark.sql(sql).collect()
        except Exception:  # noqa: BLE001 — cancelled by the timer
            return None
        finally:
            timer.cancel()
        return time.perf_counter() - started

    def duckdb_read(self, sql: str) -> float | None:
        code = (
            "import sys, time, yaml; from lakestream.config import parse_config; "
            "from lakestream.read.query import run_sql; config = parse_config(yaml.safe_load(open(sys.argv[1])), "
            "sys.argv[1]); started = time.perf_counter(); run_sql(config, sys.argv[2], engine='duckdb'); "
            "print(time.perf_counter() - started)"
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, str(self.args.reader_yaml), sql],
                capture_output=True,
                text=True,
                timeout=self.args.read_timeout,
                check=True,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            return None
        return float(done.stdout.strip().splitlines()[-1])

    def run(self) -> dict[str, Any]:
        try:
            self.base()
            self.backlog()
            if self.args.steady_s > 0:
                self.steady()
            self.settle()
            self.out["exact"] = self.exactness()
            self.out["writer"] = {
                "cpu_s": round(self.meter.cpu_s(), 2),
                "peak_rss_mb": round(self.meter.peak_rss / 2**20),
            }
            if self.cap is not None:
                peak = self.cap.peak_bytes()
                self.out["writer"]["cgroup_peak_mb"] = round(peak / 2**20) if peak else None
            # Compactions the system's own maintenance committed while it ran (Lakestream inline, Flink post-commit).
            self.out["rewrites_while_running"] = self.probe.replaces
            self.out["clean_stop"] = self.writer.stop()
            self.out["table_before_compaction"] = self.table_stats()
            self.compaction()
            self.out["exact_after_compaction"] = self.exactness()
            self.out["table"] = self.table_stats()
            self.out["reads"] = self.reads()
        except (RuntimeError, TimeoutError) as exc:
            self.out["error"] = str(exc)[:2000]
            say(f"  {self.name}: FAILED: {str(exc)[:500]}")
        finally:
            self.probe.halt.set()
            self.generator.close()
            if self.writer.alive:
                self.writer.kill()
            if self.cap is not None:
                self.cap.remove()
        self.out["load_end"] = machine_load()
        return self.out


def compare(args, info, state_dir: Path, spark, reader_config, invocation: dict[str, Any]) -> list[dict[str, Any]]:
    """Every configuration on every input, ``args.runs`` times, the order alternating; each run appended to
    ``args.results`` as it ends."""
    results = []
    for run_index in range(args.runs):
        for input_name in args.inputs:
            for name in run_order(args.configs, run_index):
                say(f"\n== run {run_index + 1}/{args.runs} · {input_name} · {name}")
                result = ConfigRun(name, input_name, run_index, info, state_dir, spark, reader_config, args).run()
                results.append(result)
                if args.results:
                    append_run(args.results, invocation, result)
    return results


def new_invocation(args, versions: dict[str, Any], commit: str | None) -> dict[str, Any]:
    return {
        "invocation": uuid.uuid4().hex[:12],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "versions": versions,
        "params": {
            k: getattr(args, k)
            for k in ("base_rows", "backlog", "runs", "configs", "inputs", "commit_interval_s", "steady_s", "rate")
        }
        | {"memory_cap": args.memory_cap},
    }


def append_run(path: Path, invocation: dict[str, Any], result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps({"kind": "run", **invocation, "result": result}) + "\n")


# -- the report -----------------------------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, Any] | None:
    """median, min and max of ``values`` (None where there are none)."""
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values), "n": len(values)}


def pick(result: dict[str, Any], *path: str) -> Any:
    value: Any = result
    for p in path:
        value = value.get(p) if isinstance(value, dict) else None
    return value


def summarise(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration and input: the medians and spreads over the runs of one invocation; the ratios of
    Lakestream's median changes per writer CPU-second to each other configuration's, per input."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines:
        r = line["result"]
        groups.setdefault((r["config"], r["input"]), []).append(r)
    table: dict[str, dict[str, Any]] = {}
    for (config, input_name), runs in groups.items():
        table.setdefault(config, {})[input_name] = {
            "runs": len(runs),
            "errors": [r["error"][:200] for r in runs if "error" in r],
            "changes_per_cpu_s": spread([pick(r, "backlog", "changes_per_cpu_s") for r in runs]),
            "drain_s": spread([pick(r, "backlog", "seconds") for r in runs]),
            "base_s": spread([pick(r, "base", "seconds") for r in runs]),
            "exact": [pick(r, "exact", "exact") for r in runs],
            "exact_after_compaction": [pick(r, "exact_after_compaction", "exact") for r in runs],
            "freshness_p50_s": spread([pick(r, "steady", "freshness_s", "p50") for r in runs]),
            "freshness_p99_s": spread([pick(r, "steady", "freshness_s", "p99") for r in runs]),
            "peak_rss_mb": spread([pick(r, "writer", "peak_rss_mb") for r in runs]),
            "compaction_s": spread([pick(r, "compaction", "seconds") for r in runs]),
            "compaction_cpu_s": spread([pick(r, "compaction", "cpu_s") for r in runs]),
            "reads": {
                key: spread([pick(r, "reads", key) for r in runs])
                for key in (
                    "spark_point_lookup_s",
                    "spark_full_aggregate_s",
                    "duckdb_point_lookup_s",
                    "duckdb_full_aggregate_s",
                )
            },
            "load_1m": spread([pick(r, "load_start", "loadavg_1m") for r in runs]),
        }
    ratios: dict[str, dict[str, float]] = {}
    for input_name in {i for c in table.values() for i in c}:
        ours = pick(table, "lakestream", input_name, "changes_per_cpu_s", "median")
        for config, inputs in table.items():
            theirs = pick(inputs, input_name, "changes_per_cpu_s", "median")
            if config != "lakestream" and ours and theirs:
                ratios.setdefault(input_name, {})[config] = round(ours / theirs, 2)
    return {"by_config": table, "lakestream_ratio_changes_per_cpu_s": ratios}


def invocation_lines(path: Path, invocation: str | None = None) -> list[dict[str, Any]]:
    """The run lines of one invocation in ``path`` (the newest when ``invocation`` is None), each with its number."""
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip():
            line = json.loads(text)
            if line.get("kind") == "run":
                lines.append({**line, "line": number})
    if not lines:
        raise ValueError(f"{path}: no run lines")
    wanted = invocation or lines[-1]["invocation"]
    return [line for line in lines if line["invocation"] == wanted]


def print_table(summary: dict[str, Any]) -> None:
    def cell(s: dict[str, Any] | None) -> str:
        return "-" if not s else f"{s['median']:g} ({s['min']:g}–{s['max']:g})"

    for config, inputs in summary["by_config"].items():
        for input_name, row in inputs.items():
            exact = "".join({True: "✓", False: "✗", None: "?"}[e] for e in row["exact"])
            say(
                f"  {config:18} {input_name:18} changes/CPU-s {cell(row['changes_per_cpu_s']):28} exact {exact:4} "
                f"RSS MB {cell(row['peak_rss_mb']):18} compaction s {cell(row['compaction_s']):18} "
                f"DuckDB agg s {cell(row['reads']['duckdb_full_aggregate_s'])}"
            )


def report(path: Path, invocation: str | None = None, append: bool = False) -> int:
    """The summary of one invocation's runs; its last line is one JSON object. ``append``: also write it to ``path``
    as a ``summary`` line (the line docs/benchmarks.md cites)."""
    lines = invocation_lines(path, invocation)
    first = lines[0]
    summary = {
        "kind": "summary",
        "bench": "peers",
        "invocation": first["invocation"],
        "started": first["started"],
        "commit": first["commit"],
        "params": first["params"],
        "versions": first["versions"],
        "run_lines": [line["line"] for line in lines],
        **summarise(lines),
    }
    print_table(summary)
    if append:
        with path.open("a") as fh:
            fh.write(json.dumps(summary) + "\n")
    print(json.dumps(summary), flush=True)
    errors = any(row["errors"] for inputs in summary["by_config"].values() for row in inputs.values())
    return 1 if errors else 0
