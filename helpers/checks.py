"""Checks: agreement with the one-ticket loop (``tolerance_for``, ``float_tolerance``), and how sure a number is."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from .data import LABELS, keyword_label
from .scoring import LabelScores, score_one_by_one

# float32 paths differ from the reference only by summation order (at most 4e-5 on log-probs measured, docs/testing.md).
# Lower precision rounds every layer: on the embedded model (24 few-shot tickets, batches of 8, prefix cache, CPU)
# float16 moved label log-probs up to 0.04, bfloat16 up to 0.30, and 0.52 on the article's 600 tickets: with margins.
FLOAT32_ATOL = 1e-3
LOW_PRECISION_ATOL = {"float16": 0.1, "bfloat16": 0.75}


def float_tolerance(values, dtype: torch.dtype = torch.float32, steps: float = 128) -> float:
    """How far two computations of ``values`` (or scores' log-probs) may differ by summing in another order: ``steps``
    rounding steps of ``dtype`` (eps) at their largest magnitude (25 at most measured, 128 allowed).
    No lesson builds it: the tests' tolerances (docs/testing.md)."""
    return steps * torch.finfo(dtype).eps * torch.as_tensor(getattr(values, "log_scores", values)).abs().max().item()


@dataclass(frozen=True)
class Tolerance:
    """How closely a path must agree with the reference in one dtype: log-probs within ``atol``; labels identical, or
    (``near_ties``, low precision) differing only where the reference's top two are as close. Notebook 01, section 3."""

    dtype: str
    atol: float
    near_ties: bool

    def __str__(self) -> str:
        if not self.near_ties:
            return f"{self.dtype}: identical labels, log-probs within {self.atol:.0e}"
        ties = f"(the reference's top two within {self.atol:g}, where rounding may order them either way)"
        return f"{self.dtype} (low precision): log-probs within {self.atol:g}, labels identical except near-ties {ties}"


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    """The agreement check for results computed in ``dtype`` (or its name). Notebook 01, section 3."""
    name = str(dtype).removeprefix("torch.")
    if name != "float32" and name not in LOW_PRECISION_ATOL:
        raise ValueError(f"no agreement tolerance for dtype {name!r}: use float32, bfloat16 or float16")
    return Tolerance(name, LOW_PRECISION_ATOL.get(name, FLOAT32_ATOL), name != "float32")


def agreement(reference: LabelScores, candidate: LabelScores, near_tie: float = 0.0) -> dict:
    """Fraction of identical labels, the largest label log-prob difference, and how many differing labels were near ties
    (the reference's top two under ``near_tie`` apart: rounding may order them either way). Notebook 01, section 4."""
    if len(reference) != len(candidate):
        raise ValueError(f"cannot compare {len(reference)} reference results with {len(candidate)}")
    reference, candidate = reference.raw, candidate.raw  # a prior is a shift: the checks read the raw scores
    same, tie = reference.predicted_index == candidate.predicted_index, (reference.margins < near_tie).numpy()
    diff = (reference.log_scores - candidate.log_scores).abs().max().item()
    return dict(agreement=float(same.mean()), max_abs_diff=diff, n=len(reference), near_ties=int((~same & tie).sum()))


def assert_agrees(reference: LabelScores, candidate: LabelScores, atol=FLOAT32_ATOL, near_ties=False, item_names=None):
    """Same label for every item and log-probs within ``atol``; the error names the first bad item (``item_names``,
    else "item i"). A ``Tolerance`` as ``atol`` sets ``near_ties`` too: in low precision a differing label is accepted
    where the reference's top two are within ``atol`` (rounding can order them either way). Notebook 01, section 3."""
    atol, near_ties = (atol.atol, atol.near_ties) if isinstance(atol, Tolerance) else (atol, near_ties)

    def name(i):  # how the error names item ``i``
        return item_names[i] if item_names is not None else f"item {i}"

    reference, candidate = reference.raw, candidate.raw
    tie = atol if near_ties else 0.0  # a margin is never below 0: no label counts as a near tie then
    stats = agreement(reference, candidate, near_tie=tie)
    differs = reference.predicted_index != candidate.predicted_index
    differs = np.flatnonzero(differs & ~(reference.margins < tie).numpy())
    if len(differs):
        i = differs[0]
        first = f"{name(i)} {reference.predictions[i]!r} (reference) vs {candidate.predictions[i]!r}"
        raise AssertionError(f"{len(differs)} of {len(reference)} predictions differ; first: {first}")
    if not stats["max_abs_diff"] <= atol:  # written this way so NaN fails too
        worst = name((reference.log_scores - candidate.log_scores).abs().max(-1).values.argmax().item())
        raise AssertionError(f"label log-probs differ by {stats['max_abs_diff']:.2e} > {atol:.1e} (worst: {worst})")
    return stats


def verify_sample(model, tokenizer, scorer, prompts, log_scores, k: int, dtype=None, shift=None) -> dict:
    """Re-run ``k`` random rows one at a time; raise on a disagreement beyond ``tolerance_for`` the scores' dtype.
    ``shift``: a verified half-precision run's (``--dtype auto``): labels identical to float32's after it (the run's
    prior, or 0.0), log-probs within the dtype's tolerance. No lesson builds it: ``classify --verify``."""
    rows = sorted(np.random.default_rng(0).choice(len(prompts), size=min(k, len(prompts)), replace=False).tolist())
    reference = score_one_by_one(model, tokenizer, scorer, [prompts[i] for i in rows], progress=False)
    numbers = [r + 1 for r in rows]
    exact = shift is not None  # read before shift is replaced below
    shift = 0.0 if shift is None else shift
    tolerance = replace(tolerance := tolerance_for(dtype or model.dtype), near_ties=tolerance.near_ties and not exact)
    candidate = LabelScores(scorer.labels, log_scores[rows] - shift)
    reference = LabelScores(scorer.labels, reference.log_scores - shift)
    try:
        stats = assert_agrees(reference, candidate, tolerance, item_names=[f"row {n}" for n in numbers])
    except AssertionError as error:
        raise RuntimeError(f"verification failed on sampled rows {numbers}: {error}") from None
    return {**stats, "rows": numbers, "atol": tolerance.atol, "exact": not tolerance.near_ties}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson interval of ``successes`` out of ``n``: unlike p ± z·sqrt(p(1-p)/n) it stays in [0, 1] and never
    shrinks to a point at 0 or n, as matters on a few dozen tickets. Notebook 01, section 4."""
    if n <= 0 or int(n) != n:
        raise ValueError(f"cannot give an interval for n={n} items: n must be a positive whole number")
    if not 0 <= successes <= n or int(successes) != successes:
        raise ValueError(f"successes={successes} must be a whole number between 0 and n={n}")
    if z <= 0:
        raise ValueError(f"z={z} must be positive (1.96 for a 95 % interval)")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5 / (1 + z2 / n)
    # At the edges the formula gives 0 and 1 exactly, up to rounding: say so exactly.
    return (0.0 if successes == 0 else max(0.0, centre - half)), (1.0 if successes == n else min(1.0, centre + half))


def accuracy_beside_rules(predictions, texts, gold) -> str:
    """What a lesson that times a classifier says of it: its accuracy on the tickets it scored, with the 95 % interval,
    beside the keyword rules' on the same tickets and chance. One item each of ``predictions``, ``texts`` and
    ``gold``. Notebook 02, summary (and 03's, 04's ladder)."""
    predictions = list(predictions)
    texts = list(texts)
    gold = list(gold)
    if not len(predictions) == len(texts) == len(gold) or not gold:
        raise ValueError(f"{len(predictions)} predictions, {len(texts)} texts, {len(gold)} labels: give one of each")
    right, rules = (sum(p == g for p, g in zip(said, gold)) for said in (predictions, map(keyword_label, texts)))
    low, high = wilson_interval(right, len(gold))
    return (
        f"{right / len(gold):.0%} [{low:.0%}, {high:.0%}] of {len(gold)} tickets right, keyword rules "
        f"{rules / len(gold):.0%}, chance {1 / len(LABELS):.0%}"
    )


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """McNemar's exact test of two classifiers on the same items: the two-sided p-value that the items only one of them
    got right split this unevenly by chance (items both got right or wrong say nothing). Notebook 01, Going deeper."""
    for name, value in (("only_first", only_first), ("only_second", only_second)):
        if value < 0 or int(value) != value:
            raise ValueError(f"{name}={value} must be a whole number >= 0")
    n, k = int(only_first + only_second), int(min(only_first, only_second))  # n = 0 gives 1.0
    return min(1.0, 2 * (sum(math.comb(n, i) for i in range(k + 1)) / 2**n))
