"""`lakestream verify PIPELINE_YAML`: compare each captured PostgreSQL table with its Iceberg mirror."""

from __future__ import annotations

import argparse

from lakestream.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="compare captured PostgreSQL tables with their Iceberg mirrors (row count + per-row hash by primary key)",
        description="Exit status: 0 when every table matches, 1 on any difference, 2 on a configuration error.",
    )
    parser.add_argument("config", help="pipeline YAML file with a `capture:` section")
    parser.add_argument(
        "--table", action="append", metavar="SCHEMA.TABLE", help="only this captured table (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--samples", type=int, default=5, help="sample keys shown per kind of difference (default: %(default)s)"
    )
    parser.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from lakestream.runtime.spark import session_for
    from lakestream.verify.compare import verify_tables

    config = load_config(args.config)
    spark = session_for(config)
    try:
        report = verify_tables(config, spark, tables=args.table, samples=args.samples)
    finally:
        spark.stop()
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1
