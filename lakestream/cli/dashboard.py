"""`lakestream dashboard PIPELINE_YAML [--host H] [--port P]`: a thin shell over `lakestream.dashboard`."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
import threading

from lakestream.config import load_config

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="serve a live web dashboard: table health, freshness, "
        "throughput, lag, files per partition, maintenance history",
    )
    parser.add_argument("pipeline", help="pipeline YAML file")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=_port, default=8765, help="port (default: %(default)s; 0 = any free port)")
    parser.add_argument(
        "--interval", type=float, default=10.0, help="seconds between health rounds (default: %(default)s)"
    )
    parser.add_argument(
        "--table",
        action="append",
        metavar="NS.T",
        help="only this table (repeatable); default: every table in the catalog",
    )
    parser.add_argument(
        "--history",
        type=float,
        default=6.0,
        metavar="HOURS",
        help="hours of history in the charts (default: %(default)s)",
    )
    parser.set_defaults(func=func)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535; 0 = any free port)")
    return int(text)


def func(args: argparse.Namespace) -> int:
    from lakestream.dashboard.server import DashboardServer
    from lakestream.runtime.spark import session_for
    from lakestream.signals import install_stop_signals

    if args.interval <= 0 or args.history <= 0:
        raise SystemExit("lakestream dashboard: --interval and --history must be positive")
    config = load_config(args.pipeline)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        log.warning(
            "the dashboard has no authentication and is bound to %s: anyone who reaches it sees table names and errors",
            args.host,
        )
    spark = session_for(config)
    server = DashboardServer(
        spark, config, args.host, args.port, args.interval, args.history * 3600, args.table
    ).start()
    # Where to point a browser: on stderr with the logs, so stdout stays free of anything but data.
    print(f"lakestream dashboard: {server.url}", file=sys.stderr, flush=True)
    stop = threading.Event()
    install_stop_signals(stop, "lakestream dashboard")
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0
