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
    """A record cannot be decoded; it goes to the dead-letter table with this message.

    ``kind`` is one of `DEAD_LETTER_KINDS`: a bounded label for metrics (the message is not)."""

    kind = "malformed"


class UnroutableRecord(DecodeError):
    """No stream claims the record's topic, or its routing field/header names no valid table."""

    kind = "unroutable"


class MissingKey(DecodeError):
    """An upsert record without a usable key (or an append record without its de-duplication id)."""

    kind = "missing_key"


class BadValue(DecodeError):
    """A value that does not match its declared type (or the table column it goes to)."""

    kind = "bad_value"


# Every reason a record becomes a dead letter, as a bounded set of labels (metrics group by these).
DEAD_LETTER_KINDS = ("malformed", "unroutable", "missing_key", "bad_value", "incompatible_schema", "write_failed",
                     "transform_failed", "late")


class SchemaRegistryUnavailable(LakestreamError):
    """The Schema Registry could not be asked (down, refused, timed out): the batch fails and is retried;
    no record is blamed for it."""


class QueryError(LakestreamError):
    """A read cannot be answered correctly by the chosen engine (unknown table, files it cannot read)."""


class OffsetError(LakestreamError):
    """Kafka offsets are inconsistent (e.g. committed offset no longer retained by the broker)."""


# Failures of the services a batch depends on (broker, catalog, storage, the Spark cluster itself),
# by exception class name as it appears in the Python or Java error. Anything else that fails a write
# is presumed to come from the data, and the engine isolates the record that causes it.
_INFRASTRUCTURE_MARKERS = (
    "KafkaException", "KafkaError", "OffsetError", "SchemaRegistryUnavailable", "_TRANSPORT", "_ALL_BROKERS_DOWN", "BrokerNotAvailable",
    "SQLException", "PSQLException", "SQLTransientConnectionException", "IOException", "FileNotFoundException",
    "NoSuchFileException", "AccessDeniedException", "No space left", "ConnectException", "Connection refused",
    "Connection reset", "SocketTimeoutException", "UnknownHostException", "OutOfMemoryError", "MemoryError",
    "ExecutorLostFailure", "Py4JNetworkError", "SparkContext was shut down", "CommitStateUnknownException",
    # The table moved under the commit (another writer, maintenance) past the committer's own retries.
    "CommitFailedException", "ValidationException", "NoSuchTableException", "NotFoundException",
    # Object storage: the AWS SDK (Java: S3FileIO) and pyarrow's S3 filesystem (C++ SDK: "AWS Error ...").
    "S3Exception", "SdkClientException", "AWS Error", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    # The REST catalog: unreachable, or an error the server reports (5xx).
    "RESTException", "ServiceFailureException", "ServiceUnavailableException",
)


def is_infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (possibly a Py4J-wrapped Java or Spark task error) comes from infrastructure."""
    text = f"{type(exc).__name__} {getattr(exc, 'java_exception', '')} {exc}"
    return any(marker in text for marker in _INFRASTRUCTURE_MARKERS)


# The infrastructure failures that pass by themselves when a service comes back (broker, catalog,
# storage unreachable); the engine waits these out instead of exiting. A dead Spark driver or JVM
# memory exhaustion does not pass, so those are not here.
_OUTAGE_MARKERS = (
    "KafkaException", "KafkaError", "_TRANSPORT", "_ALL_BROKERS_DOWN", "BrokerNotAvailable", "SQLException",
    "PSQLException", "SQLTransientConnectionException", "IOException", "ConnectException", "Connection refused",
    "Connection reset", "SocketTimeoutException", "UnknownHostException", "CommitStateUnknownException",
    "no progress reading",  # a Spark task's read stalled (lakestream.source.reader): the broker is away
    # Object storage away or overloaded: the AWS SDK's connection failures (Java, and pyarrow's C++ SDK).
    "Unable to execute HTTP request", "NETWORK_CONNECTION", "Couldn't connect to server", "SlowDown",
    "Service Unavailable", "ServiceUnavailable", "curlCode: 7,", "curlCode: 28,",
)


def is_service_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says a service the batch needs (broker, catalog, storage) is unreachable."""
    text = f"{type(exc).__name__} {getattr(exc, 'java_exception', '')} {exc}"
    return any(marker in text for marker in _OUTAGE_MARKERS) and not any(
        fatal in text for fatal in ("SparkContext was shut down", "OutOfMemoryError", "Py4JNetworkError"))
