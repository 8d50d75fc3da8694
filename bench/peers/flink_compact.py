"""Flink's own compaction of a table before the reads: Iceberg's Flink rewrite action (a Flink batch job that
rewrites the data files with the deletes applied, ``Actions.forTable(env, table).rewriteDataFiles()``, Iceberg's Flink
maintenance docs, "Rewrite files action": https://iceberg.apache.org/docs/latest/flink-maintenance/), then the
snapshots before it expired (Iceberg's table API, ``expireSnapshots``), as a Flink team's scheduled job does.

    .venv-peers/bin/python bench/peers/flink_compact.py --table ns.t --catalog-uri jdbc:postgresql://...
        --warehouse file:///... --jars a.jar,b.jar --classpath c.jar,d.jar [--hadoop-conf-dir DIR]

Prints one JSON line: the files rewritten and added.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pyflink.datastream import StreamExecutionEnvironment
from pyflink.java_gateway import get_gateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True)
    parser.add_argument("--catalog-uri", required=True)
    parser.add_argument("--catalog-user", default="lakestream")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--classpath", required=True)
    parser.add_argument("--hadoop-conf-dir", default=None)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    # As flink_sink.py: Hadoop's classes and the JDBC driver on the client JVM's class path.
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(str(Path(j).resolve()) for j in args.classpath.split(",") if j)
    env = StreamExecutionEnvironment.get_execution_environment()
    env.add_jars(*[Path(j).resolve().as_uri() for j in args.jars.split(",") if j])
    env.set_parallelism(args.parallelism)
    jvm = get_gateway().jvm
    hadoop = jvm.org.apache.hadoop.conf.Configuration()
    if args.hadoop_conf_dir:
        hadoop.addResource(jvm.org.apache.hadoop.fs.Path(str(Path(args.hadoop_conf_dir) / "core-site.xml")))
    props = jvm.java.util.HashMap()
    for key, value in {
        "uri": args.catalog_uri,
        "jdbc.user": args.catalog_user,
        "jdbc.password": os.environ.get("CATALOG_PASSWORD", ""),
        "jdbc.schema-version": "V1",
        "warehouse": args.warehouse,
    }.items():
        props.put(key, value)
    loader = jvm.org.apache.iceberg.flink.CatalogLoader.custom(
        "lake", props, hadoop, "org.apache.iceberg.jdbc.JdbcCatalog"
    )
    namespace, name = args.table.split(".")
    table_loader = jvm.org.apache.iceberg.flink.TableLoader.fromCatalog(
        loader, jvm.org.apache.iceberg.catalog.TableIdentifier.parse(f"{namespace}.{name}")
    )
    table_loader.open()
    table = table_loader.loadTable()
    result = (
        jvm.org.apache.iceberg.flink.actions.Actions.forTable(env._j_stream_execution_environment, table)
        .rewriteDataFiles()
        .execute()
    )
    table.refresh()
    # Keep the compacted snapshot only: the data and delete files the rewrite replaced go with the older ones.
    table.expireSnapshots().expireOlderThan(int(time.time() * 1000)).retainLast(1).commit()
    print(
        json.dumps(
            {
                "rewritten_data_files": result.deletedDataFiles().size(),
                "added_data_files": result.addedDataFiles().size(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
