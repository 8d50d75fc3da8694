"""Routing: which Iceberg table a record belongs to.

A topic maps to a table through its stream's naming template (``{prefix}``, ``{schema}``,
``{table}`` from the Debezium topic ``<prefix>.<schema>.<table>``, ``{topic}``), or, with
``route_field``, through a value inside the record (one topic feeding many tables).
"""

from __future__ import annotations

import re
from typing import Any

from lakestream.config import PipelineConfig, StreamSettings
from lakestream.errors import InvalidIdentifierError, UnroutableRecord
from lakestream.identifiers import TableName, table_from_template


class Router:
    """Resolves (topic, record) → (stream settings, table name). Picklable, used on executors."""

    _index_cache: dict[str, int | None]  # topic → its stream (set on first use: a Router travels pickled)

    def __init__(self, streams: list[StreamSettings]):
        self.streams = streams
        self._topic_cache: dict[str, tuple[int, TableName | None]] = {}

    @classmethod
    def from_config(cls, config: PipelineConfig) -> Router:
        return cls(list(config.streams))

    def stream_index(self, topic: str) -> int | None:
        try:
            return self._index_cache[topic]
        except (KeyError, AttributeError):
            pass
        found = next((i for i, stream in enumerate(self.streams) if stream.matches(topic)), None)
        cache = self.__dict__.setdefault("_index_cache", {})
        if len(cache) < 100_000:
            cache[topic] = found
        return found

    def _template_name(self, stream: StreamSettings, topic: str, field: str | None) -> TableName:
        try:
            return table_from_template(stream.namespace, stream.table, topic, field)
        except InvalidIdentifierError as exc:
            raise UnroutableRecord(f"cannot route to a table: {exc}") from None

    def route(
        self, topic: str, payload: dict[str, Any] | None = None, headers: list[tuple[str, bytes]] | None = None
    ) -> tuple[StreamSettings, TableName]:
        """The stream and table for a record; DecodeError when the record cannot be routed."""
        cached = self._topic_cache.get(topic)
        if cached is None:
            index = self.stream_index(topic)
            if index is None:
                raise UnroutableRecord(f"no stream in the config matches topic {topic!r}")
            stream = self.streams[index]
            dynamic = stream.route_field or stream.route_header
            cached = (index, None if dynamic else self._template_name(stream, topic, None))
            self._topic_cache[topic] = cached
        index, table = cached
        stream = self.streams[index]
        if table is not None:
            return stream, table
        if stream.route_header:
            what = f"route header {stream.route_header!r}"
            value = _header_value(headers, stream.route_header)
        else:
            what = f"route field {stream.route_field!r}"
            value = _field_value(payload, stream.route_field)
        if value is None or value == "":
            raise UnroutableRecord(f"{what} is missing or null")
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", value):
            raise UnroutableRecord(f"{what} value {str(value)[:60]!r} is not a valid table name")
        return stream, self._template_name(stream, topic, value)


def _field_value(payload: dict[str, Any] | None, path: str | None) -> Any:
    if payload is None or path is None:
        return None
    node: Any = payload
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _header_value(headers: list[tuple[str, bytes]] | None, name: str) -> str | None:
    for key, value in headers or []:
        if key == name and value is not None:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None
