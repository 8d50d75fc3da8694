"""`lakestream snapshot PIPELINE_YAML [TABLE...]`: load the captured tables into Iceberg in parallel
Spark tasks and leave the exact point where ``lakestream capture`` starts streaming."""

from __future__ import annotations

import argparse
import json
import sys

from lakestream.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "snapshot",
        help="initial load of the captured tables in parallel Spark tasks, handing over to Debezium's stream",
        description="PostgreSQL: creates the replication slot with an exported snapshot; MariaDB: starts "
        "consistent-snapshot sessions at one binlog position. Reads the tables' key-range chunks "
        "under it in parallel and appends them to the Iceberg mirrors; `lakestream capture` then streams "
        "from that exact point. An interrupted snapshot resumes from the chunks already committed. "
        "Tables named after the handover are re-snapshotted while `lakestream capture` and `lakestream "
        "run` keep streaming them: their mirrors are replaced, exactly, in one commit.",
    )
    parser.add_argument("pipeline_yaml", help="pipeline config with a `capture:` section")
    parser.add_argument("tables", nargs="*", metavar="SCHEMA.TABLE", help="only these captured tables (default: all)")
    parser.add_argument(
        "--chunk-rows", type=int, default=None, help="rows per chunk (default: capture.snapshot_chunk_rows)"
    )
    parser.add_argument("--parallelism", type=int, default=None, help="chunks read at once (default: Spark's cores)")
    parser.add_argument(
        "--again",
        action="store_true",
        help="re-snapshot the named tables while streaming continues, even without a parallel "
        "snapshot's handover (tables Debezium snapshotted)",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        help="re-snapshot: seconds to wait for the capture and the pipeline to pass the snapshot",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.set_defaults(func=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    from lakestream.errors import ConfigError
    from lakestream.runtime.spark import session_for
    from lakestream.snapshot import run_snapshot

    config = load_config(args.pipeline_yaml)
    if args.chunk_rows is not None and args.chunk_rows < 1:
        raise ConfigError("--chunk-rows must be at least 1")
    if args.again and not args.tables:
        raise ConfigError("--again re-snapshots the tables you name — fix: add SCHEMA.TABLE ...")
    spark = session_for(config)
    try:
        report = run_snapshot(
            config,
            args.tables or None,
            spark,
            chunk_rows=args.chunk_rows,
            parallelism=args.parallelism,
            again=args.again,
            wait_timeout_s=args.wait_timeout,
        )
    finally:
        spark.stop()
    print(report.to_text(), file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict()))
    return 0
