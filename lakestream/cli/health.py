"""`lakestream health PIPELINE_YAML [--json] [--check] [--serve-metrics PORT]`: a thin shell over
`lakestream.health`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lakestream.config import load_config
from lakestream.errors import ConfigError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "health", help="table health: files, snapshots, metadata size, freshness, Kafka lag, alerts"
    )
    parser.add_argument("pipeline", help="pipeline YAML file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--check", action="store_true", help="exit 1 when any threshold is crossed")
    parser.add_argument("--table", action="append", metavar="NS.T", help="only this table (repeatable)")
    parser.add_argument(
        "--serve-metrics",
        type=int,
        nargs="?",
        const=-1,
        metavar="PORT",
        help="serve Prometheus /metrics on PORT (default: health.metrics_port) and re-measure every --interval seconds",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=60.0,
        help="seconds between rounds with --serve-metrics (default: %(default)s)",
    )
    parser.add_argument("--no-lag", action="store_true", help="do not ask the Kafka broker for watermarks")
    parser.set_defaults(func=func)


def func(args: argparse.Namespace) -> int:
    from lakestream.health.exporter import MetricsExporter
    from lakestream.health.monitor import collect_health, monitor
    from lakestream.health.report import render_json, render_table
    from lakestream.health.webhook import AlertNotifier
    from lakestream.runtime.spark import session_for

    config = load_config(args.pipeline)
    spark = session_for(config)
    notifier = None
    if config.health.webhook_url:
        notifier = AlertNotifier(config.health.webhook_url, Path(config.state_dir) / "health-alerts.json")
    port = args.serve_metrics
    if port == -1:
        port = config.health.metrics_port
        if port is None:
            raise ConfigError("--serve-metrics needs a PORT, or set health.metrics_port in the pipeline config")
    if port is not None:
        exporter = MetricsExporter(port).start()
        try:
            monitor(spark, config, exporter=exporter, notifier=notifier, interval_s=args.interval, tables=args.table)
        finally:
            exporter.stop()
        return 0
    report = collect_health(spark, config, args.table, measure_lag=not args.no_lag)
    if notifier is not None:
        notifier.notify(report.alerts)
    if args.json:
        render_json(report, sys.stdout)
    else:
        render_table(report)
    return 1 if args.check and not report.healthy else 0
