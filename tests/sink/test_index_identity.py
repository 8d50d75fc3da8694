"""What a key is, and which table and key a saved index is of (issue 21, item 6).

- Composite keys hash an unambiguous encoding of their values: ``('a\\x1fb', 'c')`` and ``('a', 'b\\x1fc')``
  are two keys, in the write tasks and in a table scan alike (both go through `index_keys`).
- A saved index records the key columns, the table's UUID and the key encoding, and is loaded only when
  all three match: a restart after a change of ``key_columns`` (no snapshot in between) or for another
  table of the same name scans instead of trusting keys of something else.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pyarrow as pa
from conftest import produce_records

from lakestream.engine.pipeline import Pipeline
from lakestream.sink.index.keys import index_keys, pack, row_keys
from lakestream.sink.index.memory import KeyIndex


def test_composite_keys_with_the_separator_inside_are_distinct():
    one = pa.table({"a": ["a\x1fb", "x"], "b": ["c", None]})
    two = pa.table({"a": ["a", "x\x1f"], "b": ["b\x1fc", None]})
    k1, k2 = index_keys(one, ["a", "b"]), index_keys(two, ["a", "b"])
    assert k1[0] != k2[0]
    # The same values give the same key however the column arrives (a task's chunked column or a scan's).
    again = pa.Table.from_batches([pa.record_batch({"a": ["a\x1fb"], "b": ["c"]})])
    assert index_keys(again, ["a", "b"])[0] == k1[0]
    # Whole-row identities of keyless tables: the same separator and null ambiguity is gone.
    schema = pa.schema([("a", pa.string()), ("b", pa.string())])
    assert row_keys(one.slice(0, 1), schema)[0] != row_keys(two.slice(0, 1), schema)[0]
    nulls = pa.table({"a": pa.array([None, "\x00"], pa.string()), "b": ["z", "z"]})
    h = row_keys(nulls, schema)
    assert h[0] != h[1]


def _saved(tmp_path, key_columns, table_uuid):
    from lakestream.sink.index.disk import DiskKeyIndex
    from lakestream.sink.index.store import IndexStore

    index = DiskKeyIndex(False, key_columns, table_uuid)
    index.update(np.array([1, 2, 3], np.int64), pack(np.array([index.file_id("f1")] * 3), np.array([0, 1, 2])))
    index.snapshot_id, index.valid = 42, True
    IndexStore(str(tmp_path / "store")).persist(index)
    return str(tmp_path / "store")


def test_a_saved_index_is_loaded_only_for_its_table_and_key_columns(tmp_path):
    from lakestream.sink.index.disk import DiskKeyIndex
    from lakestream.sink.index.store import IndexStore

    location = _saved(tmp_path, ["id"], "uuid-1")

    def load(key_columns, table_uuid, hashed=False):
        return IndexStore(location).load(DiskKeyIndex(hashed, key_columns, table_uuid))

    loaded = load(["id"], "uuid-1")
    assert loaded is not None and loaded.snapshot_id == 42 and len(loaded) == 3
    assert load(["id"], "uuid-2") is None  # another table of the same name
    assert load(["code"], "uuid-1") is None  # the key columns changed
    assert load(["id"], "uuid-1", hashed=True) is None
    # The in-memory KeyIndex's own saved form (keyless tables) checks the same identity.
    index = KeyIndex(False, ["id"], "uuid-1")
    index.update(np.array([1], np.int64), np.array([0], np.int64))
    index.snapshot_id, index.valid = 42, True
    index.save(tmp_path / "t.npz")
    assert KeyIndex.load(tmp_path / "t.npz", False, 42, ["id"], "uuid-1") is not None
    assert KeyIndex.load(tmp_path / "t.npz", False, 42, ["id"], "uuid-2") is None
    assert KeyIndex.load(tmp_path / "t.npz", False, 42, ["code"], "uuid-1") is None


def test_a_restart_with_other_key_columns_does_not_use_the_saved_index(stack, spark, pipeline_config_factory):
    """Both candidate keys are integers and the table does not move between the runs: before the fix the
    index saved for ``id`` was loaded for ``code`` and an update of code 1 deleted the row of id 1."""
    suffix = uuid.uuid4().hex[:6]
    topic, table = f"kc{suffix}.public.items", f"lake.kc.items_{suffix}"

    def change(i, v, op="c"):
        row = {"id": i, "code": 11 - i, "v": v}
        return json.dumps({"id": i}), json.dumps({"before": None, "after": row, "op": op})

    def config(key):
        return pipeline_config_factory(
            [{"topics": [topic], "namespace": "kc", "table": f"items_{suffix}", "key_columns": [key]}],
            name=f"kc{suffix}",
        )

    first_config = config("id")
    first = Pipeline(first_config, spark)
    produce_records(stack.bootstrap_servers, topic, [change(i, 0) for i in range(1, 11)])
    first.run_batch()
    first.close()  # saves the index keyed on id
    second_config = config("code")
    second_config.state_dir = first_config.state_dir  # the same state directory: the saved index is there
    second = Pipeline(second_config, spark)
    try:
        produce_records(stack.bootstrap_servers, topic, [change(10, 5, "u")])  # id 10 is code 1
        second.run_batch()
    finally:
        second.close()
    rows = {r["id"]: r["v"] for r in spark.sql(f"SELECT id, v FROM {table}").collect()}
    assert rows == {**{i: 0 for i in range(1, 10)}, 10: 5}


def test_composite_keys_with_the_separator_are_two_rows_in_the_mirror(stack, spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic, table = f"ck{suffix}.public.pairs", f"lake.ck.pairs_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "ck", "table": f"pairs_{suffix}", "key_columns": ["a", "b"]}],
        name=f"ck{suffix}",
    )

    def change(a, b, v, op="c"):
        return json.dumps({"a": a, "b": b}), json.dumps({"before": None, "after": {"a": a, "b": b, "v": v}, "op": op})

    pipeline = Pipeline(config, spark)
    try:
        produce_records(stack.bootstrap_servers, topic, [change("a\x1fb", "c", 1), change("a", "b\x1fc", 2)])
        pipeline.run_batch()
        produce_records(stack.bootstrap_servers, topic, [change("a", "b\x1fc", 3, "u")])
        pipeline.run_batch()
    finally:
        pipeline.close()
    rows = sorted((r["a"], r["b"], r["v"]) for r in spark.sql(f"SELECT a, b, v FROM {table}").collect())
    assert rows == [("a", "b\x1fc", 3), ("a\x1fb", "c", 1)]
