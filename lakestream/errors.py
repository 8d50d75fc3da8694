"""Precise exception types; every user-facing failure is one of these."""

import re
from dataclasses import dataclass


class LakestreamError(Exception):
    """Base of all lakestream errors."""


class ConfigError(LakestreamError):
    """A configuration value is missing or wrong; the message names the field and the fix."""


class KafkaAccessError(ConfigError):
    """Kafka refused this client: its SASL credentials, its trust of the broker's certificate, or an ACL.
    No retry cures it, so the process stops at once; the message names the ``kafka.client`` setting (or the
    ACL) to fix and never holds a secret."""


class InvalidIdentifierError(LakestreamError, ValueError):
    """A name derived from data (topic, table, column) cannot be used as an SQL identifier."""


class FatalError(LakestreamError):
    """A failure no retry can cure (the driver's JVM died or ran out of memory, Spark stopped): the process
    exits non-zero at once, for its supervisor to restart it; everything resumes from the tables."""


class StoppedAfterFailures(LakestreamError):
    """Stopped (SIGTERM, Ctrl-C) while batches were failing: the exit is not clean, so it is non-zero."""


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
DEAD_LETTER_KINDS = (
    "malformed",
    "unroutable",
    "missing_key",
    "bad_value",
    "incompatible_schema",
    "write_failed",
    "transform_failed",
    "late",
)


class SchemaRegistryUnavailable(LakestreamError):
    """The Schema Registry could not be asked (down, refused, timed out): the batch fails and is retried;
    no record is blamed for it."""


class QueryError(LakestreamError):
    """A read cannot be answered correctly by the chosen engine (unknown table, files it cannot read)."""


class OffsetError(LakestreamError):
    """Kafka offsets are inconsistent (e.g. committed offset no longer retained by the broker)."""


class ReadStalled(OffsetError):
    """A Spark task's read made no progress for its stall timeout: the broker is away (an outage)."""


# -- classifying a failure ------------------------------------------------------------------------
# A failure is classified by the exception types it carries, never by free text: the Python exception's
# classes, the Java exception's class and every cause's (a Py4J error), and the exception class names a
# remote failure names (a Spark task's Python traceback reaches the driver only as the text of a
# `PythonException`, each line naming its exception class). So a data error whose message quotes
# "Connection refused" is data, not an outage.

# The table moved under a commit (maintenance, another writer): the write is re-planned against its new
# state. Class → the conflict's cause as a bounded metrics label.
CONFLICT_TYPES = {
    "CommitFailedException": "commit_failed",
    "ValidationException": "validation",
    "CommitStateUnknownException": "state_unknown",
    "NotFoundException": "not_found",
    "FileNotFoundException": "not_found",
}
# Kafka refused a client (credentials, TLS trust, ACL): a retry cannot fix it, stop. A Spark task's failure
# names the type only in its text.
CONFIG_TYPES = frozenset({"KafkaAccessError"})  # the name must end in Error: see _NAMED_CLASS
# A service the batch needs (broker, catalog, storage) is unreachable: waited out, it passes by itself.
OUTAGE_TYPES = frozenset(
    {
        "KafkaException",
        "KafkaError",
        "BrokerNotAvailableError",
        "SQLException",
        "PSQLException",
        "SQLTransientConnectionException",
        "IOException",
        "ConnectException",
        "SocketException",
        "SocketTimeoutException",
        "UnknownHostException",
        "NoRouteToHostException",
        "CommitStateUnknownException",
        "ReadStalled",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "OperationalError",
        "ServiceUnavailableException",  # the REST catalog answered 503
    }
)
# Infrastructure that does not pass by itself (the JVM out of memory, Spark gone), or another failure of
# a service the batch depends on: never blamed on a record, never waited out as an outage.
FATAL_TYPES = frozenset({"OutOfMemoryError", "MemoryError", "Py4JNetworkError", "StackOverflowError"})
INFRASTRUCTURE_TYPES = frozenset(
    {
        "OffsetError",
        "SchemaRegistryUnavailable",
        "FileNotFoundException",
        "NoSuchFileException",
        "AccessDeniedException",
        "NoSuchTableException",
        "CommitFailedException",
        "ValidationException",
        "NotFoundException",
        # Object storage (the AWS SDK behind S3FileIO) and the REST catalog (unreachable, or a 5xx it reports).
        "S3Exception",
        "SdkClientException",
        "AwsServiceException",
        "RESTException",
        "ServiceFailureException",
    }
)
# The AWS SDKs report what went wrong as a code inside one exception type (Java: SdkClientException or
# S3Exception; pyarrow's C++ SDK: an OSError "... AWS Error <CODE> ..."): read the code there only.
_STORAGE_TYPES = frozenset({"S3Exception", "SdkClientException", "AwsServiceException", "OSError"})
_STORAGE_OUTAGE_CODES = (
    "Unable to execute HTTP request",
    "NETWORK_CONNECTION",
    "Couldn't connect to server",
    "SlowDown",
    "Service Unavailable",
    "ServiceUnavailable",
    "curlCode: 7,",
    "curlCode: 28,",
)
_STORAGE_ERROR_CODES = ("AWS Error", "InvalidAccessKeyId", "SignatureDoesNotMatch")
# Spark states that no exception type names: the driver's context stopped, an executor died.
_SPARK_GONE = ("SparkContext was shut down", "ExecutorLostFailure", "SparkContext has been shutdown")

# An exception class named where a remote failure's text names it: at the start of a line (a Python
# traceback's last line, a Java stack trace's first) or after "Caused by:". A class name quoted inside a
# message (a record's value, an error's detail) is not one of these.
_NAMED_CLASS = re.compile(r"^\s*(?:Caused by:\s*)?(?:[\w$]+\.)*([A-Z]\w*(?:Exception|Error))\b", re.MULTILINE)


def exception_types(exc: BaseException) -> list[str]:
    """The simple class names a failure carries, without repeats: its Python classes (and its cause's), the
    Java exception's class and every cause's (a Py4J error), and the classes a remote failure's text names
    (a Spark task's Python exception reaches the driver only as the text of a `PythonException`)."""
    names = [cls.__name__ for cls in type(exc).__mro__ if cls not in (object, BaseException)]
    names += _NAMED_CLASS.findall(str(exc))
    java = getattr(exc, "java_exception", None)
    depth = 0
    while java is not None and depth < 16:
        try:
            names.append(str(java.getClass().getSimpleName()))
            names += _NAMED_CLASS.findall(str(java.getMessage() or ""))
            java = java.getCause()
        except Exception:  # noqa: BLE001 — the JVM itself may be what failed
            break
        depth += 1
    for cause in (exc.__cause__, exc.__context__):
        if cause is not None and cause is not exc:
            names += [cls.__name__ for cls in type(cause).__mro__ if cls not in (object, BaseException)]
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Failure:
    """What kind of failure an exception is: ``config`` (fix the config; stop), ``fatal`` (no retry can
    cure it: a dead or exhausted JVM; stop), ``outage`` (a service is away; wait it out), ``conflict``
    (the table moved under a commit; re-plan, ``cause`` says how), ``infrastructure`` (another failure of
    the services; retry a few times), ``data`` (presumed to come from a record; isolate it)."""

    kind: str
    cause: str | None = None

    @property
    def infrastructure(self) -> bool:
        """Not a record's fault: never isolated as one (a config failure included: no record causes it)."""
        return self.kind in ("config", "fatal", "outage", "conflict", "infrastructure")


def classify_failure(exc: BaseException) -> Failure:
    """The one classification of a failure, used by the engine, maintenance and re-snapshot alike."""
    if isinstance(exc, ConfigError):
        return Failure("config")
    names = exception_types(exc)
    if any(n in CONFIG_TYPES for n in names):
        return Failure("config")
    text = str(exc)
    if any(n in FATAL_TYPES for n in names) or any(marker in text for marker in _SPARK_GONE):
        return Failure("fatal")
    conflict = next((CONFLICT_TYPES[n] for n in names if n in CONFLICT_TYPES), None)
    storage = any(n in _STORAGE_TYPES for n in names)
    if any(n in OUTAGE_TYPES for n in names) or (storage and any(c in text for c in _STORAGE_OUTAGE_CODES)):
        return Failure("outage", conflict)
    if conflict is not None:
        return Failure("conflict", conflict)
    if any(n in INFRASTRUCTURE_TYPES for n in names) or "No space left" in text:  # ENOSPC, Python or Java
        return Failure("infrastructure")
    if storage and any(c in text for c in _STORAGE_ERROR_CODES):
        return Failure("infrastructure")
    return Failure("data")


def conflict_cause(exc: BaseException) -> str | None:
    """The cause of a commit conflict (a bounded label), or None if ``exc`` is not one."""
    names = exception_types(exc)
    return next((CONFLICT_TYPES[n] for n in names if n in CONFLICT_TYPES), None)


def is_infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (possibly a Py4J-wrapped Java or Spark task error) comes from infrastructure or the
    configuration: not a record's fault, so it fails the batch instead of being isolated."""
    return classify_failure(exc).infrastructure


def is_service_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says a service the batch needs (broker, catalog, storage) is unreachable."""
    return classify_failure(exc).kind == "outage"


def first_line(exc: BaseException, limit: int = 500) -> str:
    """The one way an error is shortened to one line (at most ``limit`` characters): the informative line (a Spark
    task failure's Python exception, a Py4J error's Java exception), else the first line, else the type's name."""
    # Py4J puts the Java exception on a line of its own after ": ".
    lines = [line.strip().removeprefix(": ") for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line) and "Traceback" not in line:
            return line[:limit]
    lines = [line for line in lines if not line.startswith(("File ", "at ", "Traceback"))] or lines
    return (lines[0] if lines else type(exc).__name__)[:limit]


class ChangeFeedError(QueryError):
    """A change feed cannot be read for the range asked (a snapshot expired or not in the table's history, a
    table without row lineage); the message names the range that can be read."""
