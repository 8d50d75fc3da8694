"""Executor side: the write task (`task`) reads its Kafka ranges, decodes, routes records to tables (with
`lakestream.routing`), converts them strictly into each table's Arrow schema (`convert`, column defaults: `defaults`),
keeps the latest change per key (`latest`), splits rows by partition (`partitioning`), writes Parquet data files
(`files`) and reports small typed facts to the driver (`lakestream.sink.report`; keyless tables' changes: `keyless`).
Nothing here needs a JVM; the driver also uses `files` for its own small files. `worker_daemon` is Spark's Python
worker daemon on each executor (a separate process, ``spark.python.daemon.module``): it imports the write task once,
before it forks a worker per task."""
