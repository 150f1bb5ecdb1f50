"""Lower precision without changing a label (notebook 05): score in a half dtype, then rescore in float32 every
ticket whose half-precision margin is too small to be sure of its label.

``half_copy`` rounds every weight and activation to 16 bits, the residual stream included; ``mixed_precision`` runs
only the matrix multiplies in the half dtype (``torch.autocast``) and keeps that running sum, the norms and the
output layer in float32. The rule: a label can flip only where its half-precision margin (the top label's log-score
minus another's) is smaller than the change rounding makes to that difference. ``margin_error`` measures that change
on a calibration sample scored both ways, ``threshold_for`` multiplies it by a margin of safety, ``score_verified``
rescores every row under the threshold: every label is then float32's wherever the sample's bound holds."""

from __future__ import annotations

import contextlib
import copy
import time
from contextlib import contextmanager

import torch

from .batching import NonFiniteScores, score_batched
from .data import encode_prompts
from .prior import Prior, calibrated, job_prior
from .scoring import LabelScores

# Prompts scored in both dtypes to measure how far rounding moves a margin (they keep their float32 scores). Each
# costs a float32 pass and a half one: on a job of a few hundred rows, 32 of them took a quarter of the verified
# path's time (classify, 300 rows); the safety factor below, not a larger sample, covers errors the sample missed.
CALIBRATION = 16
# The calibration sample's largest margin error times this is the rescoring threshold: a row of the full job may see
# a larger error than any of the sample's, and rescoring a few rows too many costs little.
SAFETY = 2.0
# Calibration and rescoring score a set of rows of any length, which in one batch would all pad to the longest: 16
# article rows (144 to 338 tokens) took 6.0 s as one float32 batch and 3.1 s in sorted batches of 4.
FEW_PER_BATCH = 4
# A verified path only pays where half precision runs at least this much faster than float32 (notebook 00's matmul).
FAST_ENOUGH = 1.5


def margin_error(half: LabelScores, full: LabelScores) -> float:
    """The largest change between two dtypes' scores of the same rows in any two labels' gap. Notebook 05, section 2."""
    if len(half) != len(full) or half.labels != full.labels:
        raise ValueError(
            f"compare the same rows and labels: {len(half)} rows of {half.labels} against {len(full)} of {full.labels}"
        )
    if not len(full):
        raise ValueError("no calibration rows: score at least one row in both dtypes")
    change = half.log_scores.float() - full.log_scores.float()
    if not torch.isfinite(change).all():
        raise ValueError("non-finite scores in the calibration sample: this dtype overflows with this model")
    # (a - c) changes by change[a] - change[c]: the largest such difference is the row's max change minus its min.
    return float((change.amax(-1) - change.amin(-1)).max())


def threshold_for(error: float, safety: float = SAFETY, floor: float = 0.0) -> float:
    """The rescoring threshold: the calibration's largest margin error times ``safety``, at least ``floor`` (a sample
    that measured no error does not prove there is none: ``calibrate`` floors it at ``rounding_step``). Notebook 05,
    section 3."""
    if error < 0 or safety < 1:
        raise ValueError(f"need a margin error >= 0 and a safety factor >= 1, got {error} and {safety}")
    return max(error * safety, floor)


def near_ties(scores: LabelScores, threshold: float) -> list[int]:
    """Rows whose top two labels are closer than ``threshold``, maybe swapped by rounding. Notebook 05, section 3."""
    return torch.nonzero(scores.margins < threshold).flatten().tolist()


def half_copy(model, dtype: str):
    """A copy of ``model`` with every weight in ``dtype``; the float32 model stays. Notebook 05, section 2."""
    return copy.deepcopy(model).to(getattr(torch, dtype))


@contextmanager
def mixed_precision(model, dtype: str):
    """In this block ``model``'s matrix multiplies run in ``dtype`` (``torch.autocast``); its residual stream, norms,
    output layer and weights stay float32 (autocast rounds each weight once per block). Notebook 05, section 2."""
    device, head = model.device.type, model.get_output_embeddings()
    own = vars(head).get("forward")  # an instance's own forward (a hook's wrapper, say) is put back as it was
    forward = head.forward

    def float32_head(hidden):
        # Logits near 20 stored in 16 bits keep steps of 0.125: rounding them alone would move a margin that much.
        with torch.autocast(device, enabled=False):
            return forward(hidden.float())

    head.forward = float32_head
    try:
        with torch.autocast(device, dtype=getattr(torch, dtype)):
            yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def batch_for_few(rows: int, batch_size: int) -> int:
    """Rows per sorted batch for calibration and near ties, sets of any length: at least four batches (each pads only to
    its quarter's longest) of at least ``FEW_PER_BATCH`` rows, at most ``batch_size``. Notebook 05, section 2."""
    return min(batch_size, max(FEW_PER_BATCH, rows // 4))


def _few(plan: dict, rows: int) -> dict:
    """The plan for a calibration sample or a set of near ties (``batch_for_few``); "loop" and a token budget kept."""
    if plan.get("strategy") in ("loop", "token_budget"):
        return plan
    return {**plan, "strategy": "sorted", "batch_size": batch_for_few(rows, plan.get("batch_size") or FEW_PER_BATCH)}


def rescore(model, tokenizer, scorer, prompts, prefix=None, **plan) -> LabelScores:
    """Prompts in float32 (also in a mixed-precision block), in ``batch_for_few`` batches. Notebook 05, section 3."""
    with torch.autocast(model.device.type, enabled=False):
        return score_batched(model, tokenizer, scorer, prompts, prefix=prefix, **_few(plan, len(prompts)))


def rounding_step(scores: LabelScores, dtype: str) -> float:
    """One rounding step of ``dtype`` at the scale of the scores a label reads (each row's top two): the least threshold
    ``calibrate`` gives, since a sample that measured no error does not prove there is none. Notebook 05, section 2."""
    return torch.finfo(getattr(torch, dtype)).eps * float(scores.log_scores.topk(2, dim=-1).values.abs().max())


def calibration_rows(tokenizer, prompts, k: int) -> list[int]:
    """``k`` of ``prompts`` spread evenly over their order by token length, the shortest and the longest among them: a
    sample like the job in any row order (a file sorted by length, date or customer). Notebook 05, section 2."""
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return sorted(order[round(j * (len(order) - 1) / max(k - 1, 1))] for j in range(min(k, len(order))))


def calibrate(model, tokenizer, scorer, prompts, dtype, prefix=None, on_batch=None, k=None, safety=SAFETY, **plan):
    """The bound: ``k`` of ``prompts`` (``calibration_rows``; default ``CALIBRATION``) scored in float32 (``on_batch``
    gets those batches, at input positions) and in ``dtype``. Returns (those rows, their float32 scores, the largest
    margin error, the threshold, seconds): the error times ``safety``, at least ``rounding_step``. Notebook 05,
    section 2."""
    rows = calibration_rows(tokenizer, prompts, CALIBRATION if k is None else k)
    chosen, relay = [prompts[i] for i in rows], on_batch and (lambda j, *batch: on_batch([rows[i] for i in j], *batch))
    first = rescore(model, tokenizer, scorer, chosen, prefix, on_batch=relay, **plan)
    with mixed_precision(model, dtype):
        in_half = score_batched(model, tokenizer, scorer, chosen, prefix=prefix, **_few(plan, len(chosen)))
    error, seconds = margin_error(in_half, first), first.info["seconds"] + in_half.info["seconds"]
    return rows, first, error, threshold_for(error, safety, rounding_step(first, dtype)), seconds


def score_verified(
    model,
    tokenizer,
    scorer,
    prompts,
    dtype: str,
    calibration: int | None = None,
    safety: float = SAFETY,
    threshold: float | None = None,
    prefix=None,
    on_batch=None,
    prior: Prior | None = None,
    **plan,
) -> LabelScores:
    """Every prompt's label scores, every label float32's wherever the calibration's bound holds. Notebook 05, section
    3. ``model``, the float32 model, runs in ``dtype`` through ``mixed_precision``. ``calibration`` prompts spread over
    the length order (``calibrate``; default ``CALIBRATION``) set the threshold (or ``threshold`` as given) and keep
    their float32 scores; the rest are scored in ``dtype``, each row under the threshold (its margin read after
    ``prior`` if given: a shift per label changes which rows are close) or not finite rescored in float32. ``plan``:
    ``score_batched``'s, for the half-precision pass (``_few`` plans the rest); ``prefix``: the float32
    ``PrefixCache``; ``on_batch`` gets each batch's final scores. ``info``: ``margin_error``, ``threshold``,
    ``rescored`` and ``non_finite`` (input positions), ``calibration``, ``seconds``, ``items_per_s``,
    ``phase_seconds``."""
    start = time.perf_counter()
    plan.setdefault("progress", False)
    k = min(CALIBRATION if calibration is None else calibration, len(prompts))
    if threshold is None and k < 1:
        raise ValueError("no calibration rows and no threshold: calibrate on at least one prompt")
    log_scores = torch.full((len(prompts), len(scorer.labels)), float("nan"))  # a row never filled shows
    shift = None if prior is None else prior.for_labels(scorer.labels)
    error, phases, sample = None, {}, []  # seconds of each phase: calibration, the half-precision pass, the rescoring
    if k:
        sample, first, error, bound, phases["calibration"] = calibrate(
            model, tokenizer, scorer, prompts, dtype, prefix, on_batch, k, safety, **plan
        )
        log_scores[sample] = first.log_scores
        threshold = bound if threshold is None else threshold
    rest = sorted(set(range(len(prompts))) - set(sample))  # the half pass's rows, in input order
    rescored, broken = [], []  # near ties and non-finite rows, input positions: rescored together at the end

    def checked(items, scores, was_full):  # a half-precision batch: its confident rows count now, its near ties later
        bad = (~torch.isfinite(scores).all(-1)).nonzero().flatten().tolist()  # overflowed in half: float32's instead
        broken.extend(rest[items[j]] for j in bad)
        near = set(near_ties(LabelScores(scorer.labels, scores, prior=shift), threshold)) | set(bad)
        sure = [j for j in range(len(items)) if j not in near]
        rescored.extend(rest[items[j]] for j in sorted(near))
        if sure:
            log_scores[[rest[items[j]] for j in sure]] = scores[sure]
            if on_batch is not None:
                on_batch([rest[items[j]] for j in sure], scores[sure], was_full)

    def landed(items, scores, was_full):  # a float32 batch of near ties
        log_scores[[rescored[j] for j in items]] = scores
        if on_batch is not None:
            on_batch([rescored[j] for j in items], scores, was_full)

    if rest:
        began = time.perf_counter()
        with mixed_precision(model, dtype), contextlib.suppress(NonFiniteScores):  # its rows: in ``broken``
            score_batched(model, tokenizer, scorer, [prompts[i] for i in rest], prefix=prefix, on_batch=checked, **plan)
        phases["half"] = time.perf_counter() - began
    if rescored:
        chosen = [prompts[i] for i in rescored]
        phases["rescore"] = rescore(model, tokenizer, scorer, chosen, prefix, on_batch=landed, **plan).info["seconds"]
    if torch.isnan(log_scores).any():  # every row is filled by one of the passes above, or the run stops here
        raise RuntimeError(f"rows {torch.isnan(log_scores).any(-1).nonzero().flatten().tolist()[:10]} got no scores")
    seconds = time.perf_counter() - start
    info = dict(margin_error=error, threshold=threshold, rescored=sorted(rescored), calibration=k, seconds=seconds)
    info["non_finite"] = sorted(broken)
    info.update(phase_seconds=phases, items_per_s=len(prompts) / seconds)
    return LabelScores(list(scorer.labels), log_scores, info, prior=shift)


def settle_job_prior(scores: LabelScores, exact, threshold, rescore_rows) -> tuple[LabelScores, Prior, list[int]]:
    """The job's prior on a verified run: the prior from these scores, every row not already float32's (``exact``) whose
    calibrated margin is under ``threshold`` rescored in float32 (``rescore_rows(rows)``: their log-scores), the prior
    recomputed, until no such row is left: every label is then float32's under the returned prior, the returned scores'
    job prior. Returns (those scores, the prior, the rows rescored). Notebook 05, section 3 (``--prior job``)."""
    log_scores, exact, added = scores.log_scores.clone(), set(exact), []
    while True:
        prior = job_prior(LabelScores(scores.labels, log_scores))
        result = calibrated(LabelScores(scores.labels, log_scores, scores.info), prior)
        close = [i for i in near_ties(result, threshold) if i not in exact]
        if not close:
            return result, prior, added
        log_scores[close] = rescore_rows(close)
        exact.update(close)
        added += close


def choose_half(profile) -> tuple[str | None, str]:
    """The half dtype worth a verified path here (notebook 00's profile: matmul at least ``FAST_ENOUGH`` times
    float32's, finite logits), or None, and a line saying why. Notebook 05, section 1; ``classify --dtype auto``."""
    base = profile.matmul_gflops["float32"]
    others = {name: flops for name, flops in profile.matmul_gflops.items() if name != "float32"}
    fast = [name for name in profile.fast_dtypes() if name != "float32"]
    for name in sorted(fast, key=lambda name: name != "bfloat16"):  # bfloat16 first: float32's range, no overflow
        ratio = profile.matmul_gflops[name] / base
        if ratio >= FAST_ENOUGH:
            return name, f"{name} (its matmul runs at {ratio:.1f}x float32's here)"
    halves = ", ".join(f"{name} {flops / base:.2g}x" for name, flops in others.items())
    return None, f"float32 (half precision is not {FAST_ENOUGH}x faster here: matmul {halves or 'not measured'})"
