"""The end-to-end demo: stack → shop database → Debezium capture → pipeline → workload → report.

Re-runnable: every run first removes what the previous one left (replication slot, publication,
capture offsets, source tables, Iceberg tables, Kafka topics, metrics), so the result always
describes this run alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2
import yaml
from psycopg2 import sql as pgsql

from lakestream.capture.connector import offsets_file
from lakestream.capture.databases import capture_database
from lakestream.capture.process import LAKESTREAM_COMMAND, CaptureProcess
from lakestream.config import PipelineConfig, parse_config
from lakestream.demo import shop
from lakestream.engine.freshness import freshness_from_metrics
from lakestream.engine.loop import metrics_path
from lakestream.errors import LakestreamError
from lakestream.identifiers import quote, quote_table
from lakestream.read.inspection import count_table_files
from lakestream.routing import Router
from lakestream.stack import Stack, StackInfo, StackSettings
from lakestream.stack.models import CatalogKind, SourceKind, StorageKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.verify.compare import VerifyReport

PIPELINE_NAME = "demo"
NAMESPACE = "shop"
TOPIC_PREFIX = "shop"
SLOT = "lakestream_demo"
PUBLICATION = "lakestream_demo_pub"


@dataclass
class DemoSettings:
    """What `lakestream demo` runs: where, for how long, how hard."""

    state_dir: Path = Path(".lakestream")
    pg_port: int = StackSettings.pg_port
    kafka_port: int = StackSettings.kafka_port
    storage: StorageKind = "local"  # or "s3": the warehouse in a local S3-compatible store (versitygw)
    source: SourceKind = "postgresql"  # or "mariadb": the shop database in a private MariaDB beside the stack
    mariadb_port: int = StackSettings.mariadb_port
    catalog: CatalogKind = "jdbc"  # or "rest": a local Iceberg REST catalog over the JDBC catalog
    duration_s: float = 60.0
    changes_per_s: float = 400.0
    catchup_timeout_s: float = 180.0
    seed_customers: int = 200
    seed_orders: int = 400


@dataclass
class DemoResult:
    ok: bool
    seconds: float
    changes: int = 0
    verify: VerifyReport | None = None
    notes: list[str] = field(default_factory=list)


class Step:
    """Numbered progress lines: ``[3/9] starting Debezium capture …``."""

    def __init__(self, total: int):
        self.total, self.n, self.started = total, 0, time.monotonic()

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"[{self.n}/{self.total}] {text}", flush=True)

    def info(self, text: str) -> None:
        print(f"      {text}", flush=True)


def run_demo(settings: DemoSettings) -> DemoResult:
    """Run the whole demo; the result is ok only if verify passes."""
    started = time.monotonic()
    step = Step(total=9)
    state_dir = Path(settings.state_dir).expanduser().resolve()
    demo_dir = state_dir / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    # Spark warns on stderr that the hostname resolves to loopback unless told which address to use.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    info = _start_stack(settings, state_dir, step)
    sql = shop.DIALECTS[settings.source]
    # The config names the object store's credentials by environment variable; capture, the pipeline
    # and the reads in this process (and its children) find them there.
    os.environ.update(info.storage_env())

    prefix = _reset_previous_run(info, sql, step)
    config, yaml_path = _write_config(info, sql, state_dir, demo_dir, prefix)
    _remove_stale_state(config, state_dir)

    from lakestream.runtime.spark import session_for

    spark = session_for(config)
    try:
        _drop_lake_tables(spark, config)

        step(
            f"creating the shop database (customers, orders, order_items) with {settings.seed_customers} customers, "
            f"{settings.seed_orders} orders"
        )
        conn = _source_connection(info)
        try:
            workload = _seeded_workload(conn, sql, settings)
            step.info(f"pipeline config: {yaml_path}")
            report, stats, workload_started_ms = _run_live(settings, config, yaml_path, demo_dir, workload, spark, step)
        finally:
            conn.close()

        step("report")
        _print_report(spark, config, report, workload_started_ms)
    finally:
        spark.stop()
    seconds = time.monotonic() - started
    _print_summary(seconds, report, info, yaml_path, config)
    return DemoResult(ok=report.ok, seconds=seconds, changes=stats.changes, verify=report)


def _start_stack(settings: DemoSettings, state_dir: Path, step: Step) -> StackInfo:
    """The local stack the demo runs on (reused when it runs already), with the source and services asked for."""
    extras = "".join(
        [
            ", S3 object store" if settings.storage == "s3" else "",
            ", REST catalog" if settings.catalog == "rest" else "",
        ]
    )
    if settings.source == "mariadb":
        extras += f", MariaDB :{settings.mariadb_port}"
    step(
        f"starting the local stack (PostgreSQL :{settings.pg_port}, Apache Kafka :{settings.kafka_port}"
        f"{extras}) — reused if running"
    )
    return Stack(
        StackSettings(
            state_dir=state_dir,
            pg_port=settings.pg_port,
            kafka_port=settings.kafka_port,
            storage=settings.storage,
            catalog=settings.catalog,
            source=settings.source,
            mariadb_port=settings.mariadb_port,
        )
    ).up()


def _reset_previous_run(info: StackInfo, sql: shop.ShopSQL, step: Step) -> str:
    """Remove the previous run's replication state, source tables and topics; the topic prefix this run uses."""
    step("resetting the previous demo run (replication slot, publication, tables, topics, offsets)")
    _reset_source(info, sql)
    prefix = _reset_topics(info.bootstrap_servers, TOPIC_PREFIX)
    if prefix != TOPIC_PREFIX:
        step.info(f"the broker kept the old topics: this run uses topic prefix {prefix!r}")
    return prefix


def _write_config(
    info: StackInfo, sql: shop.ShopSQL, state_dir: Path, demo_dir: Path, prefix: str
) -> tuple[PipelineConfig, Path]:
    """This run's pipeline config, and the YAML file capture and the pipeline read it from."""
    # A fresh consumer group per run: the engine starts new partitions at the group's committed
    # offset, and the last run's offsets point past the start of the re-created topics.
    group = f"lakestream-demo-{int(time.time())}"
    config = _pipeline_config(info, state_dir, prefix, group, sql)
    yaml_path = demo_dir / "pipeline.yaml"
    _write_pipeline_yaml(yaml_path, info, state_dir, prefix, group, sql)
    return config, yaml_path


def _remove_stale_state(config: PipelineConfig, state_dir: Path) -> None:
    """Remove the capture offsets, metrics and source state files the previous run left."""
    captured = config.require_capture("the demo")
    for stale in (
        offsets_file(state_dir, captured),
        metrics_path(config),
        *capture_database(captured).state_files(captured, state_dir),
    ):
        stale.unlink(missing_ok=True)


def _seeded_workload(conn: Any, sql: shop.ShopSQL, settings: DemoSettings) -> shop.ShopWorkload:
    """The shop's tables created and seeded, and the workload that changes them (its counts from zero)."""
    shop.create_schema(conn, sql)
    workload = shop.ShopWorkload(conn, seed=None, sql=sql)
    workload.seed(settings.seed_customers, settings.seed_orders)
    workload.stats = shop.WorkloadStats()
    return workload


def _run_live(
    settings: DemoSettings,
    config: PipelineConfig,
    yaml_path: Path,
    demo_dir: Path,
    workload: shop.ShopWorkload,
    spark: SparkSession,
    step: Step,
) -> tuple[VerifyReport, shop.WorkloadStats, int]:
    """Capture and the pipeline running while the workload changes the shop, until verify finds the tables
    caught up (or gives up); both stopped at the end. Verify's report, the workload's counts and its start (ms)."""
    step("starting Debezium capture and the pipeline (`lakestream run`)")
    capture = CaptureProcess(yaml_path, log_path=demo_dir / "capture.log")
    pipeline = PipelineProcess(yaml_path, demo_dir / "pipeline.log")
    capture.start()
    pipeline.start()
    try:
        capture.wait_until_streaming(timeout=240)
        step.info(f"capture is streaming (logs: {capture.log_path}, {pipeline.log_path})")
        # Freshness is measured on the workload: start it once the pipeline is up (its Spark
        # session started, the snapshot committed), not while changes would wait for a JVM.
        ready_s = wait_for_first_commit(config, pipeline, timeout=300)
        step.info(f"the pipeline committed the initial snapshot {ready_s:.1f}s after capture was streaming")

        step(
            f"running the workload for {settings.duration_s:.0f}s (~{settings.changes_per_s:.0f} changes/s; "
            "inserts, updates, deletes in multi-row transactions)"
        )
        workload_started_ms = int(time.time() * 1000)
        stats = _run_workload(workload, settings, pipeline, step)
        step.info(f"workload done: {stats.changes:,} changes in {stats.transactions:,} transactions")

        step(f"waiting for the pipeline to catch up (verify, up to {settings.catchup_timeout_s:.0f}s)")
        report, waited = _wait_until_verified(spark, config, pipeline, settings.catchup_timeout_s)
        step.info(("caught up" if report.ok else "NOT caught up") + f" after {waited:.1f}s")
    finally:
        step("stopping capture and the pipeline (SIGTERM)")
        pipeline.stop()
        capture.stop()
    return report, stats, workload_started_ms


def _run_workload(
    workload: shop.ShopWorkload, settings: DemoSettings, pipeline: PipelineProcess, step: Step
) -> shop.WorkloadStats:
    """The workload at the demo's rate for its duration, a progress line at a time (the pipeline checked alive)."""

    def progress(stats: shop.WorkloadStats, elapsed: float) -> None:
        pipeline.check()
        step.info(
            f"{elapsed:5.0f}s  {stats.changes:,} changes ({stats.changes / elapsed:,.0f}/s): "
            f"{stats.inserts:,} inserts, {stats.updates:,} updates, {stats.deletes:,} deletes "
            f"in {stats.transactions:,} transactions"
        )

    return workload.run(settings.duration_s, settings.changes_per_s, on_progress=progress)


def _print_summary(
    seconds: float, report: VerifyReport, info: StackInfo, yaml_path: Path, config: PipelineConfig
) -> None:
    """The demo's last lines: how it went, and how to look at the tables it wrote."""
    print(f"\ndemo finished in {seconds:.0f}s — {'OK' if report.ok else 'FAILED (verify found differences)'}")
    if info.storage_env():
        print("the warehouse is in the local S3-compatible store; its credentials come from the environment:")
        print(
            "  "
            + " ".join(f"export {name}=..." for name in info.storage_env())
            + "   (see `lakestream stack up --storage s3`)"
        )
    print(f'explore: lakestream sql {yaml_path} "SELECT * FROM {config.catalog.name}.{NAMESPACE}.orders LIMIT 10"')


# -- configuration ---------------------------------------------------------------------------------


def _config_data(
    info: StackInfo, state_dir: Path, prefix: str, group: str, sql: shop.ShopSQL = shop.POSTGRESQL
) -> dict[str, Any]:
    schema = sql.tables[0].split(".")[0]
    return {
        "name": PIPELINE_NAME,
        "state_dir": str(state_dir),
        "kafka": {"bootstrap_servers": info.bootstrap_servers, "group_id": group},
        "catalog": info.catalog_config("lake"),
        **({"storage": info.storage_config()} if info.storage_config() else {}),
        "capture": {
            "database": info.source_database(),
            "tables": list(sql.tables),
            "topic_prefix": prefix,
            "slot_name": SLOT,
            "publication_name": PUBLICATION,
        },
        "streams": [
            {"topic_pattern": rf"{prefix}\.{schema}\..*", "mode": "upsert", "namespace": NAMESPACE, "table": "{table}"}
        ],
        "engine": {"commit_interval_s": 2, "idle_poll_s": 0.3},
        "spark": {"master": "local[2]", "driver_memory": "2g"},
    }


def _pipeline_config(
    info: StackInfo, state_dir: Path, prefix: str, group: str, sql: shop.ShopSQL = shop.POSTGRESQL
) -> PipelineConfig:
    return parse_config(_config_data(info, state_dir, prefix, group, sql), "<demo>")


def _write_pipeline_yaml(
    path: Path, info: StackInfo, state_dir: Path, prefix: str, group: str, sql: shop.ShopSQL = shop.POSTGRESQL
) -> None:
    # The file holds the local stack's credentials: readable by its owner only.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("# Written by `lakestream demo`; run it yourself with `lakestream run <this file>`.\n")
        yaml.safe_dump(_config_data(info, state_dir, prefix, group, sql), fh, sort_keys=False)


def write_private_yaml(path: Path, data: dict[str, Any]) -> None:
    """Write a pipeline config that holds the stack's credentials: readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def example_stack(settings: Any, state_dir: Path, info: StackInfo | None, step: Step) -> StackInfo:
    """The stack an example runs on: ``info`` when given, else the local stack started from ``settings``
    (pg_port, kafka_port, broker)."""
    if info is not None:
        step("using the running stack")
        return info
    step(f"starting the local stack (PostgreSQL :{settings.pg_port}, broker :{settings.kafka_port})")
    return Stack(StackSettings(state_dir=state_dir, pg_port=settings.pg_port, kafka_port=settings.kafka_port)).up()


# -- reset -----------------------------------------------------------------------------------------


def _source_connection(info: StackInfo) -> Any:
    """A connection to the stack's source database (autocommit off): MariaDB's when the stack runs one."""
    if info.mariadb_port is not None:
        import pymysql

        return pymysql.connect(
            host=info.pg_host,
            port=info.mariadb_port,
            user=info.pg_user,
            password=info.pg_password,
            database=info.source_db,
            charset="utf8mb4",
        )
    return psycopg2.connect(info.pg_dsn())


def _reset_source(info: StackInfo, sql: shop.ShopSQL = shop.POSTGRESQL) -> None:
    """Drop the demo's tables and, on PostgreSQL, its replication slot (ending a leftover reader first) and
    publication."""
    if info.mariadb_port is not None:
        conn = _source_connection(info)
        try:
            with conn.cursor() as cur:
                for table in reversed(sql.tables):
                    cur.execute(f"DROP TABLE IF EXISTS {table}")
            conn.commit()
        finally:
            conn.close()
        return
    conn = psycopg2.connect(info.pg_dsn())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s "
                "AND active_pid IS NOT NULL",
                (SLOT,),
            )
            for _ in range(50):
                cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active", (SLOT,))
                if cur.fetchone()[0] == 0:
                    break
                time.sleep(0.1)
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
            )
            cur.execute(pgsql.SQL("DROP PUBLICATION IF EXISTS {}").format(pgsql.Identifier(PUBLICATION)))
            for table in reversed(shop.TABLES):
                cur.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(*table.split("."))))
    finally:
        conn.close()


def _reset_topics(bootstrap: str, prefix: str, timeout: float = 30.0) -> str:
    """Delete the demo's topics; the prefix to use (a fresh one if the broker kept them)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = [t for t in admin.list_topics(timeout=timeout).topics if t.startswith(prefix + ".")]
    if not existing:
        return prefix
    try:
        for future in admin.delete_topics(existing, operation_timeout=timeout).values():
            future.result(timeout)
    except Exception:  # noqa: BLE001 - any broker refusal means: fall back to fresh topic names
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [t for t in admin.list_topics(timeout=timeout).topics if t.startswith(prefix + ".")]
        if not left:
            return prefix
        time.sleep(0.5)
    return f"{prefix}_{int(time.time())}"


def _drop_lake_tables(spark: SparkSession, config: PipelineConfig) -> None:
    """DROP … PURGE every table of the demo namespace (and the demo's dead-letter table)."""
    catalog = config.catalog.name
    if spark.sql(f"SHOW NAMESPACES IN {quote(catalog)}").where(f"namespace = '{NAMESPACE}'").count():
        for row in spark.sql(f"SHOW TABLES IN {quote(catalog)}.{quote(NAMESPACE)}").collect():
            spark.sql(f"DROP TABLE IF EXISTS {quote_table(catalog, NAMESPACE, row['tableName'])} PURGE")
    dead_ns, dead_table = config.engine.dead_letter_table.split(".")
    spark.sql(f"DROP TABLE IF EXISTS {quote_table(catalog, dead_ns, dead_table)} PURGE")


# -- processes -------------------------------------------------------------------------------------


class PipelineProcess:
    """``lakestream run`` as a child process in its own session, its output in a log file."""

    def __init__(self, yaml_path: Path, log_path: Path):
        self.yaml_path, self.log_path = yaml_path, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:  # this run only
            self.proc = subprocess.Popen(
                [*LAKESTREAM_COMMAND, "run", str(self.yaml_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise LakestreamError(
                f"the pipeline exited with code {self.proc.returncode}; see {self.log_path}:\n{self.tail()}"
            )

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 90.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _wait_until_verified(
    spark: SparkSession, config: PipelineConfig, pipeline: PipelineProcess, timeout: float
) -> tuple[VerifyReport, float]:
    from lakestream.verify.compare import verify_tables

    started = time.monotonic()
    # Verify is a Spark job of its own: run it only once the pipeline has committed a batch
    # after the workload ended, so it does not compete for the cores with the catch-up itself.
    since_ms = int(time.time() * 1000)
    # Bounded: a workload whose last transactions changed nothing leaves nothing new to commit.
    pre_wait = min(timeout / 2, 60.0)
    while time.monotonic() - started < pre_wait and not _committed_since(metrics_path(config), since_ms):
        pipeline.check()
        time.sleep(1)
    # The timeout counts from the workload's end or from the pipeline's latest commit, whichever
    # is later: a slow but progressing pipeline gets time (up to 5× the timeout in all).
    deadline = started + timeout
    while True:
        pipeline.check()
        report = verify_tables(config, spark)
        now = time.monotonic()
        last_commit = _last_commit_ms(metrics_path(config))
        if last_commit:
            deadline = max(deadline, now - (time.time() * 1000 - last_commit) / 1000 + timeout)
        if report.ok or now >= min(deadline, started + 5 * timeout):
            return report, now - started
        time.sleep(3)


def wait_for_first_commit(config: PipelineConfig, pipeline: PipelineProcess, timeout: float) -> float:
    """Seconds until the pipeline committed its first batch (raises after ``timeout``)."""
    started = time.monotonic()
    while not _last_commit_ms(metrics_path(config)):
        pipeline.check()
        if time.monotonic() - started > timeout:
            raise LakestreamError(f"the pipeline committed nothing within {timeout:.0f}s; see {pipeline.log_path}")
        time.sleep(0.5)
    return time.monotonic() - started


def _committed_since(metrics: Path, since_ms: int) -> bool:
    return _last_commit_ms(metrics) >= since_ms


def _last_commit_ms(metrics: Path) -> int:
    """When the pipeline last committed a batch (epoch ms; 0 if never)."""
    if not metrics.exists():
        return 0
    latest = 0
    for line in metrics.read_text().splitlines()[-5:]:
        try:
            latest = max(latest, int(json.loads(line).get("commit_ts_ms") or 0))
        except ValueError:
            continue
    return latest


# -- report ----------------------------------------------------------------------------------------


def _print_report(spark: SparkSession, config: PipelineConfig, report: VerifyReport, since_ms: int) -> None:
    from rich.console import Console, JustifyMethod
    from rich.table import Table

    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    rows = Table(title="source vs lake", header_style="bold")
    for name in ("source table", "lake table", "source rows", "lake rows", "match"):
        rows.add_column(name, justify="right" if "rows" in name else "left")
    for t in report.tables:
        rows.add_row(
            t.source_table,
            f"{config.catalog.name}.{t.lake_table}",
            f"{t.source_rows:,}",
            f"{t.lake_rows:,}",
            "yes" if t.ok else "NO",
        )
    console.print(rows)

    print("\nverify (row count + per-row hash by primary key):")
    print("\n".join("  " + line for line in report.to_text().splitlines()[:-1]))
    print(report.summary_line())

    freshness = freshness_from_metrics(metrics_path(config), since_ms=since_ms)
    if freshness:
        print(
            f"\nfreshness (source commit → visible in Iceberg) during the workload: p50 {freshness.p50_s:.1f}s, "
            f"p99 {freshness.p99_s:.1f}s over {freshness.batches} batches / {freshness.records:,} changes"
        )
    else:
        print("\nfreshness: no batch metrics recorded")

    router = Router.from_config(config)
    layout = Table(title="Iceberg tables", header_style="bold")
    columns: list[tuple[str, JustifyMethod]] = [
        ("table", "left"),
        ("snapshots", "right"),
        ("data files", "right"),
        ("delete files", "right"),
        ("data MB", "right"),
    ]
    for name, justify in columns:
        layout.add_column(name, justify=justify)
    names = {}
    captured = config.require_capture("the demo")
    for source in captured.tables:
        schema, table = source.split(".")
        _, lake_name = router.route(f"{captured.topic_prefix}.{schema}.{table}")
        names[table] = lake_name
        try:
            stats = count_table_files(spark, config.catalog.name, str(lake_name))
        except Exception as exc:  # noqa: BLE001 - a missing table is already reported by verify
            layout.add_row(str(lake_name), "-", "-", "-", type(exc).__name__)
            continue
        layout.add_row(
            stats.table,
            str(stats.snapshots),
            str(stats.data_files),
            str(stats.delete_files),
            f"{stats.data_bytes / 1e6:.2f}",
        )
    console.print(layout)

    query = shop.ANALYTICAL_QUERY.format(
        **{t: quote_table(config.catalog.name, n.namespace, n.table) for t, n in names.items()}
    )
    try:
        df = spark.sql(query)
        result = df.collect()
        segments = Table(title="revenue by customer segment (top 5, from the lake)", header_style="bold")
        for column in df.columns:
            segments.add_column(column, justify="left" if column == "segment" else "right")
        for r in result:
            segments.add_row(*(f"{v:,}" if not isinstance(v, str) else v for v in r))
        console.print(segments)
    except Exception as exc:  # noqa: BLE001 - the query is illustration; verify decides the exit code
        print(f"analytical query failed: {exc}")
