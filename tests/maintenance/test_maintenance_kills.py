"""SIGKILLs of `lakestream run` inside its own compaction (issue 40): parked at each pause point of the compaction's
plan, write and commit (`lakestream.faults.MAINTENANCE_POINTS`), while updates keep arriving. Each restart must
follow the table by diff — a kill right after the compaction's snapshot landed included, whose rows all moved —
never build the key index again, and the mirror must be exact at the end.

`make test` kills at the point that cost a full build before (the snapshot landed, its index delta not written);
`make chaos` rotates through all five, twice."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid

import pytest
import yaml
from chaos_harness import PipelineProcess
from confluent_kafka import Producer
from conftest import catalog_settings

from lakestream.faults import MAINTENANCE_POINTS, PAUSE_MARKER

log = logging.getLogger(__name__)

KEYS = 3000
RATE = 150  # changes/s
# What a restart must never log: a key index built from a scan of the table.
FULL_BUILD = ("building the key index of", "building it again on the executors", "; rebuilding")
# The restart's diff: snapshots, of which compactions, and the data files it read.
DIFF = re.compile(r"(\d+) snapshot\(s\) \((\d+) compaction\(s\)\), (\d+) file\(s\) read")
WRITTEN = re.compile(r"compaction of (\d+) file\(s\) in (\d+) group\(s\) written")


class UpdateLoad(threading.Thread):
    """Debezium-shaped JSON changes (inserts, updates, some deletes) of ``KEYS`` keys at about ``RATE``/s; ``model``
    holds each key's last value once `stop` returns."""

    def __init__(self, bootstrap: str, topic: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.rng = topic, random.Random(seed)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
        self.model: dict[int, int] = {}
        self.version = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def send(self, key: int, version: int | None) -> None:
        if version is None:
            value = {"before": {"id": key}, "after": None, "op": "d"}
            self.model.pop(key, None)
        else:
            value = {
                "before": None,
                "after": {"id": key, "v": version, "note": f"n{version % 97}"},
                "op": "u" if key in self.model else "c",
            }
            self.model[key] = version
        self.producer.produce(
            self.topic,
            key=json.dumps({"id": key}),
            value=json.dumps(value),
            on_delivery=lambda err, _m: err is not None and self.failures.append(str(err)),
        )

    def seed_rows(self) -> None:
        for key in range(KEYS):
            self.send(key, 0)
        self.producer.flush(30)

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            for _ in range(RATE // 10):
                self.version += 1
                key = self.rng.randrange(KEYS)
                self.send(key, None if self.rng.random() < 0.05 and key in self.model else self.version)
            self.producer.poll(0)
            self.halt.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        self.producer.flush(30)
        assert not self.failures, self.failures[:3]


@pytest.fixture
def compacting_pipeline(stack, service_dir_factory):
    """A pipeline process mirroring one topic with inline maintenance every few seconds, and its update load."""
    run = uuid.uuid4().hex[:6]
    work = service_dir_factory("mkill")
    topic, namespace, table = f"mk{run}.public.items", f"mkill_{run}", "items"
    config = {
        "name": f"mkill-{run}",
        "state_dir": str(work / "state"),
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-mkill-{run}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": [{"topics": [topic], "namespace": namespace, "table": table, "key_columns": ["id"]}],
        "engine": {"commit_interval_s": 0, "max_records_per_batch": 5000, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1g", "conf": {"spark.ui.enabled": "false"}},
        # A round every few seconds that always finds files to compact: each batch writes one.
        "maintenance": {
            "mode": "inline",
            "interval_s": 4,
            "start_delay_s": 0,
            "policies": [
                {
                    "tables": ".*",
                    "compaction": {"max_files_per_partition": 2, "quiet_time_s": 0, "min_input_files": 2},
                    "orphan_min_age_s": 86400 * 3,
                    "orphan_dry_run": True,
                }
            ],
        },
    }
    config_path = work / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(config))
    load = UpdateLoad(stack.bootstrap_servers, topic, seed=int(run, 16))
    load.seed_rows()
    pipeline = PipelineProcess(config_path, work / "pipeline.log")
    try:
        yield pipeline, load, f"lake.{namespace}.{table}"
    finally:
        load.halt.set()
        if pipeline.alive:
            pipeline.kill_group()


def _kill_at(pipeline: PipelineProcess, point: str, last: bool) -> dict:
    """Start the pipeline parked at ``point``, SIGKILL it there, restart it and wait for its first batch: what the
    restart did with the key index, and how long it took. The restart is left running after the ``last`` kill."""
    pipeline.start(pause_at=f"{point}:300")
    pipeline.wait_for(lambda: f"{PAUSE_MARKER} {point}" in pipeline.log_text(), f"pause at {point}", 300)
    pipeline.kill_group()
    killed = time.monotonic()
    written = [tuple(map(int, m)) for m in WRITTEN.findall(pipeline.log_text())]  # (inputs, groups) of the killed run
    pipeline.start()
    pipeline.wait_for(lambda: pipeline.batches(), f"first batch after a kill at {point}", 300)
    restart_s = time.monotonic() - killed
    text = pipeline.log_text()
    builds = [line for line in text.splitlines() if any(b in line for b in FULL_BUILD)]
    diffs = [line for line in text.splitlines() if "key index refreshed by diff" in line]
    log.info("kill at %s: first batch %.1fs after; %s", point, restart_s, diffs[-1] if diffs else "no diff")
    if not last:
        pipeline.kill_group()  # the next start parks at the next point
    return {"point": point, "restart_s": restart_s, "builds": builds, "diffs": diffs, "written": written}


def _mirror(spark, table: str) -> dict[int, int]:
    rows = spark.sql(f"SELECT id, v FROM {table}").collect()
    assert len(rows) == len({r["id"] for r in rows}), "a key has two rows"
    return {r["id"]: r["v"] for r in rows}


@pytest.mark.timeout(2400)
@pytest.mark.parametrize(
    "rotation",
    [
        ("maintenance.commit.landed",),
        pytest.param(MAINTENANCE_POINTS * 2, marks=pytest.mark.chaos),
    ],
    ids=["landed", "all-points-twice"],
)
def test_a_kill_inside_a_compaction_costs_no_index_build(spark, compacting_pipeline, rotation):
    pipeline, load, table = compacting_pipeline
    load.start()
    kills = [_kill_at(pipeline, point, last=i == len(rotation) - 1) for i, point in enumerate(rotation)]
    load.stop()

    deadline = time.monotonic() + 300
    while (lake := _mirror(spark, table)) != load.model:
        assert pipeline.alive, pipeline.tail()
        assert time.monotonic() < deadline, (
            f"mirror not exact: {len(set(load.model) - set(lake))} missing, {len(set(lake) - set(load.model))} "
            f"extra, {sum(lake.get(k) != v for k, v in load.model.items())} differing"
        )
        time.sleep(2)
    text = pipeline.log_text()
    pipeline.kill_group()

    log.info("kills: %s", [(k["point"], round(k["restart_s"], 1)) for k in kills])
    assert [k for k in kills if k["builds"]] == [], "a restart built the key index again"
    assert not any(b in text for b in FULL_BUILD)
    # The kill after the compaction's snapshot landed left the index one compaction behind: followed by its diff.
    # The kill after the compaction's snapshot landed left the index one compaction behind: the restart followed it
    # by reading the files it added alone (one a group), not its inputs.
    landed = [k for k in kills if k["point"] == "maintenance.commit.landed"]
    assert landed, kills
    for k in landed:
        inputs, groups = k["written"][-1]
        assert inputs > groups, k
        followed = [tuple(map(int, m)) for d in k["diffs"] for m in DIFF.findall(d)]
        assert followed and followed[0][1] >= 1, k  # a compaction among the snapshots followed
        assert followed[0] == (1, 1, groups), k  # (snapshots, compactions, files read): its outputs alone
