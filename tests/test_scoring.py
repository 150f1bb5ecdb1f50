import numpy as np
import pytest
import torch

from helpers.checks import agreement, assert_agrees, float_tolerance
from helpers.data import LABELS, build_prompt
from helpers.generation import parse_label
from helpers.scoring import LabelScorer, LabelScores, score_one_by_one, score_the_slow_way

from .conftest import prompts_for


def test_bad_label_lists_get_one_line_errors(embedded):
    _, tokenizer, _ = embedded
    cases = [
        ([], "label list has 0 label"),
        (["billing"], "label list has 1 label"),
        (["billing", "billing", "account"], "duplicate labels: 'billing'"),
        (["billing", "  "], "label #1"),
        (["billing", "account"], None),
    ]
    for labels, message in cases:
        if message is None:
            LabelScorer(tokenizer, labels)
            continue
        with pytest.raises(ValueError, match=message) as error:
            LabelScorer(tokenizer, labels)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="unknown scoring method"):
        LabelScorer(tokenizer, LABELS, method="vibes")


def test_label_that_tokenizes_to_nothing_is_refused():
    class NothingTokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": []}

    with pytest.raises(ValueError, match="label 'billing' tokenizes to nothing"):
        LabelScorer(NothingTokenizer(), ["billing", "account"])


def test_auto_picks_first_token_only_when_it_is_exact(embedded):
    _, tokenizer, _ = embedded
    # The embedded tokenizer splits "billing" into "b" + "illing".
    assert LabelScorer(tokenizer, LABELS).method == "sequence"
    assert LabelScorer(tokenizer, ["payment", "technical", "account"]).method == "first_token"


def test_first_token_shortcut_refuses_labels_sharing_a_first_token(embedded):
    _, tokenizer, _ = embedded
    with pytest.raises(ValueError, match="share their first token"):
        LabelScorer(tokenizer, ["billing", "bills", "account"], method="first_token")
    assert LabelScorer(tokenizer, ["billing", "bills", "account"]).method == "sequence"


def test_first_token_equals_full_sequence_for_single_token_labels(any_model, tickets):
    model, tokenizer, _ = any_model
    labels = ["payment", "technical", "account"]
    prompts = prompts_for(tokenizer, tickets["text"])
    first = score_one_by_one(model, tokenizer, LabelScorer(tokenizer, labels, "first_token"), prompts, progress=False)
    full = score_one_by_one(model, tokenizer, LabelScorer(tokenizer, labels, "sequence"), prompts, progress=False)
    assert_agrees(first, full, atol=float_tolerance(first))


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_qwen", "embedded"])
def test_constrained_scores_equal_the_slow_full_forward_on_every_ticket(request, tickets, few_shot, model_name):
    """One pass + cached continuations gives what one full forward per label gives (the twins on every ticket with 3
    examples; the embedded model, with its trained weights, on 3 tickets with 1)."""
    model, tokenizer, _ = request.getfixturevalue(model_name)
    scorer = LabelScorer(tokenizer, LABELS)
    texts, examples = (tickets["text"][:3], few_shot[:1]) if model_name == "embedded" else (tickets["text"], few_shot)
    prompts = prompts_for(tokenizer, texts, examples)
    slow = score_the_slow_way(model, tokenizer, scorer, prompts)
    assert_agrees(slow, score_one_by_one(model, tokenizer, scorer, prompts, progress=False), atol=float_tolerance(slow))
    # Length-normalised: the same sums divided by each label's token count.
    normalized = LabelScorer(tokenizer, LABELS, normalize=True)
    per_token = LabelScores(LABELS, slow.log_scores / normalized.lengths)
    assert_agrees(
        per_token,
        score_one_by_one(model, tokenizer, normalized, prompts, progress=False),
        atol=float_tolerance(per_token),
    )


def test_several_multi_token_labels_are_scored_together(any_model, tickets):
    """More than one multi-token label: each is a branch after the prompt that no other branch sees."""
    model, tokenizer, _ = any_model
    labels = ["billing", "refund", "invoice", "technical"]
    scorer = LabelScorer(tokenizer, labels)
    assert len(scorer.multi) == 3 and scorer.is_tree
    prompts = prompts_for(tokenizer, tickets["text"])
    fast = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    slow = score_the_slow_way(model, tokenizer, scorer, prompts)
    assert_agrees(slow, fast, atol=float_tolerance(slow))


def test_scores_make_probabilities_and_a_frame(tiny_llama, tickets):
    model, tokenizer, _ = tiny_llama
    result = score_one_by_one(
        model, tokenizer, LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"][:4]), progress=False
    )
    assert torch.allclose(result.probabilities.sum(-1), torch.ones(4))
    frame = result.to_frame()
    assert list(frame.columns) == ["predicted_label", "confidence", "p_billing", "p_technical", "p_account"]
    assert (frame["confidence"] >= 1 / 3).all()


def test_agreement_check_names_the_first_differing_item():
    reference = LabelScores(["a", "b"], torch.tensor([[0.0, -1.0], [0.0, -1.0], [-1.0, 0.0]]))
    swapped = LabelScores(["a", "b"], torch.tensor([[0.0, -1.0], [-1.0, 0.0], [-1.0, 0.0]]))
    assert agreement(reference, swapped)["agreement"] == pytest.approx(2 / 3)
    with pytest.raises(AssertionError, match="1 of 3 predictions differ; first: item 1"):
        assert_agrees(reference, swapped)
    nudged = LabelScores(["a", "b"], reference.log_scores + 0.01)
    with pytest.raises(AssertionError, match="differ by 1.00e-02"):
        assert_agrees(reference, nudged)
    nan = LabelScores(["a", "b"], torch.full((3, 2), float("nan")))
    with pytest.raises(AssertionError):
        assert_agrees(nan, nan)


def test_parse_label_accepts_exactly_one_label():
    assert parse_label("Billing.", LABELS) == "billing"
    assert parse_label("The category is technical", LABELS) == "technical"
    assert parse_label("billing or account", LABELS) is None
    assert parse_label("I think it is a payment problem", LABELS) is None
    assert parse_label("accounting", LABELS) is None


def test_low_precision_checks_accept_near_ties_only_and_count_them():
    reference = LabelScores(["a", "b"], torch.tensor([[0.0, -0.01], [0.0, -1.0], [-1.0, 0.0]]))
    tie_flipped = LabelScores(["a", "b"], torch.tensor([[-0.01, 0.0], [0.0, -1.0], [-1.0, 0.0]]))
    stats = assert_agrees(reference, tie_flipped, atol=5e-2, near_ties=True)
    assert stats["near_ties"] == 1 and stats["agreement"] == pytest.approx(2 / 3)
    with pytest.raises(AssertionError, match="1 of 3 predictions differ; first: item 0"):
        assert_agrees(reference, tie_flipped, atol=5e-2)  # without near_ties (float32) every label must match
    clear_flip = LabelScores(["a", "b"], torch.tensor([[0.0, -0.01], [-1.0, 0.0], [-1.0, 0.0]]))
    with pytest.raises(AssertionError, match="1 of 3 predictions differ; first: item 1"):
        assert_agrees(reference, clear_flip, atol=5e-2, near_ties=True)
    with pytest.raises(AssertionError, match="first: row 17 'a' \\(reference\\) vs 'b'"):
        assert_agrees(reference, clear_flip, atol=5e-2, near_ties=True, item_names=["row 3", "row 17", "row 40"])


def test_label_checks_need_no_tokenizer():
    from helpers.scoring import check_labels

    assert check_labels(("refund request", "bug report")) == ["refund request", "bug report"]
    for labels, message in (([], "has 0 label"), (["a", "a"], "duplicate labels: 'a'"), (["a", None], "label #1")):
        with pytest.raises(ValueError, match=message):
            check_labels(labels)


def test_label_branches_on_the_prefix_cache_in_padded_batches_equal_the_slow_way(any_model, tickets):
    """The tree mask, the cached prefix and left padding together, against one full forward per label."""
    from helpers.batching import score_batched
    from helpers.prefix_cache import PrefixCache

    model, tokenizer, _ = any_model
    labels = ["bug report", "refund request", "billing question about refunds", "technical"]
    scorer = LabelScorer(tokenizer, labels)
    assert scorer.is_tree
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"]]
    cache = PrefixCache.for_prompts(model, tokenizer, labels=labels)
    batched = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=3, prefix=cache, progress=False)
    assert batched.info["padding_fraction"] > 0, "the batches must hold rows of different lengths"
    slow = score_the_slow_way(model, tokenizer, scorer, prompts)
    assert_agrees(slow, batched, atol=float_tolerance(slow))


def test_several_multi_token_labels_refuse_a_sliding_window_they_would_see_past():
    from types import SimpleNamespace

    from helpers.scoring import _check_full_attention

    config = SimpleNamespace(sliding_window=8, layer_types=["full_attention", "sliding_attention"])
    _check_full_attention(SimpleNamespace(config=config), 8)
    with pytest.raises(ValueError, match="sliding-window layers \\(8 tokens\\)"):
        _check_full_attention(SimpleNamespace(config=config), 9)
    _check_full_attention(SimpleNamespace(config=SimpleNamespace(sliding_window=8, layer_types=["full_attention"])), 99)


# --- accuracy intervals ---------------------------------------------------------------------------


def _wilson_by_quadratic(k, n, z=1.96):
    """The Wilson bounds are the proportions p where the observed rate sits z standard errors away:
    (k/n - p)^2 = z^2 p (1 - p) / n, a quadratic in p, solved here with numpy's polynomial roots."""
    import numpy as np

    phat, z2 = k / n, z * z
    roots = np.roots([1 + z2 / n, -(2 * phat + z2 / n), phat * phat])
    return tuple(sorted(float(r.real) for r in roots))


def test_wilson_interval_matches_the_quadratic_it_solves():
    from helpers.checks import wilson_interval

    for k, n in ((8, 10), (1, 3), (45, 90), (70, 90), (299, 600)):
        low, high = wilson_interval(k, n)
        expected = _wilson_by_quadratic(k, n)
        assert (low, high) == pytest.approx(expected, abs=1e-9), (k, n)
        assert low < k / n < high, f"{k}/{n}: the interval must contain the observed rate"
    # A textbook value: 8 of 10 correct, 95 %.
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    # A wider z gives a wider interval; more items at the same rate a narrower one.
    assert wilson_interval(8, 10, z=2.58)[0] < wilson_interval(8, 10)[0]
    narrow, wide = wilson_interval(80, 100), wilson_interval(8, 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_wilson_interval_edges_stay_in_zero_one_without_collapsing():
    from helpers.checks import wilson_interval

    z = 1.96
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(z * z / (10 + z * z)), "0 of n: the upper bound is z²/(n + z²)"
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and low == pytest.approx(10 / (10 + z * z)), "n of n: the lower bound is n/(n + z²)"


def test_wilson_interval_refuses_bad_counts_in_one_line():
    from helpers.checks import wilson_interval

    for args, message in (
        ((0, 0), "n=0"),
        ((3, -1), "n=-1"),
        ((11, 10), "successes=11"),
        ((-1, 10), "successes=-1"),
        ((5, 10, 0), "z=0"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            wilson_interval(*args)
        assert "\n" not in str(error.value)


# --- tokenizer-derived examples -------------------------------------------------------------------


def test_label_scores_slice_by_rows_and_refuse_anything_else():
    scores = LabelScores(["a", "b"], torch.tensor([[0.0, -1.0], [-2.0, 0.0], [-1.0, -3.0]]), {"n": 3})
    first_two = scores[:2]
    assert first_two.labels == ["a", "b"] and first_two.predictions == ["a", "b"] and len(first_two) == 2
    assert scores[[2, 0]].predictions == ["a", "a"] and scores[np.array([1])].predictions == ["b"]
    with pytest.raises(TypeError, match="not one number"):
        scores[0]


def test_accuracy_interval_figure_is_titled_from_its_data(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from types import SimpleNamespace

    import pandas as pd

    from helpers.checks import wilson_interval
    from helpers.plots import plot_accuracy_intervals

    rows = []
    for name, correct in (("0 shots", 30), ("6 shots", 70)):
        low, high = wilson_interval(correct, 90)
        rows.append({"variant": name, "accuracy": correct / 90, "accuracy_low": low, "accuracy_high": high, "n": 90})
    info = SimpleNamespace(name="model", dtype="float32", device="cpu", threads=2)
    fig, path = plot_accuracy_intervals(pd.DataFrame(rows), info, path=tmp_path / "a.png", baseline="0 shots")
    title = fig.axes[0].get_title()
    assert path.exists() and "90 tickets" in title and "6 shots" in title and "78%" in title, title
    assert "clear of" in title, title  # 30/90 and 70/90 do not overlap
    rows[1].update(accuracy=35 / 90, accuracy_low=wilson_interval(35, 90)[0], accuracy_high=wilson_interval(35, 90)[1])
    fig, _ = plot_accuracy_intervals(pd.DataFrame(rows), info, path=tmp_path / "b.png", baseline="0 shots")
    assert "overlapping" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="accuracy_low"):
        plot_accuracy_intervals(pd.DataFrame(rows).drop(columns="accuracy_low"), info, path=tmp_path / "c.png")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_tree_mask_stays_finite_when_added_to_scores_in_low_precision(embedded, dtype):
    """A kernel that adds the mask to the attention scores in the model's dtype must not get -inf (a row of -inf is
    NaN after the softmax, and a NaN in a padding row spreads through the values)."""
    from helpers.scoring import _tree_mask

    _, tokenizer, _ = embedded
    scorer = LabelScorer(tokenizer, ["bug report", "refund request", "billing question about refunds"])
    _, mask, _ = scorer.batch_inputs([[1, 2], [1, 2, 3, 4]], tokenizer.pad_token_id)  # the first row left-padded
    additive = _tree_mask(mask, scorer, past_length=0, dtype=dtype)
    assert (additive < -1000).any(), "the mask should block something"
    scores = torch.full_like(additive, -300.0)  # a strongly negative attention score, in the same dtype
    assert torch.isfinite(additive + scores).all(), f"mask + score overflows to -inf in {dtype}"


# The largest label log-prob differences measured against the one-at-a-time reference (helpers/checks.py): float32
# by summation order (every instruction set and thread count of docs/testing.md); float16 on the embedded model's 24
# tickets; bfloat16 on the article's 600.
@pytest.mark.parametrize("dtype, measured", [("float32", 4e-5), ("bfloat16", 0.52), ("float16", 0.04)])
def test_each_dtype_has_an_agreement_tolerance_above_what_was_measured(dtype, measured):
    from helpers.checks import tolerance_for

    tolerance = tolerance_for(getattr(torch, dtype))
    assert measured < tolerance.atol <= 1.0 and tolerance.near_ties == (dtype != "float32")
    assert str(tolerance).startswith(dtype) and ("near-ties" in str(tolerance)) == (dtype != "float32")
    with pytest.raises(ValueError, match="no agreement tolerance for dtype 'int8'"):
        tolerance_for("int8")


def test_the_timed_classifiers_accuracy_sits_beside_the_keyword_rules_and_chance():
    from helpers.checks import accuracy_beside_rules

    texts = ["my invoice is wrong", "the app crashes", "change my email", "refund please"]
    gold = ["billing", "technical", "account", "billing"]
    said = accuracy_beside_rules(["billing", "billing", "account", "technical"], texts, gold)
    assert (
        said.startswith("50% [15%, 85%] of 4 tickets right")
        and "keyword rules 100%" in said
        and said.endswith("chance 33%")
    ), said
    with pytest.raises(ValueError, match="3 predictions, 4 texts, 4 labels"):
        accuracy_beside_rules(["billing"] * 3, texts, ["billing"] * 4)
