"""Does an upsert batch cost what its changes cost, whatever the table size, with bounded driver memory?

    .venv/bin/python bench/scale.py [--sizes 1000000,20000000] [--batches 7] [--changes 5000] [--rows-per-file 10000]
                                    [--no-full-build] [--jfr PATH]

For each size N: the pipeline creates an upsert table from real Debezium events (schemas off); the table is then
filled to N rows through the pipeline's own write path — data files written by the sink's writer
(`sink.write.files.write_data_file`, in Spark tasks, ``--rows-per-file`` rows each: thousands of files, as a streaming
table holds before compaction) and committed by the sink's commit (`LakestreamSink.commitFiles`) — not timed.
The first batch after it brings the key index up to date (timed apart: a diff up to 2M added rows, else a build on
the executors); then ``--batches``
batches of ``--changes`` random-key changes (10% deletes) run one at a time. Per size: the median batch and its
commit part (the batch after the write job; within it the JVM's `commitFiles` and that call's own steps), data
files touched (named by the commit's deletes) and deletion vectors written per batch, the driver's peak RSS (the Python
process and the JVM apart, from each one's VmHWM, reset before the size), the index's bytes on disk and in the
driver's heap, and the time of a full build of the index on the executors (``--no-full-build``: skipped). The
commit's cost follows the data files a batch touches, not the rows: ``--sizes 1000000 --rows-per-file 100`` (10,000
files, ~3,900 touched per batch) gives a 100M-row table's commit shape in minutes. ``--rows-per-file`` may list one
value per size (``--sizes 1000000,1000000 --rows-per-file 10000,100``: the 1M-row and the 100M-row shapes in one
run, compared by the last line's ratio). The table is verified (count, distinct keys, sum of versions) after the
last batch. Default driver memory (2g). The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DebeziumEvents,
    FastProducer,
    OrderRow,
    fill_through_write_path,
    machine_load,
    pipeline_data,
    private_stack,
    quiet_logs,
    say,
    to_config,
)

import lakestream.sink.catalog.sink as sink_files  # noqa: E402
from lakestream.engine.loop import run_pipeline  # noqa: E402
from lakestream.engine.pipeline import Pipeline  # noqa: E402
from lakestream.runtime.spark import session_for  # noqa: E402


def _status_kb(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak(pid: int | str) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM (Linux)
    except OSError:
        pass


def _jvm_pid(spark) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


class CommitCalls:
    """Records each `commit_files` call (the JVM's commit of one table): wall time, files touched, the result."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._real = sink_files.commit_files

    def __enter__(self) -> CommitCalls:
        def recorded(spark, catalog, namespace, table, request):
            started = time.perf_counter()
            result = self._real(spark, catalog, namespace, table, request)
            self.calls.append(
                {"seconds": time.perf_counter() - started, "files_touched": len(request["deletes"]), "result": result}
            )
            return result

        sink_files.commit_files = recorded
        return self

    def __exit__(self, *exc) -> None:
        sink_files.commit_files = self._real


def one_size(info, state_dir: Path, spark, size: int, rows_per_file: int, args) -> dict:
    tag = f"{size}" if rows_per_file == 10000 else f"{size}_{rows_per_file}"  # one table per case
    events = DebeziumEvents(f"lsscale{tag}", f"orders_{tag}", schemas=False)
    name = f"bench.orders_{tag}"
    table = f"lake.{name}"
    config = to_config(
        pipeline_data(
            info,
            state_dir,
            f"scale{tag}",
            [{"topics": [events.topic], "mode": "upsert", "namespace": "bench", "table": "{table}"}],
        )
    )
    producer = FastProducer(info.bootstrap_servers)
    now = int(time.time() * 1000)
    for row_id in range(1, 101):
        producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, row_id % 19 + 1, 1), "c", now))
    producer.flush()
    run_pipeline(config, spark=spark, stop_when_idle=True)
    started = time.perf_counter()
    files = fill_through_write_path(spark, config, name, 101, size + 1, rows_per_file)
    say(
        f"{size:,} rows: filled through the write path in {time.perf_counter() - started:.1f}s, {files:,} files "
        f"(not timed)"
    )
    jvm = _jvm_pid(spark)
    _reset_peak("self")
    _reset_peak(jvm)
    rng = random.Random(size)
    versions = {}  # id → version for ids changed (others stay 1); None = deleted
    pipeline = Pipeline(config, spark)
    dvs: list[int] = []  # one deletion vector per data file a batch touches
    try:
        producer.send(events.topic, *events.upsert(OrderRow(1, 1, 1, 2), "u", now))
        versions[1] = 2
        producer.flush()
        started = time.perf_counter()
        pipeline.run_batch()
        build_s = time.perf_counter() - started
        index = pipeline.indexes[name]
        store = pipeline.registry.index_stores[name]
        say(
            f"{size:,} rows: first batch after the fill {build_s:.1f}s ({len(index):,} keys, {len(index.runs)} buckets)"
        )
        seconds, commit_s, java_s, touched, steps = [], [], [], [], []
        if args.jfr:  # a JFR recording of the driver JVM over the timed batches (jfr print / jfr summary)
            subprocess.run(
                [
                    "jcmd",
                    str(jvm),
                    "JFR.start",
                    "name=scale",
                    "settings=profile",
                    f"filename={Path(args.jfr).resolve()}",
                ],
                check=True,
                capture_output=True,
            )
        for b in range(args.batches):
            for _ in range(args.changes):
                row_id = rng.randrange(1, size + 1)
                if versions.get(row_id, 1) is None:
                    continue
                if rng.random() < 0.1:
                    for key, value in events.delete(row_id, now):
                        producer.send(events.topic, key, value)
                    versions[row_id] = None
                else:
                    version = versions.get(row_id, 1) + 1
                    producer.send(events.topic, *events.upsert(OrderRow(row_id, row_id % 50000, 3, version), "u", now))
                    versions[row_id] = version
            producer.flush()
            with CommitCalls() as calls:
                result = pipeline.run_batch()
            seconds.append(result.seconds)
            commit_s.append(result.seconds - result.read_seconds)
            mine = [c for c in calls.calls if not c["result"].get("stale")]
            java_s.append(sum(c["seconds"] for c in mine))
            touched.append(sum(c["files_touched"] for c in mine))
            timings: dict[str, float] = {}
            for c in mine:
                for step, ms in c["result"].get("timings_ms", {}).items():
                    timings[step] = timings.get(step, 0.0) + ms
            steps.append(timings)
            summary = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[
                0
            ][0]
            dvs.append(int(summary.get("added-dvs", summary.get("added-delete-files", 0))))
            say(
                f"  batch {b + 1}: {result.changes:,} changes in {result.seconds:.2f}s "
                f"(tasks {result.read_seconds:.2f}s, commit {commit_s[-1]:.2f}s of which commitFiles "
                f"{java_s[-1]:.2f}s), {touched[-1]} files touched, {dvs[-1]} deletion vectors; commitFiles steps ms "
                + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
            )
        if args.jfr:
            subprocess.run(["jcmd", str(jvm), "JFR.stop", "name=scale"], check=True, capture_output=True)
        index_disk = store.footprint()
        heap = index.nbytes
        # A full build as after a lost state or on a first start: on the executors, into the table's store.
        from lakestream.sink.index.disk import DiskKeyIndex

        full_build_s = None
        if args.full_build:
            fresh = DiskKeyIndex(index.hashed, index.key_columns, index.table_uuid)
            fresh.build_root = store.location
            started = time.perf_counter()
            fresh.rebuild(spark, f"`lake`.`bench`.`orders_{tag}`", index.snapshot_id)
            full_build_s = time.perf_counter() - started
            assert len(fresh) == len(index), (len(fresh), len(index))
            say(
                f"{size:,} rows: full build on the executors {full_build_s:.1f}s ({len(fresh):,} keys, "
                f"{len(fresh.runs)} buckets)"
            )
    finally:
        pipeline.close()
    py_peak_mb = _status_kb("self", "VmHWM") / 1024
    jvm_peak_mb = _status_kb(jvm, "VmHWM") / 1024
    deleted = sum(1 for v in versions.values() if v is None)
    want_rows = size - deleted
    want_version = (size - len(versions)) + sum(v for v in versions.values() if v is not None)
    row = spark.sql(f"SELECT count(*) AS n, count(DISTINCT id) AS k, sum(version) AS v FROM {table}").collect()[0]
    if (row["n"], row["k"], row["v"]) != (want_rows, want_rows, want_version):
        raise SystemExit(
            f"{size:,}: lake has {row['n']} rows / {row['k']} keys / {row['v']} version sum, "
            f"expected {want_rows} / {want_rows} / {want_version}"
        )
    median = statistics.median(seconds)
    step_names = list(dict.fromkeys(k for t in steps for k in t))
    say(
        f"{size:,} rows: median batch {median:.2f}s over {len(seconds)} batches (commit part "
        f"{statistics.median(commit_s):.2f}s, commitFiles {statistics.median(java_s):.2f}s); "
        f"verified {want_rows:,} rows; "
        f"driver peak RSS Python {py_peak_mb:.0f} MB, JVM {jvm_peak_mb:.0f} MB; index {index_disk / 1e6:.0f} MB on "
        f"disk, {heap / 1e6:.1f} MB in the heap"
    )
    return {
        "size": size,
        "rows_per_file": rows_per_file,
        "data_files": files + 1,
        "median_batch_s": round(median, 3),
        "batches_s": [round(s, 3) for s in seconds],
        "first_batch_after_fill_s": round(build_s, 2),
        "median_commit_part_s": round(statistics.median(commit_s), 3),
        "median_commit_files_s": round(statistics.median(java_s), 3),
        "commit_files_steps_ms_median": {
            k: round(statistics.median(t.get(k, 0.0) for t in steps), 1) for k in step_names
        },
        "full_build_s": None if full_build_s is None else round(full_build_s, 2),
        "files_touched_per_batch": statistics.median(touched) if touched else 0,
        "dvs_written_per_batch": statistics.median(dvs) if dvs else 0,
        "driver_peak_rss_python_mb": round(py_peak_mb),
        "driver_peak_rss_jvm_mb": round(jvm_peak_mb),
        "index_bytes_on_disk": index_disk,
        "index_overlay_bytes_in_heap": heap,
        "index_buckets": len(index.runs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,20000000")
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--changes", type=int, default=5000)
    parser.add_argument("--rows-per-file", default="10000", help="one value, or one per size")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--no-full-build",
        dest="full_build",
        action="store_false",
        help="skip the timed full build of the index after the batches",
    )
    parser.add_argument("--jfr", help="record the driver JVM over the timed batches into this .jfr file (one size)")
    args = parser.parse_args()
    quiet_logs()
    sizes = [int(s) for s in args.sizes.split(",")]
    per_file = [int(r) for r in args.rows_per_file.split(",")]
    if len(per_file) not in (1, len(sizes)):
        parser.error("--rows-per-file: one value, or one per size")
    cases = list(zip(sizes, per_file * len(sizes) if len(per_file) == 1 else per_file, strict=True))
    summary = {"bench": "scale", "load_start": machine_load(), "params": vars(args), "sizes": []}
    with private_stack("bench-scale") as (info, state_dir):
        config = to_config(
            pipeline_data(info, state_dir, "scale", [{"topics": ["x"]}], driver_memory=args.driver_memory)
        )
        spark = session_for(config)
        try:
            for size, rows_per_file in cases:
                summary["sizes"].append(one_size(info, state_dir, spark, size, rows_per_file, args))
        finally:
            spark.stop()
    # the largest table (of one size: the one with the most files) against the smallest (the fewest files)
    first, last = (f(summary["sizes"], key=lambda s: (s["size"], s["data_files"])) for f in (min, max))
    summary["ratio_largest_to_smallest"] = round(last["median_batch_s"] / first["median_batch_s"], 3)
    summary["load_end"] = machine_load()
    say("\n  rows         files   median batch   commit   full build   DVs/batch   py RSS   JVM RSS   index on disk")
    for s in summary["sizes"]:
        build = "-" if s["full_build_s"] is None else f"{s['full_build_s']:.1f} s"
        say(
            f"  {s['size']:>11,}  {s['data_files']:>6,}   {s['median_batch_s']:>9.2f} s"
            f"   {s['median_commit_part_s']:>5.2f} s"
            f"   {build:>10}"
            f"   {s['dvs_written_per_batch']:>9}"
            f"   {s['driver_peak_rss_python_mb']:>5} MB  {s['driver_peak_rss_jvm_mb']:>5} MB"
            f"   {s['index_bytes_on_disk'] / 1e6:>8.0f} MB"
        )
    say(
        f"  median at {last['size']:,} rows in {last['data_files']:,} files / median at {first['size']:,} rows in "
        f"{first['data_files']:,} files = {summary['ratio_largest_to_smallest']}"
    )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
