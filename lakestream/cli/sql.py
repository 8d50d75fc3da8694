"""`lakestream sql PIPELINE_YAML "<query>" [--engine spark|duckdb|trino]`: SQL against the pipeline's Iceberg
catalog."""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import decimal
import json
import sys
from typing import Any

from lakestream.config import load_config

EPILOG = """examples:
  lakestream sql pipeline.yaml "SHOW TABLES IN lake.shop"
  lakestream sql pipeline.yaml "SELECT count(*) FROM lake.shop.orders"
  lakestream sql pipeline.yaml "SELECT snapshot_id, committed_at, operation FROM lake.shop.orders.snapshots"
  lakestream sql pipeline.yaml "SELECT * FROM lake.shop.orders VERSION AS OF 4348315315263456139"
  lakestream sql pipeline.yaml "SELECT * FROM lake.shop.orders TIMESTAMP AS OF '2025-01-01 12:00:00'" --format csv
  echo "SELECT 1" | lakestream sql pipeline.yaml -
  lakestream sql pipeline.yaml "SELECT region, count(*) FROM lake.shop.orders GROUP BY 1" --engine duckdb --format json
  lakestream sql pipeline.yaml 'SELECT id, "$row_id" FROM lake.shop.orders FOR VERSION AS OF 4348315315263456139' \
      --engine trino --trino-uri http://127.0.0.1:18080
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sql",
        help="run SQL against the Iceberg catalog with Spark (time travel included), DuckDB or a Trino server",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="pipeline YAML file (its catalog is registered under catalog.name, e.g. `lake`)")
    parser.add_argument("query", help="the SQL statement, or - to read it from stdin")
    parser.add_argument(
        "--engine",
        choices=["spark", "duckdb", "trino"],
        default="spark",
        help="spark (Spark SQL), duckdb (DuckDB SQL over iceberg_scan of each lake.ns.table named; no JVM) or "
        "trino (Trino SQL on a running Trino whose Iceberg catalog reads the pipeline's catalog: `lakestream "
        "stack up --trino`, or your own) (default: %(default)s)",
    )
    parser.add_argument(
        "--trino-uri",
        help="with --engine trino: the coordinator's http(s) address (default: $LAKESTREAM_TRINO_URI, else the "
        "stack's http://127.0.0.1:18080); a password for https comes from $LAKESTREAM_TRINO_PASSWORD only",
    )
    parser.add_argument(
        "--trino-user", help="with --engine trino: the user (default: $LAKESTREAM_TRINO_USER, else lakestream)"
    )
    add_output_arguments(parser)
    parser.set_defaults(func=_sql)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """--format and --limit, shared by `sql` and `query`."""
    parser.add_argument(
        "--format", choices=["table", "json", "csv"], default="table", help="output format (default: %(default)s)"
    )
    parser.add_argument(
        "--limit", type=int, default=1000, help="print at most N rows, 0 for all (default: %(default)s)"
    )


def _sql(args: argparse.Namespace) -> int:
    query = sys.stdin.read() if args.query == "-" else args.query
    config = load_config(args.config)
    if args.engine == "trino":
        from lakestream.read.trino import TrinoTarget, run_trino_sql

        target = TrinoTarget.from_env(args.trino_uri, args.trino_user)
        columns, rows = run_trino_sql(target, query, catalog=config.catalog.name, limit=args.limit)
        print_rows(columns, rows, args.format, args.limit)
        return 0
    if args.engine == "duckdb":
        from lakestream.read.query import run_sql

        table = run_sql(config, query, engine="duckdb")
        print_arrow(table, args.format, args.limit)
        return 0
    from lakestream.runtime.spark import session_for

    spark = session_for(config)
    try:
        df = spark.sql(query)
        columns = df.columns
        rows = [tuple(row) for row in (df.limit(args.limit + 1) if args.limit > 0 else df).collect()] if columns else []
    finally:
        spark.stop()
    print_rows(columns, rows, args.format, args.limit)
    return 0


def print_arrow(table, output_format: str, limit: int) -> None:
    """Print a pyarrow Table like `print_rows` (at most ``limit`` rows, 0 for all)."""
    if limit > 0:
        table = table.slice(0, limit + 1)
    rows = list(zip(*(column.to_pylist() for column in table.columns), strict=True))
    print_rows(table.column_names, rows, output_format, limit)


def print_rows(columns: list[str], rows: list[tuple], output_format: str, limit: int) -> None:
    """Print rows as a table, JSON or CSV; ``rows`` may hold one row beyond ``limit`` to tell truncation."""
    truncated = limit > 0 and len(rows) > limit
    rows = rows[:limit] if truncated else rows
    if output_format == "json":
        records = [dict(zip(columns, map(plain_value, row), strict=True)) for row in rows]
        print(json.dumps(records, indent=2, default=str))
    elif output_format == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([[_text(v) for v in row] for row in rows])
    else:
        print_table(columns, rows)
    if truncated:
        print(f"(showing the first {limit} rows; use --limit 0 for all)", file=sys.stderr)


def print_table(columns: list[str], rows: list[tuple], title: str | None = None) -> None:
    """Print rows as an aligned table with rich (numbers right-aligned)."""
    from rich.console import Console
    from rich.table import Table

    if not columns:
        print("OK")
        return
    table = Table(title=title, show_lines=False, header_style="bold")
    for i, name in enumerate(columns):
        numeric = bool(rows) and all(isinstance(r[i], (int, float, decimal.Decimal)) or r[i] is None for r in rows)
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_text(v) for v in row))
    # Not a terminal (a pipe, a log): rich would wrap at 80 columns; tables only take the width they need.
    Console(soft_wrap=False, width=None if sys.stdout.isatty() else 250).print(table)


def plain_value(value: Any) -> Any:
    """A JSON-friendly form of a Spark value."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if hasattr(value, "asDict"):
        return {k: plain_value(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_value(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return str(value)
    if isinstance(value, (list, dict)) or hasattr(value, "asDict"):
        return json.dumps(plain_value(value), default=str)
    return str(plain_value(value))
