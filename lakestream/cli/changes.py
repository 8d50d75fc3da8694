"""`lakestream changes PIPELINE_YAML NS.TABLE --since SNAPSHOT [--until SNAPSHOT] [--all] [--to NS.TABLE]`: what
changed in a table between two snapshots, a thin shell over `lakestream.changes`."""

from __future__ import annotations

import argparse
import json
import sys

from lakestream.cli.sql import add_output_arguments, print_arrow
from lakestream.config import load_config

EPILOG = """examples:
  lakestream changes pipeline.yaml shop.customers --since 4126329795634851112
  lakestream changes pipeline.yaml shop.customers --since 4126329795634851112 --until 871542209170390291 --all
  lakestream changes pipeline.yaml shop.customers --since 4126329795634851112 --format json --limit 0
  lakestream changes pipeline.yaml shop.customers --to analytics.customer_changes --since 4126329795634851112
  lakestream changes pipeline.yaml shop.customers --to analytics.customer_changes   # after its checkpoint
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "changes",
        help="the rows inserted, updated and deleted in a table between two snapshots (net per key, or --all)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="pipeline YAML file")
    parser.add_argument("table", help="namespace.table (or catalog.namespace.table)")
    parser.add_argument("--since", type=int, metavar="SNAPSHOT", help="the snapshot to start after (exclusive)")
    parser.add_argument("--until", type=int, metavar="SNAPSHOT", help="the last snapshot (default: the current one)")
    parser.add_argument(
        "--all",
        action="store_true",
        dest="all_changes",
        help="every commit's changes against its parent, instead of the net change per key",
    )
    parser.add_argument(
        "--key",
        help="comma-separated key columns (default: the table's identifier fields; none: rows matched by _row_id)",
    )
    parser.add_argument(
        "--to",
        metavar="NS.TABLE",
        help="append the changes into this Iceberg table (created on first use) with --until as its checkpoint; "
        "without --since, start after the checkpoint it holds",
    )
    add_output_arguments(parser)
    parser.set_defaults(func=_changes)


def _changes(args: argparse.Namespace) -> int:
    from lakestream.changes import append_changes, read_changes_arrow
    from lakestream.errors import ConfigError
    from lakestream.runtime.spark import session_for

    config = load_config(args.config)
    keys = [k.strip() for k in args.key.split(",") if k.strip()] if args.key is not None else None
    if args.to is None and args.since is None:
        raise ConfigError(
            "--since is required (the snapshot to start after), unless --to names a table with a checkpoint"
        )
    spark = session_for(config)
    try:
        if args.to is not None:
            result = append_changes(
                spark,
                config.catalog.name,
                args.table,
                args.to,
                args.since,
                args.until,
                all_changes=args.all_changes,
                key_columns=keys,
            )
            if args.format == "json":
                print(json.dumps(result))
            else:
                print(
                    f"appended {result['rows']} changes of {result['source']} in ({result['since']}, "
                    f"{result['until']}] to {result['target']}",
                    file=sys.stderr,
                )
            return 0
        table = read_changes_arrow(
            spark,
            config.catalog.name,
            args.table,
            args.since,
            args.until,
            all_changes=args.all_changes,
            key_columns=keys,
        )
    finally:
        spark.stop()
    print_arrow(table, args.format, args.limit)
    return 0
