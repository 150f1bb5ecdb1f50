"""The label prior (helpers.prior): a shift per label that moves predictions, never the scores or any agreement check;
its estimates (a labelled sample's on a case whose answer is known); a prior saved to a file, and refused in one line
naming the file by a job it was not made for; and the verified path's job prior, whose labels are float32's under
the prior it ends with."""

import re

import pytest
import torch

from helpers.batching import score_batched
from helpers.checks import agreement, assert_agrees, float_tolerance
from helpers.data import LABELS, build_prompt
from helpers.precision import near_ties, settle_job_prior
from helpers.prior import (
    CONTENT_FREE,
    Prior,
    calibrated,
    content_free_prior,
    job_prior,
    load_prior,
    mean_prior,
    prior_scope,
    sample_prior,
    save_prior,
)
from helpers.scoring import LabelScorer, LabelScores, score_one_by_one
from tests.conftest import prompts_for


def test_a_prior_shifts_each_label_and_moves_the_top_one():
    raw = LabelScores(LABELS, torch.tensor([[-0.1, -2.5, -3.0], [-0.5, -1.0, -4.0], [-0.2, -3.0, -1.9]]))
    assert raw.predictions == ["billing"] * 3, "collapsed: one label for every row"
    prior = job_prior(raw)
    assert torch.allclose(prior.log_probs.exp(), torch.softmax(raw.log_scores, -1).mean(0))
    assert torch.allclose(prior.log_probs.exp().sum(), torch.tensor(1.0))
    fixed = calibrated(raw, prior)
    assert fixed.predictions == ["billing", "technical", "account"]
    assert torch.equal(fixed.log_scores, raw.log_scores), "the raw scores stay as they were"
    assert torch.allclose(fixed.probabilities.sum(-1), torch.ones(3))
    assert fixed.to_frame().columns.tolist() == [
        "predicted_label",
        "confidence",
        *(f"p_{label}" for label in LABELS),
        *(f"raw_p_{label}" for label in LABELS),
    ]
    assert fixed[[2, 0]].predictions == ["account", "billing"], "rows keep their prior"
    # a prior over the labels in another order is read by name
    reordered = Prior(LABELS[::-1], prior.log_probs.flip(0), "reordered")
    assert calibrated(raw, reordered).predictions == fixed.predictions


def test_bad_priors_get_one_line_errors():
    with pytest.raises(ValueError, match="at least one row"):
        mean_prior(LabelScores(LABELS, torch.empty(0, 3)), "an empty job")
    with pytest.raises(ValueError, match=r"does not cover label\(s\) \['refund'\]"):
        Prior(LABELS, torch.log(torch.full((3,), 1 / 3)), "three labels").for_labels([*LABELS, "refund"])
    with pytest.raises(ValueError, match="not finite"):
        Prior(LABELS, torch.tensor([0.0, float("-inf"), -1.0]), "a label never given")
    with pytest.raises(ValueError, match="needs as many log-probs"):
        Prior(LABELS, torch.zeros(2), "two numbers")


def test_a_labelled_sample_gives_back_the_lean_added_to_a_model_calibrated_on_it():
    """Rows whose probabilities average to the sample's label frequencies (1/2, 1/4, 1/4), with a known lean added:
    the fitted prior is the lean, and dividing it out gives the calibrated rows back; one step is the formula."""
    truth = torch.tensor([[0.8, 0.1, 0.1], [0.6, 0.2, 0.2], [0.3, 0.6, 0.1], [0.3, 0.1, 0.6]])
    gold = ["billing", "billing", "technical", "account"]
    lean = torch.tensor([0.6, 0.3, 0.1])
    leaning = LabelScores(LABELS, torch.log_softmax(truth.log() + lean.log(), -1))
    fitted = sample_prior(leaning, gold)
    assert torch.allclose(fitted.log_probs.exp(), lean, atol=1e-5), fitted
    assert torch.allclose(calibrated(leaning, fitted).probabilities, truth, atol=1e-5)
    assert "a labelled sample of 4 rows" in str(fitted)
    one = sample_prior(leaning, gold, steps=1)
    formula = torch.softmax(leaning.log_scores, -1).mean(0) / torch.tensor([0.5, 0.25, 0.25])
    assert torch.allclose(one.log_probs.exp(), formula / formula.sum(), atol=1e-6) and "one step" in one.source
    # the lean is read by name: a sample in another label order gives the same prior
    flipped = sample_prior(LabelScores(LABELS[::-1], leaning.log_scores.flip(1)), gold)
    assert torch.allclose(flipped.for_labels(LABELS), fitted.log_probs, atol=1e-5)


def test_a_labelled_sample_that_does_not_fit_its_labels_is_a_one_line_error():
    scores = LabelScores(LABELS, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="3 scored rows but 2 labels"):
        sample_prior(scores, ["billing", "account"])
    with pytest.raises(ValueError, match=r"no row is labelled \['technical'\] \(label at least one row of each\)"):
        sample_prior(scores, ["billing", "account", "account"])
    with pytest.raises(ValueError, match=r"labels \['refund'\] are not among"):
        sample_prior(scores, ["billing", "technical", "refund"])


def test_a_saved_prior_loads_back_for_the_job_it_was_made_for(tmp_path):
    path, scope = tmp_path / "prior.json", prior_scope("embedded", LABELS, [("I was charged twice", "billing")])
    prior = Prior(list(LABELS), torch.log(torch.tensor([0.5, 0.3, 0.2])), "a labelled sample of 30 rows")
    save_prior(prior, path, scope)
    loaded = load_prior(path, scope)
    assert loaded.labels == prior.labels and torch.equal(loaded.log_probs, prior.log_probs)
    assert loaded.source == f"a labelled sample of 30 rows, from {path}"
    assert calibrated(LabelScores(LABELS, torch.zeros(1, 3)), loaded).predictions == ["account"]


def test_a_prior_file_a_job_cannot_use_is_a_one_line_error_naming_it(tmp_path):
    path, examples = tmp_path / "prior.json", [("I was charged twice", "billing")]
    scope = prior_scope("embedded", LABELS, examples)
    save_prior(Prior(list(LABELS), torch.log(torch.full((3,), 1 / 3)), "even"), path, scope)
    other_labels = prior_scope("embedded", [*LABELS, "refund"], examples)
    refusals = {
        "no such prior file": (tmp_path / "missing.json", scope),
        "model 'embedded', not this job's 'twin:tiny-qwen2'": (path, prior_scope("twin:tiny-qwen2", LABELS, examples)),
        "made for examples": (path, prior_scope("embedded", LABELS)),
        "prompt_format 'chat', not this job's 'plain'": (
            path,
            prior_scope("embedded", LABELS, examples, prompt_format="plain"),
        ),
        "made for labels": (path, prior_scope("embedded", LABELS[::-1], examples)),
        "does not cover this job's label\\(s\\) \\['refund'\\]": (path, other_labels),
    }
    for words, (where, wanted) in refusals.items():
        with pytest.raises(ValueError, match=f"^{re.escape(str(where))}: .*{words}") as refused:
            load_prior(where, wanted)
        assert "\n" not in str(refused.value), refused.value
    for text, words in [
        ("{not json", "a readable JSON file"),
        ('{"labels": ["billing"]}', "a prior file \\(no key 'log_probs'"),
    ]:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match=f"bad.json: not {words}"):
            load_prior(tmp_path / "bad.json", scope)


def test_calibration_changes_no_agreement_check(any_model, tickets):
    """Every speed path's check against the loop reads the raw scores: the same numbers with a prior on both sides."""
    model, tokenizer, _ = any_model
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"][:8])
    loop = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    batched = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=3, progress=False)
    prior = job_prior(loop)
    assert agreement(loop, batched) == agreement(calibrated(loop, prior), calibrated(batched, prior))
    assert assert_agrees(loop, batched) == assert_agrees(calibrated(loop, prior), calibrated(batched, prior))
    # Two rows within the tolerance, same raw label, that a prior would order differently: still agreement.
    reference = LabelScores(LABELS[:2], torch.tensor([[0.0, -1e-4]]))
    candidate = LabelScores(LABELS[:2], torch.tensor([[0.0, -3e-4]]))
    shift = Prior(LABELS[:2], torch.log(torch.tensor([0.50005, 0.49995])), "a hair towards billing")
    assert calibrated(reference, shift).predictions != calibrated(candidate, shift).predictions
    assert assert_agrees(calibrated(reference, shift), calibrated(candidate, shift))["agreement"] == 1.0


def test_the_content_free_prior_is_the_mean_of_inputs_that_say_nothing(tiny_qwen):
    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    examples = [("I was charged twice", "billing")]
    prior = content_free_prior(model, tokenizer, scorer, examples)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in CONTENT_FREE]
    alone = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert torch.allclose(prior.log_probs, mean_prior(alone, "by hand").log_probs, atol=1e-5)
    assert prior.labels == list(LABELS) and "content-free, 3 inputs" in str(prior)


def test_the_job_prior_on_a_verified_run_gives_float32s_labels_under_the_prior_it_ends_with():
    """Half-precision scores off by up to 0.05 per label from float32's: every row the settled prior leaves close is
    rescored, so every label is float32's under that prior, also where the first prior said otherwise."""
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(200, 3, generator=generator) * 0.3 + torch.tensor([2.0, 0.0, 0.0])  # collapsed on billing
    half = exact + (torch.rand(200, 3, generator=generator) - 0.5) * 0.1
    half[:2] = exact[:2]  # rows 0 and 1: already float32's (the calibration's)
    error = float(((half - exact).amax(-1) - (half - exact).amin(-1)).max())
    calls = []

    def in_float32(rows):
        calls.append(list(rows))
        return exact[rows]

    scores, prior, added, bound, _ = settle_job_prior(LabelScores(LABELS, half.clone()), {0, 1}, error, in_float32)
    assert added and not {0, 1} & set(added), "rows already float32's are not rescored again"
    assert sorted(row for call in calls for row in call) == sorted(added), "each rescored once, in float32"
    first = job_prior(LabelScores(LABELS, half))  # the prior before settling: some label differs from float32's
    assert (
        calibrated(LabelScores(LABELS, half), first).predictions
        != calibrated(LabelScores(LABELS, exact), first).predictions
    )
    truth = calibrated(LabelScores(LABELS, exact), prior)
    assert scores.predictions == truth.predictions, "every label float32's under the settled prior"
    assert torch.allclose(prior.log_probs, job_prior(scores).log_probs), "the prior is the returned scores' own"
    assert not [i for i in near_ties(scores, error) if i not in {0, 1, *added}]
    assert len(set(scores.predictions)) == 3, "the prior lifted the collapse"


def test_a_wholly_resumed_auto_run_calibrates_its_own_bound(tiny_qwen, tickets):
    """Every row read back from progress files: no process calibrated, so the bound is measured now (on rows spread over
    the length order), and the half-precision scores settle to float32's labels under the job's prior (known before,
    from float32 scores)."""
    from helpers.classify import Gathered, Passes, _settle
    from helpers.precision import calibration_rows, mixed_precision

    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"])
    with mixed_precision(model, "bfloat16"):
        half = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, progress=False)
    full = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, progress=False)
    plan = dict(strategy="sorted", batch_size=4, token_budget=None)  # classify_file's batching plan
    known = job_prior(full[calibration_rows(tokenizer, prompts, 8)])
    passes, resumed = Passes(model, tokenizer, scorer, prompts, plan, "bfloat16"), Gathered({}, [], "job", known, True)
    scores, prior, added, runs = _settle(passes, half, set(), [], resumed)
    assert prior is known
    assert len(runs) == 1 and runs[0]["calibration"] == min(len(prompts), 16) and runs[0]["threshold"] > 0
    assert scores.predictions == calibrated(full, prior).predictions
    first = [*calibration_rows(tokenizer, prompts, 16), *added]  # the calibration rows and the rescored
    assert torch.allclose(scores.log_scores[first], full.log_scores[first], rtol=0, atol=float_tolerance(full)), (
        "float32's"
    )
