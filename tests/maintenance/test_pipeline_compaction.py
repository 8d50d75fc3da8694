"""Compaction of an upsert mirror written beside ingestion and committed by the pipeline (issue 21, item 3):
rows deleted in the inputs after the rewrite read them are carried onto the new file, the key index moves
with the rows (no diff, no rebuild), and the mirror stays exact through later updates and a restart."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import produce_records

from lakestream.engine.pipeline import Pipeline
from lakestream.maintenance.compaction import plan_groups
from lakestream.maintenance.runner import write_compaction
from lakestream.sink.commit.rewrites import RewriteGroup, carried_deletes

NS = "pcomp"


def test_carried_deletes_map_input_rows_onto_the_output():
    import numpy as np

    group = RewriteGroup(
        inputs=["a", "b"], records=[5, 4], deleted=[np.array([1, 3], np.int64), np.array([0], np.int64)]
    )
    # Output rows: a0 a2 a4 | b1 b2 b3 → positions 0..5.
    now = {"a": np.array([1, 3, 4], np.int64), "b": np.array([0, 2], np.int64)}
    assert carried_deletes(group, now).tolist() == [2, 4]
    # A row deleted at the start that is live again: not something a rewrite can carry.
    assert carried_deletes(group, {"a": np.array([1], np.int64), "b": np.array([0], np.int64)}) is None


def _policy(**overrides):
    from lakestream.config import CompactionPolicy

    return CompactionPolicy(**({"target_file_size_bytes": 64 << 20, "min_input_files": 4} | overrides))


def _file(path, size, records=1000, deleted=0, key=(0, ())):
    return {"path": path, "size": size, "records": records, "deleted": deleted, "key": key}


def _paths(groups):
    return sorted(sorted(f["path"] for f in g) for g in groups)


def test_small_files_are_merged_per_partition_once_their_size_class_has_enough():
    part = [(0, (("b", str(i)),)) for i in range(2)]
    files = [_file(f"p{i}", 10_000, key=part[i % 2]) for i in range(7)]  # 4 in partition 0, 3 in partition 1
    files.append(_file("alone", 5_000, key=(0, (("b", "9"),))))
    assert _paths(plan_groups(files, _policy())) == [["p0", "p2", "p4", "p6"]]
    assert _paths(plan_groups(files, _policy(min_input_files=3))) == [["p0", "p2", "p4", "p6"], ["p1", "p3", "p5"]]


def test_a_file_a_round_wrote_waits_for_peers_of_its_size_instead_of_being_rewritten_every_round():
    # A table far below the target size: the earlier round's 3 MB output is not rewritten with each round's new
    # small files (that rewrote the whole table every round); it is merged once three more of its class exist.
    news = [_file(f"new{i}", 60_000) for i in range(5)]
    assert _paths(plan_groups([_file("compacted", 3 << 20), *news], _policy())) == [[f"new{i}" for i in range(5)]]
    peers = [_file(f"c{i}", (2 << 20) + i) for i in range(3)]
    assert _paths(plan_groups([_file("compacted", 3 << 20), *peers], _policy())) == [["c0", "c1", "c2", "compacted"]]


def test_a_file_with_a_large_share_of_deleted_rows_is_rewritten_even_alone_and_large():
    big = _file("big", 60 << 20, records=1000, deleted=400)
    assert _paths(plan_groups([big, _file("light", 60 << 20, records=1000, deleted=100)], _policy())) == [["big"]]
    assert plan_groups([big], _policy(delete_ratio_threshold=0.5)) == []
    # Small files no larger than it join it, however few (it is rewritten anyway); larger ones wait for peers.
    heavy = _file("heavy", 5_000, records=100, deleted=40)
    assert _paths(plan_groups([heavy, _file("s1", 3_000), _file("s2", 9_000)], _policy())) == [["heavy", "s1"]]


def test_groups_are_bounded_by_rows_and_a_round_by_bytes_smallest_files_first():
    files = [_file(f"f{i}", 100_000, records=300_000) for i in range(8)]
    groups = plan_groups(files, _policy(max_rows_per_file=1_000_000))
    assert [len(g) for g in groups] == [3, 3, 2]  # 900k live rows at most a file
    # A file with 3/4 of the row cap is full: never rewritten for its size.
    assert (
        plan_groups(
            [_file(f"full{i}", 100_000, records=800_000) for i in range(6)], _policy(max_rows_per_file=1_000_000)
        )
        == []
    )
    # Smallest files first (a group's files are taken by size), then the groups that still fit the round's bytes.
    tiny = [_file(f"t{i}", 1_000, records=10) for i in range(4)]
    taken = plan_groups(files + tiny, _policy(max_rows_per_file=1_000_000, max_bytes_per_round=500_000))
    assert _paths(taken) == [["f0", "f1", "f2", "t0", "t1", "t2", "t3"]]  # 304 kB; 300 kB more would pass 500 kB
    assert _paths(plan_groups(files, _policy(max_rows_per_file=1_000_000, max_bytes_per_round=1))) == [
        ["f0", "f1", "f2"]
    ]  # one group at least


@pytest.fixture
def mirror(stack, spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic, name = f"pc{suffix}.public.items", f"{NS}.items_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"items_{suffix}"}],
        name=f"pc{suffix}",
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [
                {
                    "tables": ".*",
                    "compaction": {
                        "max_files_per_partition": 2,
                        "quiet_time_s": 600,
                        "min_input_files": 3,
                        "target_file_size_bytes": 64 * 1024 * 1024,
                    },
                }
            ],
        },
    )
    model: dict[int, int] = {}

    def send(changes: list[tuple[int, int | None]]) -> None:
        records = []
        for key, version in changes:
            if version is None:
                records.append((json.dumps({"id": key}), json.dumps({"before": {"id": key}, "after": None, "op": "d"})))
                model.pop(key, None)
            else:
                records.append(
                    (
                        json.dumps({"id": key}),
                        json.dumps(
                            {"before": None, "after": {"id": key, "v": version}, "op": "u" if key in model else "c"}
                        ),
                    )
                )
                model[key] = version
        produce_records(stack.bootstrap_servers, topic, records)

    return config, name, send, model


def _rows(spark, name):
    rows = spark.sql(f"SELECT id, v FROM lake.{name}").collect()
    assert len(rows) == len({r["id"] for r in rows}), "a key has two rows"
    return {r["id"]: r["v"] for r in rows}


def test_compaction_written_beside_batches_is_committed_with_their_deletes(spark, mirror, monkeypatch):
    from lakestream.sink.index import diff

    config, name, send, model = mirror
    pipeline = Pipeline(config, spark)
    send([(k, 0) for k in range(200)])
    pipeline.run_batch()
    for version in (1, 2, 3):  # each batch: a file, and deletes in the files before it
        send([(k, version) for k in range(version * 10, 200, 7)] + [(version, None)])
        pipeline.run_batch()
    files_before = spark.sql(f"SELECT count(*) FROM lake.{name}.data_files").collect()[0][0]
    assert files_before >= 4

    spec = pipeline.compacted_here()[name]
    policy = config.maintenance.policy_for(name)
    from lakestream.maintenance.runner import plan_table

    plan = plan_table(spark, config, name)
    assert plan.hot_skipped and not plan.compact  # hot: Iceberg's procedure would leave it alone
    prepared = write_compaction(spark, config.catalog.name, name, plan.hot_skipped, policy, spec)
    assert prepared is not None and sum(len(g.inputs) for g in prepared.groups) == files_before

    # Batches commit while the rewrite waits: updates and deletes of rows the rewrite copied.
    copied = set(model)
    changed = set(range(0, 200, 3)) | {5, 50, 150}
    send([(k, 10) for k in range(0, 200, 3)] + [(k, None) for k in (5, 50, 150)])
    pipeline.run_batch()
    diffs: list[object] = []
    monkeypatch.setattr(diff, "refresh_by_diff", lambda *a: diffs.append(a) or {})
    [result] = pipeline.commit_compactions([prepared])
    assert result.status == "ok", result.describe()
    # Every copied row updated or deleted since the rewrite read it is deleted in the new file; the rest move.
    assert result.detail["deletes_carried"] == len(copied & changed)
    assert result.detail["rows_moved"] == len(copied - changed)
    snapshots = spark.sql(f"SELECT operation, summary FROM lake.{name}.snapshots ORDER BY committed_at").collect()
    assert snapshots[-1]["operation"] == "replace"
    assert _rows(spark, name) == model
    live_files = spark.sql(f"SELECT file_path FROM lake.{name}.data_files").collect()
    assert len(live_files) == 2  # the new file, and the batch's own (written after the rewrite started)
    # Write amplification as health reports it: the compaction's bytes against the batches' (data files and DVs).
    from lakestream.read.inspection import collect_table_metrics

    sizes = [(r["operation"], int(r["summary"]["added-files-size"])) for r in snapshots]
    figures = collect_table_metrics(spark, config.catalog.name, name).write_amplification()
    assert figures["rewritten_bytes"] == sum(n for op, n in sizes if op == "replace") > 0
    assert figures["ingested_bytes"] == sum(n for op, n in sizes if op != "replace") > 0
    assert figures["ratio"] == round(figures["rewritten_bytes"] / figures["ingested_bytes"], 2)
    planned = collect_table_metrics(spark, config.catalog.name, name, for_plan=True).write_amplification()
    assert {k: v for k, v in figures.items() if k != "window_s"} == {
        k: v for k, v in planned.items() if k != "window_s"
    }

    # The index moved with the rows: later changes of moved keys delete their rows in the new file.
    send([(k, 20) for k in range(1, 200, 5)] + [(k, None) for k in (7, 8)])
    pipeline.run_batch()
    assert diffs == []  # no diff read, no rebuild: the index was exact after the compaction's commit
    assert _rows(spark, name) == model

    # A restart without a clean close (a SIGKILL) resumes from the durable index, the compaction included.
    monkeypatch.undo()
    again = Pipeline(config, spark)
    try:
        send([(k, 30) for k in range(2, 200, 4)] + [(11, None)])
        again.run_batch()
    finally:
        again.close()
    assert _rows(spark, name) == model


def test_a_group_whose_input_was_removed_is_dropped_and_its_file_deleted(spark, mirror):
    import os
    from urllib.parse import urlparse

    config, name, send, model = mirror
    pipeline = Pipeline(config, spark)
    try:
        for version in range(3):
            send([(k, version) for k in range(version, 30)])
            pipeline.run_batch()
        spec = pipeline.compacted_here()[name]
        from lakestream.maintenance.runner import plan_table

        plan = plan_table(spark, config, name)
        prepared = write_compaction(
            spark, config.catalog.name, name, plan.hot_skipped, config.maintenance.policy_for(name), spec
        )
        assert prepared is not None
        output = urlparse(prepared.outputs()[0]).path
        assert os.path.exists(output)
        # Another writer rewrites the table's files first (Iceberg's own procedure, no stream running).
        spark.sql(f"CALL lake.system.rewrite_data_files(table => '{name}', options => map('min-input-files', '2'))")
        [result] = pipeline.commit_compactions([prepared])
        assert result.status == "conflict" and result.detail["groups_dropped"] == 1, result.describe()
        assert not os.path.exists(output)
        send([(k, 9) for k in range(0, 30, 2)])
        pipeline.run_batch()
    finally:
        pipeline.close()
    assert _rows(spark, name) == model


def test_a_large_compaction_is_committed_over_several_pauses():
    import numpy as np

    from lakestream.maintenance.actions import MaintenanceResult
    from lakestream.maintenance.compaction import PreparedRewrite
    from lakestream.maintenance.runner import MaintenanceScheduler

    def group(name: str, rows: int) -> RewriteGroup:
        return RewriteGroup(
            inputs=[f"{name}-a", f"{name}-b"],
            records=[rows, 10],
            deleted=[np.empty(0, np.int64), np.arange(10, dtype=np.int64)],
            bytes=rows,
        )

    scheduler = MaintenanceScheduler(config=None)
    for table, groups in (
        ("ns.one", [group("g1", 100_000), group("g2", 200_000), group("g3", 50_000)]),
        ("ns.two", [group("g4", 300_000)]),
    ):
        scheduler.hand_over(PreparedRewrite(table, 1, groups, MaintenanceResult(table, "compact", "ok")))
    pauses = []
    while taken := scheduler.take_prepared(max_rows=250_000):
        pauses.append([(p.table, [g.inputs[0] for g in p.groups], p.result.files_before) for p in taken])
    assert pauses == [[("ns.one", ["g1-a"], 2)], [("ns.one", ["g2-a", "g3-a"], 4)], [("ns.two", ["g4-a"], 2)]]
    assert scheduler.take_prepared() == []


def test_a_started_pipeline_catches_up_before_its_first_round(pipeline_config_factory):
    import time

    from lakestream.maintenance.actions import MaintenanceResult
    from lakestream.maintenance.history import record_maintenance
    from lakestream.maintenance.runner import MaintenanceScheduler

    config = pipeline_config_factory(
        [{"topics": ["r.public.t"], "namespace": NS, "table": "t"}],
        name="rdelay",
        maintenance={"mode": "inline", "interval_s": 10, "start_delay_s": 60},
    )
    first = MaintenanceScheduler(config, resume=True)  # a first life: its first round after the delay too
    assert not first.due(time.time()) and not first.due(time.time() + 59)
    assert first.due(time.time() + 61)
    record_maintenance(
        config, [MaintenanceResult(table="ns.t", action="compact", status="ok")], int((time.time() - 3600) * 1000)
    )
    restarted = MaintenanceScheduler(config, resume=True)  # an earlier life in the log: a restart
    assert not restarted.due(time.time()) and not restarted.due(time.time() + 59)
    assert restarted.due(time.time() + 61)
    record_maintenance(
        config, [MaintenanceResult(table="ns.t", action="compact", status="ok")], int(time.time() * 1000)
    )
    undelayed = config.model_copy(update={"maintenance": config.maintenance.model_copy(update={"start_delay_s": 0})})
    resumed = MaintenanceScheduler(undelayed, resume=True)  # no delay: the schedule of the earlier life goes on
    assert not resumed.due(time.time() + 5) and resumed.due(time.time() + 11)


def test_the_first_round_waits_for_the_batches_to_settle(pipeline_config_factory, tmp_path):
    import json
    import time

    from lakestream.maintenance.runner import MaintenanceScheduler
    from lakestream.maintenance.settle import IDLE_POLLS, WINDOW, Settling, steady_batch_s

    # The previous life's metrics log gives the steady batch time: the median of its batches with records.
    log = tmp_path / "metrics.jsonl"
    assert steady_batch_s(log) is None  # no earlier life
    log.write_text(
        "".join(
            json.dumps({"batch": i, "records": 10 if i % 4 else 0, "seconds": 0.4 + (i % 3) / 10}) + "\n"
            for i in range(200)
        )
        + "{cut"
    )
    assert steady_batch_s(log) == 0.5
    config = pipeline_config_factory(
        [{"topics": ["s.public.t"], "namespace": NS, "table": "t"}],
        name="settle",
        maintenance={"mode": "inline", "interval_s": 10, "start_delay_s": 60, "settle_max_s": 180},
    )
    now = time.time()
    scheduler = MaintenanceScheduler(config, resume=True)
    scheduler.wait_for_settled_batches(log)
    for _ in range(WINDOW):
        scheduler.observe_batch(0.9)  # still warming: 1.8x the steady time
    assert not scheduler.due(now + 61) and not scheduler.due(now + 179)
    for _ in range(WINDOW // 2 + 1):
        scheduler.observe_batch(0.6)  # within 1.25x of the steady 0.5 s
    assert not scheduler.due(now + 59)  # the start delay still comes first
    assert scheduler.due(now + 61) and scheduler.settling is None  # only the first round waits

    capped = MaintenanceScheduler(config, resume=True)
    capped.wait_for_settled_batches(log)
    for _ in range(WINDOW):
        capped.observe_batch(2.0)
    assert not capped.due(now + 179) and capped.due(now + 181)  # at most settle_max_s after the start
    idle = MaintenanceScheduler(config, resume=True)
    idle.wait_for_settled_batches(log)
    idle.observe_batch(3.0)
    idle.observe_batch(None)  # one poll found nothing: at a high rate that happens by chance
    assert not idle.due(now + 61)
    idle.observe_batch(3.0)
    for _ in range(IDLE_POLLS - 1):
        idle.observe_batch(None)
    assert not idle.due(now + 61)  # a batch came between: the count starts again
    idle.observe_batch(None)  # polls in a row found nothing: caught up, no batch for a round to slow down
    assert idle.due(now + 61)
    undelayed = config.model_copy(update={"maintenance": config.maintenance.model_copy(update={"start_delay_s": 0})})
    no_wait = MaintenanceScheduler(undelayed, resume=True)
    no_wait.wait_for_settled_batches(log)
    no_wait.observe_batch(5.0)
    assert no_wait.due(now) and no_wait.settling is None

    # No earlier life: settled once a window of batches is no longer faster than the one before.
    first = Settling(None, deadline_s=now + 1000)
    for median in (1.1, 0.8, 0.5):
        for _ in range(WINDOW):
            first.observe(median)
        assert not first.settled(now)
    for _ in range(WINDOW):
        first.observe(0.48)
    assert first.settled(now)


def test_a_rewrite_task_works_at_a_lower_priority_and_leaves_its_worker_as_it_was():
    import os
    import threading

    from lakestream.beside import BACKGROUND_NICE, at_low_priority

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = niceness()
    assert at_low_priority(niceness) == max(before, BACKGROUND_NICE)
    assert niceness() == before  # the worker's own thread, reused by the batches' tasks, keeps its priority
    with pytest.raises(ZeroDivisionError):
        at_low_priority(lambda: 1 // 0)
