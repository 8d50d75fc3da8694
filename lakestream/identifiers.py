"""Validation and quoting of identifiers that come from data (topics, tables, columns).

All SQL built from such names goes through `quote` / `quote_table` (Spark SQL, back-quotes) or
`quote_ansi` (DuckDB, double quotes): names are checked against a conservative pattern first.
"""
from __future__ import annotations

import re

from lakestream.errors import InvalidIdentifierError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,127}$")


def validate_identifier(name: str, what: str = "identifier") -> str:
    """Return ``name`` if it is a safe identifier, else raise InvalidIdentifierError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} is not a valid identifier: use letters, digits and _ (not starting with a digit), at most 128 chars"
        )
    return name


def sanitize_identifier(name: str) -> str:
    """Map an arbitrary name (e.g. a topic segment) onto a safe identifier, lower-cased."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name).lower()
    if not cleaned or cleaned[0].isdigit():
        cleaned = "t_" + cleaned
    return cleaned[:128]


def quote(name: str, what: str = "identifier") -> str:
    """Validate and back-quote one identifier part for Spark SQL."""
    validate_identifier(name, what)
    return f"`{name}`"


def quote_column(name: str) -> str:
    """Back-quote a column name. Columns come from source schemas, so any character but a back-quote is allowed."""
    if not isinstance(name, str) or not name or "`" in name or len(name) > 255 or any(ord(c) < 32 for c in name):
        raise InvalidIdentifierError(f"column name {name!r} cannot be used: empty, too long, or contains ` or control characters")
    return f"`{name}`"


def quote_table(catalog: str, namespace: str, table: str) -> str:
    """``catalog.namespace.table`` with every part validated and quoted."""
    return ".".join((quote(catalog, "catalog"), quote(namespace, "namespace"), quote(table, "table")))


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_ansi(name: str, what: str = "identifier") -> str:
    """Validate and double-quote one identifier part for ANSI SQL (DuckDB)."""
    validate_identifier(name, what)
    return f'"{name}"'


def quote_ansi_column(name: str) -> str:
    """Double-quote a column name from a source schema for ANSI SQL (DuckDB); same rules as `quote_column`."""
    quote_column(name)
    return '"' + name.replace('"', '""') + '"'


def ansi_string(value: str) -> str:
    """An ANSI SQL (DuckDB) string literal: quotes doubled, no backslash escapes."""
    return "'" + value.replace("'", "''") + "'"
