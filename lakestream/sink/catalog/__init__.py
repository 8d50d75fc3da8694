"""Driver side: the catalog and the JVM. `sink` holds every call into `LakestreamSink` (Java) with its typed
result (table metadata, table creation, commits of files and deletion vectors, compaction commits, deleted
positions, snapshot diffs); `schema` creates and evolves tables (Spark SQL DDL); `upgrade` moves a table to
format v3."""
