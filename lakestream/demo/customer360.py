"""`lakestream demo --pattern customer360`: users, subscriptions and usage events in PostgreSQL →
Debezium → mirrors → the derived table `customer_360`, kept current by key.

The processing part of the config is `examples/customer360/pipeline.yaml`; this module adds the local
stack's connection settings, runs capture and `lakestream run` as child processes, drives the
subscriptions workload, waits until the mirrors equal the source tables and `customer_360` reflects
them, and prints the top customers. Progress goes to stderr; the report (a table) to stdout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2
import yaml

from lakestream.capture.process import CaptureProcess
from lakestream.config import PipelineConfig, parse_config
from lakestream.demo.fraud import drop_namespace_tables, reset_database
from lakestream.demo.runner import PipelineProcess, Step, example_stack, wait_for_first_commit, write_private_yaml
from lakestream.demo.subscriptions import SubscriptionStats, SubscriptionsWorkload
from lakestream.errors import LakestreamError
from lakestream.identifiers import quote_table
from lakestream.sink.commit.offsets import TableOffsets
from lakestream.source.kafka import TP, KafkaCluster
from lakestream.stack import StackInfo, StackSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "customer360" / "pipeline.yaml"
EXAMPLE_NAMESPACE = "customer360"  # the namespace examples/customer360/pipeline.yaml is written for
SOURCE_TABLES = ["public.plans", "public.users", "public.subscriptions", "public.usage_events"]


@dataclass
class Customer360Settings:
    state_dir: Path = Path(".lakestream")
    pg_port: int = StackSettings.pg_port
    kafka_port: int = StackSettings.kafka_port
    duration_s: float = 30.0
    per_s: float = 10.0
    seed: int | None = None
    catchup_timeout_s: float = 180.0
    top: int = 15
    dbname: str = "customer360"
    namespace: str = EXAMPLE_NAMESPACE
    example: Path = EXAMPLE


@dataclass
class Customer360Result:
    ok: bool
    config: PipelineConfig
    stats: SubscriptionStats
    customers: list[dict[str, Any]] = field(default_factory=list)  # customer_360 at the end
    pipeline_log: Path | None = None


def customer360_config_data(settings: Customer360Settings, info: StackInfo, prefix: str) -> dict[str, Any]:
    """The example's processing config, moved to ``settings.namespace``, plus this stack's connection settings."""
    try:
        text = settings.example.read_text()
    except OSError as exc:
        raise LakestreamError(
            f"cannot read the Customer 360 example config {settings.example}: {exc.strerror} — "
            f"fix: run from a checkout of the repository (examples/customer360/pipeline.yaml)"
        ) from None
    data = yaml.safe_load(text)
    ns = settings.namespace

    def moved(table: str) -> str:
        return f"{ns}.{table.split('.', 1)[1]}"

    for stream in data["streams"]:
        stream["topic_pattern"] = stream["topic_pattern"].replace("{prefix}", prefix)
        stream["namespace"] = ns
    for derived in data.get("derived_tables", []):
        derived["table"] = moved(derived["table"])
        for source in derived["inputs"]:
            source["table"] = moved(source["table"])
        # the catalog table is named in the SQL itself (it is not an input)
        derived["sql"] = derived["sql"].replace(f"lake.{EXAMPLE_NAMESPACE}.", f"lake.{ns}.")
    data["name"] = f"{data.get('name', 'customer360')}_{prefix}"
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
        "tables": SOURCE_TABLES,
        "topic_prefix": prefix,
        "slot_name": f"slot_{prefix}",
        "publication_name": f"pub_{prefix}",
        "connector": {"heartbeat.interval.ms": "1000"},
    }
    return data


def run_customer360_demo(
    settings: Customer360Settings, info: StackInfo | None = None, spark: SparkSession | None = None
) -> Customer360Result:
    """Run the example end to end and print its report; ``info``/``spark`` reuse a running stack/session."""
    with contextlib.redirect_stdout(sys.stderr):  # progress on stderr: stdout is the report
        result = _run(settings, info, spark)
    _print_report(result, settings.top)
    return result


def _run(settings: Customer360Settings, info: StackInfo | None, spark: SparkSession | None) -> Customer360Result:
    step = Step(total=7)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    state_dir = Path(settings.state_dir).expanduser().resolve()
    info = example_stack(settings, state_dir, info, step)
    prefix = f"c360{int(time.time() * 1000) % 10**10}"
    work = state_dir / prefix
    work.mkdir(parents=True, exist_ok=True)
    data = customer360_config_data(settings, info, prefix)
    config = parse_config(data, str(settings.example))
    yaml_path = work / "pipeline.yaml"
    write_private_yaml(yaml_path, data)

    step(f"resetting database {settings.dbname} and the lake namespace {settings.namespace}")
    reset_database(info, settings.dbname)
    own_spark = spark is None
    if spark is None:
        from lakestream.runtime.spark import session_for

        spark = session_for(config)
    catalog = config.catalog.name
    try:
        drop_namespace_tables(spark, catalog, settings.namespace)
        conn = psycopg2.connect(info.pg_dsn(settings.dbname))
        workload = SubscriptionsWorkload(conn, seed=settings.seed)
        workload.create_schema()  # the plan catalog is in the initial snapshot
        step(f"starting Debezium capture and the pipeline ({yaml_path})")
        capture = CaptureProcess(yaml_path, log_path=work / "capture.log")
        pipeline = PipelineProcess(yaml_path, work / "pipeline.log")
        capture.start()
        pipeline.start()
        try:
            capture.wait_until_streaming(timeout=300)
            ready = wait_for_first_commit(config, pipeline, timeout=300)
            # customer_360's SQL reads the catalog mirror: it must exist before the inputs do.
            _wait_for(
                lambda: spark.catalog.tableExists(f"{catalog}.{settings.namespace}.plans"),
                pipeline,
                settings.catchup_timeout_s,
                f"the catalog mirror {settings.namespace}.plans",
            )
            step.info(f"pipeline committed its first batch (the plan catalog) after {ready:.1f}s")
            step(f"running the subscriptions workload for {settings.duration_s:.0f}s (~{settings.per_s:.0f} changes/s)")

            def progress(s: SubscriptionStats, t: float) -> None:
                pipeline.check()
                step.info(f"{t:4.0f}s  {s.changes} changes, {len(workload.users)} customers")

            stats = workload.run(settings.duration_s, settings.per_s, on_progress=progress)
            step.info(
                f"{stats.changes} changes: {stats.signups} sign-ups, {stats.users_deleted} customers gone, "
                f"{stats.plan_changes} plan changes, {stats.transfers} transfers, {stats.cancellations} "
                f"cancellations, {stats.usage_events} usage events"
            )
            step("waiting until the mirrors equal the source tables and customer_360 reflects them")
            waited = _wait_until_current(spark, config, pipeline, settings.catchup_timeout_s)
            step.info(f"caught up {waited:.1f}s after the workload")
        finally:
            step("stopping capture and the pipeline")
            pipeline.stop()
            capture.stop()
        conn.close()
        derived = config.derived_tables[0]
        ns, tbl = derived.table.split(".")
        customers = [
            r.asDict()
            for r in spark.sql(
                f"SELECT * FROM {quote_table(catalog, ns, tbl)} ORDER BY mrr DESC, usage_units DESC, customer_id"
            ).collect()
        ]
    finally:
        if own_spark:
            spark.stop()
    step("report")
    return Customer360Result(True, config, stats, customers, pipeline.log_path)


def _wait_for(condition, pipeline: PipelineProcess, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        pipeline.check()
        if time.monotonic() > deadline:
            raise LakestreamError(f"no {what} after {timeout:.0f}s; see {pipeline.log_path}")
        time.sleep(0.5)


def _wait_until_current(
    spark: SparkSession, config: PipelineConfig, pipeline: PipelineProcess, timeout: float
) -> float:
    """Seconds until every mirror equals its source table and customer_360's snapshot records offsets at
    or past each input's (it is a function of the inputs' state as of those offsets)."""
    from lakestream.verify.compare import verify_tables

    started = time.monotonic()
    catalog = config.catalog.name
    derived = config.derived_tables[0]
    target = quote_table(catalog, *derived.table.split("."))
    inputs = [quote_table(catalog, *i.table.split(".")) for i in derived.inputs]
    tables = [f"{catalog}.{t}" for t in [derived.table, *(i.table for i in derived.inputs)]]
    offsets = TableOffsets(spark)
    kafka = KafkaCluster(config.kafka)
    last_verify = time.monotonic()

    def inputs_offsets() -> dict[str, dict[TP, int]]:
        return {ident: offsets.load(ident, refresh=True) for ident in inputs}

    try:
        while time.monotonic() - started < timeout:
            pipeline.check()
            time.sleep(1)
            if not all(spark.catalog.tableExists(t) for t in tables):
                continue
            # Cheap checks first (snapshot metadata, watermarks): verify is a Spark job competing with the pipeline.
            seen = inputs_offsets()
            consumed = {tp: off for per_input in seen.values() for tp, off in per_input.items()}
            mine = offsets.load(target, refresh=True)
            if any(mine.get(tp, -1) < off for tp, off in consumed.items()):
                continue  # customer_360 does not reflect the mirrors yet
            # Verify once the mirrors consumed their topics to the end, or every 10 s (a broker may under-report
            # its high watermarks); done if the mirrors did not move meanwhile.
            highs = kafka.watermarks(list(consumed))
            at_end = all(off >= highs[tp][1] for tp, off in consumed.items())
            if not at_end and time.monotonic() - last_verify < 10:
                continue
            last_verify = time.monotonic()
            if verify_tables(config, spark).ok and inputs_offsets() == seen:
                return time.monotonic() - started
    finally:
        kafka.close()
    raise LakestreamError(
        f"{derived.table} did not catch up with the source tables within {timeout:.0f}s; see {pipeline.log_path}"
    )


def _print_report(result: Customer360Result, top: int) -> None:
    customers = result.customers
    table = result.config.derived_tables[0].table
    paying = [c for c in customers if c["active_subscriptions"]]
    mrr = sum(c["mrr"] for c in customers)
    print(f"\n{table}: {len(customers)} customers, {len(paying)} paying, MRR {mrr:,.2f}")
    by_tier: dict[str, int] = {}
    for c in customers:
        by_tier[c["top_tier"]] = by_tier.get(c["top_tier"], 0) + 1
    print("customers by top tier: " + ", ".join(f"{k} {v}" for k, v in sorted(by_tier.items())))
    print(f"\ntop {min(len(customers), top)} customers by MRR:")
    print(
        f"{'customer':>8}  {'name':<14}{'country':<8}{'subs':>5}{'MRR':>9}  {'tier':<11}{'events':>7}{'units':>7}"
        f"  {'last active (UTC)':<20}plans"
    )
    for c in customers[:top]:
        last = f"{c['last_active_at']:%Y-%m-%d %H:%M:%S}" if c["last_active_at"] else "-"
        print(
            f"{c['customer_id']:>8}  {c['name'][:13]:<14}{c['country']:<8}{c['active_subscriptions']:>5}"
            f"{c['mrr']:>9.2f}  {c['top_tier']:<11}{c['usage_events']:>7}{c['usage_units']:>7}  {last:<20}"
            f"{c['plans']}"
        )
