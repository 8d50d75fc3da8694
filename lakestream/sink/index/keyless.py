"""Tables without a primary key: the mirror is a multiset of rows, kept exact through the same index
and deletion vectors as keyed tables.

Debezium publishes such a table's events with a null key. An insert adds one row. Under ``REPLICA
IDENTITY FULL`` an update or delete carries the whole old row, and removes exactly one row equal to it
(two identical rows stay two until one of them is deleted); an update then adds its new row.

- **Index**: a row's identity is the 16-byte hash of its whole content (`index.row_keys`); the *j*-th
  copy of content *h* lives at index key (h, j). A second map holds how many copies of *h* the table
  has, so an insert lands at (h, count) and a delete removes (h, count − 1). Both are `KeyIndex`es
  (hashed keys, the count stored where a location would be), rebuilt from a scan of the whole table
  when the table moved on (compaction, another writer) or its columns changed.
- **Re-sent events**: Debezium is at-least-once; after a capture crash it sends events again, which
  for a table without a key would add rows twice. Events carry their source position
  (`decode.envelope.source_position`: the commit LSN of the transaction before, the event's LSN), and
  along a topic partition positions never decrease. Each commit stores the newest position applied per
  partition, and how many events it applied at exactly that position, in the snapshot summary
  (``lakestream.source-positions``); an event below it is a re-send and leaves the table as it is. An update or
  delete has a position of its own, so one *at* it is the last event applied, sent again (a re-send that
  begins exactly there). Inserts can share one (the rows of one COPY record, the rows of a snapshot): of
  those, the first *count* seen again after an earlier position are re-sends, and one that follows the
  applied ones is the group going on; a re-send that begins exactly at such a group's first row is the
  ambiguous case, and re-adds its rows.
- **A key appears later** (the source table gained a primary key): the mirror stays a multiset.
  Inserts are still appended; an update or delete that carries a key is a dead letter naming the fix
  (recreate the mirror), because under ``REPLICA IDENTITY DEFAULT`` it no longer carries the old row.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa

from lakestream.sink.index.contract import IndexIdentity
from lakestream.sink.index.keys import row_keys
from lakestream.sink.index.memory import KeyIndex
from lakestream.sink.index.scan import FILE_COLUMN, POS_COLUMN, scan_locations
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


log = logging.getLogger(__name__)

POSITIONS_PROPERTY = "lakestream.source-positions"
_MIX = np.uint64(0x9E3779B97F4A7C15)


def copy_keys(hashes: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """Index keys of the ``ordinals``-th copies of rows with content ``hashes`` (16-byte keys)."""
    both = np.ascontiguousarray(hashes, "S16").view(np.uint64).reshape(-1, 2).copy()
    with np.errstate(over="ignore"):
        both[:, 1] ^= (np.asarray(ordinals, np.uint64) + np.uint64(1)) * _MIX
    return both.view("S16").reshape(-1)


def encode_positions(positions: dict[TP, tuple[int, int, int]]) -> str:
    return orjson.dumps([[tp.topic, tp.partition, *p] for tp, p in sorted(positions.items())]).decode()


def decode_positions(text: str | None) -> dict[TP, tuple[int, int, int]]:
    if not text:
        return {}
    try:
        return {TP(t, int(p)): (int(a), int(b), int(n)) for t, p, a, b, n in orjson.loads(text)}
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"unreadable {POSITIONS_PROPERTY} snapshot property {text[:200]!r}: {exc}") from None


class KeylessIndex(IndexIdentity):
    """Row copies → locations, content → copy count, and the newest source position applied per partition;
    valid for ``snapshot_id`` (`TableIndex`, not keyed)."""

    keyed = False

    def __init__(self, schema: pa.Schema | None = None, table_uuid: str | None = None):
        self.hashed = True
        self.key_columns: tuple[str, ...] = ()
        self.schema = schema  # the table's columns, as the write tasks hash rows (`keys.row_keys`)
        self.table_uuid = table_uuid  # a saved index is only loaded for the same table
        self.rows = KeyIndex(True)
        self.counts = KeyIndex(True)  # the "location" is the number of copies
        self.positions: dict[TP, tuple[int, int, int]] = {}
        self.columns: tuple[str, ...] = ()
        # Events seen at exactly the stored position in the current pass (see `lakestream.sink.commit.keyless`).
        self.seen_at: dict[TP, int] = {}
        self.snapshot_id: int | None = None
        self.valid = False

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def paths(self) -> list[str]:
        return self.rows.paths

    def file_id(self, path: str) -> int:
        return self.rows.file_id(path)

    def known_file_id(self, path: str) -> int | None:
        return self.rows.known_file_id(path)

    def reset(self) -> None:
        """Forget every row, count and position."""
        self.__init__(self.schema, self.table_uuid)  # type: ignore[misc]

    def save(self, path: Path) -> None:
        """Write the index, valid at ``snapshot_id``, to ``path`` (driver-local state, at a clean close)."""
        self.rows._merge()
        self.counts._merge()
        meta = orjson.dumps(
            {
                "snapshot_id": self.snapshot_id,
                "paths": self.rows.paths,
                "positions": encode_positions(self.positions),
                "columns": list(self.columns),
                **self.identity(),
            }
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                keys=self.rows.keys,
                locs=self.rows.locs,
                count_keys=self.counts.keys,
                counts=self.counts.locs,
                meta=np.frombuffer(meta, np.uint8),
            )
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, snapshot_id: int | None, table_uuid: str | None) -> KeylessIndex | None:
        """The index saved at ``path`` if it describes ``snapshot_id`` of the table ``table_uuid`` (else None)."""
        if snapshot_id is None or not path.exists():
            return None
        try:
            with np.load(path) as saved:
                meta = orjson.loads(saved["meta"].tobytes())
                index = cls(None, table_uuid)
                if meta.get("snapshot_id") != snapshot_id or not index.matches(meta):
                    return None
                index.rows.keys, index.rows.locs = saved["keys"], saved["locs"]
                index.counts.keys, index.counts.locs = saved["count_keys"], saved["counts"]
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
            log.warning("ignoring the saved keyless index %s: %s", path, exc)
            return None
        for p in meta["paths"]:
            index.rows.file_id(p)
        index.positions = decode_positions(meta.get("positions"))
        index.seen_at = {tp: p[2] for tp, p in index.positions.items()}
        index.columns = tuple(meta.get("columns") or ())
        index.snapshot_id, index.valid = snapshot_id, True
        return index

    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Load the index from a scan of every column of the table at ``snapshot_id`` (deletes applied), and
        the source positions from the newest snapshot summary that has them."""
        from lakestream.runtime.spark import jvm_helper

        started = time.monotonic()
        self.reset()
        if snapshot_id is not None:
            scanned = scan_locations(spark, ident, "*", int(snapshot_id), self.rows.file_id)
            if scanned is not None:
                table, locs = scanned
                content = self.schema or pa.schema([f for f in table.schema if f.name not in (FILE_COLUMN, POS_COLUMN)])
                hashes = row_keys(table, content)
                order = np.argsort(hashes, kind="stable")
                h = hashes[order]
                starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
                sizes = np.diff(np.r_[starts, len(h)])
                ordinals = np.arange(len(h)) - np.repeat(starts, sizes)
                keys = copy_keys(h, ordinals)
                by_key = np.argsort(keys, kind="stable")
                self.rows.keys, self.rows.locs = keys[by_key], locs[order][by_key]
                self.counts.keys, self.counts.locs = h[starts], sizes.astype(np.int64)
            self.positions = decode_positions(
                str(jvm_helper(spark).latestSummaryValue(spark._jsparkSession, ident, POSITIONS_PROPERTY) or "") or None
            )
            self.seen_at = {tp: p[2] for tp, p in self.positions.items()}
        if self.schema is not None:
            self.columns = tuple(self.schema.names)
        self.snapshot_id = snapshot_id
        self.valid = True
        log.info(
            "keyless index of %s rebuilt at snapshot %s: %d rows, %.2fs",
            ident,
            snapshot_id,
            len(self.rows.keys),
            time.monotonic() - started,
        )


if TYPE_CHECKING:  # mypy checks here that KeylessIndex has the contract (`contract.TableIndex`)
    from lakestream.sink.index.contract import TableIndex

    def _conforms(index: KeylessIndex) -> TableIndex:
        return index
