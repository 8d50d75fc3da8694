"""A column with a source default: rows whose record predates the column get the default; explicit NULLs stay."""

from __future__ import annotations

import datetime as dt

from lakestream.sink.types import arrow_schema
from lakestream.sink.write.convert import convert_rows


def test_rows_lacking_a_defaulted_column_get_the_default():
    schema = arrow_schema(
        {
            "type": "struct",
            "schema-id": 0,
            "fields": [
                {"id": 1, "name": "id", "required": True, "type": "int"},
                {
                    "id": 2,
                    "name": "loyalty",
                    "required": False,
                    "type": "int",
                    "write-default": 7,
                    "initial-default": 7,
                },
                {"id": 3, "name": "since", "required": False, "type": "date", "write-default": "2020-02-03"},
                {"id": 4, "name": "plain", "required": False, "type": "int"},
            ],
        }
    )
    table, bad = convert_rows(
        [{"id": 1}, {"id": 2, "loyalty": None, "since": None, "plain": 3}, {"id": 3, "loyalty": 9}], schema
    )
    assert bad == {}
    assert table.to_pylist() == [
        {"id": 1, "loyalty": 7, "since": dt.date(2020, 2, 3), "plain": None},
        {"id": 2, "loyalty": None, "since": None, "plain": 3},
        {"id": 3, "loyalty": 9, "since": dt.date(2020, 2, 3), "plain": None},
    ]
