"""The Flink peer: Flink SQL from a `debezium-json` Kafka source into an Iceberg table, in changelog mode (the
main Flink configuration) or upsert mode, with Flink's own table maintenance after the sink's commits.

Configured as Iceberg's Flink docs describe CDC into Iceberg (https://iceberg.apache.org/docs/latest/flink-writes/):
a table with ``PRIMARY KEY (id) NOT ENFORCED`` (its equality fields); ``--upsert false`` (changelog mode) applies the
-U/+U/-D the debezium-json format derives from each event's before and after images, ``--upsert true`` also writes
an equality delete of the key for every insert (apache/iceberg#2863). Committed at each checkpoint; the checkpoint
interval is the commit interval. Parallelism 2 (the topic's two partitions, the machine's two cores).

``--maintenance post-commit``: the SinkV2 sink (``table.exec.iceberg.use-v2-sink``) with Iceberg's Flink
TableMaintenance after its commits (https://iceberg.apache.org/docs/latest/flink-maintenance/, "IcebergSink with
post-commit integration"): RewriteDataFiles every 10 commits (the documented default schedule) and ExpireSnapshots
keeping the last 10, under a JDBC lock in the catalog's own PostgreSQL (the lock the same page documents).

After a crash the job starts again from the newest retained checkpoint (the Kafka offsets and the Iceberg sink's
uncommitted files are in it), as Flink's operator or an operator by hand does: ``execution.state-recovery.path``.
The Kafka source commits its offsets to the consumer group when a checkpoint completes (Flink's Kafka connector
docs, "Consumer Offset Committing"): the bench reads them there to know when a backlog is drained.

Runs under PyFlink (the `apache-flink` wheel, Flink's own distribution jars) in the bench's venv `.venv-peers`:

    .venv-peers/bin/python bench/peers/flink_sink.py --bootstrap HOST:PORT --topic T --table ns.t
        --catalog-uri jdbc:postgresql://... --warehouse file:///... --checkpoints DIR
        --jars a.jar,b.jar --classpath c.jar,d.jar [--upsert false] [--maintenance post-commit|off]
        [--interval-s 10] [--parallelism 2] [--schemas on|off] [--hadoop-conf-dir DIR] [--kafka k=v,...]
        [--rewrite-commit-count 10] [--format-version 2]

The catalog password comes from CATALOG_PASSWORD. The columns are fixed in the DDL below, as a Flink SQL job has
them: a column added at the source later is not carried (the JSON format ignores unknown fields).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pyflink.table import EnvironmentSettings, TableEnvironment

SOURCE_COLUMNS = """id INT, customer_id BIGINT, status STRING, amount DOUBLE, qty INT, price DOUBLE, express BOOLEAN,
    version INT, created_day INT, created_at BIGINT, updated_at STRING, note STRING"""
SINK_COLUMNS = """id INT NOT NULL, customer_id BIGINT, status STRING, amount DOUBLE, qty INT, price DOUBLE,
    express BOOLEAN, version INT, created_day DATE, created_at TIMESTAMP(6), updated_at TIMESTAMP_LTZ(6), note STRING,
    PRIMARY KEY (id) NOT ENFORCED"""
# Debezium's wire types as the sink's: days → DATE, microseconds → TIMESTAMP, ISO-8601 with Z → TIMESTAMP_LTZ.
SELECT = """id, customer_id, status, amount, qty, price, express, version,
    CAST(TIMESTAMPADD(DAY, created_day, DATE '1970-01-01') AS DATE),
    CAST(TO_TIMESTAMP_LTZ(created_at / 1000, 3) AS TIMESTAMP(6)),
    CAST(TO_TIMESTAMP(REPLACE(REPLACE(updated_at, 'T', ' '), 'Z', ''), 'yyyy-MM-dd HH:mm:ss.SSSSSS')
         AS TIMESTAMP_LTZ(6)),
    note"""


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest completed checkpoint under ``directory`` (``<job>/chk-N/_metadata``), or None."""
    done = [p.parent for p in directory.glob("*/chk-*/_metadata")]
    return max(done, key=lambda p: (p.stat().st_mtime, int(p.name.split("-")[1])), default=None)


def maintenance_options(args) -> dict[str, str]:
    """The sink's post-commit maintenance (Iceberg's Flink maintenance docs, the IcebergSink SQL keys)."""
    if args.maintenance != "post-commit":
        return {}
    user = args.catalog_user
    password = os.environ.get("CATALOG_PASSWORD", "")
    return {
        "flink-maintenance.rewrite.enabled": "true",
        "flink-maintenance.rewrite.schedule.commit-count": str(args.rewrite_commit_count),
        # How often the maintenance looks at the table, and waits for its lock (the documented defaults: 60 s, 30 s).
        "flink-maintenance.rate-limit-seconds": str(args.maintenance_rate_limit_s),
        "flink-maintenance.lock-check-delay-seconds": str(args.maintenance_lock_check_s),
        "flink-maintenance.expire-snapshots.enabled": "true",
        "flink-maintenance.expire-snapshots.retain-last": "10",
        "flink-maintenance.lock.type": "jdbc",
        "flink-maintenance.lock.jdbc.uri": f"{args.catalog_uri}{'&' if '?' in args.catalog_uri else '?'}"
        f"user={user}&password={password}",
        "flink-maintenance.lock.jdbc.init-lock-table": "true",
        "flink-maintenance.lock.lock-id": args.table,
    }


def environment(args) -> TableEnvironment:
    # Iceberg's catalogs need Hadoop's classes, and the JDBC catalog its driver, where the catalog is made: the
    # client JVM's own class path, which PyFlink's launcher takes from HADOOP_CLASSPATH (as Iceberg's Flink docs
    # say: export HADOOP_CLASSPATH). The connectors go in pipeline.jars.
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(str(Path(j).resolve()) for j in args.classpath.split(",") if j)
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    checkpoints = Path(args.checkpoints).resolve()
    settings = {
        "pipeline.jars": ";".join(Path(j).resolve().as_uri() for j in args.jars.split(",") if j),
        "parallelism.default": str(args.parallelism),
        "execution.checkpointing.interval": f"{int(args.interval_s * 1000)} ms",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": checkpoints.as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "2",
        "table.local-time-zone": "UTC",
        "table.exec.sink.upsert-materialize": "NONE",  # the Iceberg sink applies the changes by key itself
        # SinkV2: the Iceberg sink that runs TableMaintenance after its commits.
        "table.exec.iceberg.use-v2-sink": "true" if args.maintenance == "post-commit" else "false",
        **maintenance_options(args),
    }
    restore = latest_checkpoint(checkpoints) if checkpoints.exists() else None
    if restore is not None:
        settings["execution.state-recovery.path"] = restore.as_uri()
        print(f"restoring from {restore}", flush=True)
    for key, value in settings.items():
        conf.set(key, value)
    return env


def catalog_ddl(args) -> str:
    hadoop = f", 'hadoop-conf-dir'='{args.hadoop_conf_dir}'" if args.hadoop_conf_dir else ""
    return f"""CREATE CATALOG lake WITH ('type'='iceberg',
        'catalog-impl'='org.apache.iceberg.jdbc.JdbcCatalog', 'uri'='{args.catalog_uri}',
        'jdbc.user'='{args.catalog_user}', 'jdbc.password'='{os.environ.get("CATALOG_PASSWORD", "")}',
        'jdbc.schema-version'='V1', 'warehouse'='{args.warehouse}'{hadoop})"""


def source_ddl(args) -> str:
    kafka = "".join(f", 'properties.{k}'='{v}'" for k, v in (kv.split("=", 1) for kv in args.kafka.split(",") if kv))
    return f"""CREATE TEMPORARY TABLE orders_cdc ({SOURCE_COLUMNS}) WITH (
        'connector'='kafka', 'topic'='{args.topic}', 'properties.bootstrap.servers'='{args.bootstrap}',
        'properties.group.id'='{args.group_id}', 'scan.startup.mode'='earliest-offset'{kafka},
        'format'='debezium-json', 'debezium-json.schema-include'='{"true" if args.schemas == "on" else "false"}')"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group-id", default="peer-flink")
    parser.add_argument("--table", required=True, help="namespace.table in the catalog `lake`")
    parser.add_argument("--catalog-uri", required=True)
    parser.add_argument("--catalog-user", default="lakestream")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--jars", required=True, help="comma-separated: Iceberg's Flink runtime, the Kafka connector")
    parser.add_argument("--classpath", required=True, help="comma-separated: Hadoop's client jars, the JDBC driver")
    parser.add_argument("--upsert", choices=("true", "false"), default="false")
    parser.add_argument("--format-version", choices=("2", "3"), default="2")
    parser.add_argument("--maintenance", choices=("post-commit", "off"), default="post-commit")
    parser.add_argument("--rewrite-commit-count", type=int, default=10, help="RewriteDataFiles every N commits")
    parser.add_argument("--maintenance-rate-limit-s", type=int, default=60)
    parser.add_argument("--maintenance-lock-check-s", type=int, default=30)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--schemas", choices=("on", "off"), default="on", help="JSON with Connect schemas or not")
    parser.add_argument("--hadoop-conf-dir", default=None, help="a core-site.xml for the catalog's Hadoop conf")
    parser.add_argument("--kafka", default="", help="comma-separated consumer properties k=v")
    args = parser.parse_args()
    namespace, table = args.table.split(".")
    env = environment(args)
    env.execute_sql(catalog_ddl(args))
    env.execute_sql(f"CREATE DATABASE IF NOT EXISTS lake.`{namespace}`")
    env.execute_sql(f"""CREATE TABLE IF NOT EXISTS lake.`{namespace}`.`{table}` ({SINK_COLUMNS}) WITH (
        'format-version'='{args.format_version}', 'write.upsert.enabled'='{args.upsert}',
        'write.format.default'='parquet')""")
    env.execute_sql(source_ddl(args))
    hint = {"upsert-enabled": args.upsert, **maintenance_options(args)}
    options = ", ".join(f"'{k}'='{v}'" for k, v in hint.items())
    result = env.execute_sql(
        f"INSERT INTO lake.`{namespace}`.`{table}` /*+ OPTIONS({options}) */ SELECT {SELECT} FROM orders_cdc"
    )
    print("job started", flush=True)
    result.wait()


if __name__ == "__main__":
    main()
