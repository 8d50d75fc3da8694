"""`lakestream maintain PIPELINE_YAML [--watch] [--dry-run] [--table NS.T]`: a thin shell over
`lakestream.maintenance`."""

from __future__ import annotations

import argparse
import json

from lakestream.config import load_config


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "maintain", help="compact cold partitions, rewrite deletes/manifests, expire snapshots, remove orphans"
    )
    parser.add_argument("pipeline", help="pipeline YAML file")
    parser.add_argument(
        "--watch", action="store_true", help="run a round every maintenance.interval_s until interrupted"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="plan only: change nothing (orphan candidates are still listed)"
    )
    parser.add_argument(
        "--table", action="append", metavar="NS.T", help="only this table (repeatable); default: every table"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    parser.set_defaults(func=func)


def func(args: argparse.Namespace) -> int:
    from lakestream.maintenance.runner import MaintenanceScheduler, watch
    from lakestream.runtime.spark import session_for

    config = load_config(args.pipeline)
    spark = session_for(config)
    if args.watch:
        watch(spark, config, args.table, dry_run=args.dry_run)
        return 0
    results = MaintenanceScheduler(config).run_round(spark, args.table, dry_run=args.dry_run)
    for result in results:
        print(json.dumps(result.to_json(), default=str) if args.json else result.describe())
    if not results and not args.json:
        print("nothing to maintain")
    return 1 if any(r.status == "failed" for r in results) else 0
