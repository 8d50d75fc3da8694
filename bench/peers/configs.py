"""The named configurations of the peers bench: each writer as its own maintainers' documents say to run it on a
Debezium changelog, and the budget every JVM gets alike.

A configuration is a system (the program that writes: `lakestream run`, flink_sink.py, spark_merge.py) plus the
settings that make it that configuration; each setting below names the document or issue it follows. What is
equal for all of them (`JVM_OPTIONS`, `HEAP`, `KAFKA_FETCH`, the local file system) is here too, so that a reader
checks the fairness of the comparison in one file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# -- the budget every JVM gets alike -------------------------------------------------------------------------------

# One heap and one off-heap cap for each writer's JVM (Lakestream's Spark driver, the MERGE job's Spark driver,
# PyFlink's local cluster). The processes outside a JVM (Lakestream's Python workers, PySpark's) are not in it: the
# peak RSS of each writer's whole process tree is what the results compare, and `--memory-cap` puts every writer's
# tree under one cgroup limit where the machine allows it.
HEAP = "2g"
DIRECT_MEMORY = "1g"
# The JVM's default JIT (tiered: C1, then C2 for hot code) for all: no configuration gets a JIT of its own
# (Lakestream's `spark.jit: auto` would pick C1-only for its pipeline JVM; here it is set to "tiered").
JVM_OPTIONS = f"-XX:MaxDirectMemorySize={DIRECT_MEMORY}"
# Every JVM writes file: through the same Hadoop file system: Lakestream's LocalFileSystemNoFork (java/fs/), which
# sets a file's permissions without forking `chmod` per file. Hadoop's own RawLocalFileSystem forks `chmod` when its
# native library is absent, as with the shaded hadoop-client jars all three run with.
LOCAL_FS_CLASS = "lakestream.fs.LocalFileSystemNoFork"
# The Kafka fetch sizes Lakestream's reader asks librdkafka for (lakestream/source/reader.py: 2 MB a partition, 8 MB
# a response), given to the peers' Java consumers as the same properties (Kafka consumer configs fetch.max.bytes,
# max.partition.fetch.bytes). fetch.max.wait.ms stays at the Java default: Lakestream's 5 ms is there to see a
# range's end at once, which a subscribed Java consumer does not need (it is answered as soon as data is there).
KAFKA_FETCH = {"fetch.max.bytes": str(8 * 1024 * 1024), "max.partition.fetch.bytes": str(2 * 1024 * 1024)}

# The commit interval every writer gets in a run: Lakestream's engine.commit_interval_s, Flink's checkpoint interval
# (its Iceberg sink commits once per checkpoint), Spark's processing-time trigger. 10 s: an interval chosen for
# throughput while draining a backlog (Flink: fewer, larger commits; Iceberg's Flink docs: the sink commits at each
# checkpoint, https://iceberg.apache.org/docs/latest/flink-writes/), and the same for all so that each makes about
# as many commits. `run.py --commit-interval-s 2` is the freshness setting.
COMMIT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class PeerConfig:
    """One named configuration: the system that runs it and the settings that make it this configuration."""

    name: str
    system: str  # lakestream | flink | spark
    settings: dict[str, str] = field(default_factory=dict)
    summary: str = ""


CONFIGS: dict[str, PeerConfig] = {
    c.name: c
    for c in (
        PeerConfig(
            "lakestream",
            "lakestream",
            {
                # Its inline maintenance on, counted in its writer CPU like the peers' own maintenance.
                "maintenance.mode": "inline",
                "spark.jit": "tiered",
            },
            "`lakestream run`, one upsert stream, inline maintenance on, the JVM's default JIT",
        ),
        PeerConfig(
            "flink-changelog",
            "flink",
            {
                # Changelog mode: the debezium-json source yields -U/+U/-D from the before images (REPLICA IDENTITY
                # FULL), so the sink needs no upsert: an update is a delete of the old row and an insert.
                # Iceberg's Flink docs (https://iceberg.apache.org/docs/latest/flink-writes/#upsert) and the PR that
                # added upsert mode, apache/iceberg#2863 (openinx: upsert "will produce an extra DELETE for each
                # INSERT"; "If it's the CDC cases ... we don't have to enable the upsert switch").
                "write.upsert.enabled": "false",
                # The equality fields: the table's PRIMARY KEY (id) NOT ENFORCED (Iceberg's Flink docs, same page).
                "equality_fields": "id",
                # Flink's own table maintenance in the job, after the sink's commits (Iceberg's Flink maintenance
                # docs, https://iceberg.apache.org/docs/latest/flink-maintenance/, "IcebergSink with post-commit
                # integration"; TableMaintenance, RewriteDataFiles and ExpireSnapshots are in the
                # iceberg-flink-runtime-2.0 1.11.0 this bench runs). SinkV2 (table.exec.iceberg.use-v2-sink) is the
                # sink that takes them.
                "maintenance": "post-commit",
                # Format v2, as Iceberg's Flink docs' CDC examples create the table: Flink's batch rewrite action
                # (flink_compact.py, the compaction before the reads) refuses v3 tables in the 1.11 runtime ("Flink does
                # not support compaction on row lineage enabled tables (V3+)", RewriteDataFilesAction).
                "format-version": "2",
            },
            "Flink SQL, debezium-json → Iceberg sink in changelog mode (upsert off), Flink's own maintenance",
        ),
        PeerConfig(
            "flink-upsert",
            "flink",
            {
                # Upsert mode: what a team without before images must run (Iceberg's Flink docs, UPSERT): every
                # insert and update also writes an equality delete of its key.
                "write.upsert.enabled": "true",
                "equality_fields": "id",
                "maintenance": "post-commit",
                "format-version": "2",
            },
            "Flink SQL, the same sink in upsert mode (write.upsert.enabled), Flink's own maintenance",
        ),
        PeerConfig(
            "spark-merge-hash",
            "spark",
            {
                # Merge-on-read MERGE (deletion vectors in format v3) with hash distribution: Iceberg's default for
                # MERGE since apache/iceberg#6828, which fixed apache/iceberg#6679 ("With Merge operations None is
                # never the correct mode to request since we are always shuffling anyway"); Iceberg's Spark docs,
                # https://iceberg.apache.org/docs/latest/spark-writes/#writing-distribution-modes.
                "write.merge.mode": "merge-on-read",
                "write.distribution-mode": "hash",
                "write.merge.distribution-mode": "hash",
                # Each key's last change of the micro-batch by max_by over (partition, offset): one aggregation
                # instead of a window's sort.
                "dedupe": "max_by",
            },
            "Structured Streaming foreachBatch MERGE INTO, merge-on-read, hash distribution, max_by dedupe",
        ),
        PeerConfig(
            "spark-merge-cow",
            "spark",
            {
                # Copy-on-write MERGE: the files holding a changed row are rewritten (Iceberg's table properties,
                # write.merge.mode, https://iceberg.apache.org/docs/latest/configuration/#write-properties).
                "write.merge.mode": "copy-on-write",
                "write.distribution-mode": "hash",
                "write.merge.distribution-mode": "hash",
                "dedupe": "max_by",
            },
            "the same MERGE job, copy-on-write",
        ),
    )
}


def config_named(name: str) -> PeerConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise SystemExit(f"unknown configuration {name!r}: one of {', '.join(CONFIGS)}") from None
