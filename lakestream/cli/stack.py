"""`lakestream stack up|down|status`: the local PostgreSQL + Apache Kafka (and MariaDB with ``--source mariadb``, Trino
with ``--trino``), as a thin shell over `lakestream.stack`."""

from __future__ import annotations

import argparse
from dataclasses import Field
from pathlib import Path
from typing import Any

from lakestream.stack import Stack, StackSettings


def register(subparsers) -> None:
    """The `stack` subcommand and its options (in the order `--help` lists them)."""
    parser = subparsers.add_parser("stack", help="start, stop or inspect the local PostgreSQL + Apache Kafka")
    parser.add_argument("action", choices=["up", "down", "status"])
    defaults = StackSettings.__dataclass_fields__
    _add_core_options(parser, defaults)
    _add_warehouse_options(parser, defaults)
    _add_service_options(parser, defaults)
    parser.set_defaults(func=func)


def _add_core_options(parser: argparse.ArgumentParser, defaults: dict[str, Field[Any]]) -> None:
    """Where the stack keeps its state, and the ports of PostgreSQL and the broker."""
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=defaults["state_dir"].default,
        help="where data, logs and pid files live (default: .lakestream)",
    )
    parser.add_argument(
        "--pg-port",
        type=int,
        default=defaults["pg_port"].default,
        help="PostgreSQL port on 127.0.0.1 (default: %(default)s)",
    )
    parser.add_argument(
        "--kafka-port",
        type=int,
        default=defaults["kafka_port"].default,
        help="broker port on 127.0.0.1 (default: %(default)s)",
    )


def _add_warehouse_options(parser: argparse.ArgumentParser, defaults: dict[str, Field[Any]]) -> None:
    """Where the tables' files live and which Iceberg catalog names them."""
    parser.add_argument(
        "--storage",
        choices=["local", "s3"],
        default=defaults["storage"].default,
        help="the warehouse: a directory under the state dir, or a bucket of a local S3-compatible "
        "store (Versity's S3 gateway, objects on disk) (default: %(default)s)",
    )
    parser.add_argument(
        "--s3-port",
        type=int,
        default=defaults["s3_port"].default,
        help="object store port on 127.0.0.1 (default: %(default)s)",
    )
    parser.add_argument(
        "--catalog",
        choices=["jdbc", "rest"],
        default=defaults["catalog"].default,
        help="the Iceberg catalog: JDBC in PostgreSQL, or a local REST catalog server over it (default: %(default)s)",
    )
    parser.add_argument(
        "--rest-port",
        type=int,
        default=defaults["rest_port"].default,
        help="REST catalog port on 127.0.0.1 (default: %(default)s)",
    )
    parser.add_argument(
        "--rest-server",
        choices=["iceberg", "lakestream"],
        default=defaults["rest_server"].default,
        help="with --catalog rest: Apache Iceberg's own REST catalog server (RESTCatalogServer: http, "
        "OAuth2 secrets not checked) or the one written here (https, a checked OAuth2 secret, "
        "loopback only) (default: %(default)s)",
    )


def _add_service_options(parser: argparse.ArgumentParser, defaults: dict[str, Field[Any]]) -> None:
    """The services the stack runs only when asked: Kafka Connect, MariaDB, a Schema Registry and Trino."""
    parser.add_argument(
        "--connect",
        action="store_true",
        help="also run a Kafka Connect worker (distributed mode, Debezium's PostgreSQL connector "
        "installed) on the broker, for `lakestream capture --print-connector-config`",
    )
    parser.add_argument(
        "--source",
        choices=["postgresql", "mariadb"],
        default=defaults["source"].default,
        help="the source database: the stack's PostgreSQL, or a private MariaDB server beside it "
        "(binlog on: ROW, FULL row images, GTIDs) (default: %(default)s)",
    )
    parser.add_argument(
        "--mariadb-port",
        type=int,
        default=defaults["mariadb_port"].default,
        help="MariaDB port on 127.0.0.1, with --source mariadb (default: %(default)s)",
    )
    parser.add_argument(
        "--registry",
        action="store_true",
        help="also run a Schema Registry (Apicurio Registry, in memory; Confluent's API at /apis/ccompat/v7) "
        "for `capture.format: avro`",
    )
    parser.add_argument(
        "--registry-port",
        type=int,
        default=defaults["registry_port"].default,
        help="Schema Registry port on 127.0.0.1, with --registry (default: %(default)s)",
    )
    parser.add_argument(
        "--connect-port",
        type=int,
        default=defaults["connect_port"].default,
        help="Kafka Connect REST API port on 127.0.0.1 (default: %(default)s)",
    )
    parser.add_argument(
        "--trino",
        action="store_true",
        help="also run a Trino node (assembled from Trino's Maven modules, on a Java 25 runtime) whose Iceberg "
        "catalog `lake` reads the stack's tables, for `lakestream sql --engine trino` and Trino's own clients",
    )
    parser.add_argument(
        "--trino-port",
        type=int,
        default=defaults["trino_port"].default,
        help="Trino's HTTP port on 127.0.0.1 (default: %(default)s)",
    )


def func(args: argparse.Namespace) -> int:
    stack = Stack(
        StackSettings(
            state_dir=args.state_dir,
            pg_port=args.pg_port,
            kafka_port=args.kafka_port,
            storage=args.storage,
            s3_port=args.s3_port,
            catalog=args.catalog,
            rest_port=args.rest_port,
            rest_server=args.rest_server,
            connect=args.connect,
            connect_port=args.connect_port,
            source=args.source,
            mariadb_port=args.mariadb_port,
            trino=args.trino,
            trino_port=args.trino_port,
            registry=args.registry,
            registry_port=args.registry_port,
        )
    )
    if args.action == "up":
        info = stack.up()
        dsn_without_password = f"host={info.pg_host} port={info.pg_port} dbname={info.source_db} user={info.pg_user}"
        print(f"bootstrap.servers  {info.bootstrap_servers}")
        if info.mariadb_port is not None:
            print(f"source db          mariadb://{info.pg_user}@{info.pg_host}:{info.mariadb_port}/{info.source_db}")
        else:
            print(f"source db          {dsn_without_password}")
        print(f"catalog            {info.rest_uri if info.catalog_type == 'rest' else info.catalog_jdbc_uri()}")
        print(f"warehouse          {info.warehouse}")
        if info.s3_endpoint:
            print(f"object store       {info.s3_endpoint} (region {info.s3_region}, path style)")
            # A pipeline config names these variables, never the values: the local store's development
            # key and secret are StackSettings.s3_access_key / s3_secret_key (docs/deploying.md, object storage).
            print(f"  credentials from {' and '.join(info.storage_env())}")
        if info.connect_url:
            print(
                f"kafka connect      {info.connect_url} (plugin: Debezium PostgreSQL; secrets via ${{file:PATH:KEY}})"
            )
        if info.trino_uri:
            print(f"trino              {info.trino_uri} (catalog {info.trino_catalog})")
        if info.schema_registry_url:
            print(f"schema registry    {info.schema_registry_url} (Apicurio Registry, in memory)")
        print(f"state dir          {stack.settings.state_dir}")
    elif args.action == "down":
        stack.down()
        print(f"stopped (data kept in {stack.settings.state_dir})")
    else:
        print_status_table(stack)
    return 0


def print_status_table(stack: Stack) -> None:
    header = ("SERVICE", "STATE", "PID", "PORT", "HEALTHY", "STORAGE")
    rows = [header]
    for status in stack.status().values():
        rows.append(
            (
                status.name,
                status.state,
                str(status.pid or "-"),
                str(status.port),
                "yes" if status.healthy else "no",
                status.detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        # widths covers every column but the last (not padded): zip stops before it.
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
