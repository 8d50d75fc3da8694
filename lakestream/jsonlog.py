"""Small JSON-lines logs in the state directory (health history, maintenance log): appended a round at
a time, read back newest-last, and kept under a size bound by dropping their oldest half."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

DEFAULT_MAX_BYTES = 32 * 1024 * 1024


def append_lines(path: Path, records: list[dict[str, Any]], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Append ``records``; past ``max_bytes`` the file is rewritten with its newer half (atomically)."""
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as fh:
        fh.write(b"".join(orjson.dumps(r, default=str) + b"\n" for r in records))
        size = fh.tell()
    if size > max_bytes:
        data = path.read_bytes()
        cut = data.find(b"\n", len(data) // 2) + 1
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data[cut:])
        os.replace(tmp, path)


def read_lines(path: Path, limit: int, keep: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` records (that ``keep`` accepts), oldest first; unreadable lines (a torn last
    write) are skipped."""
    if not path.exists():
        return []
    records: deque[dict[str, Any]] = deque(maxlen=limit)
    with path.open("rb") as fh:
        for line in fh:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if keep is None or keep(record):
                records.append(record)
    return list(records)
