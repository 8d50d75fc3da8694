"""read_offset_range and KafkaCluster against Apache Kafka (the shared stack's broker).

Records are produced in several separately flushed groups so the log holds several batches.
"""

from __future__ import annotations

import uuid
from itertools import pairwise

import pytest
from confluent_kafka import Producer
from conftest import produce_records

from lakestream.config import KafkaSettings
from lakestream.source.kafka import TP, KafkaCluster
from lakestream.source.planner import OffsetRange
from lakestream.source.reader import RangeEnd, RawRecord, read_offset_range

GROUPS = 5
PER_GROUP = 12
N = GROUPS * PER_GROUP
PARTITION = 0


@pytest.fixture(scope="module")
def broker(stack) -> tuple[str, str]:
    """(name, bootstrap.servers) of the broker."""
    return "kafka", stack.bootstrap_servers


def _key(i: int) -> bytes:
    return f"k{i}".encode()


def _value(i: int) -> bytes:
    return f'{{"i": {i}, "pad": "{"x" * (i % 7)}"}}'.encode()


@pytest.fixture(scope="module")
def filled(broker) -> tuple[str, str, str]:
    """A topic with N known records in GROUPS produce batches on PARTITION: (name, bootstrap, topic).

    Shared by the read-only tests of a broker; a test that produces more makes its own topic.
    """
    name, bootstrap = broker
    topic = f"reader-{name}-{uuid.uuid4().hex[:8]}"
    for g in range(GROUPS):
        produce_records(
            bootstrap,
            topic,
            [(_key(i), _value(i)) for i in range(g * PER_GROUP, (g + 1) * PER_GROUP)],
            partition=PARTITION,
        )
    return name, bootstrap, topic


def consumer_conf(bootstrap: str) -> dict:
    return KafkaSettings(
        bootstrap_servers=bootstrap, group_id=f"reader-{uuid.uuid4().hex[:8]}", client={"session.timeout.ms": 6000}
    ).consumer_config()


def read_all(bootstrap: str, rng: OffsetRange) -> tuple[list[RawRecord], RangeEnd]:
    """Every record the reader yields for ``rng`` and its final RangeEnd (checked to come last, once)."""
    records: list[RawRecord] = []
    ends: list[RangeEnd] = []
    for item in read_offset_range(consumer_conf(bootstrap), rng, stall_timeout_s=30):
        assert not ends, "nothing may follow the RangeEnd"
        if isinstance(item, RangeEnd):
            ends.append(item)
        else:
            assert item, "record lists are never empty"
            records.extend(item)
    assert len(ends) == 1
    return records, ends[0]


def assert_records(records: list[RawRecord], topic: str, offsets: list[int]) -> None:
    assert [r.offset for r in records] == offsets
    assert [(r.topic, r.partition) for r in records] == [(topic, PARTITION)] * len(offsets)
    # Without transactions offsets are dense from 0, so offset i holds record i.
    assert [r.key for r in records] == [_key(i) for i in offsets]
    assert [r.value for r in records] == [_value(i) for i in offsets]


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    cluster = KafkaCluster(KafkaSettings(bootstrap_servers=bootstrap))
    try:
        return cluster.watermarks([TP(topic, PARTITION)])[TP(topic, PARTITION)]
    finally:
        cluster.close()


@pytest.mark.parametrize("start,end", [(0, N), (0, 1), (5, 17), (PER_GROUP, 2 * PER_GROUP), (N - 3, N), (11, 13)])
def test_exact_closed_range(filled, start, end):
    _, bootstrap, topic = filled
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, start, end, 10_000))
    assert_records(records, topic, list(range(start, end)))
    assert range_end.next_offset == end
    assert range_end.at_end is False  # stopped at the range end, not at end-of-partition


@pytest.mark.parametrize("start,limit", [(0, 1), (0, 25), (7, 30), (N - 4, 4)])
def test_limit_stops_an_open_range(filled, start, limit):
    _, bootstrap, topic = filled
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, start, None, limit))
    assert_records(records, topic, list(range(start, start + limit)))
    assert range_end == RangeEnd(start + limit, at_end=False)


def test_limit_smaller_than_a_closed_range(filled):
    _, bootstrap, topic = filled
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, 3, 40, 10))
    assert_records(records, topic, list(range(3, 13)))
    assert range_end == RangeEnd(13, at_end=False)


@pytest.mark.parametrize("start", [0, 1, N - PER_GROUP, N - 1])
def test_open_range_reads_to_the_end(filled, start):
    _, bootstrap, topic = filled
    low, high = watermarks(bootstrap, topic)
    assert (low, high) == (0, N)
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, start, None, 10_000))
    assert_records(records, topic, list(range(start, N)))
    assert range_end == RangeEnd(N, at_end=True)


def test_open_range_at_the_end_yields_nothing(filled):
    _, bootstrap, topic = filled
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, N, None, 100))
    assert records == []
    assert range_end == RangeEnd(N, at_end=True)


@pytest.mark.parametrize("at", [0, 17, N])
def test_empty_closed_range_yields_nothing(filled, at):
    _, bootstrap, topic = filled
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, at, at, 100))
    assert records == []
    assert range_end.next_offset == at


def test_records_produced_after_planning_are_read_by_an_open_range(broker):
    name, bootstrap = broker
    topic = f"late-{name}-{uuid.uuid4().hex[:8]}"
    produce_records(bootstrap, topic, [(_key(i), _value(i)) for i in range(N)], partition=PARTITION)
    produce_records(bootstrap, topic, [(_key(N), _value(N))], partition=PARTITION)
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, N - 2, None, 100))
    assert_records(records, topic, [N - 2, N - 1, N])
    assert range_end == RangeEnd(N + 1, at_end=True)


def test_group_offsets_round_trip(broker):
    name, bootstrap = broker
    topic = f"group-{name}-{uuid.uuid4().hex[:8]}"
    produce_records(bootstrap, topic, [(_key(i), _value(i)) for i in range(10)], partition=PARTITION)
    settings = KafkaSettings(
        bootstrap_servers=bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}", client={"session.timeout.ms": 6000}
    )
    cluster = KafkaCluster(settings)
    try:
        tp = TP(topic, PARTITION)
        assert tp in cluster.partitions_of(lambda t: t == topic)
        assert cluster.committed([tp]) == {}
        cluster.commit({tp: 7})
        assert cluster._unacknowledged == 1  # sent, not waited for: a batch does not wait a round trip
        assert cluster.committed([tp]) == {tp: 7}  # a read waits for this client's own commits
        assert cluster._unacknowledged == 0
        cluster.commit({tp: 10})  # acknowledged at close
    finally:
        cluster.close()
    # A new client (as after a restart) sees the same committed offset.
    again = KafkaCluster(settings)
    try:
        assert again.committed([TP(topic, PARTITION)]) == {TP(topic, PARTITION): 10}
    finally:
        again.close()


def test_transactional_records_are_read_exactly_once_across_offset_gaps(stack):
    """Transaction markers take offsets, so the log has gaps; aborted records are never read."""
    bootstrap = stack.bootstrap_servers
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}", "linger.ms": 5}
    )
    producer.init_transactions(30)
    expected: list[bytes] = []
    aborted: list[bytes] = []
    for txn in range(6):
        producer.begin_transaction()
        values = [f"txn{txn}-{i}".encode() for i in range(txn + 1)]
        for v in values:
            producer.produce(topic, key=v, value=v, partition=PARTITION)
        if txn == 3:
            producer.abort_transaction(30)
            aborted += values
        else:
            producer.commit_transaction(30)
            expected += values
    # A plain (non-transactional) record after the last commit marker.
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, key=b"plain", value=b"plain", partition=PARTITION)
    assert plain.flush(30) == 0
    expected.append(b"plain")

    low, high = watermarks(bootstrap, topic)
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, 0, None, 10_000))
    offsets = [r.offset for r in records]
    assert [r.value for r in records] == expected  # every committed record once, none aborted
    assert not set(aborted) & {r.value for r in records}
    assert offsets == sorted(set(offsets))
    assert offsets[-1] > len(expected) - 1, "transaction markers should leave gaps in the offsets"
    assert range_end.at_end and range_end.next_offset == high == offsets[-1] + 1

    # Re-reading from a gap (a marker's offset) or from the middle returns exactly the rest.
    gap = next(o for a, o in pairwise(offsets) if o - a > 1) - 1
    rest, rest_end = read_all(bootstrap, OffsetRange(topic, PARTITION, gap, None, 10_000))
    assert [r.offset for r in rest] == [o for o in offsets if o >= gap]
    assert rest_end == range_end

    # Closed ranges split at arbitrary offsets cover every record exactly once.
    seen: list[int] = []
    cuts = list(range(0, high, 4)) + [high]
    for a, b in pairwise(cuts):
        part, part_end = read_all(bootstrap, OffsetRange(topic, PARTITION, a, b, 10_000))
        seen += [r.offset for r in part]
        assert all(a <= r.offset < b for r in part)
    assert seen == offsets


def test_the_listed_end_is_the_last_stable_offset_and_an_open_range_stops_there(stack):
    """Apache Kafka lists a read_committed client the last stable offset as a partition's end, not the high
    watermark: the records of a transaction still open are neither counted nor read (no read waits for
    them), and are read once it commits."""
    bootstrap = stack.bootstrap_servers
    topic = f"opentxn-{uuid.uuid4().hex[:8]}"
    produce_records(bootstrap, topic, [(_key(i), _value(i)) for i in range(5)], partition=PARTITION)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5, 9):
        producer.produce(topic, key=_key(i), value=_value(i), partition=PARTITION)
    producer.flush(30)
    assert watermarks(bootstrap, topic) == (0, 5)
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, 0, None, 10_000, known_end=5))
    assert_records(records, topic, list(range(5)))
    assert range_end == RangeEnd(5, at_end=True)
    producer.commit_transaction(30)
    assert watermarks(bootstrap, topic) == (0, 10)  # past the commit marker
    records, range_end = read_all(bootstrap, OffsetRange(topic, PARTITION, 5, None, 10_000, known_end=10))
    assert [r.offset for r in records] == [5, 6, 7, 8]
    assert range_end == RangeEnd(10, at_end=True)


def test_an_open_range_reads_its_known_backlog_in_full_before_the_time_cap(filled, monkeypatch):
    """The open-range time cap (a live producer must not hold a batch back) starts only past the end
    known at planning: a backlog is read whole however long it takes; live records beyond it are cut."""
    import lakestream.source.reader as reader

    _, bootstrap, topic = filled
    monkeypatch.setattr(reader, "OPEN_RANGE_MAX_S", -1.0)  # cut as soon as the cap applies
    conf = consumer_conf(bootstrap)
    chunks = [
        c
        for c in reader.read_offset_range(conf, OffsetRange(topic, PARTITION, 0, None, 10_000, N), chunk=5)
        if isinstance(c, list)
    ]
    assert [r.offset for c in chunks for r in c] == list(range(N))
    cut = [
        r.offset
        for c in reader.read_offset_range(conf, OffsetRange(topic, PARTITION, 0, None, 10_000, 10), chunk=5)
        if isinstance(c, list)
        for r in c
    ]
    assert 10 <= len(cut) < N and cut == list(range(len(cut)))


def test_close_is_bounded_while_the_group_coordinator_does_not_answer(stack_factory):
    """After a broker restart librdkafka's `close()` can wait without end on a group commit to a coordinator that does
    not answer (the pipeline's restart after an outage hung there); the driver's client gives it ``timeout_s`` and
    leaves it to finish in the background. Here the broker is frozen (SIGSTOP) with a commit in flight."""
    import os
    import signal
    import time

    stack = stack_factory()  # a broker of its own: this one is frozen
    info = stack.up()
    topic = f"close-{uuid.uuid4().hex[:8]}"
    produce_records(info.bootstrap_servers, topic, [(_key(0), _value(0))], partition=PARTITION)
    settings = KafkaSettings(bootstrap_servers=info.bootstrap_servers, group_id=f"g-{uuid.uuid4().hex[:8]}")
    cluster = KafkaCluster(settings, timeout_s=2.0)
    tp = TP(topic, PARTITION)
    assert cluster.committed([tp]) == {}  # the coordinator is known and connected
    pid = stack.broker.pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        cluster.commit({tp: 1})
        started = time.monotonic()
        cluster.close()
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
        stack.down()
    assert took < 3 * cluster.timeout_s, f"close took {took:.1f}s"
