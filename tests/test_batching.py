import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.batching import STRATEGIES, Batching, global_padding_factor, padding_report, plan_batches, score_batched
from helpers.checks import assert_agrees, float_tolerance
from helpers.data import LABELS, build_prompt, encode_prompt
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, score_one_by_one

from .conftest import prompts_for

lengths_lists = st.lists(st.integers(1, 500), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_lists,
    strategy=st.sampled_from(STRATEGIES),
    batch_size=st.integers(1, 64),
    budget=st.integers(1, 20000),
    per_row=st.integers(0, 400),
)
def test_every_item_lands_in_exactly_one_batch(lengths, strategy, batch_size, budget, per_row):
    batches = plan_batches(lengths, strategy, batch_size, budget, tokens_per_row=per_row)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(batches), "no empty batch"
    if strategy == "token_budget":
        for batch in batches:
            assert len(batch) == 1 or len(batch) * (per_row + max(lengths[i] for i in batch)) <= budget
    elif strategy != "loop":
        assert all(len(batch) <= batch_size for batch in batches)
    report = padding_report(lengths, batches)
    assert report.real_tokens == sum(lengths) and report.processed_tokens >= report.real_tokens
    assert 0 <= report.padding_fraction < 1


def test_sorting_pads_less_than_arbitrary_order():
    lengths = [10, 400, 12, 390, 11, 405, 9, 380]
    arbitrary = padding_report(lengths, plan_batches(lengths, "arbitrary", 2))
    ordered = padding_report(lengths, plan_batches(lengths, "sorted", 2))
    assert ordered.padding_fraction < 0.05 < 0.4 < arbitrary.padding_fraction
    assert plan_batches(lengths, "sorted", 2)[0] == [5, 1], "longest first"
    assert global_padding_factor([10, 30]) == pytest.approx(1.5)


def test_some_batches_of_a_plan_report_their_own_padding():
    lengths = [10, 400, 12, 390, 11, 405, 9, 380]
    plan = plan_batches(lengths, "sorted", 2)
    some = padding_report(lengths, plan[:1])  # [405, 400]: 5 tokens of padding
    assert (some.real_tokens, some.processed_tokens, some.n_batches) == (805, 810, 1)


def test_a_run_records_each_batch_with_its_seconds_in_the_order_they_ran(tiny_qwen):
    model, tokenizer, _ = tiny_qwen
    prompts = [build_prompt(tokenizer, text) for text in ["short", "a much longer ticket " * 8, "medium length " * 3]]
    result = score_batched(
        model, tokenizer, LabelScorer(tokenizer, LABELS), prompts, "sorted", batch_size=2, progress=False
    )
    assert result.info["batches"] == [[1, 2], [0]], "longest first, input positions"
    assert len(result.info["batch_seconds"]) == 2 and all(t > 0 for t in result.info["batch_seconds"])
    assert sum(result.info["batch_seconds"]) <= result.info["seconds"]


def test_the_batches_holding_the_first_items_run_first_with_the_same_shapes_and_scores(tiny_qwen, tickets):
    """``first`` (the verified path's calibration rows) moves whole batches of the plan to the front: every batch keeps
    its rows, so every row its scores; the forward passes are recorded in the order they ran."""
    model, tokenizer, _ = tiny_qwen
    scorer, prompts = LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"][:10])
    plain = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=3, progress=False)
    moved = score_batched(model, tokenizer, scorer, prompts, Batching("sorted", 3, first={7, 2}), progress=False)
    held = [batch for batch in plain.info["batches"] if {7, 2} & set(batch)]
    assert moved.info["batches"] == held + [batch for batch in plain.info["batches"] if batch not in held]
    # The same batches (rows, shapes, threads) run the same kernels in the same order: equal bit for bit.
    assert torch.equal(moved.log_scores, plain.log_scores)
    shape = dict(zip(map(tuple, plain.info["batches"]), plain.info["forward_passes"]))
    assert moved.info["forward_passes"] == [shape[tuple(batch)] for batch in moved.info["batches"]]


def test_bad_batching_arguments_are_refused():
    with pytest.raises(ValueError, match="list of items is empty"):
        plan_batches([], "sorted")
    with pytest.raises(ValueError, match="unknown batching strategy 'random'"):
        plan_batches([1], "random")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        plan_batches([1], "sorted", batch_size=0)
    with pytest.raises(ValueError, match="needs token_budget"):
        plan_batches([1], "token_budget")
    with pytest.raises(ValueError, match="tokens_per_row must be >= 0"):
        plan_batches([1], "token_budget", token_budget=10, tokens_per_row=-1)


def test_a_token_budget_counts_the_cached_prefix_in_every_row(any_model, tickets, few_shot):
    """With the prefix cache a row holds the prefix's keys and values as well as its own tokens."""
    model, tokenizer, _ = any_model
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"][:12], few_shot)
    cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=few_shot)
    suffixes = [len(cache.split(p)) for p in prompts]
    per_row = cache.length + len(scorer.tail)  # the prefix's keys and values, and the label continuations
    budget = 4 * (per_row + max(suffixes))
    result = score_batched(
        model, tokenizer, scorer, prompts, Batching("token_budget", token_budget=budget), prefix=cache, progress=False
    )
    plan = plan_batches(suffixes, "token_budget", token_budget=budget, tokens_per_row=per_row)
    assert result.info["n_batches"] == len(plan) == 3, "4 rows of (prefix + longest suffix) fit the budget"
    widths = [max(suffixes[i] for i in batch) + len(scorer.tail) for batch in plan]
    assert result.info["forward_passes"] == [(len(b), w, cache.length) for b, w in zip(plan, widths)], (
        "every forward pass is recorded with its rows, padded width and cached prefix (the benchmark's kernel ceiling)"
    )
    assert len(plan_batches(suffixes, "token_budget", token_budget=budget)) < len(plan), (
        "counting suffixes alone would pack more rows than the budget holds"
    )
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert_agrees(reference, result, atol=float_tolerance(reference))


def test_a_token_budget_counts_the_label_continuations_in_every_row(tiny_qwen, tickets):
    """Multi-token labels append their continuation tokens to every row: the budget holds them too."""
    model, tokenizer, _ = tiny_qwen
    labels = ["bug report", "refund request", "billing question about refunds"]
    scorer = LabelScorer(tokenizer, labels)
    assert len(scorer.tail) >= 3
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"][:12]]
    lengths = [len(encode_prompt(tokenizer, p)) for p in prompts]
    budget = 4 * max(lengths)
    result = score_batched(
        model, tokenizer, scorer, prompts, Batching("token_budget", token_budget=budget), progress=False
    )
    plan = plan_batches(lengths, "token_budget", token_budget=budget, tokens_per_row=len(scorer.tail))
    assert result.info["n_batches"] == len(plan)
    for batch in plan:
        assert len(batch) == 1 or len(batch) * (max(lengths[i] for i in batch) + len(scorer.tail)) <= budget
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert_agrees(reference, result, atol=float_tolerance(reference))


STRATEGY_CASES = [
    ("arbitrary", dict(batch_size=4)),  # with 6 or 16 tickets: a short last batch
    ("sorted", dict(batch_size=4)),
    ("sorted", dict(batch_size=None)),  # one batch holding every ticket
    ("token_budget", dict(token_budget=900)),
]
# Both architectures on every ticket (3-shot prompts), with and without the prefix cache; and the embedded model with
# its trained weights on 4 tickets with one example (the suite's costliest forwards), the path the notebooks time.
MATRIX = [(m, p) for m in ("tiny_llama", "tiny_qwen") for p in (False, True)] + [("embedded", True)]


@pytest.mark.parametrize("model_name,use_prefix", MATRIX, ids=[f"{m}-{'prefix' if p else 'plain'}" for m, p in MATRIX])
def test_every_strategy_agrees_with_the_loop_on_every_ticket(request, tickets, few_shot, model_name, use_prefix):
    model, tokenizer, _ = request.getfixturevalue(model_name)
    scorer = LabelScorer(tokenizer, LABELS)
    texts, examples = (tickets["text"][:4], few_shot[:1]) if model_name == "embedded" else (tickets["text"], few_shot)
    prompts = prompts_for(tokenizer, texts, examples)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert reference.log_scores.std(0).sum() > 0, "tickets must score differently for the check to mean anything"
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples) if use_prefix else None
    for strategy, options in STRATEGY_CASES:
        options = {k: v or len(prompts) for k, v in options.items()}
        result = score_batched(
            model, tokenizer, scorer, prompts, Batching(strategy, **options), prefix=prefix, progress=False
        )
        assert not torch.isnan(result.log_scores).any(), f"{strategy}: NaN scores"
        try:
            assert_agrees(reference, result, atol=float_tolerance(reference))
        except AssertionError as error:
            raise AssertionError(f"{model_name}, {strategy} {options} prefix={use_prefix}: {error}") from None


def test_results_return_to_their_input_slots(any_model, tickets):
    """Sorted batches run in another order; each score must still land in its own row."""
    model, tokenizer, _ = any_model
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"][:6])
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    reversed_input = score_batched(model, tokenizer, scorer, prompts[::-1], "sorted", batch_size=3, progress=False)
    assert torch.allclose(
        reversed_input.log_scores.flip(0), reference.log_scores, rtol=0, atol=float_tolerance(reference)
    )
    assert reference.log_scores.std(0).sum() > 0, "tickets must differ for this test to mean anything"


def test_batched_info_reports_timing_and_padding(tiny_llama, tickets):
    model, tokenizer, _ = tiny_llama
    scorer = LabelScorer(tokenizer, LABELS)
    result = score_batched(
        model, tokenizer, scorer, prompts_for(tokenizer, tickets["text"][:8]), "sorted", batch_size=4, progress=False
    )
    info = result.info
    assert info["n"] == 8 and info["n_batches"] == 2 and info["items_per_s"] > 0
    assert info["processed_tokens"] >= info["real_tokens"] and 0 <= info["padding_fraction"] < 1
    with pytest.raises(ValueError, match="no prompts"):
        score_batched(model, tokenizer, scorer, [], "sorted")
