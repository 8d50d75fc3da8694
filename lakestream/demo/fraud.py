"""`lakestream demo --pattern fraud`: transactions in PostgreSQL → Debezium → rules → alerts.

The processing part of the config is `examples/fraud/pipeline.yaml`; this module adds the local
stack's connection settings, runs capture and `lakestream run` as child processes, drives the
transactions workload, waits until the history table holds every transaction, and prints the alerts
with their rule and their latency from the PostgreSQL commit to the alert.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg2
import yaml
from psycopg2 import sql as pgsql

from lakestream.capture.process import CaptureProcess
from lakestream.config import PipelineConfig, parse_config
from lakestream.demo.runner import PipelineProcess, Step, example_stack, wait_for_first_commit, write_private_yaml
from lakestream.demo.transactions import TransactionStats, TransactionsWorkload
from lakestream.errors import LakestreamError
from lakestream.identifiers import quote, quote_table
from lakestream.stack import StackInfo, StackSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fraud" / "pipeline.yaml"


@dataclass
class FraudSettings:
    state_dir: Path = Path(".lakestream")
    pg_port: int = StackSettings.pg_port
    kafka_port: int = StackSettings.kafka_port
    duration_s: float = 30.0
    per_s: float = 8.0
    accounts: int = 60
    seed: int | None = None
    catchup_timeout_s: float = 180.0
    dbname: str = "fraud"
    namespace: str = "fraud"
    alerts_topic: str = "fraud_alerts"
    example: Path = EXAMPLE


@dataclass
class FraudResult:
    ok: bool
    config: PipelineConfig
    transactions: list[dict[str, Any]] = field(default_factory=list)  # the source table at the end
    alerts: list[dict[str, Any]] = field(default_factory=list)  # the alerts table at the end
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max


def fraud_config_data(settings: FraudSettings, info: StackInfo, prefix: str) -> dict[str, Any]:
    """The example's processing config plus this stack's connection settings."""
    try:
        data = yaml.safe_load(settings.example.read_text())
    except OSError as exc:
        raise LakestreamError(
            f"cannot read the fraud example config {settings.example}: {exc.strerror} — fix: run "
            f"from a checkout of the repository (examples/fraud/pipeline.yaml)"
        ) from None
    ns = settings.namespace
    for stream in data["streams"]:
        stream["topic_pattern"] = stream["topic_pattern"].replace("{prefix}", prefix)
        stream["namespace"] = ns
    for rules in data.get("rules", []):
        rules["source"] = f"{ns}.{rules['source'].split('.', 1)[1]}"
        rules["alerts_table"] = f"{ns}.{rules['alerts_table'].split('.', 1)[1]}"
        rules["alerts_topic"] = settings.alerts_topic
    data["name"] = f"{data.get('name', 'fraud')}_{prefix}"
    data["state_dir"] = str(Path(settings.state_dir).resolve())
    data["kafka"] = {"bootstrap_servers": info.bootstrap_servers, "group_id": f"lakestream-{prefix}"}
    data["catalog"] = {
        "name": "lake",
        "type": "jdbc",
        "uri": info.catalog_jdbc_uri(),
        "user": info.pg_user,
        "password": info.pg_password,
        "warehouse": info.warehouse,
    }
    data["capture"] = {
        "database": {
            "host": info.pg_host,
            "port": info.pg_port,
            "dbname": settings.dbname,
            "user": info.pg_user,
            "password": info.pg_password,
        },
        "tables": ["public.transactions"],
        "topic_prefix": prefix,
        "slot_name": f"slot_{prefix}",
        "publication_name": f"pub_{prefix}",
        "connector": {"heartbeat.interval.ms": "1000"},
    }
    return data


def reset_database(info: StackInfo, dbname: str) -> None:
    """Drop the example's database (and any replication slot on it), create it empty."""
    conn = psycopg2.connect(info.pg_dsn())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s "
                "AND active_pid IS NOT NULL",
                (dbname,),
            )
            time.sleep(0.5)
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (dbname,)
            )
            cur.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(dbname)))
            cur.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(dbname)))
    finally:
        conn.close()


def drop_namespace_tables(spark: SparkSession, catalog: str, namespace: str) -> None:
    if spark.sql(f"SHOW NAMESPACES IN {quote(catalog)}").where(f"namespace = '{namespace}'").count():
        for row in spark.sql(f"SHOW TABLES IN {quote(catalog)}.{quote(namespace)}").collect():
            spark.sql(f"DROP TABLE IF EXISTS {quote_table(catalog, namespace, row['tableName'])} PURGE")


def _table_count(spark: SparkSession, config: PipelineConfig, table: str) -> int:
    ns, tbl = table.split(".")
    if not spark.catalog.tableExists(f"{config.catalog.name}.{ns}.{tbl}"):
        return 0
    return spark.sql(f"SELECT count(*) FROM {quote_table(config.catalog.name, ns, tbl)}").collect()[0][0]


def run_fraud_demo(
    settings: FraudSettings, info: StackInfo | None = None, spark: SparkSession | None = None
) -> FraudResult:
    """Run the example end to end and print its report; ``info``/``spark`` reuse a running stack/session."""
    step = Step(total=7)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    state_dir = Path(settings.state_dir).expanduser().resolve()
    info = example_stack(settings, state_dir, info, step)
    prefix = f"fraud{int(time.time() * 1000) % 10**10}"
    work = state_dir / prefix
    work.mkdir(parents=True, exist_ok=True)
    data = fraud_config_data(settings, info, prefix)
    config = parse_config(data, str(settings.example))
    yaml_path = work / "pipeline.yaml"
    write_private_yaml(yaml_path, data)

    step(f"resetting database {settings.dbname} and the lake namespace {settings.namespace}")
    reset_database(info, settings.dbname)
    own_spark = spark is None
    if spark is None:
        from lakestream.runtime.spark import session_for

        spark = session_for(config)
    try:
        drop_namespace_tables(spark, config.catalog.name, settings.namespace)
        conn = psycopg2.connect(info.pg_dsn(settings.dbname))
        workload = TransactionsWorkload(conn, accounts=settings.accounts, seed=settings.seed)
        workload.create_schema()
        step(f"starting Debezium capture and the pipeline ({yaml_path})")
        capture = CaptureProcess(yaml_path, log_path=work / "capture.log")
        pipeline = PipelineProcess(yaml_path, work / "pipeline.log")
        capture.start()
        pipeline.start()
        try:
            capture.wait_until_streaming(timeout=300)
            workload.pay(1, 1.0)  # warms the pipeline up: latency is measured on a running pipeline
            ready = wait_for_first_commit(config, pipeline, timeout=300)
            step.info(f"pipeline committed its first batch after {ready:.1f}s")
            step(f"running the transactions workload for {settings.duration_s:.0f}s (~{settings.per_s:.0f}/s)")

            def progress(s: TransactionStats, t: float) -> None:
                pipeline.check()
                step.info(f"{t:4.0f}s  {s.transactions} transactions ({s.injected} in patterns)")

            stats = workload.run(settings.duration_s, settings.per_s, on_progress=progress)
            step.info(f"{stats.transactions} transactions, {stats.injected} in injected patterns")
            step("waiting until the history table holds every transaction")
            history = f"{settings.namespace}.tx_history"
            deadline = time.monotonic() + settings.catchup_timeout_s
            while (have := _table_count(spark, config, history)) < stats.transactions:
                pipeline.check()
                if time.monotonic() > deadline:
                    raise LakestreamError(
                        f"{history} holds {have} of {stats.transactions} transactions after "
                        f"{settings.catchup_timeout_s:.0f}s; see {pipeline.log_path}"
                    )
                time.sleep(1)
        finally:
            step("stopping capture and the pipeline")
            pipeline.stop()
            capture.stop()
        with conn.cursor() as cur:
            cur.execute("SELECT id, account_id, amount, country, created_at FROM public.transactions ORDER BY id")
            names = [d[0] for d in cur.description]
            transactions = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        conn.close()
        alerts_table = next(r.alerts_table for r in config.rules)
        ns, tbl = alerts_table.split(".")
        alerts = [
            r.asDict()
            for r in spark.sql(
                f"SELECT * FROM {quote_table(config.catalog.name, ns, tbl)} ORDER BY event_time, check_name"
            ).collect()
        ]
    finally:
        if own_spark:
            spark.stop()
    step("report")
    latency = _print_report(alerts, len(transactions))
    return FraudResult(True, config, transactions, alerts, latency)


def _print_report(alerts: list[dict[str, Any]], transactions: int) -> dict[str, float]:
    by_check: dict[str, int] = {}
    for a in alerts:
        by_check[a["check_name"]] = by_check.get(a["check_name"], 0) + 1
    print(
        f"\n{len(alerts)} alert(s) over {transactions} transactions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_check.items()))
    )
    print(f"\n{'alert id':<26}{'rule':<16}{'account':>8}  {'tx':>6}  {'latency':>9}  detail")
    for a in alerts[-15:]:
        latency = "-" if a["latency_ms"] is None else f"{a['latency_ms'] / 1000:.2f}s"
        print(
            f"{a['alert_id']:<26}{a['rule_set'] + '.' + a['check_name']:<16}{a['key']:>8}  {a['event_id']:>6}  "
            f"{latency:>9}  {a['detail']}"
        )
    values = np.array([a["latency_ms"] for a in alerts if a["latency_ms"] is not None], dtype=float)
    if not len(values):
        return {}
    out = {"p50": float(np.quantile(values, 0.5)), "p99": float(np.quantile(values, 0.99)), "max": float(values.max())}
    print(
        f"\nevent → alert latency (PostgreSQL commit → alert produced): p50 {out['p50'] / 1000:.2f}s, "
        f"p99 {out['p99'] / 1000:.2f}s, max {out['max'] / 1000:.2f}s over {len(values)} alerts"
    )
    return out
