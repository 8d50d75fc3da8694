"""Strict conversion of decoded rows into a table's Arrow schema.

Rows arrive with typed values (see `lakestream.decode.types`); a column is built with one pyarrow call
(`lakestream.decode.columns.build_column`). A value that does not fit its column (an integer overflow, NaN in an
integer or decimal column, a string in a numeric column, a fraction in an integer column) is never turned into NULL:
the whole row is reported with a precise reason and left out, and the rest is converted.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import pyarrow as pa

from lakestream.decode.columns import build_column
from lakestream.errors import first_line
from lakestream.sink.types import DEFAULT_KEY, write_default


def _value_error(value: Any, arrow_type: pa.DataType) -> str | None:
    try:
        build_column([value], arrow_type)
        return None
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
        return first_line(exc, 200)


def _columns(rows: list[dict[str, Any]], names: list[str]) -> dict[str, list[Any]]:
    """Rows → one list per column (C-level item getters; a row lacking a column gives None there)."""
    if not rows:
        return {n: [] for n in names}
    if len(names) == 1:
        return {names[0]: [r.get(names[0]) for r in rows]}
    get = itemgetter(*names)
    tuples: list[tuple[Any, ...]] = []
    append = tuples.append
    for r in rows:
        try:
            append(get(r))
        except KeyError:
            append(tuple(map(r.get, names)))
    return dict(zip(names, map(list, zip(*tuples, strict=True)), strict=False))  # no rows: no columns


def convert_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
    """``rows`` as a table in ``schema`` (columns a row lacks are NULL), and the rows left out
    because a value did not fit: index → reason naming the column, the value and the type."""
    bad: dict[int, str] = {}
    columns = _columns(rows, schema.names)
    arrays: dict[str, pa.Array] = {}
    for f in schema:
        values = columns[f.name]
        if f.metadata and DEFAULT_KEY in f.metadata:
            # A record that predates the column (its shape lacks it) gets the source's default, as the
            # source row did when the column was added; an explicit null stays null.
            _, default = write_default(f)
            name = f.name
            values = columns[name] = [r[name] if name in r else default for r in rows]
        try:
            arrays[f.name] = build_column(values, f.type)
        except (ValueError, TypeError, OverflowError, pa.ArrowException):
            for i, v in enumerate(values):
                if i in bad or v is None:
                    continue
                reason = _value_error(v, f.type)
                if reason is not None:
                    bad[i] = f"column {f.name!r}: value {str(v)[:80]!r} does not fit type {f.type}: {reason}"
        if not f.nullable and (f.name not in arrays or arrays[f.name].null_count):
            for i, v in enumerate(values):
                if v is None and i not in bad:
                    bad[i] = f"column {f.name!r} is required (a key column) but missing or null"
    if bad:
        keep = [i for i in range(len(rows)) if i not in bad]
        arrays = {f.name: build_column([columns[f.name][i] for i in keep], f.type) for f in schema}
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema), bad
