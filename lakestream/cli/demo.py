"""`lakestream demo`: the end-to-end demo — a shop database streamed into Iceberg, then verified."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lakestream.demo.runner import DemoSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = DemoSettings()
    parser = subparsers.add_parser(
        "demo",
        help="run the end-to-end demo: stack, shop database, capture, pipeline, workload, verify, report",
        description="Exit status 0 only if the lake matches the source (verify) at the end.",
    )
    parser.add_argument(
        "--duration", type=float, default=defaults.duration_s, help="workload seconds (default: %(default)s)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=defaults.changes_per_s,
        help="target row changes per second (default: %(default)s)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=defaults.state_dir, help="stack and pipeline state (default: %(default)s)"
    )
    parser.add_argument("--pg-port", type=int, default=defaults.pg_port, help="PostgreSQL port (default: %(default)s)")
    parser.add_argument(
        "--kafka-port", type=int, default=defaults.kafka_port, help="broker port (default: %(default)s)"
    )
    parser.add_argument(
        "--storage",
        choices=["local", "s3"],
        default=defaults.storage,
        help="where the warehouse lives: a local directory, or a bucket of a local S3-compatible "
        "store (Versity's S3 gateway, built by make setup) (default: %(default)s; the shop pattern)",
    )
    parser.add_argument(
        "--catalog",
        choices=["jdbc", "rest"],
        default=defaults.catalog,
        help="the Iceberg catalog: JDBC in PostgreSQL, or a local Iceberg REST catalog over it "
        "(default: %(default)s; the shop pattern)",
    )
    parser.add_argument(
        "--source",
        choices=["postgresql", "mariadb"],
        default=defaults.source,
        help="the shop database: in the stack's PostgreSQL, or in a private MariaDB beside it "
        "(default: %(default)s; the shop pattern)",
    )
    parser.add_argument(
        "--mariadb-port",
        type=int,
        default=defaults.mariadb_port,
        help="MariaDB port, with --source mariadb (default: %(default)s)",
    )
    parser.add_argument(
        "--catchup-timeout",
        type=float,
        default=defaults.catchup_timeout_s,
        help="seconds to wait for the lake to match after the workload (default: %(default)s)",
    )
    parser.add_argument(
        "--pattern",
        choices=["shop", "fraud", "iot", "customer360"],
        default="shop",
        help="shop: the CDC mirror demo; fraud: transactions → rules → alerts; iot: sensor readings → windows; "
        "customer360: users, subscriptions, usage → customer_360 (default: %(default)s)",
    )
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from lakestream.demo.runner import run_demo

    if args.pattern != "shop" and (args.storage != "local" or args.catalog != "jdbc" or args.source != "postgresql"):
        print(
            f"--storage s3, --catalog rest and --source mariadb run the shop pattern only, not {args.pattern!r}",
            file=sys.stderr,
        )
        return 2
    if args.pattern == "fraud":
        from lakestream.demo.fraud import FraudSettings, run_fraud_demo

        duration = args.duration if args.duration != DemoSettings().duration_s else FraudSettings().duration_s
        rate = args.rate if args.rate != DemoSettings().changes_per_s else FraudSettings().per_s
        fraud = FraudSettings(
            state_dir=args.state_dir,
            pg_port=args.pg_port,
            kafka_port=args.kafka_port,
            duration_s=duration,
            per_s=rate,
            catchup_timeout_s=args.catchup_timeout,
        )
        return 0 if run_fraud_demo(fraud).ok else 1
    if args.pattern == "customer360":
        from lakestream.demo.customer360 import Customer360Settings, run_customer360_demo

        duration = args.duration if args.duration != DemoSettings().duration_s else Customer360Settings().duration_s
        rate = args.rate if args.rate != DemoSettings().changes_per_s else Customer360Settings().per_s
        c360 = Customer360Settings(
            state_dir=args.state_dir,
            pg_port=args.pg_port,
            kafka_port=args.kafka_port,
            duration_s=duration,
            per_s=rate,
            catchup_timeout_s=args.catchup_timeout,
        )
        return 0 if run_customer360_demo(c360).ok else 1
    if args.pattern == "iot":
        from lakestream.demo.iot import IotSettings, run_iot_demo

        run_iot_demo(IotSettings(state_dir=args.state_dir, pg_port=args.pg_port, kafka_port=args.kafka_port))
        return 0

    settings = DemoSettings(
        state_dir=args.state_dir,
        pg_port=args.pg_port,
        kafka_port=args.kafka_port,
        storage=args.storage,
        catalog=args.catalog,
        source=args.source,
        mariadb_port=args.mariadb_port,
        duration_s=args.duration,
        changes_per_s=args.rate,
        catchup_timeout_s=args.catchup_timeout,
    )
    return 0 if run_demo(settings).ok else 1
