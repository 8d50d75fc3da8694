"""Starts and stops ``lakestream capture`` as a child process (one JVM per process; see runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakestream.capture.runner import STREAMING_MARKER
from lakestream.errors import CaptureError

# `lakestream.cli` is a package without __main__, so call its entry point directly.
LAKESTREAM_COMMAND = [sys.executable, "-c", "import sys; from lakestream.cli import main; sys.exit(main())"]


class CaptureProcess:
    """``lakestream capture <pipeline.yaml>`` in a subprocess, its output in ``log_path``.

    Use as a context manager, or call ``start()`` / ``stop()``.
    """

    def __init__(self, pipeline_yaml: str | Path, log_path: str | Path | None = None, verbose: bool = False) -> None:
        self.pipeline_yaml = Path(pipeline_yaml)
        self.log_path = Path(log_path) if log_path else self.pipeline_yaml.with_suffix(".capture.log")
        self.verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> CaptureProcess:
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        cmd = [*LAKESTREAM_COMMAND, *(["-v"] if self.verbose else []), "capture", str(self.pipeline_yaml)]
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        """This run's output so far."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode("utf-8", errors="replace")

    def wait_until_streaming(self, timeout: float = 120.0) -> None:
        """Block until the snapshot is done and Debezium reads the slot; CaptureError otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if STREAMING_MARKER in self.log_text():
                return
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise CaptureError(f"capture exited (code {code}) before streaming:\n{self._tail()}")
            time.sleep(0.2)
        raise CaptureError(f"capture not streaming after {timeout:.0f}s:\n{self._tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (clean stop: offsets flushed), then SIGKILL after ``timeout``. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL, to test crash recovery (events since the last offset flush are re-sent)."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)

    def _tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> CaptureProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
