"""The README's first command, end to end: `lakestream demo` on its own stack, with a short workload."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lakestream.verify.compare import PASS_MARKER


@pytest.mark.slow
def test_demo_runs_end_to_end_and_verifies(stack_factory):
    stack = stack_factory()
    s = stack.settings
    cmd = [
        sys.executable,
        "-m",
        "lakestream",
        "demo",
        "--duration",
        "8",  # the command's whole path, not the size of its workload, is what this checks
        "--catchup-timeout",
        "180",
        "--state-dir",
        str(s.state_dir),
        "--pg-port",
        str(s.pg_port),
        "--kafka-port",
        str(s.kafka_port),
    ]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    finally:
        stack.down()  # the demo leaves its stack running; the rest of the session has no use for it
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert PASS_MARKER in run.stdout, run.stdout[-6000:]
    for heading in ("source vs lake", "freshness", "Iceberg tables", "revenue by customer segment"):
        assert heading in run.stdout, heading
    assert s.pg_port and "password" not in run.stdout.lower()
