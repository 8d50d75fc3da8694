"""Precise exception types; every user-facing failure is one of these."""


class LakestreamError(Exception):
    """Base of all lakestream errors."""


class ConfigError(LakestreamError):
    """A configuration value is missing or wrong; the message names the field and the fix."""


class InvalidIdentifierError(LakestreamError, ValueError):
    """A name derived from data (topic, table, column) cannot be used as an SQL identifier."""


class StackError(LakestreamError):
    """A local service (PostgreSQL, broker) failed to start, stop or answer."""


class CaptureError(LakestreamError):
    """Debezium capture failed."""


class DecodeError(LakestreamError):
    """A record cannot be decoded; it goes to the dead-letter table with this message."""


class QueryError(LakestreamError):
    """A read cannot be answered correctly by the chosen engine (unknown table, files it cannot read)."""


class OffsetError(LakestreamError):
    """Kafka offsets are inconsistent (e.g. committed offset no longer retained by the broker)."""

