"""The key index beside tables on object storage: each table's generations are named gen-<seq> under its own
location, and the driver maps a local copy of them; two tables must never share that copy (before 8c03274 the
copy was keyed by the generation's name alone, so the second table was served the first one's keys: duplicates
on S3). No Spark: the index's own store, on the suite's S3-compatible store."""

from __future__ import annotations

import uuid

import numpy as np

from lakestream.sink.index.disk import DiskKeyIndex
from lakestream.sink.index.keys import MISSING, pack
from lakestream.sink.index.store import IndexStore, store_location
from lakestream.storage import S3Options, StorageContext, active_options, use_options


def _index(table_uuid: str, keys: np.ndarray, data_file: str) -> DiskKeyIndex:
    index = DiskKeyIndex(hashed=False, key_columns=["id"], table_uuid=table_uuid)
    fid = index.file_id(data_file)
    index.update(keys, pack(np.full(len(keys), fid), np.arange(len(keys))))
    index.snapshot_id, index.valid = 1, True
    return index


def test_two_tables_on_object_storage_keep_their_own_key_index(object_store):
    s = object_store.settings
    before = active_options()
    use_options(
        StorageContext(
            S3Options(
                region=s.s3_region,
                endpoint=object_store.endpoint,
                path_style=True,
                access_key=s.s3_access_key,
                secret_key=s.s3_secret_key,
            )
        )
    )
    try:
        run = uuid.uuid4().hex[:8]
        tables = {}
        for name, first in (("a", 0), ("b", 1_000)):
            location = f"{object_store.warehouse}/keyidx_{run}/{name}"
            keys = np.arange(first, first + 50, dtype=np.int64)
            index = _index(f"uuid-{run}-{name}", keys, f"{location}/data/{name}.parquet")
            IndexStore(store_location(location)).write_base(index)  # both tables' first generation: gen-<1>
            assert index.generation == "gen-000000000001"
            tables[name] = (location, keys, index)
        expected = pack(np.zeros(50), np.arange(50)).tolist()
        for name, (location, keys, written) in tables.items():
            other_keys = tables["b" if name == "a" else "a"][1]
            loaded = IndexStore(store_location(location)).load(
                DiskKeyIndex(hashed=False, key_columns=["id"], table_uuid=f"uuid-{run}-{name}")
            )
            assert loaded is not None and loaded.snapshot_id == 1
            assert loaded.paths == [f"{location}/data/{name}.parquet"]
            for index in (written, loaded):  # the generation each one maps is its own table's
                assert index.lookup(keys).tolist() == expected, name
                assert (index.lookup(other_keys) == MISSING).all(), f"table {name} is served the other one's keys"
    finally:
        use_options(before)
