"""The clocks and the one way to compare timings (helpers.timing): warm-up, alternating order, spread-aware verdicts."""

import pytest

from helpers.timing import Stopwatch, Timing, compare


def test_a_stopwatch_times_its_block_and_a_timing_keeps_every_run(monkeypatch):
    """A fake clock: the stopwatch reads it once on entering and once on leaving, and nothing else counts."""
    import helpers.timing as timing

    ticks = iter([10.0, 10.25, 20.0, 20.5, 30.0, 30.125, 40.0, 40.75])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    with Stopwatch("cpu") as clock:
        pass
    assert clock.seconds == 0.25
    runs = compare({"work": lambda: None}, "cpu", repeats=3, warmup=0)["work"]
    assert runs.seconds == [0.5, 0.125, 0.75] and (runs.low, runs.median, runs.high) == (0.125, 0.5, 0.75)


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
    # the ratio of the medians, and its range: the slower's slowest over the faster's fastest, and the other way round
    assert slow.verdict(fast) == "batched is 1.91x faster than loop (runs 1.67-2.20x: no overlap)"
    close = Timing("sorted", [1.15, 1.3, 1.25])
    assert fast.overlaps(close) and close.overlaps(fast)
    sentence = fast.verdict(close)
    assert "within noise" in sentence and "faster" not in sentence and "runs 0.96-1.30x" in sentence
    assert fast.median == 1.1 and (fast.low, fast.high) == (1.0, 1.2)
    assert str(fast) == "batched: 1.100 s (runs 1.000-1.200 s, 3 runs)"


def test_one_run_has_no_spread_and_decides_nothing():
    once, twice = Timing("loop", [2.0]), Timing("sorted", [1.0, 1.1])
    assert once.overlaps(twice) and twice.overlaps(once)
    sentence = once.verdict(twice)
    assert "no winner named" in sentence and "faster" not in sentence
