"""Column records (`lakestream.capture.columns`) as pure units: the catalog's default texts, the record's bytes, and
the shape the decoder makes of them."""

from __future__ import annotations

import pytest

from lakestream.capture.columns import (
    COLUMNS_OP,
    CatalogColumn,
    column_record,
    default_wire_value,
    mariadb_default_literal,
    postgresql_default_literal,
)
from lakestream.decode.envelope import COLUMN_RECORD_SHAPE, COLUMNS, SchemaCache, decode_debezium
from lakestream.errors import DecodeError


@pytest.mark.parametrize(
    ("expression", "literal"),
    [
        ("'qd'::character varying", "qd"),
        ("'it''s'::text", "it's"),
        ("42", "42"),
        ("(-1.5)::numeric", "-1.5"),
        ("'2024-02-29'::date", "2024-02-29"),
        ("true", "true"),
        ("now()", None),
        ("nextval('t_id_seq'::regclass)", None),
        (None, None),
    ],
)
def test_postgresql_default_literals(expression, literal):
    assert postgresql_default_literal(expression) == literal


@pytest.mark.parametrize(
    ("default", "nullable", "data_type", "column_type", "ddl", "literal"),
    [
        ("'qd'", True, "varchar", "varchar(5)", "string", "qd"),
        ("'it''s'", True, "varchar", "varchar(9)", "string", "it's"),
        ("5", True, "int", "int(11)", "int", "5"),
        ("NULL", True, "varchar", "varchar(5)", "string", None),
        (None, True, "int", "int(11)", "int", None),
        ("current_timestamp()", False, "timestamp", "timestamp", "timestamp", None),
        # NOT NULL without a default: the implicit one MariaDB gives the rows that predate the column
        (None, False, "varchar", "varchar(5)", "string", ""),
        (None, False, "int", "int(11)", "int", "0"),
        (None, False, "enum", "enum('b','a')", "string", "b"),
        (None, False, "blob", "blob", "binary", None),
    ],
)
def test_mariadb_default_literals(default, nullable, data_type, column_type, ddl, literal):
    assert mariadb_default_literal(default, nullable, data_type, column_type, ddl) == literal


@pytest.mark.parametrize(
    ("ddl", "literal", "wire"),
    [
        ("string", "qd", "qd"),
        ("int", "7", 7),
        ("bigint", "-9", -9),
        ("double", "2.5", 2.5),
        ("boolean", "true", True),
        ("boolean", "0", False),
        ("decimal(8,2)", "1.5", "1.50"),
        ("date", "1970-01-03", 2),
        ("timestamp", "2024-01-01 00:00:00", None),
        ("int", "not a number", None),
        ("string", None, None),
    ],
)
def test_default_wire_values(ddl, literal, wire):
    assert default_wire_value(ddl, literal) == wire


def test_a_column_record_decodes_to_its_shape():
    columns = [CatalogColumn("id", "int"), CatalogColumn("q", "string", "qd"), CatalogColumn("n", "decimal(8,2)")]
    value = column_record("shop.quiet", columns, 1_700_000_000_000)
    change = decode_debezium(None, value, SchemaCache())
    assert change is not None and change.op == COLUMNS == COLUMNS_OP
    assert (change.columns.names, [t.ddl for t in change.columns.types]) == (
        ["id", "q", "n"],
        ["int", "string", "decimal(8,2)"],
    )
    assert change.columns.defaults == {"q": "qd"} and change.columns.inferred and change.row == {}
    assert change.columns.schema_id.startswith(COLUMN_RECORD_SHAPE)
    # another default is another shape
    other = decode_debezium(None, column_record("shop.quiet", [CatalogColumn("q", "string", "x")], 1), SchemaCache())
    again = decode_debezium(None, column_record("shop.quiet", [CatalogColumn("q", "string", "qd")], 2), SchemaCache())
    assert other is not None and again is not None and other.columns.schema_id != again.columns.schema_id


def test_a_column_record_without_columns_is_refused():
    with pytest.raises(DecodeError, match="without a list of columns"):
        decode_debezium(None, b'{"op": "lakestream.columns", "columns": 3}', SchemaCache())
