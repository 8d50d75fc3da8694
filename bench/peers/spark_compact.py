"""The MERGE job's compaction before the reads: Iceberg's Spark procedures, as a Spark team's scheduled job runs
them (https://iceberg.apache.org/docs/latest/spark-procedures/): ``rewrite_data_files`` with every file that has a
delete taken (``delete-file-threshold`` 1), ``rewrite_position_delete_files`` (what is left of the deletion vectors),
then ``expire_snapshots`` down to the compacted snapshot.

    python bench/peers/spark_compact.py --table ns.t --catalog-uri jdbc:postgresql://... --warehouse file:///...
        [--jars a.jar,b.jar] [--fs-jar J] [--java-options O]

Prints one JSON line: what each procedure returned.
"""

from __future__ import annotations

import argparse
import json
import time

from spark_merge import session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True)
    parser.add_argument("--catalog-uri", required=True)
    parser.add_argument("--catalog-user", default="lakestream")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--jars", default="")
    parser.add_argument("--fs-jar", default=None)
    parser.add_argument("--java-options", default="")
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args()
    # The MERGE job's own session (its catalog, file system and JVM options): the compaction is that team's job.
    spark = session(argparse.Namespace(**vars(args), master="local[2]", shuffle_partitions=4))
    spark.sparkContext.setLogLevel("WARN")
    t = args.table
    out = {}
    rows = spark.sql(
        f"CALL lake.system.rewrite_data_files(table => '{t}', options => map('delete-file-threshold', '1'))"
    ).collect()
    out["rewrite_data_files"] = rows[0].asDict() if rows else {}
    rows = spark.sql(f"CALL lake.system.rewrite_position_delete_files(table => '{t}')").collect()
    out["rewrite_position_delete_files"] = rows[0].asDict() if rows else {}
    # older_than takes a literal: now, in the session's time zone (UTC).
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 1))
    rows = spark.sql(
        f"CALL lake.system.expire_snapshots(table => '{t}', older_than => TIMESTAMP '{now}', retain_last => 1)"
    ).collect()
    out["expire_snapshots"] = rows[0].asDict() if rows else {}
    print(json.dumps(out, default=str), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
