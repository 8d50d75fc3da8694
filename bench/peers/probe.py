"""What a reader sees of a table while it is written, read from the table's own metadata the same way for every
writer: each snapshot's commit time, and the produce time (``updated_at``, stamped when the change was sent) of every
row in the data files it added. A change is visible from the commit of the first snapshot that holds its row, so
``commit − produce`` is its freshness, and ``now − the newest produce time visible`` is how far the writer lags.

Deletes add no row, so they are not in the freshness figures (the updates and inserts around them are). Snapshots
that only rewrite files (``replace``: compaction) are skipped: their rows were visible before.

The probe also keeps the Kafka offsets Lakestream stores in its snapshots (``lakestream.offsets``): the table's own
record of how far it has written each partition (drain.py).
"""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlparse

import numpy as np


def _produce_ms(path: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    column = pq.read_table(urlparse(path).path if path.startswith("file:") else path, columns=["updated_at"])[0]
    if pa.types.is_timestamp(column.type):
        micros = pc.cast(column, pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        return np.asarray(micros.to_numpy(zero_copy_only=False), dtype=np.int64) // 1000
    text = column.to_pylist()  # ISO-8601 as sent: 2026-11-28T03:00:00.123000Z
    return np.array([int(np.datetime64(t.rstrip("Z"), "ms").astype(np.int64)) for t in text if t], dtype=np.int64)


class SnapshotProbe(threading.Thread):
    """Polls one table every ``interval`` s (pyiceberg, through the catalog) and keeps, per new snapshot, its commit
    time and the produce times of the rows it added."""

    def __init__(self, catalog, identifier: str, interval: float = 1.0, read_rows: bool = True):
        super().__init__(name=f"probe-{identifier}", daemon=True)
        self.catalog, self.identifier, self.interval = catalog, identifier, interval
        # False: the snapshots' summaries only (their offsets), no data file read: a drain's end is then seen as
        # soon as the commit is, whatever the size of the files it added.
        self.read_rows = read_rows
        self.seen: set[int] = set()
        self.commits: list[tuple[int, np.ndarray]] = []  # (commit ms, produce ms of the rows it added)
        self.newest_produce_ms = 0
        self.errors = 0
        self.table_offsets: dict[str, dict[int, int]] = {}  # topic → partition → next offset, from the summaries
        self.replaces = 0  # snapshots that only rewrote files (compaction)
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def poll(self) -> None:
        from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

        try:
            table = self.catalog.load_table(self.identifier)
        except Exception:  # noqa: BLE001 — not created yet
            return
        for snap in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
            if snap.snapshot_id in self.seen:
                continue
            self.seen.add(snap.snapshot_id)
            self._keep_offsets(snap.summary)
            if snap.summary is not None and snap.summary.operation.value == "replace":
                self.replaces += 1
                continue
            if not self.read_rows:
                continue
            produced = []
            for manifest in snap.manifests(table.io):
                if manifest.added_snapshot_id != snap.snapshot_id or manifest.content != ManifestContent.DATA:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    if entry.status == ManifestEntryStatus.ADDED and entry.data_file.content == DataFileContent.DATA:
                        produced.append(_produce_ms(entry.data_file.file_path))
            rows = np.concatenate(produced) if produced else np.empty(0, np.int64)
            with self.lock:
                self.commits.append((snap.timestamp_ms, rows))
                if rows.size:
                    self.newest_produce_ms = max(self.newest_produce_ms, int(rows.max()))

    def _keep_offsets(self, summary) -> None:
        text = None if summary is None else summary.additional_properties.get("lakestream.offsets")
        if not text:
            return
        with self.lock:
            for topic, parts in json.loads(text).items():
                kept = self.table_offsets.setdefault(topic, {})
                for partition, offset in parts.items():
                    kept[int(partition)] = max(kept.get(int(partition), 0), int(offset))

    def offsets(self, topic: str) -> dict[int, int]:
        """partition → the next offset the table's snapshots say it has written (Lakestream's tables)."""
        with self.lock:
            return dict(self.table_offsets.get(topic, {}))

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 — a metadata file replaced under the read; the next poll sees it
                self.errors += 1
            self.halt.wait(self.interval)

    def lag_s(self, now_ms: float | None = None) -> float:
        """Seconds since the newest change a reader can see was produced."""
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        return (now_ms - self.newest_produce_ms) / 1000 if self.newest_produce_ms else float("inf")

    def freshness(self, from_ms: float, to_ms: float) -> dict[str, float | int | None]:
        """p50/p99/max of commit − produce over the rows produced in [from_ms, to_ms)."""
        with self.lock:
            parts = [commit - rows[(rows >= from_ms) & (rows < to_ms)] for commit, rows in self.commits]
        values = np.concatenate(parts) / 1000 if parts else np.empty(0)
        if not values.size:
            return {"p50": None, "p99": None, "max": None, "rows": 0}
        return {
            "p50": round(float(np.percentile(values, 50)), 2),
            "p99": round(float(np.percentile(values, 99)), 2),
            "max": round(float(values.max()), 2),
            "rows": int(values.size),
        }

    def visible(self, produce_ms: int) -> bool:
        return self.newest_produce_ms >= produce_ms
