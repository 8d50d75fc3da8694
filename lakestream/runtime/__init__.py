"""The JVM runtime lakestream starts: the Spark session and the jars of every JVM it runs. Driver side; the jars it
resolves also serve the separate processes (Debezium capture, the Kafka broker, Trino, the REST catalog).

- `spark`: `session_for`, the SparkSession with the Iceberg runtime, the configured catalog, object storage, the
  fair scheduler's pools (`fairscheduler.xml`) and log4j2's configuration (`log4j2.properties`).
- `jars`: the JVM jars by Maven coordinates (`jars.toml`), resolved by Maven into a local cache
  (``python -m lakestream.runtime.jars``).
- `jvm_jars`: the class paths built from those groups, and lakestream's own Java sources (`lakestream/java/`)
  compiled against them.
"""
