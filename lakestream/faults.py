"""Named pause points in the commit protocol and in capture, so a crash test can kill the process exactly there.

Inactive unless the environment variable ``LAKESTREAM_PAUSE_AT`` names a point: ``name[:seconds][@file]``,
comma-separated (default 60 s). The first time a named point is reached (once ``file`` exists, if one is
named: a long run arms the point when it wants the kill) the process logs ``PAUSE_MARKER <name>`` and
sleeps; the test SIGKILLs it meanwhile. Later passes do not pause.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

ENV_VAR = "LAKESTREAM_PAUSE_AT"
PAUSE_MARKER = "pause point reached:"
# The points, in the order a batch passes them.
POINTS = (
    "commit.table.before",  # a table's data files are written; its Iceberg commit has not been made
    "commit.table.landed",  # a table's snapshot (data + offsets) has landed; its key index delta is not written
    "commit.table.after",  # the table's key index is durable too; the batch has not finished
    "commit.group.before",  # every table and the dead letters have committed; the Kafka group has not
)
# The points of a compaction of the pipeline's own mirror (inline maintenance), in the order it passes them.
MAINTENANCE_POINTS = (
    "maintenance.rewrite.planned",  # its groups are chosen and their deleted rows read; nothing written yet
    "maintenance.rewrite.written",  # its new files are written on the executors; not handed to the pipeline yet
    "maintenance.commit.before",  # the pipeline is committing it between two batches; Iceberg's commit not made
    "maintenance.commit.landed",  # its snapshot has landed; the key index's delta for it is not written
    "maintenance.commit.after",  # the key index is durable at its snapshot too
)

# The points of `lakestream capture`, in the order a batch of change events passes them (the last one once).
CAPTURE_POINTS = (
    "capture.batch.produced",  # a batch is handed to the Kafka producer; not acknowledged yet
    "capture.batch.acknowledged",  # Kafka acknowledged the batch; Debezium has not marked it processed
    "capture.offsets.written",  # the offsets are in the temporary file; the stored file is not replaced yet (JVM)
    "capture.streaming.connected",  # the snapshot is done and Debezium reads the slot or the binlog
)

_passed: set[str] = set()
_lock = threading.Lock()


def pause_point(name: str) -> None:
    """Pause here the first time if ``LAKESTREAM_PAUSE_AT`` names ``name``; otherwise return at once."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    for item in spec.split(","):
        spec_, _, arm_file = item.strip().partition("@")
        point, _, seconds = spec_.partition(":")
        if point != name or (arm_file and not os.path.exists(arm_file)):
            continue
        with _lock:
            if name in _passed:
                return
            _passed.add(name)
        pause = float(seconds or 60)
        log.warning("%s %s (pausing %.0fs)", PAUSE_MARKER, name, pause)
        time.sleep(pause)
        return
