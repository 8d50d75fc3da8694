"""`lakestream dead-letters list|summary|replay PIPELINE_YAML`: work the dead-letter table (a thin
shell over `lakestream.sink.deadletters.replay`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from lakestream.config import load_config
from lakestream.errors import ConfigError

EPILOG = """examples:
  lakestream dead-letters summary pipeline.yaml
  lakestream dead-letters list pipeline.yaml --table shop.orders --reason "does not fit type int" --json
  lakestream dead-letters replay pipeline.yaml --table shop.orders --reason "does not fit type int" --dry-run
  lakestream dead-letters replay pipeline.yaml --offset shop.public.orders:0:1234

Replay after fixing the cause (e.g. `ALTER TABLE lake.shop.orders ALTER COLUMN qty TYPE bigint`): the
original key and value go back to their topic and partition, the running pipeline applies them exactly
once, and each dead letter is replayed at most once. An upsert change is applied as the latest change of
its key: replay before newer changes of the same key, or select with care.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dead-letters",
        help="list, summarise and replay dead letters",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=["list", "summary", "replay"])
    parser.add_argument("config", help="pipeline YAML file")
    parser.add_argument("--table", help="only dead letters meant for this table (namespace.table)")
    parser.add_argument("--reason", help="only dead letters whose reason contains this text (case-insensitive)")
    parser.add_argument("--topic", help="only dead letters read from this topic")
    parser.add_argument(
        "--offset",
        action="append",
        default=[],
        metavar="TOPIC:PARTITION:OFFSET",
        help="only this dead letter (repeatable)",
    )
    parser.add_argument("--include-replayed", action="store_true", help="list/summary: also those already replayed")
    parser.add_argument("--limit", type=int, default=100, help="list: at most N rows, 0 for all (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout (logs stay on stderr)")
    parser.add_argument("--dry-run", action="store_true", help="replay: only count what would be re-sent")
    parser.set_defaults(func=_dead_letters)


def _coordinates(values: list[str]) -> list[tuple[str, int, int]]:
    out = []
    for value in values:
        topic, _, rest = value.rpartition(":")
        topic, _, partition = topic.rpartition(":")
        try:
            out.append((topic, int(partition), int(rest)))
        except ValueError:
            raise ConfigError(
                f"--offset {value!r}: write it as TOPIC:PARTITION:OFFSET, e.g. shop.public.orders:0:42"
            ) from None
        if not topic:
            raise ConfigError(f"--offset {value!r}: write it as TOPIC:PARTITION:OFFSET, e.g. shop.public.orders:0:42")
    return out


def _dead_letters(args: argparse.Namespace) -> int:
    from lakestream.cli.sql import plain_value, print_table
    from lakestream.runtime.spark import session_for
    from lakestream.sink.deadletters.replay import (
        DeadLetterFilter,
        list_dead_letters,
        replay_dead_letters,
        summarize_dead_letters,
    )

    config = load_config(args.config)
    flt = DeadLetterFilter(args.table, args.reason, args.topic, _coordinates(args.offset), args.include_replayed)
    out = _clean_stdout()
    spark = session_for(config)
    try:
        if args.action == "list":
            rows: Any = list_dead_letters(spark, config, flt, args.limit)
        elif args.action == "summary":
            rows = summarize_dead_letters(spark, config, flt)
        else:
            result = replay_dead_letters(spark, config, flt, dry_run=args.dry_run)
            rows = {
                "selected": result.selected,
                "produced": result.produced,
                "already_sent": result.already_sent,
                "skipped": result.skipped,
                "dry_run": args.dry_run,
            }
    finally:
        spark.stop()
    if args.json:
        out.write(json.dumps(plain_value(rows), indent=2, default=str) + "\n")
        out.flush()
        return 0
    sys.stdout = out
    if args.action == "replay":
        if args.dry_run:
            print(f"{rows['selected']} dead letter(s) selected; would re-send {rows['selected'] - rows['skipped']}")
        else:
            print(
                f"{rows['selected']} dead letter(s) selected; re-sent {rows['produced']}, "
                f"{rows['already_sent']} found already sent by an earlier replay, {rows['skipped']} without a value"
            )
    elif not rows:
        print("no dead letters match")
    else:
        columns = list(rows[0])
        if args.action == "summary":
            columns = ["table", "reason", "count", "replayed", "first_failed", "last_failed"]
        print_table(
            columns, [tuple(r[c] for c in columns) for r in rows], title=f"dead letters of pipeline {config.name}"
        )
    out.flush()
    return 0


def _clean_stdout() -> TextIO:
    """A stream on the real stdout, with file descriptor 1 pointed at stderr from now on: the JVM Spark
    starts writes some of its log lines to fd 1, which would corrupt ``--json`` output."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(saved, "w")
