"""The engine's own Prometheus endpoint (`engine.metrics_port`), scraped over HTTP while the real
pipeline runs: batch seconds, records and changes per table, dead letters by kind, freshness, lag,
commit conflicts and retries."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid

from conftest import load_debezium_fixture, produce_records
from prometheus_client.parser import text_string_to_metric_families

from lakestream.engine.loop import run_pipeline
from lakestream.identifiers import quote_column
from lakestream.stack.process import free_ports


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_run_exports_engine_metrics(stack, spark, pipeline_config_factory):
    events = load_debezium_fixture()
    topic = f"m{uuid.uuid4().hex[:6]}.public.all_types"
    bad = [
        (events[0]["key"], "not json at all"),  # malformed
        (None, events[0]["value"]),
    ]  # a change without a key: missing_key
    produce_records(stack.bootstrap_servers, topic, [(e["key"], e["value"]) for e in events] + bad, partition=0)
    [port] = free_ports(1)
    ns = f"metrics_{topic[1:7]}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": ns, "table": "{table}"}],
        name=f"metrics{topic[1:7]}",
        engine={"metrics_port": port},
    )
    table = f"{ns}.all_types"

    results = []
    committed = threading.Condition()

    def on_batch(result):
        with committed:
            results.append(result)
            committed.notify_all()

    def wait_for(predicate, what: str, timeout: float = 90):
        with committed:
            assert committed.wait_for(lambda: predicate(results), timeout), f"timed out waiting for {what}: {results}"

    stop = threading.Event()
    failure: list[BaseException] = []

    def run():
        try:
            run_pipeline(config, stop=stop, spark=spark, on_batch=on_batch)
        except BaseException as exc:  # noqa: BLE001 — reported by the test thread
            failure.append(exc)
            with committed:
                committed.notify_all()

    runner = threading.Thread(target=run, name="pipeline", daemon=True)
    runner.start()
    try:
        wait_for(lambda rs: failure or sum(r.table_records.get(table, 0) for r in rs) >= 7, "the first batch")
        assert not failure, failure
        first = scrape(port)
        assert first[("lakestream_table_records_total", (("table", table),))] == 7  # 8 messages, one tombstone
        assert first[("lakestream_table_changes_total", (("table", table),))] == 5  # keys 1-5 (2 deleted)
        assert first[("lakestream_dead_letters_total", (("kind", "malformed"),))] == 1
        assert first[("lakestream_dead_letters_total", (("kind", "missing_key"),))] == 1
        assert first[("lakestream_dead_letters_total", (("kind", "bad_value"),))] == 0
        assert first[("lakestream_table_kafka_lag", (("table", table),))] == 0
        newest_source_s = max(json.loads(e["value"])["payload"]["source"]["ts_ms"] for e in events if e["value"]) / 1000
        assert (
            abs(first[("lakestream_table_freshness_seconds", (("table", table),))] - (time.time() - newest_source_s))
            < 5
        )
        assert not [k for k in first if k[0] == "lakestream_commit_conflicts_total"]

        # Another writer commits between two batches: the next commit finds its key index stale,
        # refreshes it and retries (one conflict, one retry).
        columns = spark.table(f"lake.{table}").columns
        select = ", ".join("100 AS id" if c == "id" else quote_column(c) for c in columns)
        spark.sql(f"INSERT INTO lake.{table} SELECT {select} FROM lake.{table} WHERE id = 3")
        update = json.loads(
            next(e["value"] for e in events if e["value"] and '"op":"u"' in e["value"].replace(" ", ""))
        )
        sent_ms = int(time.time() * 1000)
        update["payload"]["after"]["note"] = "metrics"
        update["payload"]["source"]["ts_ms"] = sent_ms
        produce_records(stack.bootstrap_servers, topic, [(events[0]["key"], json.dumps(update))], partition=0)
        wait_for(lambda rs: failure or sum(r.table_records.get(table, 0) for r in rs) >= 8, "the second batch")
        assert not failure, failure
        second = scrape(port)
        scraped_at = time.time()
    finally:
        stop.set()
        runner.join(60)
    assert not failure, failure

    assert second[("lakestream_table_records_total", (("table", table),))] == 8
    assert second[("lakestream_table_changes_total", (("table", table),))] == 6
    assert second[("lakestream_commit_conflicts_total", (("cause", "stale_index"), ("table", table)))] == 1
    assert second[("lakestream_commit_retries_total", (("table", table),))] == 1
    freshness = second[("lakestream_table_freshness_seconds", (("table", table),))]
    assert 0 <= freshness <= scraped_at - sent_ms / 1000 + 1
    assert second[("lakestream_batch_seconds_count", ())] == len(results)
    assert abs(second[("lakestream_batch_seconds_sum", ())] - sum(r.seconds for r in results)) < 1e-6
    assert second[("lakestream_dead_letters_total", (("kind", "malformed"),))] == 1  # not counted twice
    rows = {r["id"]: r["note"] for r in spark.sql(f"SELECT id, note FROM lake.{table}").collect()}
    assert rows == {1: "metrics", 3: rows[3], 4: rows[4], 5: rows[5], 100: rows[3]}
    # The server stops with the pipeline.
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics endpoint is still up after the pipeline stopped")
    except OSError:
        pass


def test_cli_run_serves_metrics_on_its_port_and_keeps_stdout_clean(stack, pipeline_config_factory, tmp_path):
    """`lakestream run --metrics-port`: the real command, scraped while it runs, stopped by SIGTERM."""
    import signal
    import subprocess

    from conftest import write_pipeline_yaml

    from lakestream.capture.process import LAKESTREAM_COMMAND

    topic = f"cli{uuid.uuid4().hex[:6]}"
    produce_records(
        stack.bootstrap_servers,
        topic,
        [(str(i), json.dumps({"id": i, "v": "x"})) for i in range(5)] + [("bad", "{not json")],
        partition=0,
    )
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": "metrics_cli", "table": topic}], name=topic
    )
    pipeline = write_pipeline_yaml(config, stack, tmp_path / "pipeline.yaml")
    [port] = free_ports(1)
    proc = subprocess.Popen(
        [*LAKESTREAM_COMMAND, "run", str(pipeline), "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    table = f"metrics_cli.{topic}"
    samples: dict = {}
    try:
        deadline = time.monotonic() + 120
        while samples.get(("lakestream_table_records_total", (("table", table),))) != 5:
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, f"no batch scraped in time: {samples}"
            try:
                samples = scrape(port)
            except OSError:
                pass  # not serving yet (the JVM is starting)
            time.sleep(0.5)
        assert samples[("lakestream_table_changes_total", (("table", table),))] == 5
        assert samples[("lakestream_dead_letters_total", (("kind", "malformed"),))] == 1
        assert samples[("lakestream_pipeline_info", (("pipeline", topic),))] == 1
        # The pipeline's own JVM (local mode, no Spark SQL of its own) compiles with C1 only (`SparkSettings.jit`).
        [jvm] = [cmd for cmd in _children_cmdlines(proc.pid) if "org.apache.spark.deploy.SparkSubmit" in cmd]
        assert "-XX:TieredStopAtLevel=1" in jvm, jvm
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert out == b"", out[:500]  # logs and the JVM's chatter go to stderr


def _children_cmdlines(pid: int) -> list[str]:
    """The command lines of ``pid``'s child processes (from /proc)."""
    import os

    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            if int(stat[stat.rfind(")") + 2 :].split()[1]) != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                out.append(fh.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # ended meanwhile
    return out
