"""Which of librdkafka's client-level errors `kafka_access` takes as the broker refusing the client. Pure: the errors
are made here, as librdkafka words them."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from lakestream.errors import KafkaAccessError
from lakestream.kafka_access import CUT_HANDSHAKES_BEFORE_REFUSAL, refusals_raised

CONF = {"bootstrap.servers": "127.0.0.1:1", "sasl.username": "lakestream", "sasl.mechanism": "SCRAM-SHA-512"}
# A busy broker dropped the connection before answering the SASL handshake (seen in a loaded suite run).
CUT = KafkaError(
    KafkaError._AUTHENTICATION,
    "GroupCoordinator: SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker transport failure: broker's "
    "supported mechanisms: (n/a) (after 0ms in state DOWN)",
)
WRONG_PASSWORD = KafkaError(
    KafkaError._AUTHENTICATION,
    "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed during authentication due "
    "to invalid credentials with SASL mechanism SCRAM-SHA-512",
)


def test_a_wrong_password_is_a_refusal_at_once():
    error_cb = refusals_raised(CONF)["error_cb"]
    with pytest.raises(KafkaAccessError, match="refused SASL user 'lakestream'"):
        error_cb(WRONG_PASSWORD)


def test_a_cut_handshake_is_a_refusal_only_once_it_repeats():
    error_cb = refusals_raised(CONF)["error_cb"]
    for _ in range(CUT_HANDSHAKES_BEFORE_REFUSAL - 1):
        error_cb(CUT)  # an outage for now: the client reconnects
    with pytest.raises(KafkaAccessError, match="refused SASL user"):
        error_cb(CUT)


def test_an_outage_is_never_a_refusal():
    error_cb = refusals_raised(CONF)["error_cb"]
    for _ in range(10):
        error_cb(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connect failed: Connection refused"))
