"""`lakestream run PIPELINE_YAML`: the streaming job."""

from __future__ import annotations

import argparse
import faulthandler
import signal
import threading

from lakestream.config import load_config
from lakestream.engine.loop import run_pipeline
from lakestream.signals import install_stop_signals


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("run", help="run the micro-batch pipeline (Kafka → Iceberg)")
    parser.add_argument("config", help="pipeline YAML file")
    parser.add_argument("--max-batches", type=int, default=None, help="stop after N non-empty batches")
    parser.add_argument("--until-idle", action="store_true", help="stop when a batch finds nothing new")
    parser.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve the engine's Prometheus /metrics on PORT (default: engine.metrics_port; off)",
    )
    parser.set_defaults(func=_run)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535; 0 = any free port)")
    return int(text)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.metrics_port is not None:
        config.engine.metrics_port = args.metrics_port
    stop = threading.Event()
    install_stop_signals(stop)
    # `kill -USR1 <pid>` prints every thread's Python stack to stderr: where a stuck pipeline waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    run_pipeline(config, stop=stop, max_batches=args.max_batches, stop_when_idle=args.until_idle)
    return 0
