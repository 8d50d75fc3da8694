"""One Arrow column from typed values, strictly: a value that does not fit its type raises, never becomes NULL
or a nearby number. The write task's conversion of rows (`lakestream.sink.write.convert`) and the run decoder's
per-value path (`lakestream.decode.vectorized`) both build their columns here."""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa


def _text(value: Any) -> Any:
    """A value for a string column: text as is; numbers, booleans and nested values as their text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, decimal.Decimal)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return orjson.dumps(value, default=str).decode()


_EXACT_FLOAT_INT = 2.0**53


def _check_integers(values: Sequence[Any]) -> None:
    """pyarrow truncates 1.5 to 1 when building an integer column: refuse fractions ourselves. Refuse
    floats beyond 2^53 too: JSON parsers read an integer literal outside int64 (-2^63 - 1) as the
    nearest float, which may round to a value that fits (-2^63) — a different number."""
    if float in set(map(type, values)):
        for v in values:
            if type(v) is float and not (v == v and abs(v) < _EXACT_FLOAT_INT and v.is_integer()):
                raise ValueError(f"{v!r} is not an integer (or not exactly one)")


def _check_decimals(values: Sequence[Any]) -> None:
    for v in values:
        if isinstance(v, float) and not (v == v and v not in (float("inf"), float("-inf"))):
            raise ValueError(f"{v!r} is not a finite number")
        if isinstance(v, decimal.Decimal) and not v.is_finite():
            raise ValueError(f"{v!r} is not a finite number")


def build_column(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """One column, strictly: raises (ValueError, ArrowException, TypeError, OverflowError) when a value does not fit."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pa.array([_text(v) for v in values], type=arrow_type)
    if pa.types.is_integer(arrow_type):
        _check_integers(values)
    elif pa.types.is_decimal(arrow_type):
        _check_decimals(values)
        values = [decimal.Decimal(repr(v)) if isinstance(v, float) else v for v in values]
    elif pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        if bool in set(map(type, values)) and not pa.types.is_boolean(arrow_type):
            raise ValueError("a boolean is not a number")
    return pa.array(values, type=arrow_type)
