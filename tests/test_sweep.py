"""Timing on the full-scale workload (helpers.sweep): whole batches drawn from the plan of every ticket, stratified,
re-planned exactly, and the whole plan's seconds estimated with an interval that says what the draw cannot know."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.batching import plan_batches
from helpers.data import ticket_word_counts
from helpers.scoring import LabelScores
from helpers.sweep import (
    MIN_TICKETS,
    SWEEP_LOOPS,
    curve,
    describe_curve,
    draw_batches,
    estimate_plan,
    estimate_plans,
)
from tests.test_profile import synthetic

# The article's long-tailed lengths (its word counts plus a fixed instruction), with no tokenizer needed.
LENGTHS = [int(n) + 40 for n in ticket_word_counts(600, seed=0)]


def replanned(draw):
    """The batches plan_batches cuts the draw's tickets into, as ticket indices."""
    sub = [draw.lengths[i] for i in draw.tickets]
    plan = plan_batches(sub, draw.strategy, draw.batch_size or 1, draw.token_budget, tokens_per_row=draw.past + draw.tail)
    return [[draw.tickets[j] for j in batch] for batch in plan]


@pytest.mark.parametrize("strategy, size, budget", [("loop", 1, None), ("sorted", 2, None), ("sorted", 32, None),
                                                    ("arbitrary", 8, None), ("arbitrary", 32, None),
                                                    ("token_budget", 8, 800), ("token_budget", 32, 3200)])
def test_a_draw_is_whole_batches_of_the_full_plan_from_each_half_and_replans_into_exactly_them(strategy, size, budget):
    draw = draw_batches(LENGTHS, strategy, size, budget, tail=1)
    assert draw.plan == plan_batches(LENGTHS, strategy, size, budget, tokens_per_row=1), "the plan of every ticket"
    assert draw.plan_tickets == 600 and len(draw.strata) == 2
    assert len(draw.numbers) >= 2 and len(draw.tickets) >= MIN_TICKETS, draw.describe()
    assert all(len(picked) >= 1 and set(picked) <= set(group) for group, picked in zip(draw.strata, draw.drawn))
    rows = max(map(len, draw.plan))
    if strategy != "token_budget":
        assert all(len(batch) == rows for batch in draw.batches), "no short last batch is drawn"
    assert replanned(draw) == draw.batches, "score_batched on draw.tickets must run exactly the drawn batches"
    # the groups split the plan by padded tokens: every batch of the longer half is at least as big
    tokens = [len(b) * max(LENGTHS[i] for i in b) for b in draw.plan]
    assert min(tokens[k] for k in draw.strata[0]) >= max(tokens[k] for k in draw.strata[1])


def test_sorted_draws_at_every_size_sit_at_the_same_places_and_pad_like_their_plans():
    """The points of a sweep time nearly the same tickets, and their padding stays within a few points of the plan's."""
    draws = {size: draw_batches(LENGTHS, "sorted" if size > 1 else "loop", size) for size in (1, 2, 4, 8, 16, 32)}
    union = set().union(*(draw.tickets for draw in draws.values()))
    assert len(union) <= len(draws[32].tickets) + 8, "smaller sizes draw (nearly) within the largest size's batches"
    for size, draw in draws.items():
        assert abs(draw.padding - draw.plan_padding) < 0.05, (size, draw.describe())
    assert draws[32].padding > draws[2].padding, "larger sorted batches pad more"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=8, max_size=80), st.sampled_from(["loop", "sorted", "arbitrary"]),
       st.integers(1, 6), st.integers(1, 3), st.integers(1, 20))
def test_any_draw_replans_into_its_batches(lengths, strategy, size, strata, tickets):
    if 2 * size > len(lengths):
        return
    draw = draw_batches(lengths, strategy, size, strata=strata, min_tickets=tickets)
    assert replanned(draw) == draw.batches
    assert len(set(draw.tickets)) == len(draw.tickets), "no ticket twice"


def test_the_full_plan_is_a_draw_of_every_batch():
    draw = draw_batches(LENGTHS, "sorted", 32, min_tickets=None)
    assert draw.batches == draw.plan and sorted(draw.tickets) == list(range(600))
    assert draw.padding == pytest.approx(draw.plan_padding)


def fake_runs(draw, seconds_of, repeats=2, tokenize=0.0):
    """Timed runs of a draw whose batch k takes seconds_of(k) seconds, repeat r scaled by (1 + 0.01 r)."""
    runs = []
    for r in range(repeats):
        seconds = [seconds_of(k) * (1 + 0.01 * r) for k in draw.numbers]
        info = {"batches": [[draw.tickets.index(i) for i in batch] for batch in draw.batches],
                "batch_seconds": seconds, "tokenize_seconds": tokenize, "seconds": sum(seconds) + tokenize}
        runs.append(LabelScores(["a"], np.zeros((len(draw.tickets), 1)), info))
    return runs


def test_where_batches_cost_what_the_model_predicts_times_a_factor_the_estimate_is_exact():
    profile = synthetic()
    draw = draw_batches(LENGTHS, "sorted", 8, tail=1)
    predicted = draw.predicted_seconds(profile)
    runs = fake_runs(draw, lambda k: 3.0 * predicted[k], tokenize=0.05)
    estimate = estimate_plan("sorted at 8", draw, runs, profile)
    truth = 3.0 * sum(predicted) + 0.05 / len(draw.tickets) * 600
    assert estimate.seconds[0] == pytest.approx(truth)
    assert estimate.seconds[1] > estimate.seconds[0], "each repeat gives its own estimate"
    assert estimate.items_per_s == pytest.approx(600 / np.median(estimate.seconds))
    assert estimate.items_per_s_min < estimate.items_per_s < estimate.items_per_s_max


def test_a_draw_from_the_middle_alone_would_overstate_the_plan_the_stratified_estimate_does_not():
    """Long rows cost more per token (here, per key): the middle's rate is not the plan's."""
    profile = synthetic()
    draw = draw_batches(LENGTHS, "sorted", 8, tail=1)
    widths = [max(LENGTHS[i] for i in batch) for batch in draw.plan]
    seconds_of = lambda k: 8 * widths[k] * (1e-3 + 4e-6 * widths[k])  # noqa: E731
    truth = sum(seconds_of(k) for k in range(len(draw.plan)))
    estimate = estimate_plans({"s": draw}, {"s": fake_runs(draw, seconds_of)}, profile)["s"]
    middle = len(draw.plan) // 2
    from_the_middle = seconds_of(middle) / 8 * 600
    assert abs(estimate.seconds[0] / truth - 1) < abs(from_the_middle / truth - 1)
    assert from_the_middle < truth, "the middle's tickets are cheaper than the plan's average"


def test_the_interval_pools_the_scatter_of_every_draw_and_is_none_wide_where_every_batch_ran():
    profile = synthetic()
    draws = {size: draw_batches(LENGTHS, "sorted" if size > 1 else "loop", size, tail=1) for size in (1, 2, 4)}
    noise = np.random.default_rng(0)
    runs = {}
    for size, draw in draws.items():
        predicted = draw.predicted_seconds(profile)
        jitter = {k: 1 + 0.1 * noise.standard_normal() for k in draw.numbers}
        runs[size] = fake_runs(draw, lambda k, p=predicted, j=jitter: p[k] * j[k])
    estimates = estimate_plans(draws, runs, profile)
    assert all(0 < e.relative_error < 0.2 for e in estimates.values())
    assert estimates[1].relative_error < estimates[4].relative_error, "single tickets pin a plan down better than batches of 4"
    every = draw_batches(LENGTHS, "sorted", 32, tail=1, min_tickets=None)
    lone = {"all": every, **{k: v for k, v in draws.items()}}
    pooled = estimate_plans(lone, {"all": fake_runs(every, lambda k: 1.0), **runs}, profile)
    assert pooled["all"].relative_error == 0, "a full run leaves nothing unknown"
    pair = draw_batches(LENGTHS, "sorted", 8, tail=1)
    alone = estimate_plans({"one": pair}, {"one": fake_runs(pair, lambda k: 1.0 + k)}, profile)["one"]
    assert math.isnan(alone.relative_error) and math.isnan(alone.interval[0]), "2 batches alone cannot measure a scatter"


def test_runs_that_did_not_make_the_drawn_batches_are_refused():
    profile = synthetic()
    draw = draw_batches(LENGTHS, "sorted", 4)
    run = fake_runs(draw, lambda k: 1.0)[0]
    run.info["batches"] = run.info["batches"][::-1]
    with pytest.raises(ValueError, match="did not make the drawn batches"):
        estimate_plan("sorted", draw, [run], profile)


def test_a_curve_is_its_loop_then_its_batches_and_its_description_names_a_rise_only_beyond_the_spread():
    rows = [{"strategy": SWEEP_LOOPS["sorted"], "batch_size": 1, "items_per_s": 2.0},
            *[{"strategy": "sorted", "batch_size": b, "items_per_s": r} for b, r in ((2, 3.0), (4, 3.5), (8, 3.52), (16, 3.0))],
            {"strategy": "arbitrary", "batch_size": 8, "items_per_s": 1.0}]
    frame = pd.DataFrame(rows).assign(repeats=2)
    frame = frame.assign(items_per_s_min=frame["items_per_s"] * 0.98, items_per_s_max=frame["items_per_s"] * 1.02)
    points = curve(frame, "sorted")
    assert points["batch_size"].tolist() == [1, 2, 4, 8, 16]
    described = describe_curve(points)
    assert described["rose"] and described["best"]["batch_size"] == 8 and described["reached"] == 4
    assert described["fell"] == [16] and "slower beyond the spread at 16" in described["text"]
    flat = describe_curve(points.assign(items_per_s_min=points["items_per_s"] * 0.5))
    assert not flat["rose"] and "no batch size beat batch 1 beyond the spread" in flat["text"]
    once = describe_curve(points.assign(repeats=1))
    assert "no spread to judge by" in once["text"]
