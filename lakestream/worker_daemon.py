"""Spark's Python worker daemon, with the write path imported before it forks workers.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``) and forks a
worker from it for each concurrent task. PySpark's own daemon imports only pyspark, so every new
worker pays for importing pyarrow, numpy, confluent-kafka and the sink (about a second on this
machine) before its first task reads a record; forked from here, a worker starts with them loaded.
"""

from __future__ import annotations

import numpy  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.parquet  # noqa: F401
from confluent_kafka import Consumer  # noqa: F401
from pyspark.daemon import manager

import lakestream.sink.write.task  # noqa: F401

if __name__ == "__main__":
    manager()
