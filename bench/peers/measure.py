"""What one system costs, from /proc: the CPU seconds and the peak resident memory of its whole process tree (the
writer's process group and every descendant), sampled while it runs; and an optional memory cap for that tree (a
cgroup), the same for every system.

A `TreeMeter` follows one root process: the CPU a process used is kept at its last sample, so a process that exits
between two samples keeps what it used until then (at most one interval's CPU is missed); the RSS is the sum over
the tree at each sample, and the peak is the largest such sum. Nothing is cumulative across systems: each run of
each configuration has meters of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from sustained import tree_pids

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime, stime, and the children's that were waited for (cutime, cstime): a forked helper counts once.
        return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def _rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class TreeMeter:
    """CPU seconds and peak RSS of the process tree under ``root`` (sampled by `sample`)."""

    def __init__(self, root: int):
        self.root = root
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0

    def sample(self) -> None:
        pids = tree_pids(self.root)
        rss = 0
        for pid in pids:
            cpu = _cpu_s(pid)
            if cpu is not None:
                self.cpu[pid] = cpu
            rss += _rss_bytes(pid)
        self.peak_rss = max(self.peak_rss, rss)

    def cpu_s(self) -> float:
        return sum(self.cpu.values())


class MemoryCap:
    """A memory cgroup for one process tree: ``limit_bytes`` for all of it (its peak from the cgroup's own counter).
    Made beside the cgroup this process runs in (cgroup v2: ``memory.max``; v1: ``memory.limit_in_bytes``); raises
    OSError where the machine does not allow it (no writable memory controller)."""

    def __init__(self, name: str, limit_bytes: int):
        self.path = self._parent() / name
        self.v2 = (self.path.parent / "cgroup.controllers").exists()
        self.path.mkdir(exist_ok=True)
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))

    @staticmethod
    def _parent() -> Path:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
                return Path("/sys/fs/cgroup") / path.lstrip("/")
            if "memory" in controllers.split(","):
                return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        raise OSError("no memory cgroup for this process")

    def add(self, pid: int) -> None:
        """Put ``pid`` in the cgroup (the processes it starts from then on are in it too)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process is still in it; the caller killed its tree, the kernel frees it when it exits
