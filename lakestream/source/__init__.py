"""Kafka as the pipeline's source, split by side.

- `kafka` (driver): topic discovery, watermarks, the consumer group's offsets and lag.
- `planner` (driver): which offset range of which partition each Spark task reads in a micro-batch.
- `reader` (executors): reading one planned offset range with confluent-kafka, in runs of records.
"""
