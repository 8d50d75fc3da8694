"""Expiry and orphan removal of a pipeline's mirror in the JVM (`LineHistory`): a Puffin file holding the DVs of
two data files stays while one of them is live and goes with the last; after an expiry to one snapshot, the
table's directory holds exactly the files that snapshot references (nothing live deleted, nothing left behind);
an orphan scan removes planted files and never the key index under `_lakestream/`, on the line or not."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from conftest import produce_records

from lakestream.engine.pipeline import Pipeline
from lakestream.maintenance.actions import BESIDE_THE_BATCHES, MaintenanceResult, expire_snapshots, remove_orphan_files
from lakestream.read.inspection import load_java_table

NS = "sexp"


def _path(uri: str) -> Path:
    return Path(urlparse(uri).path)


def _referenced(spark, table: str) -> set[Path]:
    """Every file the table's current snapshot needs: data, deletes, manifests, its manifest list."""
    paths = {r[0] for r in spark.sql(f"SELECT file_path FROM {table}.files").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT path FROM {table}.manifests").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT manifest_list FROM {table}.snapshots").collect()}
    return {_path(p) for p in paths}


def _expire_all_but_current(spark, name: str):
    snapshots = spark.sql(f"SELECT count(*) FROM lake.{name}.snapshots").collect()[0][0]
    result = expire_snapshots(spark, "lake", name, int(time.time() * 1000) + 1, 1, snapshots)
    assert result.status == "ok", result.describe()
    assert result.detail["method"] == "line", result.detail
    return result


def test_a_shared_puffin_file_outlives_its_first_dv_and_goes_with_its_last(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic, name = f"se{suffix}.public.items", f"{NS}.items_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"items_{suffix}"}], name=f"se{suffix}"
    )
    model: dict[int, int] = {}

    def send(changes: dict[int, int]) -> None:
        produce_records(
            config.kafka.bootstrap_servers,
            topic,
            [
                (
                    json.dumps({"id": k}),
                    json.dumps({"before": None, "after": {"id": k, "v": v}, "op": "u" if k in model else "c"}),
                )
                for k, v in changes.items()
            ],
        )
        model.update(changes)

    def rows() -> dict[int, int]:
        got = spark.sql(f"SELECT id, v FROM lake.{name}").collect()
        assert len(got) == len({r["id"] for r in got}), "a key has two rows"
        return {r["id"]: r["v"] for r in got}

    pipeline = Pipeline(config, spark)
    try:
        send({k: 0 for k in range(100)})
        pipeline.run_batch()
        send({k: 0 for k in range(100, 200)})
        pipeline.run_batch()
        send({5: 1, 105: 1})  # one Puffin file: a DV for each of the two files
        pipeline.run_batch()
        deletes = spark.sql(f"SELECT file_path, referenced_data_file FROM lake.{name}.delete_files").collect()
        puffins = {r["file_path"] for r in deletes}
        assert len(deletes) == 2 and len(puffins) == 1, deletes
        shared = _path(puffins.pop())

        send({6: 1})  # the first file's DV moves to a new Puffin file; the shared one keeps the second's
        pipeline.run_batch()
        send({300: 0})  # a snapshot after it, so the one that removed the DV's entry is expired
        pipeline.run_batch()
        first = _expire_all_but_current(spark, name)
        assert first.detail["expired_snapshots"] == 4 and first.detail["deleted_data_files"] == 0
        assert shared.exists(), "a Puffin file holding a live DV was deleted"
        assert rows() == model

        send({106: 1})  # the shared file's last live DV is replaced
        pipeline.run_batch()
        send({301: 0})
        pipeline.run_batch()
        second = _expire_all_but_current(spark, name)
        assert not shared.exists(), "the Puffin file no snapshot references was left behind"
        assert second.detail["deleted_position_delete_files"] >= 1 and second.detail["deleted_manifest_lists"] == 2
        # Deleted on the expiry's own paced threads at its nice, not in a burst on HadoopFileIO's bulk pool.
        assert second.detail["delete_nice"] >= BESIDE_THE_BATCHES["nice"]
        assert rows() == model

        location = _path(spark.sql(f"SELECT file_path FROM lake.{name}.files LIMIT 1").collect()[0][0]).parents[1]
        on_disk = {
            p
            for sub in ("data", "metadata")
            for p in (location / sub).rglob("*")
            if p.is_file() and not p.name.endswith((".metadata.json", ".crc"))
        }
        assert on_disk == _referenced(spark, f"lake.{name}")
    finally:
        pipeline.close()


def test_orphans_go_and_the_key_index_and_every_referenced_file_stay(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic, name = f"so{suffix}.public.items", f"{NS}.orph_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"orph_{suffix}"}], name=f"so{suffix}"
    )
    pipeline = Pipeline(config, spark)
    try:
        for version in range(3):  # files, DVs, several snapshots
            produce_records(
                config.kafka.bootstrap_servers,
                topic,
                [
                    (
                        json.dumps({"id": k}),
                        json.dumps({"before": None, "after": {"id": k, "v": version}, "op": "u" if version else "c"}),
                    )
                    for k in range(50)
                ],
            )
            pipeline.run_batch()
    finally:
        pipeline.close()  # the key index is durable under <location>/_lakestream/
    table = f"lake.{name}"
    location = _path(spark.sql(f"SELECT file_path FROM {table}.files LIMIT 1").collect()[0][0]).parents[1]
    index_files = [p for p in (location / "_lakestream").rglob("*") if p.is_file()]
    assert index_files

    def plant(relative: str) -> Path:
        path = location / relative
        path.write_bytes(b"not referenced by any snapshot")
        return path

    def age_everything() -> None:
        old = time.time() - 5 * 86400  # a quiet table: even its index files are days old
        for p in location.rglob("*"):
            if p.is_file():
                os.utime(p, (old, old))

    def remove() -> MaintenanceResult:
        result = remove_orphan_files(
            spark, "lake", name, load_java_table(spark, "lake", name), int((time.time() - 3 * 86400) * 1000)
        )
        assert result.status == "ok", result.describe()
        return result

    def still_whole() -> None:
        assert all(p.exists() for p in index_files), "the key index was taken for orphans"
        referenced = {r[0] for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()}
        referenced |= {r[0] for r in spark.sql(f"SELECT path FROM {table}.all_manifests").collect()}
        referenced |= {r[0] for r in spark.sql(f"SELECT manifest_list FROM {table}.snapshots").collect()}
        assert all(_path(p).exists() for p in referenced)
        assert spark.sql(f"SELECT count(*), sum(v) FROM {table}").collect()[0][:] == (50, 100)

    planted = [plant("data/orphan-a.parquet"), plant("metadata/orphan-b.avro")]
    age_everything()
    line = remove()
    assert line.detail["method"] == "line"
    assert sorted(_path(p) for p in line.detail["orphans"]) == sorted(planted)
    assert not any(p.exists() for p in planted)
    assert line.detail["delete_nice"] >= BESIDE_THE_BATCHES["nice"]  # deleted paced, at the scan's priority
    still_whole()

    # A tag takes the table off the line: Iceberg's procedure lists, and the index is still left out.
    spark.sql(f"ALTER TABLE {table} CREATE TAG kept")
    planted = [plant("data/orphan-c.parquet")]
    age_everything()
    procedure = remove()
    assert procedure.detail["method"] == "procedure"
    assert [_path(p) for p in procedure.detail["orphans"]] == planted and not planted[0].exists()
    still_whole()


def test_expiry_and_orphan_scans_read_on_threads_at_a_lower_priority(spark):
    from lakestream.maintenance.actions import BESIDE_THE_BATCHES

    history = spark.sparkContext._jvm.lakestream.LineHistory
    as_they_are = history.poolNiceness(json.dumps({"threads": 1}))
    assert as_they_are > -100, "no /proc/thread-self: the priority cannot be read"
    assert BESIDE_THE_BATCHES["nice"] > 0
    assert history.poolNiceness(json.dumps(BESIDE_THE_BATCHES)) == max(as_they_are, BESIDE_THE_BATCHES["nice"])
    # The pool's threads end with the call: the JVM's other threads (the batches' commits) keep their priority.
    assert history.poolNiceness(json.dumps({"threads": 1})) == as_they_are
