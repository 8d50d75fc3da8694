"""Validation and quoting of identifiers that come from data (topics, tables, columns).

All SQL built from such names goes through `quote` / `quote_table` (Spark SQL, back-quotes) or
`quote_ansi` (DuckDB, double quotes): names are checked against a conservative pattern first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lakestream.errors import InvalidIdentifierError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,127}$")


def validate_identifier(name: str, what: str = "identifier") -> str:
    """Return ``name`` if it is a safe identifier, else raise InvalidIdentifierError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} is not a valid identifier: use letters, digits and _ (not starting with a digit), "
            "at most 128 chars"
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
        raise InvalidIdentifierError(
            f"column name {name!r} cannot be used: empty, too long, or contains ` or control characters"
        )
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


# PostgreSQL names as written in `capture.tables`: a part is taken exactly as written (no case folding);
# a part that holds a dot or a double quote must be written "quoted", with "" for a quote inside.
_SIMPLE_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
# Debezium's default topic naming keeps these characters and turns every other one into `_`.
_TOPIC_CHAR = re.compile(r"[^A-Za-z0-9._-]")


def _split_qualified(text: str) -> list[str]:
    """``schema.table`` parts, honouring "double-quoted" parts."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise ValueError(f"{text!r}: unterminated double quote")
                if text[j] == '"':
                    if j + 1 < n and text[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(text[j])
                j += 1
            parts.append("".join(buf))
            i = j + 1
        else:
            j = text.find(".", i)
            j = n if j < 0 else j
            part = text[i:j]
            if '"' in part:
                raise ValueError(f'{text!r}: a part with a double quote must be quoted as a whole, e.g. "a""b"')
            parts.append(part)
            i = j
        if i == n:
            return parts
        if text[i] != ".":
            raise ValueError(f"{text!r}: expected a dot after a quoted part")
        i += 1


class SourceTableName:
    """A PostgreSQL table name (schema and table exactly as PostgreSQL holds them), parsed once, with
    every form lakestream needs: the text form used in configs and logs, the SQL identifier, the
    Debezium include-list pattern and topic. Any name PostgreSQL accepts is allowed."""

    __slots__ = ("schema", "table")

    def __init__(self, schema: str, table: str):
        for part in (schema, table):
            if not part or len(part.encode("utf-8")) > 63 or "\x00" in part:
                raise ValueError(f"{part!r} is not a PostgreSQL name: empty, longer than 63 bytes, or holds NUL")
        self.schema, self.table = schema, table

    @classmethod
    def parse(cls, text: str) -> SourceTableName:
        """``public.orders``, ``public.Order Items`` or ``"my.schema"."Order ""x"" Items"``: the parts as
        written (no case folding); quote a part that holds a dot or a double quote."""
        if not isinstance(text, str):
            raise ValueError(f"{text!r}: write tables as <schema>.<table>, e.g. public.orders")
        if '"' not in text:
            parts = text.split(".")
        else:
            parts = _split_qualified(text)
        if len(parts) != 2:
            raise ValueError(
                f"{text!r}: write tables as <schema>.<table>, e.g. public.orders "
                '(double-quote a part holding a dot: public."a.b")'
            )
        return cls(parts[0], parts[1])

    @staticmethod
    def _text_part(part: str) -> str:
        return part if "." not in part and '"' not in part else '"' + part.replace('"', '""') + '"'

    def __str__(self) -> str:
        """The canonical text form: parts as they are, quoted only where a dot or quote needs it."""
        return f"{self._text_part(self.schema)}.{self._text_part(self.table)}"

    def __repr__(self) -> str:
        return f"SourceTableName({self.schema!r}, {self.table!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceTableName) and (self.schema, self.table) == (other.schema, other.table)

    def __hash__(self) -> int:
        return hash((self.schema, self.table))

    @property
    def is_simple(self) -> bool:
        return bool(_SIMPLE_PART.match(self.schema) and _SIMPLE_PART.match(self.table))

    def sql(self) -> str:
        """The PostgreSQL SQL identifier ``"schema"."table"`` (quotes doubled)."""
        return ".".join('"' + p.replace('"', '""') + '"' for p in (self.schema, self.table))

    @staticmethod
    def _pattern_literal(part: str) -> str:
        return "".join(c if (c.isascii() and (c.isalnum() or c == "_")) else f"\\x{{{ord(c):x}}}" for c in part)

    def include_pattern(self) -> str:
        """A Debezium ``table.include.list`` entry matching exactly this table. Debezium matches these
        regular expressions case-insensitively and splits the list at commas, so the pattern turns case
        sensitivity back on and writes every character other than a letter, digit or _ as ``\\x{hex}``."""
        return f"(?-i:{self._pattern_literal(self.schema)}\\.{self._pattern_literal(self.table)})"

    def schema_include_pattern(self) -> str:
        """A Debezium ``database.include.list`` / ``schema.include.list`` entry matching exactly this table's
        schema (a MariaDB table's database), written as `include_pattern` writes it."""
        return f"(?-i:{self._pattern_literal(self.schema)})"

    def topic(self, prefix: str) -> str:
        """The Kafka topic lakestream publishes this table's changes to: ``<prefix>.<schema>.<table>``, each
        character other than a letter, digit, ``_`` or ``-`` (a dot inside a name too) replaced by ``_``."""
        return ".".join(
            [
                prefix,
                _TOPIC_CHAR.sub("_", self.schema).replace(".", "_"),
                _TOPIC_CHAR.sub("_", self.table).replace(".", "_"),
            ]
        )

    def debezium_topic(self, prefix: str) -> str:
        """The topic Debezium's default naming gives this table (it keeps dots inside a name)."""
        return ".".join([prefix, _TOPIC_CHAR.sub("_", self.schema), _TOPIC_CHAR.sub("_", self.table)])


# -- lake table names ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableName:
    """A lake table's name: ``namespace.table`` (the catalog is the pipeline's)."""

    namespace: str
    table: str

    def __str__(self) -> str:
        return f"{self.namespace}.{self.table}"

    @classmethod
    def parse(cls, text: str, catalog: str | None = None) -> TableName:
        """``namespace.table`` (or ``<catalog>.namespace.table`` when ``catalog`` is given), every part a valid
        identifier; InvalidIdentifierError naming the expected form otherwise."""
        parts = text.split(".") if isinstance(text, str) else []
        if catalog is not None and len(parts) == 3 and parts[0] == catalog:
            parts = parts[1:]
        if len(parts) != 2:
            form = f"namespace.table or {catalog}.namespace.table" if catalog else "namespace.table"
            raise InvalidIdentifierError(f"table {text!r}: write it as {form}")
        return cls(validate_identifier(parts[0], "namespace"), validate_identifier(parts[1], "table"))

    def quoted(self, catalog: str) -> str:
        """``catalog.namespace.table`` validated and quoted for Spark SQL."""
        return quote_table(catalog, self.namespace, self.table)


def topic_parts(topic: str) -> dict[str, str]:
    """``{prefix, schema, table, topic}`` of a Debezium-style topic name, sanitized into identifiers."""
    parts = topic.split(".")
    table = parts[-1]
    schema = parts[-2] if len(parts) >= 2 else ""
    prefix = ".".join(parts[:-2]) if len(parts) >= 3 else ""
    return {
        "prefix": sanitize_identifier(prefix) if prefix else "",
        "schema": sanitize_identifier(schema) if schema else "",
        "table": sanitize_identifier(table),
        "topic": sanitize_identifier(topic),
    }


def table_from_template(namespace: str, template: str, topic: str, field: str | None = None) -> TableName:
    """The table a stream's ``table`` template names for ``topic`` (and a routing ``field`` value): the one
    naming rule of mirrors. InvalidIdentifierError when the result is not a valid table name."""
    values = topic_parts(topic)
    values["field"] = field or ""
    name = template.format(**values).strip("_")
    name = re.sub(r"__+", "_", name) if "{" in template else name
    return TableName(namespace, validate_identifier(name, what="table name"))
