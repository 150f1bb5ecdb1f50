"""Label sets of every shape, scored every way, equal the one-at-a-time reference on every item.

Users bring their own labels: all single tokens (the first-token path), one multi-token label, several
multi-token labels of different lengths (one continuation row per label and ticket), length-normalised, labels
that extend one another (scored as whole answers, with the end-of-answer marker), whole answers on request.
Each is checked at batch 1 and batch > 1, with and without the prefix cache, on both architectures.
"""

import pytest
import torch

from helpers.batching import score_batched
from helpers.checks import assert_agrees, float_tolerance
from helpers.data import build_prompt
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, score_one_by_one, score_the_slow_way

SINGLE = ["payment", "technical", "account"]
ONE_MULTI = ["billing", "technical", "account"]  # "b" + "illing"
THREE_MULTI = ["bug report", "refund request", "billing question about refunds"]  # 2, 3 and 6 tokens
MIXED = ["bug report", "technical", "refund request"]  # two multi-token labels around a single-token one
EXTENDING = ["account", "account change", "billing"]  # one label's tokens start another's: whole answers
THREE_LEVELS = ["bug", "bug report", "bug report urgent"]  # 1, 2, 3 tokens, each extending the one before
# name: (labels, normalize, complete)
LABEL_SETS = {
    "single_tokens": (SINGLE, False, None),
    "one_multi_token": (ONE_MULTI, False, None),
    "three_multi_token": (THREE_MULTI, False, None),
    "three_multi_token_normalized": (THREE_MULTI, True, None),
    "two_multi_around_a_single": (MIXED, False, None),
    "extending": (EXTENDING, False, None),
    "three_levels": (THREE_LEVELS, False, None),
    "three_levels_normalized": (THREE_LEVELS, True, None),
    "whole_answers_on_request": (SINGLE, False, True),
}
N = 6  # a short last batch at every batch size below


def test_the_label_sets_have_the_shapes_they_are_named_after(embedded):
    _, tokenizer, _ = embedded
    scorers = {
        name: LabelScorer(tokenizer, labels, complete=complete) for name, (labels, _, complete) in LABEL_SETS.items()
    }
    token_counts = {name: [len(ids) for ids in scorer.label_ids] for name, scorer in scorers.items()}
    assert token_counts["single_tokens"] == [1, 1, 1]
    assert LabelScorer(tokenizer, SINGLE).method == "first_token"
    assert sorted(n > 1 for n in token_counts["one_multi_token"]) == [False, False, True]
    assert all(n > 1 for n in token_counts["three_multi_token"])
    assert len(set(token_counts["three_multi_token"])) == 3, "three different lengths"
    assert scorers["extending"].overlaps == [("account", "account change")] and scorers["extending"].complete
    assert len(scorers["three_levels"].overlaps) == 3 and token_counts["three_levels"] == [1, 2, 3]
    assert scorers["whole_answers_on_request"].complete and not scorers["single_tokens"].complete


@pytest.mark.parametrize("name", list(LABEL_SETS))
def test_the_reference_equals_one_full_forward_per_label(any_model, tickets, name):
    model, tokenizer, _ = any_model
    labels, normalize, complete = LABEL_SETS[name]
    scorer = LabelScorer(tokenizer, labels, normalize=normalize, complete=complete)
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"][:2]]
    slow = score_the_slow_way(model, tokenizer, scorer, prompts)
    assert_agrees(slow, score_one_by_one(model, tokenizer, scorer, prompts, progress=False), atol=float_tolerance(slow))


# Both two-layer twins run every case; the embedded model (trained weights, the slowest) the case that exercises the
# most code at once: continuation rows of three lengths on the prefix cache.
CASES = [(m, name, p) for m in ("tiny_llama", "tiny_qwen") for name in LABEL_SETS for p in (False, True)] + [
    ("embedded", "three_multi_token", True)
]


@pytest.mark.parametrize(
    "model_name,name,use_prefix", CASES, ids=[f"{m}-{n}-{'prefix' if p else 'plain'}" for m, n, p in CASES]
)
def test_every_label_set_agrees_with_the_reference_at_batch_1_and_more(request, tickets, model_name, name, use_prefix):
    model, tokenizer, _ = request.getfixturevalue(model_name)
    labels, normalize, complete = LABEL_SETS[name]
    scorer = LabelScorer(tokenizer, labels, normalize=normalize, complete=complete)
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"][:N]]
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert reference.log_scores.std(0).sum() > 0, "tickets must score differently for the check to mean anything"
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=labels) if use_prefix else None
    for strategy, batch_size in (("loop", 1), ("sorted", 4), ("arbitrary", 5)):  # 4 + 2, and 5 + a single row
        result = score_batched(
            model, tokenizer, scorer, prompts, strategy, batch_size=batch_size, prefix=prefix, progress=False
        )
        try:
            assert_agrees(reference, result, atol=float_tolerance(reference))
        except AssertionError as error:
            raise AssertionError(f"{name}, {strategy} x {batch_size}, prefix={use_prefix}: {error}") from None


def test_visible_keys_hide_padding_and_other_branches(embedded):
    """The picture notebook 03 draws is the mask the forward pass gets: prefix seen by all, padding by none,
    causal over real tokens, and no label branch sees another."""

    _, tokenizer, _ = embedded
    scorer = LabelScorer(tokenizer, THREE_MULTI)
    rows, past = [[5, 6, 7], [8], [9, 10]], 4
    input_ids, mask, positions = scorer.batch_inputs(rows, tokenizer.pad_token_id, past)
    seen = scorer.visible_keys(mask, past)
    width, tail = mask.shape[1], len(scorer.tail)
    assert seen.shape == (3, width, past + width)
    assert seen[:, :, :past].all(), "every query sees the cached prefix"
    assert not seen[:, :, past:][~mask.bool()[:, None, :].expand(-1, width, -1)].any(), "nobody sees padding"
    assert not seen[:, :, past:].triu(1).any(), "no query sees a later token"
    branch = scorer.tail_label
    for q in range(tail):
        for k in range(tail):
            assert seen[0, width - tail + q, past + width - tail + k] == (branch[q] == branch[k] and k <= q)
    # Positions count real tokens from the prefix on; every branch restarts after the row's last token.
    assert positions[1, width - tail - 1] == past and positions[0, width - tail - 1] == past + 2
    first = [i for i, offset in enumerate(scorer.tail_offsets) if offset == 0]
    assert (positions[:, width - tail + torch.tensor(first)] == positions[:, width - tail - 1 : width - tail] + 1).all()
