"""Progress of a parallel snapshot: per-table rows, rate, chunks and ETA while it runs; the summary
(rows per table, seconds, the stream's lag at handover) when it ends."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TableProgress:
    source: str  # schema.table
    lake: str  # namespace.table
    chunks_total: int = 0
    chunks_done: int = 0  # committed, this run or an earlier one
    rows: int = 0  # committed by this run
    started: float | None = None  # monotonic, first chunk of this run
    finished: float | None = None
    resumed_chunks: int = 0  # committed by an earlier run

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.monotonic()) - self.started

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        done_here = self.chunks_done - self.resumed_chunks
        if self.finished is not None:
            return 0.0
        if done_here <= 0 or self.started is None:
            return None
        return self.seconds / done_here * (self.chunks_total - self.chunks_done)

    def line(self) -> str:
        eta = "?" if self.eta_s is None else f"{self.eta_s:,.0f}s"
        bar_width = 20
        filled = bar_width * self.chunks_done // max(self.chunks_total, 1)
        bar = "#" * filled + "." * (bar_width - filled)
        return (
            f"snapshot {self.source} [{bar}] {self.chunks_done}/{self.chunks_total} chunks, {self.rows:,} rows, "
            f"{self.rows_per_s:,.0f} rows/s, ETA {eta}"
        )


@dataclass
class SnapshotReport:
    """The outcome of `run_snapshot`."""

    slot: str
    lsn: str  # the handover point: the slot's consistent point
    tables: list[TableProgress] = field(default_factory=list)
    seconds: float = 0.0
    resumed: bool = False
    already_complete: bool = False
    handover_lag_bytes: int = 0  # WAL written since the handover point, which streaming replays first
    handover_lag_s: float = 0.0  # age of the handover point when the snapshot ended
    resnapshot: bool = False  # a re-snapshot while streaming (`lsn`: the WAL position when it ended)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tables"] = [
            {
                "source": t.source,
                "lake": t.lake,
                "rows": t.rows,
                "seconds": round(t.seconds, 3),
                "rows_per_s": round(t.rows_per_s),
                "chunks": t.chunks_total,
                "resumed_chunks": t.resumed_chunks,
            }
            for t in self.tables
        ]
        out["rows"], out["rows_per_s"] = self.rows, round(self.rows_per_s)
        return out

    def to_text(self) -> str:
        width = max([len(t.source) for t in self.tables] + [5])
        lines = [f"{'table':<{width}}  {'rows':>12}  {'seconds':>8}  {'rows/s':>10}  chunks"]
        for t in self.tables:
            resumed = f" ({t.resumed_chunks} from an earlier run)" if t.resumed_chunks else ""
            lines.append(
                f"{t.source:<{width}}  {t.rows:>12,}  {t.seconds:>8.1f}  {t.rows_per_s:>10,.0f}  "
                f"{t.chunks_total}{resumed}"
            )
        lines.append(f"{'total':<{width}}  {self.rows:>12,}  {self.seconds:>8.1f}  {self.rows_per_s:>10,.0f}")
        if self.resnapshot:
            lines.append(
                f"re-snapshot committed while slot {self.slot} streamed (WAL at {self.lsn}); rows are those "
                "the snapshot wrote, keys the stream changed meanwhile kept the stream's rows"
            )
        else:
            lines.append(
                f"handover at {self.lsn} (slot {self.slot}); streaming starts {self.handover_lag_bytes:,} WAL "
                f"bytes, {self.handover_lag_s:.1f}s behind the source"
            )
        return "\n".join(lines)
