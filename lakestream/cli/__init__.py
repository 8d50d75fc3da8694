"""The `lakestream` command: a thin shell over the library.

Each sub-command lives in its own module here exposing ``register(subparsers)``; the module
adds its parser and sets ``func`` to a callable taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from lakestream.errors import LakestreamError

# Modules are imported lazily so that a missing optional piece never breaks the other commands.
_COMMAND_MODULES = [
    "stack",
    "capture",
    "snapshot",
    "run",
    "sql",
    "query",
    "changes",
    "verify",
    "maintain",
    "health",
    "demo",
    "upgrade",
    "deadletters",
    "dashboard",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakestream", description="Streaming CDC into Apache Iceberg on Spark")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"lakestream.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"lakestream.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("py4j", "py4j.clientserver", "urllib3", "pyiceberg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except LakestreamError as exc:
        print(f"lakestream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
