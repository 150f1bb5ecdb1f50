"""The full-scale workload's sample: whole batches of every plan, each timed block standing for its stratum, and a
sweep checked against the loop (notebooks 03 and 04, ``python -m helpers bench``)."""

import numpy as np
import pytest
import torch

from helpers.batching import plan_batches
from helpers.bench import Design, Row, Sample, processed_tokens, run_benchmark, sample_blocks, sweep, sweep_rows
from helpers.checks import FLOAT32_ATOL, float_tolerance
from helpers.data import LABELS, make_tickets
from helpers.scoring import LabelScorer, score_one_by_one
from helpers.timing import NO_VERDICT

LENGTHS = list(np.random.default_rng(0).integers(20, 400, size=600))


@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16, 32])
def test_the_sample_is_whole_batches_of_every_plan_up_to_its_block(batch_size):
    blocks, strata = sample_blocks(LENGTHS, block=32, every=9)
    assert [len(b) for b in blocks] == [32, 32, 24], "19 blocks of 32 (the last 24): strata of 9, 9 and 1"
    plan = {tuple(batch) for batch in plan_batches(LENGTHS, "sorted", batch_size)}
    for chunk in blocks:
        cut = [tuple(chunk[start : start + batch_size]) for start in range(0, len(chunk), batch_size)]
        assert all(batch in plan for batch in cut), f"a batch of {batch_size} in the sample is not one of the plan's"
        # replanned as score_batched replans it, a block gives back exactly those batches
        replanned = plan_batches([LENGTHS[i] for i in chunk], "sorted", batch_size)
        assert [tuple(chunk[j] for j in batch) for batch in replanned] == cut


def test_each_block_is_the_one_most_like_its_stratum_and_the_strata_hold_every_ticket():
    order = list(np.argsort(-np.asarray(LENGTHS), kind="stable"))
    blocks, strata = sample_blocks(LENGTHS, block=16, every=12)
    assert sorted(i for stratum in strata for i in stratum) == list(range(600)), "the strata partition the tickets"
    mean = lambda items: np.mean([LENGTHS[i] for i in items])  # noqa: E731
    for chunk, stratum in zip(blocks, strata):
        ranks = sorted(order.index(i) for i in stratum)
        assert set(chunk) <= set(stratum) and ranks == list(range(ranks[0], ranks[-1] + 1)), "neighbours in length"
        others = [stratum[k : k + 16] for k in range(0, len(stratum), 16)]
        assert abs(mean(chunk) - mean(stratum)) == min(abs(mean(o) - mean(stratum)) for o in others), "most like it"
    even = list(range(600, 0, -1))  # evenly spaced lengths: the middle block is the stratum's mean
    picked, _ = sample_blocks(even, block=16, every=12)
    assert [even.index(even[b[0]]) // 16 for b in picked] == [5, 17, 29, 36], "the middle one (the earlier of two)"
    every = sample_blocks(LENGTHS, block=16, every=1)
    assert every[0] == every[1] and sorted(i for b in every[0] for i in b) == list(range(600)), "every=1: all of them"
    with pytest.raises(ValueError, match="must be >= 1"):
        sample_blocks(LENGTHS, block=0, every=3)


def test_a_fixed_cost_per_call_is_scaled_by_the_calls_it_stands_for_on_a_long_tailed_workload():
    """03's race read 1.14x where all 600 timed whole gave 1.04x (issue 69): the middle block of the long tail's
    stratum is shorter than the stratum's mean, so scaling it by tokens also scaled the loop's fixed cost per ticket
    by more than the stratum's tickets. A loop that is mostly fixed cost, on the article's long-tailed lengths."""
    lengths = [40 + len(text.split()) for text in make_tickets(600, seed=0, style="article")["text"]]
    per_call, per_token = 200.0, 1.0
    for block, every in ((32, 9), (32, 12), (32, 18), (16, 18)):  # 03's (32, 9) and 04's (16, 18) default samples
        sample = sample_blocks(lengths, block=block, every=every)
        row = Row.plan("loop", 1, lengths, sample)
        truth = sum(per_call + per_token * n for n in lengths)
        timed = [sum(per_call + per_token * lengths[i] for i in chunk) for chunk in row.blocks]
        off = abs(row.estimate(timed) / truth - 1)
        assert off < 0.025, f"every={every}: {off:.1%} off"
        cut = [[stratum[k : k + block] for k in range(0, len(stratum), block)] for stratum in sample[1]]
        middle = [chunks[(len(chunks) - 1) // 2] for chunks in cut]
        tokens = lambda items: sum(lengths[i] for i in items)  # noqa: E731
        by_middle = sum(
            sum(per_call + per_token * lengths[i] for i in chunk) * tokens(stratum) / tokens(chunk)
            for chunk, stratum in zip(middle, sample[1])
        )
        assert by_middle / truth - 1 > max(0.03, 2 * off), f"every={every}: the middle blocks were as good: a weak test"


def test_the_rule_is_exact_where_neighbouring_batches_cost_in_proportion_to_their_tokens():
    """Seconds per padded token that differ along the length order (a loop's per-call cost weighs on short
    tickets, attention on long ones) but not within a stratum: each block scaled to its own stratum is exact,
    where one scale for the whole sample (the plan's tokens over the sample's) is not."""
    sample = sample_blocks(LENGTHS, block=32, every=6)
    for name, size in (("loop", 1), ("sorted", 32), ("sorted", 8)):
        row = Row.plan(name, size, LENGTHS, sample)
        strategy = row.strategy
        cost = [3.0**k for k in range(len(sample[1]))]  # seconds per padded token, per stratum
        truth = sum(c * processed_tokens(LENGTHS, stratum, strategy, size) for c, stratum in zip(cost, sample[1]))
        timed = [c * processed_tokens(LENGTHS, chunk, strategy, size) for c, chunk in zip(cost, row.blocks)]
        assert row.estimate(timed) == pytest.approx(truth), (name, size)
        whole = processed_tokens(LENGTHS, range(600), strategy, size)
        one_scale = sum(timed) * whole / sum(processed_tokens(LENGTHS, chunk, strategy, size) for chunk in row.blocks)
        assert abs(one_scale / truth - 1) > 0.03, "the single scale would have been as good: a weak test"
    everything = Row.plan("sorted", 8, LENGTHS, sample_blocks(LENGTHS, 32, 1))
    assert everything.weights == pytest.approx([1.0] * 19), "every block timed: nothing is scaled"


def test_rows_report_the_whole_plans_rate_and_their_spread():
    sample = sample_blocks(LENGTHS, block=32, every=9)
    row = Row.plan("sorted", 8, LENGTHS, sample)
    row.seconds = [20.0, 30.0, 40.0]  # each repeat's estimate for all 600
    assert row.items_per_s == pytest.approx(600 / 30.0)
    assert row.spread == pytest.approx((600 / 40.0, 600 / 20.0))
    assert "88 of 600 timed" in row.timed
    assert "all 600 timed" in Row.plan("loop", 1, LENGTHS, sample_blocks(LENGTHS, 32, 1)).timed
    slower = Row("loop", 1, 600, [], [], seconds=[50.0, 60.0, 55.0])
    assert row.timing.judge(Row("x", 1, 600, [], [], seconds=[35.0, 45.0]).timing) == "within noise"
    assert row.timing.judge(slower.timing) == NO_VERDICT, "3 rounds each lie apart 1 time in 10: no verdict"
    row.seconds, slower.seconds = [*row.seconds, 25.0], [*slower.seconds, 52.0]
    assert row.timing.beats(slower.timing)
    assert (
        row.timing.verdict(slower.timing)
        == "sorted at 8 is 1.95x faster than loop at 1 (runs 1.25-3.00x: apart over 4 rounds each)"
    )


def test_sweep_rows_run_the_loops_once_and_sorted_batches_at_every_size():
    assert sweep_rows(["loop", "loop_prefix", "sorted_prefix"], [1, 4, 8]) == [
        ("loop", 1),
        ("loop_prefix", 1),
        ("sorted_prefix", 4),
        ("sorted_prefix", 8),
    ]


def test_the_sweep_times_every_row_on_the_same_tickets_and_scores_them_as_the_loop(tiny_llama):
    model, tokenizer, _ = tiny_llama
    from helpers.data import build_prompt

    prompts = [build_prompt(tokenizer, text) for text in make_tickets(96, style="article")["text"]]
    scorer = LabelScorer(tokenizer, LABELS)
    found, failed = sweep(
        model, tokenizer, scorer, prompts, [("loop", 1), ("sorted", 4)], Sample(8, 4, 2), progress=False
    )
    loop, batched = found["loop", 1], found["sorted", 4]
    assert not failed and loop.sample == batched.sample and len(loop.sample) == 24, "3 blocks of 8, the same ones"
    assert len(loop.seconds) == len(batched.seconds) == 2 and all(s > 0 for s in loop.seconds + batched.seconds)
    for row in (loop, batched):  # each round's estimate is its own blocks' seconds, scaled by the rule
        assert [len(seconds) for seconds in row.block_seconds] == [3, 3]
        assert row.seconds == [row.estimate(seconds) for seconds in row.block_seconds]
    alone = score_one_by_one(model, tokenizer, scorer, [prompts[i] for i in loop.sample], progress=False)
    assert torch.allclose(loop.scores.log_scores, alone.log_scores, rtol=0, atol=float_tolerance(alone)), (
        "the loop row, in order"
    )
    assert torch.allclose(batched.scores.log_scores, alone.log_scores, rtol=0, atol=float_tolerance(alone))
    assert batched.scores.info["processed_tokens"] >= batched.scores.info["real_tokens"]


def test_the_bench_sweep_agrees_with_the_loop_on_every_sampled_ticket(tiny_qwen, monkeypatch):
    monkeypatch.setattr("helpers.bench.load_model", lambda *args, **kwargs: tiny_qwen)
    design = Design(shots=1, batch_sizes=[1, 4, 8], every=3, repeats=2, n=48)
    frame, _ = run_benchmark("twin:tiny-qwen2", design, progress=False)
    assert list(frame["strategy"]) == ["loop", "loop_prefix", "sorted", "sorted", "sorted_prefix", "sorted_prefix"]
    assert (frame["agreement"] == 1.0).all() and (frame["max_abs_diff"] <= FLOAT32_ATOL).all(), frame
    assert (frame["items_per_s_min"] <= frame["items_per_s"]).all() and (
        frame["items_per_s"] <= frame["items_per_s_max"]
    ).all()
    assert (frame["sample_tickets"] == 16).all() and frame.loc[0, "speedup_vs_loop"] == 1.0
    for column in (
        "strategy",
        "batch_size",
        "dtype",
        "items_per_s",
        "items_per_s_min",
        "items_per_s_max",
        "n",
        "padding_fraction",
        "shots",
    ):
        assert column in frame, f"runs/benchmark.csv lost its {column} column"
    with pytest.raises(ValueError, match="each divide the largest"):
        run_benchmark("twin:tiny-qwen2", Design(batch_sizes=[1, 3, 8], n=48), progress=False)
