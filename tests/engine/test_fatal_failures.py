"""A failure no retry can cure ends `lakestream run` at once and non-zero: a dead driver JVM is not an
outage to wait out. And a pipeline stopped (SIGTERM) while its batches fail does not exit 0 as if it had
stopped cleanly. Both on the real process, with its real Spark JVM."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

from chaos_harness import PipelineProcess
from conftest import produce_records, write_pipeline_yaml


def _java_children(pid: int) -> list[int]:
    """The java processes started by ``pid`` (PySpark's driver JVM)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            exe = os.readlink(entry / "exe")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and exe.endswith("java"):
            out.append(int(entry.name))
    return out


def _pipeline(stack, pipeline_config_factory, tmp_path: Path, **engine) -> tuple[PipelineProcess, str, object]:
    suffix = uuid.uuid4().hex[:6]
    topic = f"fatal{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": f"fatal_{suffix}", "table": "events"}],
        name=f"fatal{suffix}",
        **engine,
    )
    produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": i})) for i in range(5)])
    path = write_pipeline_yaml(config, stack, tmp_path / "pipeline.yaml")
    return PipelineProcess(path, tmp_path / "run.log"), topic, config


def test_a_dead_driver_jvm_ends_the_run_at_once_and_non_zero(stack, pipeline_config_factory, tmp_path):
    proc, topic, config = _pipeline(stack, pipeline_config_factory, tmp_path)
    proc.start()
    try:
        proc.wait_for(lambda: proc.batches(), "a first batch", timeout=180)
        jvms = _java_children(proc.proc.pid)
        assert jvms, "no Spark JVM under the pipeline process"
        for jvm in jvms:
            os.kill(jvm, signal.SIGKILL)  # the driver's JVM dies (an OOM kill, a crash)
        produce_records(config.kafka.bootstrap_servers, topic, [(None, json.dumps({"n": 99}))])
        killed = time.monotonic()
        code = proc.proc.wait(120)
        waited = time.monotonic() - killed
    finally:
        proc.kill_group()
    log = proc.log_text()
    assert code != 0, log[-3000:]
    assert "cannot be retried in this process" in log or "JVM" in log, log[-3000:]
    assert "an outage" not in log, "a dead JVM was waited out as an outage:\n" + log[-3000:]
    assert waited < 90, f"the process took {waited:.0f}s to exit after its JVM died"


def test_sigterm_while_batches_fail_exits_non_zero(stack, pipeline_config_factory, tmp_path):
    # A broker nobody listens on: every batch fails as an outage, waited out.
    proc, _, _ = _pipeline(stack, pipeline_config_factory, tmp_path)
    text = proc.config_path.read_text()
    import yaml

    data = yaml.safe_load(text)
    data["kafka"]["bootstrap_servers"] = "127.0.0.1:9"  # discard port: refused
    proc.config_path.write_text(yaml.safe_dump(data))
    proc.start()
    try:
        proc.wait_for(lambda: "batch failed" in proc.log_text(), "a failed batch", timeout=180)
        os.kill(proc.proc.pid, signal.SIGTERM)
        code = proc.proc.wait(120)
    finally:
        proc.kill_group()
    log = proc.log_text()
    assert "an outage" in log, log[-3000:]
    assert code != 0, "stopped during an outage, yet exited 0:\n" + log[-3000:]
    assert "stopped while batches were failing" in log, log[-3000:]
