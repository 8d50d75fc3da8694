"""Lakestream beside the writers users would pick instead, each configured as its maintainers' documents say
(configs.py: ``lakestream``, ``flink-changelog``, ``flink-upsert``, ``spark-merge-hash``, ``spark-merge-cow``),
draining the same CDC backlog on the same machine, ``--runs`` times each, the order alternating (compare.py).

    .venv/bin/python bench/peers/run.py [--base-rows 10000000] [--backlog 1000000] [--runs 3]
        [--configs lakestream,flink-changelog,...] [--inputs json-schemas,json-plain,json-schemas-zipf]
        [--commit-interval-s 10] [--steady-s 0 --rate 2000] [--memory-cap 6g] [--results FILE]
    .venv/bin/python bench/peers/run.py --report FILE [--invocation ID] [--append-summary]

One private stack (PostgreSQL for the JDBC catalog, Apache Kafka), one warehouse; the configurations run one after
another, each on a topic and a table of its own holding the same records (bench/peers/workload.py: a seeded stream,
two partitions). Each run is appended to ``--results`` as one JSON line when it ends; the report (the medians and
spreads of one invocation; the last line of stdout is one JSON object) is printed at the end, and
``--report FILE`` prints it again from the file without running anything. ``--append-summary`` writes the summary
into the file too: the line docs/benchmarks.md cites (bench/peers/report_doc.py).

``--memory-cap BYTES`` (e.g. 6g) puts each writer's process tree in a memory cgroup of that limit (measure.py); off
by default, and refused where the machine has no writable memory controller.

Duration (an estimate, not yet timed end to end): a run of one configuration is the base's production and drain,
the backlog's, the settling, two exactness checks, the compaction and the reads. At ``--scale 10m`` (10M base rows, a
1M-change backlog) on 2 cores that is 10–25 minutes, Flink and the MERGE job at the long end, so the default 5
configurations × 3 inputs × 3 runs take 8–20 hours; ``--scale 1m`` (1M rows, 200k changes) 1.5–4 hours.
`make bench-peers PEERS_SCALE=1m` is the shorter one; ``--inputs json-schemas`` alone takes a third of either.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import machine_load, pipeline_data, private_stack, quiet_logs, say, to_config, write_pipeline_yaml  # noqa: E402
from compare import compare, new_invocation, report  # noqa: E402
from configs import CONFIGS  # noqa: E402
from workload import INPUTS  # noqa: E402

SCALES = {"10m": (10_000_000, 1_000_000), "1m": (1_000_000, 200_000), "smoke": (2_000, 1_000)}


def size(text: str) -> int:
    """Bytes from ``6g``, ``512m`` or a number."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def versions() -> dict[str, str | None]:
    import duckdb
    import pyspark

    from lakestream.runtime import jars

    out: dict[str, str | None] = {
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "iceberg_spark": next(c.version for c in jars.group(jars.spark_group()).artifacts),
        "spark_sql_kafka": jars.group("bench-spark-kafka").artifacts[0].version,
    }
    for c in jars.group("bench-flink").artifacts:
        if c.artifact.startswith("iceberg-flink-runtime"):
            out["iceberg_flink"] = f"{c.artifact} {c.version}"
        if c.artifact == "flink-sql-connector-kafka":
            out["flink_sql_connector_kafka"] = c.version
    dist = list((HERE.parent.parent / ".venv-peers").glob("lib/python*/site-packages/pyflink/lib/flink-dist-*.jar"))
    out["flink"] = dist[0].stem.removeprefix("flink-dist-") if dist else None
    return out


def git_commit() -> str | None:
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=tuple(SCALES), default="10m", help="base rows and backlog: 10m, 1m, smoke")
    parser.add_argument("--base-rows", type=int, default=None, help="rows of the mirror (default: the scale's)")
    parser.add_argument("--backlog", type=int, default=None, help="changes drained per run (default: the scale's)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--inputs", default=",".join(INPUTS))
    parser.add_argument("--commit-interval-s", type=float, default=None, help="default: configs.COMMIT_INTERVAL_S")
    parser.add_argument("--steady-s", type=float, default=0.0, help="a steady phase after the backlog (freshness)")
    parser.add_argument("--rate", type=float, default=2000.0, help="changes/s of the steady phase")
    parser.add_argument("--memory-cap", type=size, default=None, help="a memory cgroup per writer, e.g. 6g")
    parser.add_argument("--timeout", type=float, default=3600.0, help="of each drain and each compaction")
    parser.add_argument("--read-repeats", type=int, default=3)
    parser.add_argument("--read-timeout", type=float, default=900.0)
    parser.add_argument("--results", type=Path, default=None, help="append each run here (JSON lines)")
    parser.add_argument("--keep", action="store_true", help="keep the state dir (its path is printed)")
    parser.add_argument("--report", type=Path, default=None, help="run nothing: the summary of a results file")
    parser.add_argument("--invocation", default=None, help="with --report: this invocation (default: the newest)")
    parser.add_argument("--append-summary", action="store_true", help="with --report: write the summary line too")
    args = parser.parse_args(argv)
    from configs import COMMIT_INTERVAL_S

    base_rows, backlog = SCALES[args.scale]
    args.base_rows = args.base_rows or base_rows
    args.backlog = args.backlog or backlog
    args.commit_interval_s = args.commit_interval_s or COMMIT_INTERVAL_S
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.inputs = [i.strip() for i in args.inputs.split(",") if i.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS] + [i for i in args.inputs if i not in INPUTS]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: configurations {', '.join(CONFIGS)}; inputs {', '.join(INPUTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report(args.report, args.invocation, args.append_summary)
    quiet_logs()
    invocation = new_invocation(args, versions(), git_commit())
    say(f"machine: {machine_load()}; invocation {invocation['invocation']}; {json.dumps(invocation['params'])}")
    started = time.monotonic()
    with private_stack("bench-peers", keep=args.keep, discard_topics=True) as (info, state_dir):
        if args.keep:
            say(f"state dir: {state_dir}")
        from lakestream.runtime.spark import session_for

        reader = pipeline_data(info, state_dir, "peers-reader", [{"topics": ["x"]}])
        args.reader_yaml = write_pipeline_yaml(state_dir / "reader.yaml", reader)
        reader_config = to_config(reader)
        spark = session_for(reader_config)
        try:
            results = compare(args, info, state_dir, spark, reader_config, invocation)
        finally:
            spark.stop()
    say(f"\n{len(results)} runs in {(time.monotonic() - started) / 60:.0f} min")
    if args.results:
        return report(args.results, invocation["invocation"])
    from compare import summarise

    print(json.dumps({"kind": "summary", **invocation, **summarise([{"result": r} for r in results])}), flush=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
