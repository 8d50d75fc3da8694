"""The micro-batch engine, on the driver: plan offset ranges, run the write job, commit each table with its offsets.

- `loop`: the driver loop, one micro-batch after another until stopped; `pipeline`: `run_batch`, one micro-batch as
  its steps; `result`: what a batch did.
- `positions`: where each Kafka partition is read from and the next batch's offset ranges; `cadence`: tables that
  commit less often than their stream is read; `prefetch`: the next batch's write job overlapping this one's commit.
- `writejob`: the Spark job whose tasks (on the executors) run `lakestream.sink.write.task`.
- `registry`: the tables a pipeline writes, their specs, indexes, transforms and reference data; `references`: the
  reference tables read from the lake and broadcast to the tasks.
- `commits`: the batch's table commits, in the order the stages declare; `isolation`: the failing record bisected
  out as a dead letter.
- `freshness` and `metrics`: source-to-lake freshness and the engine's Prometheus metrics.
"""
