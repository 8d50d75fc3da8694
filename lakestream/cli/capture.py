"""`lakestream capture PIPELINE_YAML`: run Debezium capture into Kafka until stopped."""

from __future__ import annotations

import argparse
import json
import sys

from lakestream.config import load_config
from lakestream.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "capture",
        help="capture PostgreSQL or MariaDB changes into Kafka with Debezium (runs until Ctrl-C / SIGTERM)",
    )
    parser.add_argument("pipeline_yaml", help="pipeline config with a `capture:` section")
    parser.add_argument(
        "--print-connector-config",
        action="store_true",
        help="run capture's start check (PostgreSQL: prepare and check the publication; MariaDB: binlog settings, "
        "grants, tables), then print the equivalent Kafka Connect connector JSON (password as a placeholder) "
        "and exit",
    )
    parser.add_argument(
        "--connect-secrets-file",
        metavar="PATH",
        default=None,
        help="with --print-connector-config: the properties file on the Connect workers that holds the secrets "
        "(database.password, schema.registry.user.info; with capture.avro_converter apicurio "
        "schema.registry.username and schema.registry.password), read by their FileConfigProvider "
        "(default: /opt/kafka/secrets/lakestream.properties)",
    )
    parser.add_argument(
        "--skip-publication-check",
        action="store_true",
        help="with --print-connector-config: do not connect to the source database (Debezium's filtered mode then "
        "creates the publication, and nothing checks that every table publishes its changes)",
    )
    parser.set_defaults(func=_capture)


def _capture(args: argparse.Namespace) -> int:
    config = load_config(args.pipeline_yaml)
    if config.capture is None:
        raise ConfigError(
            f"{args.pipeline_yaml} has no `capture:` section — fix: add capture.database and capture.tables"
        )
    if args.print_connector_config:
        from lakestream.capture.connector import (
            DEFAULT_SECRETS_FILE,
            connect_json,
            password_note,
            prepared_connect_json,
        )

        secrets_file = args.connect_secrets_file or DEFAULT_SECRETS_FILE
        if not secrets_file.startswith("/"):
            raise ConfigError(
                f"--connect-secrets-file {secrets_file!r} is not an absolute path — fix: give the "
                "file's absolute path on the Connect workers"
            )
        if args.skip_publication_check:
            doc = connect_json(config.capture, secrets_file=secrets_file, kafka=config.kafka)
            print(
                "note: the publication was not checked: Debezium's filtered mode creates it unquoted (tables "
                "whose names need quotes fail) and nothing checks that a partitioned table publishes under its "
                "own name",
                file=sys.stderr,
            )
        else:
            doc = prepared_connect_json(config.capture, secrets_file=secrets_file, kafka=config.kafka)
        print(json.dumps(doc, indent=2))
        print(f"note: {password_note(secrets_file)}", file=sys.stderr)
        if config.capture.snapshot == "parallel":
            _print_handover_note(config)
        return 0
    from lakestream.capture.runner import run_capture

    if config.capture.snapshot == "parallel":
        _snapshot_first(args.pipeline_yaml, config)
    run_capture(config)
    return 0


def _snapshot_first(pipeline_yaml: str, config) -> None:
    """Run `lakestream snapshot` (its own process: Spark's JVM) unless it already finished."""
    import subprocess

    from lakestream.capture.handover import read_handover
    from lakestream.capture.process import LAKESTREAM_COMMAND
    from lakestream.errors import CaptureError

    if read_handover(config.state_dir, config.capture) is not None:
        return
    code = subprocess.run(
        [*LAKESTREAM_COMMAND, "snapshot", pipeline_yaml], stdin=subprocess.DEVNULL, stdout=sys.stderr
    ).returncode
    if code != 0:
        raise CaptureError(
            f"the parallel snapshot failed (exit code {code}); run `lakestream snapshot "
            f"{pipeline_yaml}` again to resume it"
        )


def _print_handover_note(config) -> None:
    from lakestream.capture.connector import connect_offsets_json
    from lakestream.capture.handover import read_handover

    handover = read_handover(config.state_dir, config.capture)
    name = f"{config.capture.topic_prefix}-postgres"
    if handover is None:
        print(
            "note: capture.snapshot is parallel: run `lakestream snapshot` first; it prints the offsets to set",
            file=sys.stderr,
        )
        return
    body = json.dumps(connect_offsets_json(config.capture, int(handover["lsn"])))
    print(
        f"note: the connector is created STOPPED; set its start to the snapshot's handover point, then resume it:\n"
        f"  curl -X PATCH -H 'Content-Type: application/json' <connect>/connectors/{name}/offsets -d '{body}'\n"
        f"  curl -X PUT <connect>/connectors/{name}/resume",
        file=sys.stderr,
    )
