"""Pure units of the engine: routing, identifier quoting, freshness quantiles, offsets encoding."""

from __future__ import annotations

import pytest

from lakestream.config import StreamSettings
from lakestream.engine.result import combine_quantiles
from lakestream.errors import DecodeError, InvalidIdentifierError
from lakestream.identifiers import TableName, quote, quote_column, quote_table, sql_string, topic_parts
from lakestream.routing import Router
from lakestream.sink.commit.offsets import ancestry, decode_offsets, encode_offsets
from lakestream.source.kafka import TP


def test_topic_parts_of_debezium_names():
    assert topic_parts("shop.public.order_items") == {
        "prefix": "shop",
        "schema": "public",
        "table": "order_items",
        "topic": "shop_public_order_items",
    }
    assert topic_parts("a.b.c.d")["prefix"] == "a_b"  # a dotted prefix
    assert topic_parts("clicks")["table"] == "clicks"
    assert topic_parts("shop.public.Order-Items")["table"] == "order_items"


def test_router_template_field_and_header():
    router = Router(
        [
            StreamSettings(topics=["shop.public.orders"], namespace="cdc", table="{schema}_{table}"),
            StreamSettings(
                topic_pattern=r"events\..*", mode="append", namespace="ev", table="{field}", route_field="kind"
            ),
            StreamSettings(topics=["mixed"], mode="append", namespace="ev", table="m_{field}", route_header="type"),
        ]
    )
    assert router.route("shop.public.orders")[1] == TableName("cdc", "public_orders")
    assert router.route("events.x", {"kind": "click"})[1] == TableName("ev", "click")
    assert router.route("mixed", {}, [("type", b"view")])[1] == TableName("ev", "m_view")
    with pytest.raises(DecodeError, match="not a valid table name"):
        router.route("events.x", {"kind": "drop table; --"})
    with pytest.raises(DecodeError, match="missing or null"):
        router.route("events.x", {"other": 1})
    with pytest.raises(DecodeError, match="no stream"):
        router.route("unknown.topic")


def test_quoting_rejects_injection():
    assert quote_table("lake", "cdc", "orders") == "`lake`.`cdc`.`orders`"
    assert quote_column("weird name$") == "`weird name$`"
    with pytest.raises(InvalidIdentifierError):
        quote("a`; DROP TABLE x")
    with pytest.raises(InvalidIdentifierError):
        quote_column("a`b")
    assert sql_string("it's") == "'it\\'s'"


def test_offsets_round_trip():
    offsets = {TP("a.b.c", 0): 10, TP("a.b.c", 3): 7, TP("x", 1): 0}
    assert decode_offsets(encode_offsets(offsets)) == offsets
    assert decode_offsets(None) == {}


def test_offsets_are_looked_up_along_the_ancestry_not_by_time():
    # 4 was rolled back (not an ancestor of 5); 1 is expired (its child's chain ends at 2)
    parents = {2: 1, 3: 2, 4: 3, 5: 3}
    assert ancestry(5, parents) == [5, 3, 2]
    assert ancestry(4, parents) == [4, 3, 2]
    assert ancestry(None, parents) == [] and ancestry(9, parents) == []
    assert ancestry(7, {7: 8, 8: 7}) == [7, 8]  # a corrupt loop ends instead of spinning


def test_combined_quantiles_of_two_groups():
    q01, q50, q99, lo = combine_quantiles([(100, [1, 50, 99], 0, 100), (100, [101, 150, 199], 100, 200)])
    assert abs(q01 - 2) < 0.5 and abs(q50 - 100) < 0.5 and abs(q99 - 198) < 0.5 and lo == 0
    assert combine_quantiles([]) is None


def test_outages_are_waited_out_other_failures_are_not(monkeypatch):
    from confluent_kafka import KafkaException

    from lakestream.config import EngineSettings
    from lakestream.engine import loop
    from lakestream.errors import is_service_outage

    class Config:
        engine = EngineSettings(max_consecutive_failures=3, max_outage_s=100)

    assert is_service_outage(KafkaException("_TRANSPORT: broker down"))
    assert is_service_outage(RuntimeError("org.postgresql.util.PSQLException: Connection to 127.0.0.1:5432 refused"))
    assert not is_service_outage(RuntimeError("Null value appeared in non-nullable field"))
    assert not is_service_outage(RuntimeError("IOException ... SparkContext was shut down"))
    clock = [1000.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    # An outage: retried with a backoff capped at 15 s however many batches fail, until it lasted max_outage_s.
    assert loop._retry_backoff(Config, True, 1, 0, 1000.0) == 2.0
    assert loop._retry_backoff(Config, True, 12, 0, 1000.0) == 15.0
    clock[0] = 1099.0
    assert loop._retry_backoff(Config, True, 13, 0, 1000.0) == 15.0
    clock[0] = 1100.0
    assert loop._retry_backoff(Config, True, 14, 0, 1000.0) is None
    # Anything else: max_consecutive_failures of them and the process gives up.
    assert loop._retry_backoff(Config, False, 2, 2, None) == 4.0
    assert loop._retry_backoff(Config, False, 3, 3, None) is None


class _JavaClass:
    def __init__(self, name):
        self.name = name

    def getSimpleName(self):  # noqa: N802 — the JVM's name
        return self.name


class _JavaException:
    """A stand-in for a py4j JavaObject of a Java exception: its class, message and cause."""

    def __init__(self, name, message="", cause=None):
        self.name, self.message, self.cause = name, message, cause

    def getClass(self):  # noqa: N802
        return _JavaClass(self.name)

    def getMessage(self):  # noqa: N802
        return self.message

    def getCause(self):  # noqa: N802
        return self.cause


class _Py4JJavaError(Exception):
    def __init__(self, java):
        super().__init__("An error occurred while calling o42.commitFiles.")
        self.java_exception = java


def test_failures_are_classified_by_type_not_by_text():
    from lakestream.errors import BadValue, ConfigError, ReadStalled, classify_failure, conflict_cause

    # A data error quoting an outage's words stays a data error.
    assert classify_failure(BadValue("column note: 'Connection refused by peer' is not an int")).kind == "data"
    assert classify_failure(ValueError("value 'java.io.IOException: x' does not fit column note")).kind == "data"
    assert classify_failure(ConfigError("windows[0].source: fix it")).kind == "config"
    assert classify_failure(ReadStalled("no progress reading t[0] for 30s")).kind == "outage"
    assert classify_failure(ConnectionRefusedError(111, "Connection refused")).kind == "outage"
    assert classify_failure(MemoryError()).kind == "fatal"
    # The Java exception's cause chain: a catalog that refuses connections is an outage.
    chain = _JavaException(
        "UncheckedSQLException",
        "Failed to connect",
        _JavaException(
            "PSQLException",
            "Connection to 127.0.0.1:5 refused",
            _JavaException("ConnectException", "Connection refused"),
        ),
    )
    assert classify_failure(_Py4JJavaError(chain)).kind == "outage"
    conflict = _Py4JJavaError(_JavaException("ValidationException", "Found conflicting files"))
    assert classify_failure(conflict).kind == "conflict" and conflict_cause(conflict) == "validation"
    assert conflict_cause(_Py4JJavaError(_JavaException("ClassNotFoundException", "x"))) is None
    assert classify_failure(_Py4JJavaError(_JavaException("OutOfMemoryError", "Java heap space"))).kind == "fatal"
    # A Spark task's Python failure reaches the driver as text naming its exception class.
    task = _Py4JJavaError(
        _JavaException(
            "SparkException",
            "Job aborted",
            _JavaException(
                "PythonException",
                "Traceback (most recent call last):\ncimpl.KafkaException: KafkaError{code=_TRANSPORT}",
            ),
        )
    )
    assert classify_failure(task).kind == "outage"
    poison = _Py4JJavaError(
        _JavaException(
            "SparkException", "Job aborted", _JavaException("PythonException", "pyarrow.lib.ArrowInvalid: bad")
        )
    )
    assert classify_failure(poison).kind == "data"


def test_commit_phases_put_every_table_before_the_tables_it_reads():
    from lakestream.process.stage import commit_phases

    reads = {"fraud.alerts": {"fraud.history"}, "fraud.history": {"shop.tx"}, "shop.tx_daily": {"shop.tx"}}
    phases = commit_phases(["shop.tx", "shop.other", "fraud.history", "fraud.alerts", "shop.tx_daily"], reads)
    assert phases == [["fraud.alerts"], ["fraud.history", "shop.tx_daily"], ["shop.tx", "shop.other"]]
    assert commit_phases(["a", "b"], {"a": {"a"}}) == [["a", "b"]]  # a table reading itself is not a cycle
