"""When a started pipeline's batches are back to their steady time: its first inline round waits for that.

A started process runs its first minutes slower than it will later: it catches up on what arrived while it was
down, merges the key index overlay of its previous life, and its JVM compiles the batch path (a fifth to two fifths
of a core for minutes). A maintenance round then (a compaction written beside the batches, snapshot expiry, an
orphan listing) lands on batches that are already slow. So the first round of a process waits, after
``maintenance.start_delay_s``, until the pipeline is steady — the median of its last batches within
``SETTLED_RATIO`` of the previous life's median batch (from its metrics log), or, with no earlier life on record,
until the batches stop getting faster — or until polls in a row find nothing, and at most until
``maintenance.settle_max_s`` after the start. A fixed longer delay (180 s for every start) makes the rounds fewer
and heavier, so it is not used.
"""

from __future__ import annotations

import statistics
from collections import deque
from pathlib import Path

import orjson

WINDOW = 20  # batches whose median is compared
SETTLED_RATIO = 1.25  # steady: the window's median at most this times the previous life's median batch
STILL_FALLING = 0.9  # without an earlier life: still warming while a window's median is below this share of the last
# Polls in a row that found nothing: caught up. One is not enough — at 15,000 changes/s a poll found nothing by
# chance while the restarted batches were still at 1.8x their steady time.
IDLE_POLLS = 3
TAIL_BYTES = 1 << 20  # of the metrics log read for the previous life's median (~700 batches)


def steady_batch_s(metrics_log: Path) -> float | None:
    """The median time of the last batches a pipeline's earlier life logged (None with fewer than `WINDOW`)."""
    try:
        with metrics_log.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_BYTES))
            lines = fh.read().splitlines()[1 if size > TAIL_BYTES else 0 :]  # the first may be cut
    except OSError:
        return None
    seconds = []
    for line in lines:
        try:
            batch = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(batch, dict) and batch.get("records") and isinstance(batch.get("seconds"), (int, float)):
            seconds.append(float(batch["seconds"]))
    return statistics.median(seconds) if len(seconds) >= WINDOW else None


class Settling:
    """Whether a started pipeline's batches have settled (`observe` each batch, `idle` each empty poll)."""

    def __init__(self, steady_s: float | None, deadline_s: float):
        self.steady_s = steady_s
        self.deadline_s = deadline_s  # epoch seconds: settled by then whatever the batches do
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.batches = 0
        self.last_window_s: float | None = None  # median of the last full window (no earlier life)
        self.stopped_falling = False
        self.idle_polls = 0  # polls in a row that found nothing

    def observe(self, seconds: float) -> None:
        self.idle_polls = 0
        self.recent.append(seconds)
        self.batches += 1
        if self.steady_s is None and self.batches % WINDOW == 0:
            median = statistics.median(self.recent)
            if self.last_window_s is not None and median >= STILL_FALLING * self.last_window_s:
                self.stopped_falling = True
            self.last_window_s = median

    def idle(self) -> None:
        """Nothing arrived: after `IDLE_POLLS` such polls in a row, nothing to catch up on and no batch for a round
        to slow down."""
        self.idle_polls += 1

    def settled(self, now_s: float) -> bool:
        if now_s >= self.deadline_s or self.idle_polls >= IDLE_POLLS:
            return True
        if len(self.recent) < WINDOW:
            return False
        if self.steady_s is not None:
            return statistics.median(self.recent) <= SETTLED_RATIO * self.steady_s
        return self.stopped_falling

    def describe(self) -> str:
        median = f"{statistics.median(self.recent):.2f}s" if self.recent else "-"
        steady = f"{self.steady_s:.2f}s" if self.steady_s is not None else "not on record"
        return f"median of the last {len(self.recent)} batches {median}, the previous life's {steady}"
