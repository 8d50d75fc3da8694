"""Consumer lag: the one computation the engine's progress line and `health` share."""

from lakestream.source.kafka import TP, consumer_lag

A, B, C = TP("t", 0), TP("t", 1), TP("u", 0)


def test_lag_counts_what_is_behind_and_nothing_else():
    highs = {A: 100, B: 50, C: 7}
    # B is ahead of the watermark listed earlier; C was never read: neither is backlog.
    assert consumer_lag(highs, {A: 60, B: 55}) == 40
    assert consumer_lag(highs, {A: 100, B: 50, C: 7}) == 0
    assert consumer_lag({}, {A: 3}) == 0
