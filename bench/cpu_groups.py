"""CPU seconds of each process group of an end-to-end run, read from /proc.

A group is a set of root processes and everything below them; its CPU is the user + system time of every live
process in it plus what its processes' reaped children used (``cutime``/``cstime``), so short-lived Python
workers are counted too. The bench process is counted as the pipeline driver (its polling of the lake is a small
part of it; the load generator runs in processes of its own).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_tree() -> dict[int, list[int]]:
    """Children of every live process, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(
    roots: Iterable[int | None], children: dict[int, list[int]], stop: Callable[[int], bool] | None = None
) -> set[int]:
    """The roots (None ones skipped) and every process below them, not descending into a process for which ``stop``
    is true."""
    seen: set[int] = set()
    todo = [r for r in roots if r]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(c for c in children.get(pid, ()) if stop is None or not stop(c))
    return seen


def cpu_seconds(pids: Iterable[int], with_reaped: bool = True) -> float:
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            # utime, stime, cutime, cstime are fields 14-17 of stat(5); here 0-based after the name: 11-14.
            total += int(fields[11]) + int(fields[12])
            if with_reaped:
                total += int(fields[13]) + int(fields[14])
    return total / TICKS


class ProcessGroups:
    """Samples the CPU of the groups of an end-to-end run: the source database (PostgreSQL or MariaDB), the load
    generator, the capture process (its CLI and JVM), the broker, the pipeline driver (Python), the Spark JVM and
    its Python workers.

    ``source_db_pid`` and ``broker_pid`` are the servers' root processes; ``capture_pid`` the capture CLI's;
    ``load_pids`` the load generator's processes.
    """

    def __init__(
        self,
        source_db_pid: int | None,
        broker_pid: int | None,
        capture_pid: int | None,
        load_pids: list[int],
    ) -> None:
        self.source_db_pid, self.broker_pid, self.capture_pid = source_db_pid, broker_pid, capture_pid
        self.load_pids = load_pids

    def capture_threads(self) -> dict[str, float]:
        """``thread_cpu`` of the capture process (its Python and its JVM: Debezium's, the converter's, the publisher's
        and librdkafka's threads)."""
        return thread_cpu(descendants([self.capture_pid], process_tree()))

    def sample(self) -> dict[str, float]:
        children = process_tree()
        me = os.getpid()
        others = {p for p in (self.source_db_pid, self.broker_pid, self.capture_pid) if p} | set(self.load_pids)
        spark_jvms = [c for c in children.get(me, ()) if c not in others and "java" in _cmdline(c)]

        def is_worker(pid: int) -> bool:
            return "python" in _cmdline(pid).split(" ", 1)[0]

        spark = descendants(spark_jvms, children, stop=is_worker)
        worker_roots = [c for j in spark for c in children.get(j, ()) if is_worker(c)]
        workers = descendants(worker_roots, children)
        groups = {
            "source_db": cpu_seconds(descendants([self.source_db_pid], children)),
            "load_generator": cpu_seconds(descendants(self.load_pids, children)),
            "capture": cpu_seconds(descendants([self.capture_pid], children)),
            "broker": cpu_seconds(descendants([self.broker_pid], children)),
            # The bench process without its children's reaped time (those are the load generator's, counted above).
            "driver": cpu_seconds([me], with_reaped=False),
            # The JVM's reaped children are its Python workers: counted under workers, not twice.
            "spark_jvm": cpu_seconds(spark, with_reaped=False),
            "python_workers": cpu_seconds(workers) + sum(_reaped(j) for j in spark),
        }
        return groups


def _thread_name(pid: int, tid: str) -> str:
    try:
        name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"
    # Numbered members of one pool are one entry: "pool-3-thread-1" → "pool-3-thread-#", "rdk:broker1" → "rdk:broker#".
    return re.sub(r"\d+$", "#", name)


def thread_cpu(pids: Iterable[int]) -> dict[str, float]:
    """CPU seconds of the live threads of ``pids``, summed by thread name (numbered pool members together)."""
    by_name: dict[str, float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            fields = _stat(f"{pid}/task/{tid}")
            if fields:
                name = _thread_name(pid, tid)
                by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return by_name


def thread_delta(before: dict[str, float], after: dict[str, float], seconds: float, top: int = 8) -> dict[str, float]:
    """Cores each thread name used between two ``thread_cpu`` samples, the busiest ``top`` first."""
    used = {k: (v - before.get(k, 0.0)) / seconds for k, v in after.items()}
    return {k: round(v, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:top] if v > 0}


def _reaped(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[13]) + int(fields[14])) / TICKS if fields else 0.0


def per_thousand(before: dict[str, float], after: dict[str, float], changes: int) -> dict[str, float]:
    """CPU seconds per 1,000 changes of each group between two samples (a group's counter never goes back, but a
    process that ended between the samples without being reaped by a sampled parent is lost: reported as 0)."""
    if changes <= 0:
        return {}
    return {k: round(max(0.0, after[k] - before.get(k, 0.0)) * 1000 / changes, 3) for k in after}
