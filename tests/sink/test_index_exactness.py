"""The key index stays exact when snapshots the pipeline did not write change the table (compaction
moves rows, another writer inserts/updates/deletes), and every engine reads exact results at every
snapshot of a table written with deletion vectors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from conftest import produce_records

from lakestream.engine.pipeline import Pipeline


def _change(i: int, v: int, op: str = "u"):
    after = None if op == "d" else {"id": i, "v": v, "tag": f"t{i}-{v}"}
    before = {"id": i} if op == "d" else None
    return json.dumps({"id": i}), json.dumps({"before": before, "after": after, "op": op})


def _drain(pipeline: Pipeline) -> None:
    for _ in range(20):
        result = pipeline.run_batch()
        if result is None or (result.advanced == 0 and not result.tables):
            return
    raise AssertionError("the pipeline did not become idle")


@pytest.fixture
def mirror(stack, spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic = f"ix{suffix}.public.items"
    table = f"lake.ix.items_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": "ix", "table": f"items_{suffix}"}],
        name=f"ix{suffix}",
        engine={"max_records_per_task": 150},
    )
    pipeline = Pipeline(config, spark)
    yield topic, table, pipeline
    pipeline.close()


def _sender(stack, topic: str, expected: dict[int, tuple]):
    """A function producing changes (id, v[, op]) to ``topic`` and applying them to ``expected``."""

    def send(changes):
        produce_records(stack.bootstrap_servers, topic, [_change(*c) for c in changes])
        for i, v, *op in changes:
            if op and op[0] == "d":
                expected.pop(i, None)
            else:
                expected[i] = (v, f"t{i}-{v}")

    return send


def _rows(spark, sql: str) -> dict[int, tuple]:
    rows = spark.sql(sql).collect()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate keys: {sorted(i for i in ids if ids.count(i) > 1)[:10]}"
    return {r["id"]: (r["v"], r["tag"]) for r in rows}


def test_index_survives_compaction_and_another_writer(stack, spark, mirror, monkeypatch):
    """... and follows them by diff (the files each snapshot added and removed), never by a full scan."""
    topic, table, pipeline = mirror
    expected: dict[int, tuple] = {}
    rebuilds = _count_rebuilds(monkeypatch)

    send = _sender(stack, topic, expected)

    send([(i, 0, "c") for i in range(1, 301)])
    _drain(pipeline)
    send([(i, 1) for i in range(1, 301, 2)] + [(i, 0, "d") for i in range(3, 301, 5)])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected

    # Compaction (maintenance): every row moves to a new file and position.
    name = table.split(".", 1)[1]
    spark.sql(
        f"CALL lake.system.rewrite_data_files(table => '{name}', "
        f"options => map('rewrite-all', 'true', 'delete-file-threshold', '1'))"
    ).collect()
    send([(i, 2) for i in range(1, 301, 4)] + [(i, 0, "d") for i in range(2, 301, 9)])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected

    # Another writer: a backfill insert touching no file of ours (no commit conflict to hide a stale
    # index), then changes of that key from the source.
    spark.sql(f"INSERT INTO {table} VALUES (1000, 5, 't1000-5'), (1001, 5, 't1001-5')")
    expected[1001] = (5, "t1001-5")
    send([(1000, 4)])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected
    # ... a manual fix and a manual delete.
    spark.sql(f"UPDATE {table} SET v = 99, tag = 't13-99' WHERE id = 13")
    spark.sql(f"DELETE FROM {table} WHERE id = 17")
    expected[1000], expected[13] = (5, "t1000-5"), (99, "t13-99")
    expected.pop(17)
    send([(1000, 6), (13, 7), (17, 8, "c"), (19, 0, "d"), (21, 9)])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected
    # ADD COLUMN moves no row: the index is kept.
    spark.sql(f"ALTER TABLE {table} ADD COLUMN note string")
    send([(5, 11), (7, 0, "d")])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected
    deletes = spark.sql(f"SELECT count(*) FROM {table}.delete_files").collect()[0][0]
    assert deletes > 0  # the upserts really went through deletion vectors
    assert [s for s in rebuilds if s is not None] == []  # no full scan of the table, ever


def _count_rebuilds(monkeypatch) -> list[int | None]:
    """The snapshots at which a key index is rebuilt from a full scan, from now on."""
    from lakestream.sink.index.disk import DiskKeyIndex

    rebuilds: list[int | None] = []
    real_rebuild = DiskKeyIndex.rebuild

    def counting_rebuild(self, spark_, ident, snapshot_id):
        rebuilds.append(snapshot_id)
        return real_rebuild(self, spark_, ident, snapshot_id)

    monkeypatch.setattr(DiskKeyIndex, "rebuild", counting_rebuild)
    return rebuilds


def test_the_index_is_durable_with_every_commit(stack, spark, mirror, monkeypatch, pipeline_config_factory):
    """The index is durable beside the table with each commit: a pipeline that dies (no close) restarts
    from it without a scan; one that died between a commit and its index delta, or after which another
    writer committed, catches up from the table's snapshots since (a diff), again without a scan. The files
    live under the table's location, where orphan removal leaves them alone."""
    from lakestream.engine.registry import TableRegistry

    topic, table, pipeline = mirror
    config = pipeline.config
    expected: dict[int, tuple] = {}
    send = _sender(stack, topic, expected)
    rebuilds = _count_rebuilds(monkeypatch)
    send([(i, 0, "c") for i in range(1, 201)])
    _drain(pipeline)
    send([(i, 1) for i in range(1, 201, 3)] + [(i, 0, "d") for i in range(5, 201, 7)])
    _drain(pipeline)
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").where("col_name = 'Location'").collect()[0][1]
    store = Path(location.replace("file:", "", 1)) / "_lakestream" / "index"
    assert any(p.name.startswith("base-") for p in store.iterdir())
    assert any(p.name.startswith("gen-") and p.is_dir() for p in store.iterdir())
    assert any(p.name.startswith("delta-") for p in store.iterdir())
    assert not (Path(config.state_dir) / "indexes").exists()  # nothing on the driver's disk
    # Dies: no close(), nothing saved at exit.
    pipeline = Pipeline(config, spark)
    send([(i, 2) for i in range(2, 201, 5)] + [(i, 0, "d") for i in range(3, 201, 11)])
    _drain(pipeline)
    assert _rows(spark, f"SELECT * FROM {table}") == expected

    # Dies between a commit and its delta: the next start follows that snapshot by diff.
    monkeypatch.setattr(TableRegistry, "persist_index", lambda self, name: None)
    send([(i, 3) for i in range(1, 201, 9)] + [(10, 0, "d"), (1000, 1, "c")])
    _drain(pipeline)
    monkeypatch.undo()
    rebuilds = _count_rebuilds(monkeypatch)
    # ... and another writer moves the table on while no pipeline runs.
    spark.sql(f"UPDATE {table} SET v = 77, tag = 't4-77' WHERE id = 4")
    spark.sql(f"DELETE FROM {table} WHERE id = 6")
    expected[4] = (77, "t4-77")
    expected.pop(6, None)
    again = Pipeline(config, spark)
    send([(4, 8), (6, 0, "c"), (1000, 2), (12, 0, "d")])
    _drain(again)
    assert _rows(spark, f"SELECT * FROM {table}") == expected
    again.close()
    assert [s for s in rebuilds if s is not None] == []

    # Orphan removal lists the table's location: it removes a real orphan and leaves the index's files alone.
    import os
    import time

    from lakestream.maintenance.runner import maintain_table

    root = store.parent.parent
    files = sorted(store.iterdir())
    orphan = root / "data" / "orphan-old.parquet"
    orphan.write_bytes(b"not referenced")
    old = time.time() - 5 * 86400
    for path in [*files, store, store.parent, orphan]:
        os.utime(path, (old, old))
    maintenance = pipeline_config_factory(
        [{"topics": [topic]}], maintenance={"policies": [{"tables": ".*", "orphan_min_age_s": 3 * 86400}]}
    )
    results = maintain_table(spark, maintenance, table.split(".", 1)[1])
    [orphans] = [r for r in results if r.action == "remove_orphans"]
    assert orphans.status == "ok", orphans
    assert not orphan.exists()
    assert all(path.exists() for path in files)


def test_a_diff_lists_only_the_rows_each_snapshot_deleted(stack, spark, mirror, monkeypatch):
    """A v3 table keeps one deletion vector per data file, so a commit that deletes one more row of a file
    rewrites its whole vector. The diff a restart follows lists only the positions the snapshot newly deleted:
    at 100M rows a batch's vectors hold tens of millions of earlier positions, which once filled a 2g driver's
    heap as JSON. Past the limit of listed positions the index is built again instead."""
    from lakestream.engine.registry import TableRegistry
    from lakestream.sink.catalog.sink import snapshot_changes
    from lakestream.sink.index import diff

    topic, table, pipeline = mirror
    expected: dict[int, tuple] = {}
    send = _sender(stack, topic, expected)
    send([(i, 0, "c") for i in range(1, 301)])
    _drain(pipeline)
    send([(i, 1) for i in range(1, 301, 2)])
    _drain(pipeline)
    _, ns, name = table.split(".")
    before = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    changed = set(range(2, 41, 2)) | set(range(41, 51))
    send([(i, 2) for i in range(2, 41, 2)] + [(i, 0, "d") for i in range(41, 51)])
    _drain(pipeline)

    changes = snapshot_changes(spark, "lake", ns, name, before)
    [snap] = changes["snapshots"]
    rows = {
        (r["_file"], r["_pos"]): r["id"]
        for r in spark.sql(f"SELECT id, _file, _pos FROM {table} VERSION AS OF {before}").collect()
    }
    listed = [
        rows.get((d["data_file"], int(p)), f"a row deleted before ({p})")
        for d in snap["deleted"]
        for p in d["positions"]
    ]
    assert len(listed) == len(changed) and set(listed) == changed  # not the rows the earlier vectors deleted
    assert not changes.get("positions_over")
    assert snapshot_changes(spark, "lake", ns, name, before, max_positions=5)["positions_over"] is True

    # A restart after a commit whose delta was never written, with more deleted rows than a diff lists:
    # the index is built again (on the executors), and the mirror stays exact.
    monkeypatch.setattr(TableRegistry, "persist_index", lambda self, name: None)
    send([(i, 3) for i in range(1, 120, 3)])
    _drain(pipeline)
    monkeypatch.undo()
    monkeypatch.setattr(diff, "DIFF_MAX", 5)
    rebuilds = _count_rebuilds(monkeypatch)
    again = Pipeline(pipeline.config, spark)
    send([(7, 4), (8, 0, "d")])
    _drain(again)
    again.close()
    assert len([s for s in rebuilds if s is not None]) == 1
    assert _rows(spark, f"SELECT * FROM {table}") == expected


def _duckdb():
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        found = sorted(Path(module.__file__).parent.rglob(f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{found[-1]}'")
    return con


def test_every_engine_reads_exact_rows_at_every_snapshot(stack, spark, mirror):
    from pyiceberg.catalog.sql import SqlCatalog

    topic, table, pipeline = mirror
    states = []
    steps = [
        [(i, 0, "c") for i in range(1, 201)],
        [(i, 1) for i in range(1, 201, 3)],
        [(i, 0, "d") for i in range(2, 201, 4)] + [(i, 2) for i in range(1, 201, 6)],
        [(4, 0, "d"), (4, 3, "c"), (8, 3, "c"), (7, 0, "d")],
    ]
    expected: dict[int, tuple] = {}
    for step in steps:
        produce_records(stack.bootstrap_servers, topic, [_change(*c) for c in step])
        for i, v, *op in step:
            if op and op[0] == "d":
                expected.pop(i, None)
            else:
                expected[i] = (v, f"t{i}-{v}")
        _drain(pipeline)
        snapshot = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[
            0
        ][0]
        states.append((snapshot, dict(expected)))

    uri = (
        f"postgresql+psycopg2://{stack.pg_user}:{stack.pg_password}@127.0.0.1:{stack.pg_port}/"
        + stack.catalog_jdbc_uri().rsplit("/", 1)[1]
    )
    catalog = SqlCatalog("lake", uri=uri, warehouse=stack.warehouse)
    iceberg_table = catalog.load_table(table.split(".", 1)[1])
    con = _duckdb()
    metadata = iceberg_table.metadata_location
    for snapshot, want in states:
        assert _rows(spark, f"SELECT * FROM {table} VERSION AS OF {snapshot}") == want, "spark"
        arrow = iceberg_table.scan(snapshot_id=snapshot).to_arrow()
        got = {r["id"]: (r["v"], r["tag"]) for r in arrow.to_pylist()}
        assert len(got) == arrow.num_rows and got == want, "pyiceberg"
        rows = con.execute(f"SELECT id, v, tag FROM iceberg_scan('{metadata}', snapshot_from_id={snapshot})").fetchall()
        assert len(rows) == len({r[0] for r in rows}) and {r[0]: (r[1], r[2]) for r in rows} == want, "duckdb"
