"""Reading the lake: the tables the pipeline writes, as Arrow, pandas or Spark, and their metadata. Driver side (the
caller's process: a notebook, the CLI, the dashboard, maintenance).

- `query`: `read_table`, `read_pandas`, `run_sql` with Spark, DuckDB or pyiceberg over the pipeline's catalog.
- `fresh`: a table's committed snapshot plus the uncommitted tail of its Kafka partitions (`read_table(fresh=True)`).
- `trino`: the same tables through a Trino server (`lakestream sql --engine trino`).
- `inspection`: a table's files, partitions and offsets from its Iceberg metadata (`TableMetrics`), which health,
  maintenance and the dashboard read.
"""
