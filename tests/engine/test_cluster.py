"""The pipeline on a Spark standalone cluster: executors in their own processes write the data files,
the driver commits them. Nothing may depend on state local to the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import yaml
from conftest import catalog_settings, produce_records


def test_pipeline_on_a_standalone_cluster(stack, spark, spark_cluster, service_dir_factory):
    suffix = uuid.uuid4().hex[:6]
    topic = f"cl{suffix}.public.accounts"
    events = []
    for i in range(1, 401):
        events.append(({"id": i}, {"before": None, "after": {"id": i, "balance": i * 10, "owner": f"o{i}"}, "op": "c"}))
    for i in range(1, 401, 3):
        events.append(({"id": i}, {"before": None, "after": {"id": i, "balance": -i, "owner": f"o{i}"}, "op": "u"}))
    for i in range(2, 401, 7):
        events.append(({"id": i}, {"before": {"id": i}, "after": None, "op": "d"}))
    produce_records(stack.bootstrap_servers, topic, [(json.dumps(k), json.dumps(v)) for k, v in events])
    work = service_dir_factory("cluster-run")
    config = {
        "name": f"cluster{suffix}",
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "group_id": f"cluster{suffix}"},
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topics": [topic], "namespace": "cluster", "table": f"accounts_{suffix}"}],
        "engine": {"commit_interval_s": 0, "max_records_per_task": 200},
        # The configuration a real cluster takes (docs/deploying.md, "Running on a cluster").
        "spark": {
            "master": spark_cluster,
            "driver_memory": "1g",
            "conf": {
                "spark.executor.memory": "768m",
                "spark.executor.cores": "1",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            },
        },
        "state_dir": str(work / "state"),
    }
    path = work / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    run = subprocess.run(
        [sys.executable, "-m", "lakestream.cli", "run", str(path), "--until-idle"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want = {i: (-i if i % 3 == 1 else i * 10) for i in range(1, 401) if i % 7 != 2}
    got = {
        r["id"]: r["balance"] for r in spark.sql(f"SELECT id, balance FROM lake.cluster.accounts_{suffix}").collect()
    }
    assert got == want
    tasks = spark.sql(f"SELECT count(*) FROM lake.cluster.accounts_{suffix}.files").collect()[0][0]
    assert tasks >= 2  # several tasks wrote files (max_records_per_task=200)
