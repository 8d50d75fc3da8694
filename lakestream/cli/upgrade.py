"""`lakestream upgrade-tables PIPELINE_YAML [--table NS.T]`: move v2 tables to format v3 (deletion vectors)."""

from __future__ import annotations

import argparse

from lakestream.config import load_config


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "upgrade-tables", help="upgrade Iceberg format-v2 tables to v3 so upserts can write deletion vectors"
    )
    parser.add_argument("pipeline", help="pipeline YAML file")
    parser.add_argument(
        "--table",
        action="append",
        metavar="NS.T",
        required=False,
        help="only this table (repeatable); default: every table in the streams' namespaces",
    )
    parser.set_defaults(func=func)


def func(args: argparse.Namespace) -> int:
    from lakestream.identifiers import quote, validate_identifier
    from lakestream.runtime.spark import session_for
    from lakestream.sink.catalog.upgrade import upgrade_table

    config = load_config(args.pipeline)
    spark = session_for(config)
    catalog = config.catalog.name
    tables: list[tuple[str, str]] = []
    if args.table:
        for item in args.table:
            ns, _, tbl = item.partition(".")
            tables.append((validate_identifier(ns, "namespace"), validate_identifier(tbl, "table")))
    else:
        for ns in sorted({s.namespace for s in config.streams}):
            if not spark.catalog.databaseExists(f"{catalog}.{ns}"):
                continue
            for row in spark.sql(f"SHOW TABLES IN {quote(catalog, 'catalog')}.{quote(ns, 'namespace')}").collect():
                tables.append((ns, row["tableName"]))
    for ns, tbl in tables:
        print(upgrade_table(spark, catalog, ns, tbl))
    return 0
