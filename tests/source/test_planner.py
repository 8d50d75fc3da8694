"""plan_offset_ranges: pure planning, no broker."""

from __future__ import annotations

from itertools import pairwise

from lakestream.source.kafka import TP
from lakestream.source.planner import OffsetRange, plan_offset_ranges

A, B, C = TP("t", 0), TP("t", 1), TP("u", 0)


def test_small_backlog_is_one_open_range_per_partition():
    ranges = plan_offset_ranges({A: 10, B: 0}, {A: (0, 15), B: (0, 3)}, set(), max_records=1000, max_per_task=100)
    assert ranges == [OffsetRange("t", 0, 10, None, 100, 15), OffsetRange("t", 1, 0, None, 100, 3)]


def test_partitions_with_nothing_new_are_skipped():
    ranges = plan_offset_ranges({A: 15, B: 3, C: 0}, {A: (0, 15), B: (0, 3), C: (0, 7)}, set(), 1000, 100)
    assert [r.tp for r in ranges] == [C]
    assert plan_offset_ranges({A: 15}, {A: (0, 15)}, set(), 1000, 100) == []


def test_maybe_more_partition_is_read_even_if_the_watermark_says_nothing_new():
    # The last read stopped at its limit, not at the end: there may be more than the watermark listed.
    ranges = plan_offset_ranges({A: 15, B: 3}, {A: (0, 15), B: (0, 3)}, {A}, 1000, 100)
    assert ranges == [OffsetRange("t", 0, 15, None, 100, 15)]


def test_low_watermark_above_position_starts_at_low():
    ranges = plan_offset_ranges({A: 5}, {A: (40, 50)}, set(), 1000, 100)
    assert ranges == [OffsetRange("t", 0, 40, None, 100, 50)]
    # everything below low was deleted and nothing new: skipped
    assert plan_offset_ranges({A: 5}, {A: (50, 50)}, set(), 1000, 100) == []


def test_backlog_is_split_into_equal_closed_chunks_with_the_last_one_open():
    ranges = plan_offset_ranges({A: 0}, {A: (0, 350)}, set(), max_records=10_000, max_per_task=100)
    assert ranges == [
        OffsetRange("t", 0, 0, 88, 88),
        OffsetRange("t", 0, 88, 176, 88),
        OffsetRange("t", 0, 176, 264, 88),
        OffsetRange("t", 0, 264, None, 100, 350),  # an open range knows where the end was
    ]
    # chunks are contiguous and each closed chunk ends where the next starts
    for a, b in pairwise(ranges):
        assert a.end == b.start
    # never more than max_per_task in a chunk, however the backlog divides
    for known in (101, 199, 200, 201, 1234):
        ranges = plan_offset_ranges({A: 0}, {A: (0, known)}, set(), max_records=10_000, max_per_task=100)
        assert all(r.limit <= 100 for r in ranges)
        assert [r.end for r in ranges][:-1] == [r.start for r in ranges][1:]
        assert ranges[-1].known_end == known


def test_a_partition_a_little_over_its_share_is_not_split_into_an_extra_task():
    # Two partitions, 4,150 records, two cores: a target of 2,075 per task. The partition with 2,150 stays
    # one range (a 75-record remainder would be a third task, run after one of the other two).
    ranges = plan_offset_ranges({A: 0, B: 0}, {A: (0, 2150), B: (0, 2000)}, set(), 1_000_000, 100_000, parallelism=2)
    assert [(r.tp, r.start, r.end) for r in ranges] == [(A, 0, None), (B, 0, None)]
    # One partition with twice the target is still spread over both cores, in equal halves.
    ranges = plan_offset_ranges({A: 0}, {A: (0, 4100)}, set(), 1_000_000, 100_000, parallelism=2)
    assert [(r.start, r.end, r.limit) for r in ranges] == [(0, 2050, 2050), (2050, None, 100_000)]


def test_batch_cap_is_shared_between_active_partitions():
    ranges = plan_offset_ranges(
        {A: 0, B: 0}, {A: (0, 10_000), B: (0, 10_000)}, set(), max_records=300, max_per_task=100
    )
    per_tp: dict[TP, int] = {}
    for r in ranges:
        per_tp[r.tp] = per_tp.get(r.tp, 0) + r.limit
    assert per_tp == {A: 150, B: 150}
    assert sum(r.limit for r in ranges) <= 300
    assert all(r.limit <= 100 for r in ranges)
    # the last range of each partition is open, so a lagging watermark never strands records
    assert [r.end for r in ranges if r.tp == A][-1] is None


def test_cap_below_per_task_gives_one_capped_open_range():
    ranges = plan_offset_ranges({A: 0}, {A: (0, 10_000)}, set(), max_records=50, max_per_task=100)
    assert ranges == [OffsetRange("t", 0, 0, None, 50, 10_000)]


def test_every_active_partition_gets_at_least_one_record_when_the_cap_is_tiny():
    ranges = plan_offset_ranges({A: 0, B: 0, C: 0}, {A: (0, 5), B: (0, 5), C: (0, 5)}, set(), 1, 100)
    assert [(r.tp, r.limit) for r in ranges] == [(A, 1), (B, 1), (C, 1)]


def test_partition_unknown_to_watermarks_only_when_maybe_more():
    assert plan_offset_ranges({A: 0}, {}, set(), 100, 100) == []
    assert plan_offset_ranges({A: 0}, {}, {A}, 100, 100) == [OffsetRange("t", 0, 0, None, 100, 0)]


def test_pack_ranges_shares_consumers_but_keeps_backlog_chunks_apart():
    from lakestream.source.planner import pack_ranges

    chunks = [OffsetRange("big", 0, i * 100, (i + 1) * 100, 100) for i in range(3)]
    singles = [OffsetRange(f"t{i}", 0, 0, None, 10 + i) for i in range(7)]
    tasks = pack_ranges(chunks + singles, slots=2)
    assert [t for t in tasks if t[0].topic == "big"] == [[c] for c in chunks]
    small = [t for t in tasks if t[0].topic != "big"]
    assert len(small) == 2
    assert sorted(r.topic for t in small for r in t) == sorted(r.topic for r in singles)
    for task in tasks:  # a consumer cannot be assigned one partition twice
        assert len({r.tp for r in task}) == len(task)
    assert pack_ranges([], 4) == []
