"""Snapshot expiry of a pipeline's mirror in the JVM (`SnapshotExpiry`): a Puffin file holding the DVs of two
data files stays while one of them is live and goes with the last; after an expiry to one snapshot, the table's
directory holds exactly the files that snapshot references (nothing live deleted, nothing left behind)."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from conftest import produce_records
from lakestream.engine.pipeline import Pipeline
from lakestream.maintenance.actions import expire_snapshots

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
    config = pipeline_config_factory([{"topics": [topic], "namespace": NS, "table": f"items_{suffix}"}],
                                     name=f"se{suffix}")
    model: dict[int, int] = {}

    def send(changes: dict[int, int]) -> None:
        produce_records(config.kafka.bootstrap_servers, topic, [
            (json.dumps({"id": k}), json.dumps({"before": None, "after": {"id": k, "v": v},
                                                "op": "u" if k in model else "c"}))
            for k, v in changes.items()])
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
        assert rows() == model

        location = _path(spark.sql(f"SELECT file_path FROM lake.{name}.files LIMIT 1").collect()[0][0]).parents[1]
        on_disk = {p for sub in ("data", "metadata") for p in (location / sub).rglob("*")
                   if p.is_file() and not p.name.endswith((".metadata.json", ".crc"))}
        assert on_disk == _referenced(spark, f"lake.{name}")
    finally:
        pipeline.close()
