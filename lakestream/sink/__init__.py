"""The sink: records of a batch into Iceberg tables, with the executor/driver split in the tree.

- `write/` (executors): the write task — route, convert, keep the latest change per key, write Parquet, report.
- `report.py` and `spec.py` (both sides): what crosses between them — the facts a task reports to the driver
  (`report`), and the table contract the driver ships to the tasks (`spec.TableSpec`).
- `types.py` (both sides): Iceberg types as Arrow types and Spark DDL.
- `commit/` (driver): the resolution across tasks, table commits with their offsets, compaction commits, lineage.
- `index/` (driver): the table indexes, one contract (`index.contract.TableIndex`), their store and refresh.
- `catalog/` (driver): every `LakestreamSink` (JVM) call with its typed result, and the table DDL.
- `deadletters/` (driver): the dead-letter table and the replay of dead letters.
"""
