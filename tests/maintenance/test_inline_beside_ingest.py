"""Inline maintenance keeps to the pipeline's own tables (unless a policy names others), runs beside ingestion
on a thread of its own, and its compaction moves the key index by diff, never by a full scan (issue 21)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
from conftest import produce_records

from lakestream.engine.loop import run_pipeline
from lakestream.maintenance import InlineMaintenance
from lakestream.maintenance.history import read_maintenance_log

NS = "mown"


def _small_files_table(spark, name: str, files: int = 4) -> str:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"DROP TABLE IF EXISTS lake.{NS}.{name} PURGE")
    spark.sql(f"CREATE TABLE lake.{NS}.{name} (id BIGINT, v STRING) USING iceberg")
    for i in range(files):
        spark.sql(f"INSERT INTO lake.{NS}.{name} VALUES ({i}, 'x')")
    return f"{NS}.{name}"


def test_inline_rounds_keep_to_the_pipelines_tables_unless_a_policy_names_others(spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    mine = _small_files_table(spark, f"mine_{suffix}")
    other = _small_files_table(spark, f"other_{suffix}")
    policy = {"compaction": {"max_files_per_partition": 2, "quiet_time_s": 0}}
    config = pipeline_config_factory(
        [{"topics": ["unused"]}],
        name=f"own{suffix}",
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [{"tables": ".*", **policy}],
        },
    )
    results = InlineMaintenance(spark, config).round(time.time(), own={mine})
    assert results and {r.table for r in results} == {mine}, [r.describe() for r in results]
    assert spark.sql(f"SELECT count(*) FROM lake.{other}.data_files").collect()[0][0] == 4  # untouched

    named = pipeline_config_factory(
        [{"topics": ["unused"]}],
        name=f"own{suffix}b",
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [{"tables": f"{NS}\\.other_{suffix}", **policy}, {"tables": ".*", **policy}],
        },
    )
    results = InlineMaintenance(spark, named).round(time.time(), own={mine})
    assert {r.table for r in results} == {mine, other}
    assert spark.sql(f"SELECT count(*) FROM lake.{other}.data_files").collect()[0][0] == 1


def _jit_nice(spark) -> dict[int, int]:
    """The nice value of each JIT compiler thread of the session's JVM."""
    from lakestream.beside import JIT_THREADS
    from lakestream.runtime.spark import jvm_pid

    pid, found = jvm_pid(spark), {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{tid}/comm").read().startswith(JIT_THREADS):
                found[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
        except OSError:
            continue
    return found


def test_a_round_waits_while_a_key_index_merge_runs_beside_the_batches(spark, pipeline_config_factory):
    from lakestream import beside

    suffix = uuid.uuid4().hex[:6]
    mine = _small_files_table(spark, f"slot_{suffix}")
    config = pipeline_config_factory(
        [{"topics": ["unused"]}],
        name=f"slot{suffix}",
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [{"tables": ".*", "compaction": {"max_files_per_partition": 2, "quiet_time_s": 0}}],
        },
    )
    jit_before = _jit_nice(spark)
    assert jit_before
    try:  # an earlier test's round may have lowered them already: back to 0 (root only)
        for tid in jit_before:
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    except OSError:
        pytest.skip("not allowed to raise the JIT threads' priority again")
    try:
        assert beside.take_slot()  # a key index merge runs
        try:
            maintenance = InlineMaintenance(spark, config)
            assert maintenance.round(time.time(), own={mine}, background=True) == []
            state = maintenance
            assert state.thread is None  # no round started
        finally:
            beside.release_slot()
        # From the first round due on, the JVM's JIT compilers work on what the batches leave.
        assert min(_jit_nice(spark).values()) >= beside.BACKGROUND_NICE
        maintenance.round(time.time(), own={mine}, background=True)
        assert state.thread is not None and beside.slot_taken()  # the round holds the slot while it runs
        state.thread.join(120)
    finally:
        for tid in jit_before:  # the rest of the suite's JVM at the usual priority
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
            except OSError:
                pass
    assert not beside.slot_taken()
    results = maintenance.round(time.time(), own={mine}, background=True)  # the finished round's
    assert any(r.table == mine and r.action == "compact" for r in results), [r.describe() for r in results]
    # The log gives the round's whole window: from before its tables' metrics were read to its end.
    logged = read_maintenance_log(config)
    assert {line["action"] for line in logged} >= {"compact"}
    for line in logged:
        assert line["round_started_ms"] + 1000 * (line["seconds"] or 0) <= line["finished_ms"] + 1, line


@pytest.mark.chaos  # ~80 s of live ingestion: `make chaos`
def test_maintenance_runs_beside_ingestion_and_moves_the_index_by_diff(
    stack, spark, pipeline_config_factory, monkeypatch
):
    from lakestream.maintenance import runner
    from lakestream.sink.index.disk import DiskKeyIndex

    suffix = uuid.uuid4().hex[:6]
    topic, table = f"mb{suffix}.public.items", f"lake.{NS}.items_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"items_{suffix}"}],
        name=f"mb{suffix}",
        engine={"commit_interval_s": 0, "idle_poll_s": 0.2},
        maintenance={
            "mode": "inline",
            "interval_s": 1,
            "orphan_interval_s": 3600,
            "start_delay_s": 0,
            "policies": [
                {
                    "tables": ".*",
                    "compaction": {"max_files_per_partition": 3, "quiet_time_s": 0},
                    "max_delete_files": 2,
                    "orphan_min_age_s": 3 * 86400,
                    "orphan_dry_run": True,
                }
            ],
        },
    )
    rebuilds: list[int | None] = []
    real_rebuild = DiskKeyIndex.rebuild
    monkeypatch.setattr(DiskKeyIndex, "rebuild", lambda self, *a: (rebuilds.append(a[-1]), real_rebuild(self, *a))[1])
    threads: list[str] = []
    real_maintain = runner.maintain_table

    def maintain_table(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real_maintain(*args, **kwargs)

    monkeypatch.setattr(runner, "maintain_table", maintain_table)
    expected: dict[int, int] = {}

    def send(version: int) -> None:
        records = []
        for i in range(1, 301):
            if (i + version) % 7 == 0:
                records.append((json.dumps({"id": i}), json.dumps({"before": {"id": i}, "after": None, "op": "d"})))
                expected.pop(i, None)
            else:
                records.append(
                    (
                        json.dumps({"id": i}),
                        json.dumps(
                            {"before": None, "after": {"id": i, "v": version}, "op": "u" if i in expected else "c"}
                        ),
                    )
                )
                expected[i] = version
        produce_records(stack.bootstrap_servers, topic, records)

    stop = threading.Event()
    errors: list[BaseException] = []

    def ingest() -> None:
        try:
            run_pipeline(config, spark=spark, stop=stop)
        except BaseException as exc:  # noqa: BLE001 — surfaced below
            errors.append(exc)

    runner_thread = threading.Thread(target=ingest)
    runner_thread.start()
    try:
        version = 0
        deadline = time.time() + 240
        while time.time() < deadline and not errors:
            version += 1
            send(version)
            time.sleep(1.0)
            compacted = (
                spark.catalog.tableExists(table)
                and spark.sql(f"SELECT count(*) FROM {table}.snapshots WHERE operation = 'replace'").collect()[0][0]
            )
            if compacted and version >= 6:
                break
        want = {i: v for i, v in expected.items()}
        deadline = time.time() + 180
        while time.time() < deadline and not errors:
            rows = {r["id"]: r["v"] for r in spark.sql(f"SELECT id, v FROM {table}").collect()}
            if rows == want:
                break
            time.sleep(1.0)
    finally:
        stop.set()
        runner_thread.join(timeout=300)
    assert not errors, errors
    rows = spark.sql(f"SELECT id, v FROM {table}").collect()
    assert len(rows) == len({r["id"] for r in rows}), "duplicate keys"
    assert {r["id"]: r["v"] for r in rows} == want
    assert spark.sql(f"SELECT count(*) FROM {table}.snapshots WHERE operation = 'replace'").collect()[0][0] >= 1
    assert threads and set(threads) == {"lakestream-maintenance"}  # never on the ingestion thread
    assert [s for s in rebuilds if s is not None] == []  # the compaction was followed by diff
