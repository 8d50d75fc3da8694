"""What a re-snapshot leaves alone: its chunk rows matched against the mirror's rows, by key and content.

A re-snapshot reads the whole table, but a mirror that drifted usually differs in a few rows. Each row has a
content digest (`lakestream.sink.index.keys.row_keys`: a 16-byte hash of the whole row, the same for a row parsed
from the source and for that row scanned from the table), computed where the rows are: by the chunk tasks as they
write them (`ChunkResult.digests`), and for the mirror by a scan on the executors (`MirrorRows`), so only keys,
digests and locations reach the driver. Outside the stream's window (those keys stay as the stream left them), per
key (`match_keyed`):

- **equal** digests: the mirror row stays as it is, with its ``_row_id`` and ``_last_updated_sequence_number``;
  the chunk row is not added (a deletion vector on its new file, or the file left out when none of its rows is);
- **different** digests: the mirror row is deleted and the chunk row added with the mirror row's ``_row_id``
  (`keep_row_ids`, by the committer's in-place rewrite `lakestream.sink.commit.lineage.write_lineage`) and a null
  ``_last_updated_sequence_number``, which reads as the re-snapshot's commit: an update, as the pipeline's are;
- a key only in the chunks is added (a new ``_row_id``); a key only in the mirror is deleted. A key the mirror
  holds twice (a duplicate made by hand) loses both rows; its chunk row keeps the first one's id.

A table without a key (`match_keyless`) is a row multiset whose rows are identified by content: the j-th copy of a
content in the chunks is equal to the mirror's j-th copy, copies beyond the mirror's count are added and copies
beyond the chunks' count deleted. A row whose content changed there is a delete and an insert (a new id): without a
key nothing says which old row it was.

A digest collision (two different rows with one 128-bit digest, odds ~n²/2¹²⁹) would leave the mirror's row in
place: the same risk the key index takes with hashed keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lakestream.sink.index.keys import find_sorted, index_keys, keys_from_arrow, keys_to_arrow, pack, row_keys, unpack
from lakestream.sink.index.scan import FILE_COLUMN, POS_COLUMN, data_files, scan_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestream.sink.index.keyless import KeylessIndex

log = logging.getLogger(__name__)

NO_ROW = np.int64(-1)  # a chunk row that replaces no mirror row


class MirrorRows:
    """A keyed mirror at one snapshot: its rows' keys (sorted), packed locations and content digests, from one
    scan whose digests are computed on the executors. ``paths[file id]`` is the data file of a location."""

    def __init__(self, key_columns: list[str], hashed: bool, schema: pa.Schema):
        self.key_columns = list(key_columns)
        self.hashed = hashed
        self.schema = schema  # the columns a digest covers: the chunks' schema
        self.keys: np.ndarray = np.empty(0, "S16" if hashed else np.int64)
        self.locs: np.ndarray = np.empty(0, np.int64)
        self.digests: np.ndarray = np.empty(0, "S16")
        self.paths: list[str] = []
        self.snapshot_id: int | None = None

    def rebuild(self, spark: SparkSession, ident: str, snapshot_id: int | None) -> None:
        """Load the mirror's rows at ``snapshot_id`` (every delete applied)."""
        started = time.monotonic()
        self.keys, self.locs, self.digests = self.keys[:0], self.locs[:0], self.digests[:0]
        self.paths, self.snapshot_id = [], snapshot_id
        if snapshot_id is None:
            return
        by_hash = data_files(spark, ident, int(snapshot_id))
        known = np.array(sorted(by_hash), np.int64)
        self.paths = [by_hash[int(h)] for h in known]  # a file's id is its place in ``known``
        key_columns, hashed, schema = self.key_columns, self.hashed, self.schema

        def digest(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for rb in batches:
                rows = pa.Table.from_batches([rb])
                keys = keys_to_arrow(index_keys(rows, key_columns))
                yield pa.record_batch(
                    [
                        keys.cast(pa.binary()) if hashed else keys,
                        keys_to_arrow(row_keys(rows, schema)).cast(pa.binary()),
                        rb.column(rb.schema.get_field_index(FILE_COLUMN)),
                        rb.column(rb.schema.get_field_index(POS_COLUMN)),
                    ],
                    names=["key", "digest", "file", "pos"],
                )

        key_type = "binary" if hashed else "bigint"
        scanned = spark.sql(scan_sql(ident, "*", int(snapshot_id))).mapInArrow(
            digest, f"key {key_type}, digest binary, file bigint, pos bigint"
        )
        batches = scanned._collect_as_arrow()
        if batches:
            table = pa.Table.from_batches(batches)
            key_column = table.column("key")
            keys = keys_from_arrow(key_column.cast(pa.binary(16)) if hashed else key_column)
            digests = keys_from_arrow(table.column("digest").cast(pa.binary(16)))
            files = table.column("file").to_numpy()
            slot = np.searchsorted(known, files)
            if len(known) == 0 or not np.array_equal(known[np.minimum(slot, len(known) - 1)], files):
                raise RuntimeError(f"{ident}: rows of a data file missing from its files table at {snapshot_id}")
            locs = pack(slot, table.column("pos").to_numpy())
            order = np.argsort(keys, kind="stable")
            self.keys, self.locs, self.digests = keys[order], locs[order], digests[order]
        log.info(
            "rows of %s at snapshot %s scanned with their digests: %d rows, %.2fs",
            ident,
            snapshot_id,
            len(self.keys),
            time.monotonic() - started,
        )


@dataclass
class Match:
    """Which rows a re-snapshot's commit changes: the mirror rows it leaves (``keep``, by mirror row), the chunk
    rows it does not add (``drop``, positions per new file) and, per new file, the mirror location each chunk row
    replaces (`NO_ROW`: none, a new row)."""

    keep: np.ndarray
    drop: list[np.ndarray]
    replaces: list[np.ndarray]
    unchanged: int  # rows left equal
    updated: int  # chunk rows replacing a mirror row of their key


def match_keyed(
    mirror: MirrorRows,
    keep: np.ndarray,
    window_keys: np.ndarray,
    new_keys: list[np.ndarray],
    new_digests: list[np.ndarray],
) -> Match:
    """Match the chunk rows (per new file: keys and digests, in row order) against ``mirror`` outside the
    window's keys; ``keep`` says which mirror rows the window keeps already."""
    keep = keep.copy()
    keys = mirror.keys
    twice = np.zeros(len(keys), bool)  # a key the mirror holds more than once
    if len(keys) > 1:
        same = keys[1:] == keys[:-1]
        twice[1:] |= same
        twice[:-1] |= same
    drop, replaces = [], []
    unchanged = updated = 0
    for fkeys, fdigests in zip(new_keys, new_digests, strict=True):
        window = np.isin(fkeys, window_keys)
        src = np.full(len(fkeys), NO_ROW, np.int64)
        equal = np.zeros(len(fkeys), bool)
        if len(keys):
            found, idx = find_sorted(keys, fkeys)
            found &= ~window
            equal = found & ~twice[idx] & (mirror.digests[idx] == fdigests)
            keep[idx[equal]] = True
            changed = found & ~equal
            src[changed] = mirror.locs[idx[changed]]
            updated += int(changed.sum())
        unchanged += int(equal.sum())
        drop.append(np.flatnonzero(window | equal))
        replaces.append(src)
    return Match(keep, drop, replaces, unchanged, updated)


def match_keyless(
    mirror: KeylessIndex, keep: np.ndarray, window_contents: np.ndarray, new_keys: list[np.ndarray]
) -> Match:
    """Match a keyless table's chunk rows (per new file: content hashes) against the mirror's copies (in
    ``mirror.rows``' order) outside the window's contents; ``keep`` says which copies the window keeps already."""
    from lakestream.sink.index.keyless import copy_keys

    keep = keep.copy()
    sizes = [len(k) for k in new_keys]
    contents = np.concatenate(new_keys) if new_keys else np.empty(0, "S16")
    outside = np.flatnonzero(~np.isin(contents, window_contents))
    equal = np.zeros(len(contents), bool)
    if len(outside) and len(mirror.rows.keys):
        order = np.argsort(contents[outside], kind="stable")
        hashes = contents[outside][order]
        starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]])
        ordinals = np.arange(len(hashes)) - np.repeat(starts, np.diff(np.r_[starts, len(hashes)]))
        copies = copy_keys(hashes, ordinals)  # the j-th chunk copy of a content is the mirror's j-th
        held = np.isin(copies, mirror.rows.keys)
        keep |= np.isin(mirror.rows.keys, copies[held])
        equal[outside[order[held]]] = True
    window = np.ones(len(contents), bool)
    window[outside] = False
    dropped = window | equal
    bounds = np.cumsum([0, *sizes])
    drop = [np.flatnonzero(dropped[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    replaces = [np.full(n, NO_ROW, np.int64) for n in sizes]
    return Match(keep, drop, replaces, int(equal.sum()), 0)


def keep_row_ids(
    spark: SparkSession,
    catalog: str,
    namespace: str,
    table: str,
    base: int,
    mirror_paths: list[str],
    files: list[dict[str, Any]],
    replaces: list[np.ndarray],
    rewritten: set[str],
) -> bool:
    """Give each chunk row that replaces a mirror row that row's ``_row_id``: the new files holding such rows (or
    rewritten so by an earlier attempt) are rewritten in place with the ids, and their entries' ``file_size``
    updated. False when the table does not track lineage (format < 3). Raises `StaleLineage` when the table is
    no longer at ``base``."""
    from lakestream.sink.commit.lineage import ROW_IDS, UNKNOWN, write_lineage

    wanted = [i for i, src in enumerate(replaces) if np.any(src >= 0) or files[i]["path"] in rewritten]
    if not wanted:
        return True
    sources = np.concatenate([replaces[i][replaces[i] >= 0] for i in wanted])
    file_ids, positions = unpack(np.unique(sources))
    groups = np.unique(file_ids).tolist()
    found = ROW_IDS.lookup(
        spark,
        catalog,
        namespace,
        table,
        base,
        [mirror_paths[f] for f in groups],
        [positions[file_ids == f] for f in groups],
    )
    if found is None:
        return False
    located = np.unique(sources)  # sorted, as the ids are
    ids_of = np.concatenate(found) if found else np.empty(0, np.int64)
    # `found` follows the groups (file ids ascending), then positions ascending: the packed order of ``located``.
    rewrites = []
    for i in wanted:
        src = replaces[i]
        ids = np.full(len(src), UNKNOWN, np.int64)
        hit = src >= 0
        ids[hit] = ids_of[np.searchsorted(located, src[hit])]
        rewrites.append((files[i]["path"], ids))
    with ThreadPoolExecutor(max_workers=min(4, len(rewrites))) as pool:
        sizes = list(pool.map(lambda item: write_lineage(*item), rewrites))
    for i, size in zip(wanted, sizes, strict=True):
        files[i]["file_size"] = size
        rewritten.add(files[i]["path"])
    return True
