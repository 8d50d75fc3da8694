"""Spark's Python worker daemon, with the write path imported before it forks workers.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``) and forks a
worker from it for each concurrent task. PySpark's own daemon imports only pyspark, so every new
worker pays for importing pyarrow, numpy, confluent-kafka and the sink (about a second on this
machine) before its first task reads a record; forked from here, a worker starts with them loaded.

It also keeps the worker's zip archives from being re-read at every task (`keep_zip_directories`), and moves what it
imported out of the garbage collector's generations before it forks (`gc.freeze`).
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport

import numpy  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.parquet  # noqa: F401
from confluent_kafka import Consumer  # noqa: F401
from pyspark.daemon import manager

import lakestream.sink.write.task  # noqa: F401


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def keep_zip_directories() -> None:
    """Make ``zipimporter.invalidate_caches`` re-read an archive's directory only when the archive changed.

    PySpark's worker calls ``importlib.invalidate_caches()`` before every task, and up to Python 3.12 each
    ``zipimporter`` then re-reads its whole archive, in Python: the worker's path holds ``pyspark.zip``, py4j's zip
    and Spark's ``spark-core`` jar (5,000 entries, no Python in it), with one importer per package imported from
    them. That was 185–320 ms of CPU per task here, most of a small batch's write task. The archive's mtime and size
    stand in for its contents: a changed file is re-read as before. Python 3.13 invalidates lazily (CPython issue
    103200): left alone there."""
    if sys.version_info >= (3, 13) or getattr(zipimport.zipimporter, "_lakestream_kept", False):
        return
    reread = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: zipimport.zipimporter) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, "_lakestream_stamp", None) == stamp:
            return
        reread(self)
        self._lakestream_stamp = stamp  # type: ignore[attr-defined]

    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter):
            finder._lakestream_stamp = _stamp(finder.archive)  # type: ignore[attr-defined]  # read at import
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    zipimport.zipimporter._lakestream_kept = True  # type: ignore[attr-defined]


if __name__ == "__main__":
    keep_zip_directories()
    # What the daemon imported lives as long as every worker forked from it: out of the collector's sight, its full
    # collections in a worker scan only what the worker made (and the pages stay shared with the daemon).
    gc.freeze()
    manager()  # type: ignore[no-untyped-call]  # pyspark.daemon is unannotated
