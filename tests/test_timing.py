"""The clocks and the one way to compare timings (helpers.timing): warm-up, alternating order, spread-aware verdicts."""

import time

import pytest

from helpers.timing import Stopwatch, Timing, compare


def test_a_stopwatch_times_its_block_and_a_timing_keeps_its_fastest_run():
    with Stopwatch("cpu") as clock:
        time.sleep(0.02)
    assert 0.02 <= clock.seconds < 0.5
    durations = iter([0.0, 0.03, 0.01, 0.02])  # the warm-up first, then three timed runs
    timing = compare({"sleep": lambda: time.sleep(next(durations))}, "cpu", repeats=3)["sleep"]
    assert 0.01 <= timing.low < 0.02 and timing.high >= 0.03


def test_compare_warms_up_each_then_alternates_the_order_of_the_rounds():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timings = compare(calls, "cpu", repeats=3, warmup=2)
    assert order == [
        "a",
        "a",
        "b",
        "b",
        "c",
        "c",  # warm-ups
        "a",
        "b",
        "c",
        "c",
        "b",
        "a",
        "a",
        "b",
        "c",
    ]
    assert [len(t.seconds) for t in timings.values()] == [3, 3, 3] and list(timings) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="nothing to time"):
        compare({}, "cpu")


def test_a_winner_is_named_only_when_the_runs_do_not_overlap():
    fast, slow = Timing("batched", [1.0, 1.1, 1.2]), Timing("loop", [2.0, 2.2, 2.1])
    assert not fast.overlaps(slow)
    assert slow.verdict(fast) == "batched is 1.91x faster than loop (runs do not overlap)"
    close = Timing("sorted", [1.15, 1.3, 1.25])
    assert fast.overlaps(close) and close.overlaps(fast)
    sentence = fast.verdict(close)
    assert "within noise" in sentence and "faster" not in sentence
    assert fast.median == 1.1 and (fast.low, fast.high) == (1.0, 1.2)
    assert str(fast) == "batched: 1.100 s (runs 1.000-1.200 s, 3 runs)"


def test_one_run_has_no_spread_and_decides_nothing():
    once, twice = Timing("loop", [2.0]), Timing("sorted", [1.0, 1.1])
    assert once.overlaps(twice) and twice.overlaps(once)
    sentence = once.verdict(twice)
    assert "no winner named" in sentence and "faster" not in sentence
