"""The clocks and the one way to compare timings (helpers.timing): warm-up, alternating order, verdicts by one rule."""

import random
import re
from pathlib import Path

import pytest

from helpers.timing import (
    FALSE_WINNERS,
    NO_VERDICT,
    ROUNDS_NEEDED,
    Stopwatch,
    Timing,
    compare,
    false_winner_rate,
    judge_spreads,
)


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


def test_a_winner_is_named_only_when_the_runs_lie_apart_over_enough_rounds():
    fast, slow = Timing("batched", [1.0, 1.1, 1.2, 1.05]), Timing("loop", [2.0, 2.2, 2.1, 2.05])
    assert fast.judge(slow) == "winner" and fast.beats(slow) and not slow.beats(fast)
    # the ratio of the medians, and its range: the slower's slowest over the faster's fastest, and the other way round
    assert slow.verdict(fast) == "batched is 1.93x faster than loop (runs 1.67-2.20x: apart over 4 rounds each)"
    close = Timing("sorted", [1.15, 1.3, 1.25, 1.2])
    assert fast.judge(close) == close.judge(fast) == "within noise" and not close.beats(fast)
    sentence = fast.verdict(close)
    assert "within noise" in sentence and "faster" not in sentence and "runs 0.96-1.30x" in sentence
    assert fast.median == pytest.approx(1.075) and (fast.low, fast.high) == (1.0, 1.2)
    assert str(fast) == "batched: 1.075 s (runs 1.000-1.200 s, 4 runs)"


def test_runs_apart_over_too_few_rounds_give_no_verdict_and_the_rounds_needed():
    fast, slow = Timing("batched", [1.0, 1.1, 1.2]), Timing("loop", [2.0, 2.2, 2.1])
    assert fast.judge(slow) == NO_VERDICT == "no verdict at this size: 4 rounds each would be needed"
    assert not fast.beats(slow) and not slow.beats(fast)
    sentence = slow.verdict(fast)
    assert (
        sentence.endswith(NO_VERDICT)
        and "faster" not in sentence
        and "(runs 1.67-2.20x over 3 rounds each)" in sentence
    )
    # 3 rounds against 5 pass the bar (1 time in 28); a single run against 2 never does
    assert Timing("a", [1.0, 1.1, 1.2]).beats(Timing("b", [2.0, 2.1, 2.2, 2.3, 2.4]))
    once, twice = Timing("loop", [2.0]), Timing("sorted", [1.0, 1.1])
    assert once.judge(twice) == NO_VERDICT and "faster" not in once.verdict(twice)


def test_the_false_winner_rate_is_two_over_the_binomial_and_the_bar_needs_four_rounds_each():
    rates = {k: false_winner_rate(k, k) for k in (2, 3, 4, 5)}
    assert rates == pytest.approx({2: 1 / 3, 3: 1 / 10, 4: 1 / 35, 5: 1 / 126})
    assert false_winner_rate(3, 5) == pytest.approx(1 / 28) and false_winner_rate(3, 4) == pytest.approx(2 / 35)
    assert false_winner_rate(1, 1) == 1.0 and ROUNDS_NEEDED == 4
    assert judge_spreads((1, 2), 4, (3, 4), 4) == "winner" and judge_spreads((1, 2), 3, (3, 4), 4) == NO_VERDICT
    assert judge_spreads((1, 3), 9, (2, 4), 9) == "within noise", "overlapping spreads: no rounds make a winner"


def test_between_equal_contenders_the_rule_names_a_winner_at_most_1_time_in_20():
    """2000 seeded races of two contenders drawn from one distribution: the rule's rate, counted."""
    rng = random.Random(0)

    def winners(n, m):
        draws = [([rng.gauss(1, 0.1) for _ in range(n)], [rng.gauss(1, 0.1) for _ in range(m)]) for _ in range(2000)]
        return sum(Timing("a", a).judge(Timing("b", b)) == "winner" for a, b in draws) / 2000

    assert winners(2, 2) == 0 and winners(3, 3) == 0, "too few rounds: never a winner"
    four, mixed = winners(4, 4), winners(3, 5)
    assert 0.015 < four < 0.045 and four <= FALSE_WINNERS, f"4 rounds each: {four:.3f}, the rule says 1 in 35"
    assert mixed <= FALSE_WINNERS, f"3 against 5 rounds: {mixed:.3f}, the rule says 1 in 28"


def test_the_docs_state_the_rules_rates_as_the_function_computes_them():
    """docs/benchmarks.md's table of rounds and false-winner rates is the function's."""
    text = (Path(__file__).parent.parent / "docs" / "benchmarks.md").read_text()
    rows = re.findall(r"^\| (\d+) each \| 1 time in (\d+) \| (yes|no) \|$", text, re.M)
    assert [int(k) for k, _, _ in rows] == [2, 3, 4, 5], f"docs/benchmarks.md's table of rates: {rows}"
    for k, one_in, named in rows:
        assert round(1 / false_winner_rate(int(k), int(k))) == int(one_in), (k, one_in)
        assert (named == "yes") == (false_winner_rate(int(k), int(k)) <= FALSE_WINNERS), (k, named)
