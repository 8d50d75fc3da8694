"""One heavy job beside the batches at a time: a key index merge or an inline maintenance round.

Each alone leaves the batches most of the machine; together (a 1.5 GB index rewrite, a compaction written on the
executors, the expiry and orphan scan in the JVM) they starved them on two cores: in the 100M-row sustained
run (`bench/sustained.py`) the batches that made freshness p99 were those where two of these overlapped. A job that
finds the slot taken waits for a later turn: a merge for a later commit (the overlay grows meanwhile, up to its
hard cap), a round for a later pause between batches.

The slot is a plain lock, taken by the thread that starts a job and released by the job's own thread. Background
work's own threads also run at a lower priority (`BACKGROUND_NICE`, `at_low_priority`; the JVM's: `ThreadPriority`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_slot = threading.Lock()

# The nice value of background work's own threads (0 normal, 19 lowest): the compaction rewrite's work in its Python
# worker, the JVM's expiry, orphan and table-stats reads. Linux keeps a nice value per thread; under contention a
# nice-10 thread gets about a tenth of the CPU a nice-0 one gets (CFS weights 110 vs 1024), and all of an idle core.
BACKGROUND_NICE = 10


def lower_this_thread() -> None:
    """The calling thread at nice `BACKGROUND_NICE` from now on (never raising its priority; on Linux a thread's
    niceness is its own): for a thread that only ever does background work."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, max(BACKGROUND_NICE, os.getpriority(os.PRIO_PROCESS, me)))
    except (OSError, AttributeError):  # not Linux, or not allowed: at the usual priority
        pass


# The JVM's just-in-time compiler threads (HotSpot names them so; Linux cuts a thread's name to 15 characters).
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def lower_jit_compilers(jvm_pid: int) -> int:
    """The JIT compiler threads of the JVM ``jvm_pid`` (on this host: the driver's) at nice `BACKGROUND_NICE` from
    now on; returns how many were lowered. Called when the first maintenance round starts, once the batches' code
    is compiled: the round's new code (the compaction's Parquet rewrite) then compiles on what the batches leave —
    at nice 0 it took up to half a core in the round's first seconds of a 100M-row sustained run, as the batches
    waited. HotSpot starts further compiler threads from its compiler threads, and a new thread inherits its
    creator's nice value."""
    lowered = 0
    try:
        tasks = os.listdir(f"/proc/{jvm_pid}/task")
    except OSError:  # not Linux, or the JVM elsewhere
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{jvm_pid}/task/{tid}/comm") as fh:
                if not fh.read().startswith(JIT_THREADS):
                    continue
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < BACKGROUND_NICE:
                os.setpriority(os.PRIO_PROCESS, int(tid), BACKGROUND_NICE)
                lowered += 1
        except OSError:  # the thread ended, or not allowed
            continue
    return lowered


def at_low_priority(work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own at nice `BACKGROUND_NICE`, never raising a priority (on Linux a thread's
    niceness is its own and ends with it: the calling thread — a Spark Python worker, reused by the batches' tasks
    later — keeps its own). E.g. a compaction rewrite task: at a lower priority it gets what the batches leave."""
    outcome: list[Any] = []

    def run() -> None:
        lower_this_thread()
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # noqa: BLE001 — raised again on the task's own thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="lakestream-background", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def take_slot() -> bool:
    """Take the slot if it is free; the caller then releases it when its job ends (`release_slot`)."""
    return _slot.acquire(blocking=False)


def release_slot() -> None:
    _slot.release()


def slot_taken() -> bool:
    return _slot.locked()


__all__ = ["BACKGROUND_NICE", "at_low_priority", "lower_jit_compilers", "release_slot", "slot_taken", "take_slot"]
