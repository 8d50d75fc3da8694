"""Pure units of the engine: routing, identifier quoting, freshness quantiles, offsets encoding."""
from __future__ import annotations

import pytest

from lakestream.config import StreamSettings
from lakestream.engine.result import combine_quantiles
from lakestream.errors import DecodeError, InvalidIdentifierError
from lakestream.identifiers import quote, quote_column, quote_table, sql_string
from lakestream.sink.offsets import decode_offsets, encode_offsets
from lakestream.sink.router import Router, TableName, topic_parts
from lakestream.source.kafka import TP


def test_topic_parts_of_debezium_names():
    assert topic_parts("shop.public.order_items") == {"prefix": "shop", "schema": "public", "table": "order_items",
                                                      "topic": "shop_public_order_items"}
    assert topic_parts("a.b.c.d")["prefix"] == "a_b"  # a dotted prefix
    assert topic_parts("clicks")["table"] == "clicks"
    assert topic_parts("shop.public.Order-Items")["table"] == "order_items"


def test_router_template_field_and_header():
    router = Router([
        StreamSettings(topics=["shop.public.orders"], namespace="cdc", table="{schema}_{table}"),
        StreamSettings(topic_pattern=r"events\..*", mode="append", namespace="ev", table="{field}",
                       route_field="kind"),
        StreamSettings(topics=["mixed"], mode="append", namespace="ev", table="m_{field}", route_header="type"),
    ])
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
