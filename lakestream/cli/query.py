"""`lakestream query PIPELINE_YAML NS.TABLE [--engine spark|duckdb|pyiceberg]`: read one table, a thin shell over
`lakestream.read.query`."""

from __future__ import annotations

import argparse

from lakestream.cli.sql import add_output_arguments, print_arrow
from lakestream.config import load_config

EPILOG = """examples:
  lakestream query pipeline.yaml shop.orders --engine duckdb --format json
  lakestream query pipeline.yaml shop.orders --engine pyiceberg --columns id,status --where "status = 'paid'"
  lakestream query pipeline.yaml shop.orders --engine spark --snapshot 4348315315263456139
  lakestream query pipeline.yaml shop.orders --fresh --where "status = 'paid'"   # + the uncommitted Kafka tail
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "query",
        help="read one lake table with Spark, DuckDB or pyiceberg (the last two start no JVM)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="pipeline YAML file")
    parser.add_argument("table", help="namespace.table (or catalog.namespace.table)")
    parser.add_argument(
        "--engine",
        choices=["spark", "duckdb", "pyiceberg"],
        default="pyiceberg",
        help="who reads the table (default: %(default)s)",
    )
    parser.add_argument("--columns", help="comma-separated columns (default: all)")
    parser.add_argument(
        "--where", help="row filter in the engine's expression syntax, e.g. \"id > 3 AND region = 'eu'\""
    )
    parser.add_argument("--snapshot", type=int, metavar="ID", help="read this snapshot (time travel)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="add the changes in Kafka not yet committed to the table (applied by key as the "
        "pipeline will apply them); --where is then DuckDB SQL over the merged rows",
    )
    add_output_arguments(parser)
    parser.set_defaults(func=_query)


def _query(args: argparse.Namespace) -> int:
    from lakestream.read.query import read_table

    config = load_config(args.config)
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    limit = args.limit + 1 if args.limit > 0 else None  # one more row tells the printer the output was cut
    table = read_table(
        config,
        args.table,
        args.engine,
        columns=columns,
        where=args.where,
        snapshot_id=args.snapshot,
        limit=limit,
        fresh=args.fresh,
    )
    print_arrow(table, args.format, args.limit)
    return 0
