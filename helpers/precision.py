"""Lower precision without changing a label (notebook 05): score in a half dtype, then rescore in float32 every
ticket whose half-precision margin is too small to be sure of its label.

The rule: a label can only flip between two dtypes where the half-precision margin (the top label's log-score minus
another label's) is smaller than the change rounding makes to that difference. ``margin_error`` measures that
change on a calibration sample scored both ways; ``threshold_for`` multiplies it by a stated margin of safety (the
sample's largest error is not the population's); ``score_verified`` rescores every row under the threshold. Every label
then equals float32's wherever the sample's bound holds, and the summary says how many rows were rescored.
"""

from __future__ import annotations

import copy
import time

import torch

from .batching import score_batched
from .checks import top2_margin
from .scoring import LabelScores

# Prompts scored in both dtypes to measure how far rounding moves a margin (they keep their float32 scores).
CALIBRATION = 32
# The calibration sample's largest margin error times this is the rescoring threshold: a row of the full job may see
# a larger error than any of the sample's, and rescoring a few rows too many costs little.
SAFETY = 2.0
# A verified path only pays where half precision runs at least this much faster than float32 (notebook 00's matmul).
FAST_ENOUGH = 1.5


def margin_error(half: LabelScores, full: LabelScores) -> float:
    """The largest change, between two dtypes' scores of the same rows, in the difference of any two labels'
    log-scores (the margins the label choice reads): per row, the spread of the per-label changes. Notebook 05,
    section 2."""
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


def threshold_for(error: float, safety: float = SAFETY) -> float:
    """The half-precision margin under which a row is rescored in float32: the calibration sample's largest margin
    error times ``safety``. Notebook 05, section 4."""
    if error < 0 or safety < 1:
        raise ValueError(f"need a margin error >= 0 and a safety factor >= 1, got {error} and {safety}")
    return error * safety if error else 0.0


def near_ties(scores: LabelScores, threshold: float) -> list[int]:
    """Rows whose top two labels are closer than ``threshold``: the ones rounding could have ordered either way.
    Notebook 05, section 4."""
    return torch.nonzero(top2_margin(scores) < threshold).flatten().tolist()


def half_copy(model, dtype: str):
    """A copy of ``model`` in ``dtype`` (the float32 model stays as it is, for the rescoring). Notebook 05, section
    2."""
    return copy.deepcopy(model).to(getattr(torch, dtype))


def score_verified(
    half_model,
    full_model,
    tokenizer,
    scorer,
    prompts,
    calibration: int | None = None,
    safety: float = SAFETY,
    threshold: float | None = None,
    half_prefix=None,
    full_prefix=None,
    on_batch=None,
    **plan,
) -> LabelScores:
    """Every prompt's label scores, every label float32's wherever the calibration's bound holds. Notebook 05,
    section 4. The first ``calibration`` prompts (default ``CALIBRATION``) are scored in float32 (``full_model``;
    they keep those scores) and in the half dtype (``half_model``); the threshold is their largest margin error times
    ``safety`` (or ``threshold`` as given); the rest are scored in the half dtype, each row under the threshold
    rescored in float32. ``plan``: ``score_batched``'s strategy, batch_size or token_budget for every pass; the
    prefixes are each model's own ``PrefixCache``; ``on_batch`` as ``score_batched``'s, with each batch's final
    scores. ``info``: ``margin_error``, ``threshold``, ``rescored`` (input positions), ``calibration``, ``seconds``,
    ``items_per_s``."""
    start = time.perf_counter()
    plan.setdefault("progress", False)
    k = min(CALIBRATION if calibration is None else calibration, len(prompts))
    if threshold is None and k < 1:
        raise ValueError("no calibration rows and no threshold: calibrate on at least one prompt")
    log_scores = torch.empty(len(prompts), len(scorer.labels))
    error = None
    if k:
        first = score_batched(full_model, tokenizer, scorer, prompts[:k], prefix=full_prefix, on_batch=on_batch, **plan)
        in_half = score_batched(half_model, tokenizer, scorer, prompts[:k], prefix=half_prefix, **plan)
        log_scores[:k] = first.log_scores
        error = margin_error(in_half, first)
        threshold = threshold_for(error, safety) if threshold is None else threshold
    rescored = []

    def checked(items, scores, full):  # a half-precision batch: its near ties rescored before it counts
        near = near_ties(LabelScores(scorer.labels, scores), threshold)
        if near:
            again = [prompts[k + items[j]] for j in near]
            scores = scores.clone()
            scores[near] = score_batched(full_model, tokenizer, scorer, again, prefix=full_prefix, **plan).log_scores
            rescored.extend(k + items[j] for j in near)
        log_scores[[k + i for i in items]] = scores
        if on_batch is not None:
            on_batch([k + i for i in items], scores, full)

    if k < len(prompts):
        score_batched(half_model, tokenizer, scorer, prompts[k:], prefix=half_prefix, on_batch=checked, **plan)
    seconds = time.perf_counter() - start
    info = {
        "margin_error": error,
        "threshold": threshold,
        "rescored": sorted(rescored),
        "calibration": k,
        "seconds": seconds,
        "items_per_s": len(prompts) / seconds,
    }
    return LabelScores(list(scorer.labels), log_scores, info)


def choose_half(profile) -> tuple[str | None, str]:
    """The half dtype worth a verified path on this machine (notebook 00's profile: matmul at least ``FAST_ENOUGH``
    times float32's, and finite logits with this model), or None; and one line saying why. Notebook 05, section 1
    reads the same profile; ``classify --dtype auto`` calls this."""
    base = profile.matmul_gflops["float32"]
    others = {name: flops for name, flops in profile.matmul_gflops.items() if name != "float32"}
    fast = [name for name in profile.fast_dtypes() if name != "float32"]
    for name in sorted(fast, key=lambda name: name != "bfloat16"):  # bfloat16 first: float32's range, no overflow
        ratio = profile.matmul_gflops[name] / base
        if ratio >= FAST_ENOUGH:
            return name, f"{name} (its matmul runs at {ratio:.1f}x float32's here)"
    halves = ", ".join(f"{name} {flops / base:.2g}x" for name, flops in others.items())
    return None, f"float32 (half precision is not {FAST_ENOUGH}x faster here: matmul {halves or 'not measured'})"
