"""Freshness — source commit → visible in Iceberg — from the engine's per-batch figures.

Each batch records the quantiles [q01, q50, q99, min] of its changes' source commit times and the
time its data became visible (commit). Its freshness distribution is therefore commit − those
times; the figures over many batches are quantiles of the record-weighted mixture of the batches'
distributions (each taken as piecewise linear through its known points).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


def mixture_quantiles(
    groups: Sequence[tuple[int, list[float], float, float]], targets: tuple[float, ...] = (0.01, 0.5, 0.99)
) -> list[float] | None:
    """Quantiles of a mixture of groups given as (count, [q01, q50, q99], min, max)."""
    populated = [g for g in groups if g[0] > 0]
    if not populated:
        return None
    curves = []
    for n, q, lo, hi in populated:
        xs = [float(min(lo, q[0])), float(q[0]), float(q[1]), float(q[2]), float(max(hi, q[2]))]
        curves.append((n, xs, [0.0, 0.01, 0.5, 0.99, 1.0]))
    total = sum(n for n, _, _ in curves)

    def cdf(x: float) -> float:
        acc = 0.0
        for n, xs, ps in curves:
            if x < xs[0]:
                continue
            if x >= xs[-1]:
                acc += n
                continue
            for i in range(1, len(xs)):
                if x < xs[i]:
                    span = xs[i] - xs[i - 1]
                    frac = 1.0 if span <= 0 else (x - xs[i - 1]) / span
                    acc += n * (ps[i - 1] + frac * (ps[i] - ps[i - 1]))
                    break
        return acc / total

    lo_all = min(c[1][0] for c in curves)
    hi_all = max(c[1][-1] for c in curves)
    out = []
    for target in targets:
        lo, hi = lo_all, hi_all
        for _ in range(60):
            mid = (lo + hi) / 2
            if cdf(mid) < target:
                lo = mid
            else:
                hi = mid
        out.append(hi)
    return out


@dataclass
class Freshness:
    """Source commit → visible in Iceberg over a set of batches."""

    p50_s: float
    p99_s: float
    batches: int
    records: int


def freshness_of_batches(batches: Iterable[dict[str, Any]], since_ms: int = 0) -> Freshness | None:
    """Freshness over batch records (dicts with commit_ts_ms, records, source_ts_quantiles)."""
    groups = []
    count = 0
    for batch in batches:
        q = batch.get("source_ts_quantiles")
        commit = batch.get("commit_ts_ms")
        n = int(batch.get("records") or 0)
        if not q or commit is None or n <= 0 or commit < since_ms:
            continue
        # Freshness quantiles are the source-time quantiles mirrored around the commit time.
        lag01, lag50, lag99, lag_max = commit - q[2], commit - q[1], commit - q[0], commit - q[3]
        groups.append((n, [lag01 / 1000, lag50 / 1000, lag99 / 1000], lag01 / 1000, lag_max / 1000))
        count += 1
    quantiles = mixture_quantiles(groups, (0.5, 0.99))
    if quantiles is None:
        return None
    return Freshness(quantiles[0], quantiles[1], count, sum(g[0] for g in groups))


def freshness_from_metrics(path: Path, since_ms: int = 0) -> Freshness | None:
    """Freshness from a pipeline's metrics JSONL (``<state_dir>/metrics/<name>.jsonl``)."""
    if not path.exists():
        return None
    batches = []
    for line in path.read_bytes().splitlines():
        try:
            batches.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return freshness_of_batches(batches, since_ms)
