"""Kafka's refusals of a client, raised as `KafkaAccessError` naming the ``kafka.client`` setting to fix.

librdkafka does not fail a call when the broker refuses a client: a wrong SASL password or an untrusted
broker certificate reaches only the client's ``error_cb`` (``_AUTHENTICATION``, ``_SSL``) while the call
itself times out as if the broker were away (``_TRANSPORT``), and retries forever. Classified as an outage,
that would be waited out for minutes. A client made with `refusals_raised` raises them from the call that
serves its callbacks (``poll``, ``consume``, ``flush``); `check_access` asks for metadata until the broker
answers, so a refusal surfaces within about a second of the client's start. An ACL refusal arrives as the
error of a fetched message or of a delivery: `denied_on_topic` names the principal, the operation and the
topic. No message holds a secret (librdkafka's reasons never quote the password).
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from lakestream.errors import KafkaAccessError

# librdkafka reports a failed TLS handshake as _SSL; one could in principle come from a broker dying
# mid-handshake, an untrusted certificate repeats at every reconnect: only a repeat is taken as a refusal.
SSL_FAILURES_BEFORE_REFUSAL = 2
# A SASL handshake cut by the connection ("Broker transport failure", no mechanisms heard from the broker) reaches
# the client as _AUTHENTICATION too: a busy or restarting broker drops one now and then, while a client talking SASL
# to a listener that does not (the broker closes each connection) repeats it at every reconnect. A wrong password
# is refused in so many words ("invalid credentials") and is a refusal at once.
CUT_HANDSHAKES_BEFORE_REFUSAL = 3

_AUTHENTICATION_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
_ACL_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}


class _RefusalCallback:
    """A client's ``error_cb``: raises the broker's refusals, lets everything else (outages) pass."""

    def __init__(self, conf: dict[str, Any]):
        self.conf = conf
        self.ssl_failures = 0
        self.cut_handshakes = 0

    def __call__(self, err: KafkaError) -> None:
        if err.code() == KafkaError._SSL:
            self.ssl_failures += 1
        if handshake_cut(err):
            self.cut_handshakes += 1
        refusal = refusal_of(err, self.conf, ssl_failures=self.ssl_failures, cut_handshakes=self.cut_handshakes)
        if refusal is not None:
            raise refusal


def refusals_raised(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with an ``error_cb`` that raises `KafkaAccessError` when the broker refuses the client."""
    return {**conf, "error_cb": _RefusalCallback(conf)}


def handshake_cut(err: KafkaError) -> bool:
    """Whether ``err`` is a SASL handshake the connection cut before the broker answered it."""
    return err.code() == KafkaError._AUTHENTICATION and "Broker transport failure" in err.str()


def refusal_of(
    err: KafkaError,
    conf: dict[str, Any],
    ssl_failures: int = SSL_FAILURES_BEFORE_REFUSAL,
    cut_handshakes: int = CUT_HANDSHAKES_BEFORE_REFUSAL,
) -> KafkaAccessError | None:
    """The `KafkaAccessError` that ``err`` (a client-level error) is, or None if it is none. ``ssl_failures`` and
    ``cut_handshakes``: how many failed TLS handshakes and cut SASL handshakes the client met so far, this one
    included (each is a refusal only once it repeats)."""
    where = f"Kafka at {conf.get('bootstrap.servers')}"
    reason = err.str()
    if handshake_cut(err) and cut_handshakes < CUT_HANDSHAKES_BEFORE_REFUSAL:
        return None
    if err.code() in _AUTHENTICATION_CODES:
        user = conf.get("sasl.username")
        return KafkaAccessError(
            f"{where} refused SASL user {user!r} ({conf.get('sasl.mechanism', 'GSSAPI')}): {reason} — fix: "
            "kafka.client.sasl.password (and kafka.client.sasl.username / sasl.mechanism) must match a user "
            "known to the broker; give the password as ${VARIABLE} and export it"
        )
    if err.code() == KafkaError._SSL and ssl_failures >= SSL_FAILURES_BEFORE_REFUSAL:
        return KafkaAccessError(
            f"the TLS handshake with {where} failed: {reason} — fix: kafka.client.ssl.ca.location must name a "
            f"PEM file with the certificate of the CA that signed the broker's (now "
            f"{conf.get('ssl.ca.location', 'the system CAs')!r})"
        )
    return None


def denied_on_topic(err: KafkaError, conf: dict[str, Any], operation: str, topic: str) -> KafkaAccessError | None:
    """The `KafkaAccessError` that a message's or a delivery's ``err`` is (an ACL refusal), or None."""
    resource = _ACL_CODES.get(err.code())
    if resource is None:
        return None
    principal = f"User:{conf.get('sasl.username', 'ANONYMOUS')}"
    group = conf.get("group.id")
    named, option = {
        "topic": (f"topic {topic!r}", f"--topic {topic}"),
        "group": (f"group {group!r} (kafka.group_id)", f"--group {group}"),
        "cluster": ("the cluster", "--cluster"),
        "transactional id": ("its transactional id", "--transactional-id ..."),
    }[resource]
    return KafkaAccessError(
        f"Kafka at {conf.get('bootstrap.servers')} denied {principal} {operation} on {named}: {err.str()} — fix: "
        f"grant it an ACL (kafka-acls.sh --add --allow-principal {principal} --operation {operation} {option}) "
        "or set kafka.client.sasl.username to a principal that has one"
    )


def check_access(client: Any, timeout_s: float = 10.0) -> None:
    """Ask ``client`` (made with `refusals_raised`) for metadata until the broker answers: a refusal raises
    `KafkaAccessError` from its error callback. An unreachable broker is left to the caller (it returns
    after ``timeout_s``): whether that is an outage is not decided here."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.list_topics(timeout=0.5)
            return
        except KafkaException:
            client.poll(0)  # serves the error callback
            if time.monotonic() >= deadline:
                return
