"""The latest change per key, and where the TOAST values Debezium withheld come from.

One rule for the write tasks (``sink/write/task.py``) and fresh reads (``read/fresh.py``): within a run of changes in
Kafka order, the last change of each key wins; a change that withholds a column (Debezium's placeholder for an
unchanged TOASTed value) takes it from the key's previous change in the run, following a chain of such
changes back to one that carried it, or, when the run holds no earlier change of the key, from the key's
stored row (``STORED``). After a delete there is nothing to take from: an insert after a delete carries every
column.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

STORED = -1  # a fill source: the key's row as stored before this run (the table's, or the snapshot's)


def last_per_key(keys: np.ndarray, order: np.ndarray) -> list[int]:
    """Indices of the last change of each key in ``order`` (vectorized; for runs that withhold nothing)."""
    reversed_keys = keys[order][::-1]
    _, first_in_reversed = np.unique(reversed_keys, return_index=True)
    return sorted(order[::-1][first_in_reversed].tolist())


def first_per_key(keys: Sequence[Hashable], order: Sequence[int]) -> list[int]:
    """Indices of the first change of each key in ``order`` (append streams de-duplicated by id)."""
    first: dict[Any, int] = {}
    for i in order:
        first.setdefault(keys[i], i)
    return sorted(first.values())


def latest_per_key(
    keys: Sequence[Hashable], ops: Sequence[str], withheld: Sequence[Sequence[str]], order: Sequence[int]
) -> tuple[list[int], dict[int, dict[str, int]]]:
    """Indices of the last change of each key (in ``order``), and the fills: for each change that withholds
    columns, column → the index of the earlier change that carries its value, or ``STORED``."""
    last: dict[Any, int] = {}
    fills: dict[int, dict[str, int]] = {}
    for i in order:
        key = keys[i]
        prev = last.get(key)
        if withheld[i] and ops[i] != "d":
            mine: dict[str, int] = {}
            if prev is None:
                mine = {column: STORED for column in withheld[i]}
            elif ops[prev] != "d":
                sources = fills.get(prev, {})
                for column in withheld[i]:
                    if column in sources:
                        mine[column] = sources[column]  # the earlier change withheld it too: follow its source
                    elif column not in withheld[prev]:
                        mine[column] = prev
            if mine:
                fills[i] = mine
        last[key] = i
    return sorted(last.values()), fills
