"""The verified half-precision path (notebook 05, ``classify --dtype auto``): the threshold rule, and the rescoring
on both twins and the embedded model, every label equal to float32's."""

from dataclasses import replace

import pytest
import torch

from helpers.batching import score_batched
from helpers.checks import float_tolerance
from helpers.data import LABELS, build_prompt, encode_prompts
from helpers.precision import (
    FEW_PER_BATCH,
    Calibration,
    batch_for_few,
    calibrate,
    calibration_rows,
    half_copy,
    margin_error,
    mixed_precision,
    near_ties,
    rounding_step,
    score_verified,
    threshold_for,
)
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, LabelScores
from tests.conftest import prompts_for


def scores(rows):
    return LabelScores(list(LABELS), torch.tensor(rows, dtype=torch.float32))


def test_the_margin_error_is_the_largest_change_in_a_difference_of_two_labels():
    full = scores([[-0.5, -1.5, -3.0], [-1.0, -1.1, -2.0]])
    half = scores([[-0.4, -1.7, -3.0], [-1.0, -1.1, -2.05]])
    # row 1 changes by (+0.1, -0.2, 0): billing - technical moved by 0.3; row 2 by (0, 0, -0.05): 0.05
    assert margin_error(half, full) == pytest.approx(0.3)
    assert threshold_for(0.3) == pytest.approx(0.6) and threshold_for(0.3, safety=1) == pytest.approx(0.3)
    assert near_ties(half, 0.2) == [1] and near_ties(half, 2.0) == [0, 1] and near_ties(half, 0.0) == []
    with pytest.raises(ValueError, match="same rows and labels"):
        margin_error(half[:1], full)
    with pytest.raises(ValueError, match="non-finite"):
        margin_error(scores([[float("nan"), 0.0, 0.0]]), full[:1])
    with pytest.raises(ValueError, match="safety factor >= 1"):
        threshold_for(0.3, safety=0.5)


def test_no_row_whose_margin_clears_the_error_can_change_its_label():
    """The rule itself, on many random rows: perturb every label's score by changes whose spread is at most e; every
    row whose perturbed top-two margin is at least e keeps its label."""
    generator = torch.Generator().manual_seed(0)
    full = torch.randn(5_000, 3, generator=generator)
    change = torch.rand(5_000, 3, generator=generator) * 0.8 - 0.4
    half = scores((full + change).tolist())
    error = margin_error(half, scores(full.tolist()))
    assert error <= 0.8
    safe = torch.ones(len(half), dtype=torch.bool)
    safe[near_ties(half, error)] = False
    assert safe.sum() > 2_000, "many rows clear the bound: the test would prove nothing otherwise"
    assert (half.log_scores[safe].argmax(-1) == full[safe].argmax(-1)).all()
    flipped = (half.log_scores.argmax(-1) != full.argmax(-1)).sum()
    assert flipped > 0, "some near ties do flip: the threshold is what saves them"


def check_the_bound(verified, half, reference, sample):
    """The bound was measured on ``sample``'s rows of the half pass ``half`` (the job's own batches); those rows keep
    float32's scores; of the rest exactly the near ties were rescored, to float32's, and the others keep ``half``'s."""
    info, rescored = verified.info, verified.info["rescored"]
    assert info["margin_error"] == pytest.approx(
        margin_error(half[sample], reference[sample]), abs=float_tolerance(reference)
    )
    assert rescored == [i for i in near_ties(half, info["threshold"]) if i not in sample]
    assert torch.allclose(
        verified.log_scores[rescored + sample],
        reference.log_scores[rescored + sample],
        rtol=0,
        atol=float_tolerance(reference),
    )
    kept = [i for i in range(len(reference)) if i not in rescored and i not in sample]
    assert kept and torch.equal(verified.log_scores[kept], half.log_scores[kept]), "the same batches, in another order"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_verified_path_gives_float32s_label_on_every_row_of_both_twins(any_model, tickets, few_shot, dtype):
    model, tokenizer, _ = any_model
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"], few_shot)
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    relayed = []  # what on_batch hands on: (input positions, their final scores)
    verified = score_verified(
        model,
        tokenizer,
        scorer,
        prompts,
        dtype,
        calibration=6,
        strategy="sorted",
        batch_size=8,
        on_batch=lambda items, scores, full, exact: relayed.append((items, scores.clone())),
    )
    landed = [i for items, _ in relayed for i in items]
    assert sorted(landed) == list(range(len(prompts))), "every row lands once, at its input position"
    for items, scores in relayed:
        assert torch.equal(scores, verified.log_scores[items]), "a row landed with other scores than it ends with"
    assert model.dtype == torch.float32 and "forward" not in vars(model.get_output_embeddings()), "the model is kept"
    assert verified.predictions == reference.predictions
    info = verified.info
    assert info["calibration"] == 6 and info["threshold"] >= threshold_for(info["margin_error"]) > 0
    # the same passes by hand: in half precision a row's scores depend a little on its batch, so the calibration's
    # rows (spread over the length order) are read from the half pass's own batches, the job's plan
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    sample = calibration_rows(tokenizer, prompts, 6)
    assert {lengths[i] for i in sample} >= {min(lengths), max(lengths)}, "the shortest and the longest calibrate"
    rest = [i for i in range(len(prompts)) if i not in sample]
    with mixed_precision(model, dtype):
        half = score_batched(model, tokenizer, scorer, prompts, "sorted", 8, progress=False)
    assert margin_error(half[rest], reference[rest]) > 0, "the block ran the model in half precision"
    check_the_bound(verified, half, reference, sample)
    everything = score_verified(
        model, tokenizer, scorer, prompts, dtype, calibration=Calibration(threshold=float("inf")), strategy="loop"
    )
    assert len(everything.info["rescored"]) == len(prompts) - everything.info["calibration"]
    assert torch.allclose(everything.log_scores, reference.log_scores, rtol=0, atol=float_tolerance(reference))
    landed = []
    nothing = score_verified(
        model,
        tokenizer,
        scorer,
        prompts,
        dtype,
        calibration=Calibration(rows=0, threshold=0.0),
        strategy="sorted",
        batch_size=4,
        on_batch=lambda items, scores, full, exact: landed.extend(items),
    )
    assert nothing.info["rescored"] == [] and nothing.log_scores.dtype == torch.float32
    assert sorted(landed) == list(range(len(prompts))), "every row lands once, at its input position"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_verified_path_on_a_wholly_rounded_copy_keeps_every_label(tiny_qwen, tickets, few_shot, dtype):
    """``whole``: the half pass runs on ``half_copy`` (every activation rounded) with its own copy of the prefix cache;
    calibration and rescoring stay on the float32 model."""
    model, tokenizer, _ = tiny_qwen
    scorer, prompts = LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"], few_shot)
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=few_shot)
    plan, half = dict(strategy="sorted", batch_size=8, prefix=prefix), half_copy(model, dtype)
    reference = score_batched(model, tokenizer, scorer, prompts, **plan, progress=False)
    verified = score_verified(model, tokenizer, scorer, prompts, dtype, calibration=6, whole=half, **plan)
    assert verified.predictions == reference.predictions and model.dtype == torch.float32
    own = PrefixCache(half, tokenizer, prefix.text)
    rounded = score_batched(half, tokenizer, scorer, prompts, "sorted", 8, prefix=own, progress=False)
    assert margin_error(rounded, reference) > 0, "the copy ran in half precision"
    check_the_bound(verified, rounded, reference, calibration_rows(tokenizer, prompts, 6))
    everything = score_verified(
        model, tokenizer, scorer, prompts, dtype, calibration=Calibration(threshold=float("inf")), whole=half, **plan
    )
    assert torch.allclose(everything.log_scores, reference.log_scores, rtol=0, atol=float_tolerance(reference)), (
        "rescored"
    )
    other = "float16" if dtype == "bfloat16" else "bfloat16"
    with pytest.raises(ValueError, match=f"not {other}: pass half_copy"):
        score_verified(model, tokenizer, scorer, prompts, other, whole=half, **plan)


def test_the_few_rows_run_in_sorted_batches_of_a_quarter_of_their_set_within_the_plan(tiny_qwen, monkeypatch):
    """The calibration sample's float32 pass and the near ties are rows of any length: sorted, at least four batches
    of at least FEW_PER_BATCH rows, never over the plan's batch size; "loop" and a token budget (it bounds memory) keep
    theirs. The half-precision pass runs the plan on every row, the calibration's among them."""
    assert [batch_for_few(rows, 16) for rows in (1, 6, 16, 40, 64, 600)] == [FEW_PER_BATCH] * 3 + [10, 16, 16]
    assert batch_for_few(16, 2) == 2
    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, [f"ticket {i} " + "word " * (i % 7) for i in range(20)])
    calls = []  # each pass: (rows, strategy, batch_size, token_budget)

    def spy(model, tokenizer, scorer, chosen, how, **options):
        calls.append((len(chosen), how.strategy, how.batch_size, how.token_budget))
        return score_batched(model, tokenizer, scorer, chosen, how, **options)

    monkeypatch.setattr("helpers.precision.score_batched", spy)
    everything = dict(
        dtype="bfloat16", calibration=Calibration(8, threshold=float("inf"))
    )  # rescores all 12 after the calibration
    score_verified(model, tokenizer, scorer, prompts, **everything, strategy="arbitrary", batch_size=16)
    assert calls == [(8, "sorted", 4, None), (20, "arbitrary", 16, None), (12, "sorted", 4, None)]
    for plan in (dict(strategy="loop", batch_size=1), dict(strategy="token_budget", batch_size=None, token_budget=900)):
        calls.clear()
        score_verified(model, tokenizer, scorer, prompts, **everything, **plan)
        assert {call[1:] for call in calls} == {
            tuple(plan.get(key) for key in ("strategy", "batch_size", "token_budget"))
        }


def test_the_verified_path_on_the_embedded_model_keeps_every_label(embedded):
    """Trained weights, where rounding moves real margins: a handful of short prompts (bfloat16 on a CPU without
    bfloat16 instructions is slow)."""
    model, tokenizer, _ = embedded
    scorer = LabelScorer(tokenizer, LABELS)
    texts = ["I was charged twice this month", "The app crashes on start", "Change my login email"]
    prompts = prompts_for(tokenizer, texts)
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    verified = score_verified(model, tokenizer, scorer, prompts, "bfloat16", calibration=2, strategy="loop")
    assert 0 < verified.info["margin_error"] < 1, f"bfloat16 moved a margin by {verified.info['margin_error']}"
    assert verified.predictions == reference.predictions
    phases = verified.info["phase_seconds"]  # where the time went: each phase timed inside the whole
    assert {"calibration", "half"} <= phases.keys() <= {"calibration", "half", "rescore"}
    assert 0 < sum(phases.values()) <= verified.info["seconds"]
    # The residual stream and output layer in float32 move margins less than rounding the whole model (section 2).
    with mixed_precision(model, "bfloat16"):
        mixed = score_batched(model, tokenizer, scorer, prompts[:2], "loop", progress=False)
    whole = score_batched(half_copy(model, "bfloat16"), tokenizer, scorer, prompts[:2], "loop", progress=False)
    assert margin_error(mixed, reference[:2]) < margin_error(whole, reference[:2])


def test_mixed_precision_keeps_the_output_layer_in_float32_and_puts_it_back(tiny_qwen):
    model, tokenizer, _ = tiny_qwen
    ids = tokenizer("The app crashes on start", return_tensors="pt").input_ids
    head = model.get_output_embeddings()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast alone: 16-bit logits
        assert model(input_ids=ids).logits.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="stopped inside"):
        with mixed_precision(model, "bfloat16"):
            assert model(input_ids=ids).logits.dtype == torch.float32
            raise RuntimeError("stopped inside")
    assert "forward" not in vars(head), "the class's forward is back, also after an error"
    wrapper = head.forward  # an instance's own forward, as a hook's wrapper would be
    head.forward = wrapper
    try:
        with mixed_precision(model, "bfloat16"), mixed_precision(model, "bfloat16"):  # nested, too
            assert model(input_ids=ids).logits.dtype == torch.float32
        assert vars(head)["forward"] is wrapper, "an instance's own forward is put back as it was"
    finally:
        del head.forward


def test_calibration_reads_its_rows_half_scores_from_the_jobs_own_batches_and_runs_no_other(
    tiny_qwen, tickets, monkeypatch
):
    """``calibrate`` (a resumed ``classify --dtype auto`` run) bounds the rows in the batches the job's plan puts them
    in, as ``score_verified``'s half pass does, and runs only those batches in half precision."""
    import helpers.batching as batching

    model, tokenizer, _ = tiny_qwen
    scorer, prompts = LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"])
    plan = dict(strategy="sorted", batch_size=4, progress=False)
    reference = score_batched(model, tokenizer, scorer, prompts, **plan)
    with mixed_precision(model, "bfloat16"):
        half = score_batched(model, tokenizer, scorer, prompts, **plan)
    rows, first, error, threshold, seconds = calibrate(model, tokenizer, scorer, prompts, "bfloat16", 3, **plan)
    assert rows == calibration_rows(tokenizer, prompts, 3) and torch.allclose(
        first.log_scores, reference.log_scores[rows]
    )
    assert (
        error == pytest.approx(margin_error(half[rows], reference[rows]), abs=float_tolerance(reference))
        and seconds > 0
    )
    assert threshold == pytest.approx(max(2 * error, rounding_step(first, "bfloat16")))
    ran = []
    real = batching.label_log_probs

    def counted(model, scorer, batch, *args, **kwargs):
        ran.append((torch.is_autocast_enabled("cpu"), len(batch)))
        return real(model, scorer, batch, *args, **kwargs)

    monkeypatch.setattr(batching, "label_log_probs", counted)
    calibrate(model, tokenizer, scorer, prompts, "bfloat16", 3, **plan)
    holding = [batch for batch in half.info["batches"] if set(rows) & set(batch)]
    assert [size for in_half, size in ran if in_half] == [len(batch) for batch in holding]


def test_a_calibration_that_measures_no_error_still_rescores_under_one_rounding_step(tiny_qwen, tickets, monkeypatch):
    """A sample whose two dtypes agree exactly does not prove a zero bound: the threshold stays at the dtype's rounding
    step at the scores' scale, and the rows under it are rescored."""
    import helpers.precision as precision

    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"])
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    monkeypatch.setattr(precision, "margin_error", lambda half, full: 0.0)
    verified = score_verified(model, tokenizer, scorer, prompts, "bfloat16", calibration=4, strategy="sorted")
    sample = calibration_rows(tokenizer, prompts, 4)
    step = torch.finfo(torch.bfloat16).eps * reference.log_scores[sample].topk(2, dim=-1).values.abs().max().item()
    assert verified.info["margin_error"] == 0.0 and verified.info["threshold"] == pytest.approx(step, rel=1e-3)
    kept = [i for i in range(len(prompts)) if i not in verified.info["rescored"] + sample]  # half scores, no near tie
    assert (verified.margins[kept] >= step).all()
    assert verified.predictions == reference.predictions


def test_a_row_that_overflows_in_half_precision_is_rescored_in_float32_and_counted(tiny_llama, tickets, monkeypatch):
    """A non-finite half-precision row neither stops the run nor lands: it is rescored in float32 with the near ties."""
    import helpers.batching as batching

    model, tokenizer, _ = tiny_llama
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"])
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    real = batching.label_log_probs

    def overflowing(model, scorer, rows, *args, **kwargs):  # in half precision, a batch's first row overflows
        scores = real(model, scorer, rows, *args, **kwargs).clone()
        if torch.is_autocast_enabled("cpu"):
            scores[0] = float("nan")
        return scores

    monkeypatch.setattr(batching, "label_log_probs", overflowing)
    landed = []
    verified = score_verified(
        model, tokenizer, scorer, prompts, "bfloat16", Calibration(0, threshold=0.0), strategy="sorted", batch_size=4,
        on_batch=lambda items, scores, full, exact: landed.extend(items),
    )  # fmt: skip
    broken = verified.info["non_finite"]
    assert len(broken) == len(prompts) // 4 and set(broken) <= set(verified.info["rescored"])
    assert sorted(landed) == list(range(len(prompts))), "every row lands once"
    assert torch.isfinite(verified.log_scores).all(), "threshold 0: only the broken rows are rescored"
    assert verified.info["rescored"] == broken
    assert torch.allclose(
        verified.log_scores[broken], reference.log_scores[broken], rtol=0, atol=float_tolerance(reference)
    )
    # a calibration row that overflows bounds nothing: it keeps float32's scores, the others set the threshold
    calibrated = score_verified(
        model, tokenizer, scorer, prompts, "bfloat16", calibration=6, strategy="sorted", batch_size=4
    )  # fmt: skip
    sample, broken = calibration_rows(tokenizer, prompts, 6), calibrated.info["non_finite"]
    assert set(sample) & set(broken) and calibrated.info["margin_error"] is not None
    assert set(broken) - set(sample) <= set(calibrated.info["rescored"]) and len(broken) == len(prompts) // 4
    assert calibrated.predictions == reference.predictions and torch.isfinite(calibrated.log_scores).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_several_multi_token_labels_keep_float32s_labels_under_autocast(any_model, tickets, dtype):
    """The tree mask (branches of several multi-token labels) is built for the autocast dtype's scores: finite, and the
    verified path gives float32's label on every row."""
    model, tokenizer, _ = any_model
    labels = ["bug report", "refund request", "billing question about refunds"]  # 2, 3 and 6 tokens: a tree
    scorer = LabelScorer(tokenizer, labels)
    assert len(scorer.multi) == 3
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"]]
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    with mixed_precision(model, dtype):
        half = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, progress=False)
    assert torch.isfinite(half.log_scores).all() and margin_error(half, reference) < 0.75
    verified = score_verified(model, tokenizer, scorer, prompts, dtype, calibration=4, strategy="sorted", batch_size=4)
    assert verified.predictions == reference.predictions and not verified.info["non_finite"]


def test_a_row_no_pass_filled_stops_the_run_instead_of_holding_garbage(tiny_qwen, tickets, monkeypatch):
    import helpers.precision as precision

    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"][:8])
    real = precision.score_batched

    def losing(model, tokenizer, scorer, prompts, how, **kwargs):  # the half pass forgets to hand on its last batch
        batches = []
        result = real(model, tokenizer, scorer, prompts, replace(how, on_batch=lambda *b: batches.append(b)), **kwargs)
        for batch in batches[:-1] if torch.is_autocast_enabled("cpu") else batches:
            how.on_batch(*batch) if how.on_batch is not None else None
        return result

    monkeypatch.setattr(precision, "score_batched", losing)
    with pytest.raises(RuntimeError, match=r"rows \[.*\] got no scores"):
        score_verified(model, tokenizer, scorer, prompts, "bfloat16", calibration=2, strategy="sorted", batch_size=2)


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_a_job_sorted_by_length_calibrates_on_its_whole_range_and_keeps_every_label(tiny_qwen, few_shot, order):
    """A file sorted short to long (or long to short) calibrates on rows like the rest, not on its first ones, and
    every label is float32's; a random model's close labels give it near ties to rescore."""
    from helpers.data import make_tickets

    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, make_tickets(40, seed=3, style="varied")["text"], few_shot[:1])
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    prompts = [p for _, p in sorted(zip(lengths, prompts), key=lambda pair: pair[0], reverse=order == "descending")]
    sample = calibration_rows(tokenizer, prompts, 8)
    assert sample[0] == 0 and sample[-1] == len(prompts) - 1 and len(set(sample)) == 8, "both ends and between"
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    verified = score_verified(model, tokenizer, scorer, prompts, "bfloat16", calibration=8, strategy="sorted")
    assert verified.predictions == reference.predictions
    assert len(verified.info["rescored"]) >= 3, "near ties were there to rescore"


def test_a_rescored_row_beyond_the_bound_widens_it_and_the_rows_under_the_wider_bound_are_rescored(
    tiny_qwen, tickets, monkeypatch
):
    """The near ties are scored both ways anyway: each is one more calibration row. One whose error exceeds the bound
    widens it to ``safety`` times that error, and every row under the wider bound is rescored, float32's scores."""
    import helpers.precision as precision

    model, tokenizer, _ = tiny_qwen
    scorer, prompts = LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"])
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    with mixed_precision(model, "bfloat16"):
        half = score_batched(model, tokenizer, scorer, prompts, "sorted", 8, progress=False)
    first = sorted(half.margins.tolist())[1] + 1e-3  # two near ties at first
    monkeypatch.setattr(precision, "change_in_gaps", lambda half, full: torch.full((len(half),), 0.2))
    exact, plan = (
        {},
        dict(strategy="sorted", batch_size=8, on_batch=lambda items, s, full, e: exact.update(dict.fromkeys(items, e))),
    )
    verified = score_verified(model, tokenizer, scorer, prompts, "bfloat16", Calibration(0, 2.0, first), **plan)
    info = verified.info
    assert (
        info["calibrated"] == first
        and info["threshold"] == pytest.approx(0.4)
        and info["evidence_error"] == pytest.approx(0.2)
    )
    assert info["rescored"] == near_ties(half, 0.4) and len(info["rescored"]) > 2, "the wider bound rescored more"
    assert info["evidence"] == len(info["rescored"])
    rescored = info["rescored"]
    assert torch.allclose(
        verified.log_scores[rescored], reference.log_scores[rescored], rtol=0, atol=float_tolerance(reference)
    )
    assert {i for i, e in exact.items() if e} == set(rescored), "each row's last landing says whose scores it holds"
    assert verified.predictions == reference.predictions


def test_every_calibration_row_overflowing_falls_back_to_float32_for_every_row(tiny_llama, tickets, monkeypatch):
    import helpers.batching as batching

    model, tokenizer, _ = tiny_llama
    scorer, prompts = LabelScorer(tokenizer, LABELS), prompts_for(tokenizer, tickets["text"])
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    real = batching.label_log_probs

    def overflowing(model, scorer, rows, *args, **kwargs):  # every half-precision row overflows
        scores = real(model, scorer, rows, *args, **kwargs).clone()
        return scores.fill_(float("nan")) if torch.is_autocast_enabled("cpu") else scores

    monkeypatch.setattr(batching, "label_log_probs", overflowing)
    verified = score_verified(model, tokenizer, scorer, prompts, "bfloat16", 4, strategy="sorted", batch_size=4)
    info = verified.info
    assert info["overflowed"] and info["threshold"] == float("inf")
    assert len(info["rescored"]) == len(prompts) - 4, "every row but the calibration's, which are float32's already"
    assert torch.allclose(verified.log_scores, reference.log_scores, rtol=0, atol=float_tolerance(reference))
    assert verified.predictions == reference.predictions
