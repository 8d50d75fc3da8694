"""Stream processing stages over the rows a batch wrote, on the driver between the write job and the commits.

- `stage`: the contract between the engine and a stage (`StageContext`, `Stage`).
- `alerts` and `rules`: stateful rules over each key's recent history, their alerts sent to Kafka and to a table.
- `windows`: event-time windows per key, with a watermark and allowed lateness.
- `materialize`: derived tables kept current by key (Spark SQL over several mirrors).

The per-stream transforms run inside the write tasks, on the executors: `lakestream.transform`.
"""
