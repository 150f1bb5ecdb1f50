"""Checks: agreement with the reference, and the statistics that say how sure a number is.

Agreement with the reference: every optimized path's labels and log-probs against the one-ticket loop's.

Identical labels and log-probs within a tolerance chosen by dtype (``tolerance_for``): 1e-3 in float32, where paths
differ only by summation order; looser in half precision, where they are reported, not asserted. Notebook 01's
section 4 checks by hand first; every later lesson calls ``assert_agrees``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .scoring import LabelScores

# Lower precision rounds every layer: batched, cached and padded paths then differ from the loop by rounding.
# Measured on the embedded model (24 few-shot tickets, sorted/arbitrary batches of 8, prefix cache, on a CPU):
# float16 up to 0.04, bfloat16 up to 0.30 on label log-probs. Each tolerance leaves a margin over that.
# float32 paths differ from the reference only by summation order: ~1e-5 on log-probs in practice.
FLOAT32_ATOL = 1e-3
LOW_PRECISION_ATOL = {"float16": 0.1, "bfloat16": 0.5}


@dataclass(frozen=True)
class Tolerance:
    """How closely a path must agree with the reference in one dtype: log-probs within ``atol``; labels identical,
    or (``near_ties``, low precision only) different only where the reference's top two are within ``atol``.
    Notebook 01, section 4."""

    dtype: str
    atol: float
    near_ties: bool

    def __str__(self) -> str:
        if not self.near_ties:
            return f"{self.dtype}: identical labels, log-probs within {self.atol:.0e}"
        return (
            f"{self.dtype} (low precision): log-probs within {self.atol:g}, labels identical except near-ties "
            f"(the reference's top two within {self.atol:g}, where rounding may order them either way)"
        )


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    """The agreement check for results computed in ``dtype`` (a model's ``.dtype`` or its name). Notebook 01, section
    4."""
    name = str(dtype).removeprefix("torch.")
    if name == "float32":
        return Tolerance(name, FLOAT32_ATOL, False)
    if name not in LOW_PRECISION_ATOL:
        raise ValueError(f"no agreement tolerance for dtype {name!r}: use float32, bfloat16 or float16")
    return Tolerance(name, LOW_PRECISION_ATOL[name], True)


def agreement(reference: LabelScores, candidate: LabelScores, near_tie: float = 0.0) -> dict:
    """Fraction of identical predicted labels, the largest label log-prob difference, and near-ties.

    A differing label counts as a near-tie when the reference's top two labels are less than ``near_tie``
    apart: two runs that differ by rounding may then order them either way. ``agreement`` counts only
    identical labels; ``near_ties`` says how many of the differences were near-ties.
    Notebook 01, section 4.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"cannot compare {len(reference)} reference results with {len(candidate)}")
    same = reference.predicted_index == candidate.predicted_index
    tie = (reference.margins < near_tie).numpy()
    diff = (reference.log_scores - candidate.log_scores).abs().max().item()
    return dict(agreement=float(same.mean()), max_abs_diff=diff, n=len(reference), near_ties=int((~same & tie).sum()))


def assert_agrees(
    reference: LabelScores,
    candidate: LabelScores,
    atol: float | Tolerance = FLOAT32_ATOL,
    near_ties: bool = False,
    item_names: Sequence[str] | None = None,
) -> dict:
    """Same label for every item and log-probs within ``atol``; the error names the first bad item.

    ``atol`` may be a ``Tolerance`` (``tolerance_for(model.dtype)``), which sets ``near_ties`` too.
    ``near_ties=True`` is for low-precision runs: a differing label is accepted when the reference's top
    two labels are within ``atol`` of each other (rounding can flip them), and counted in ``near_ties``.
    float32 checks keep it off: there every label must be identical. ``item_names`` name the items in the
    error (e.g. rows of a file); by default "item i", the position.
    Notebook 01, section 4.
    """
    if isinstance(atol, Tolerance):
        atol, near_ties = atol.atol, atol.near_ties
    name = (lambda i: item_names[i]) if item_names is not None else (lambda i: f"item {i}")
    stats = agreement(reference, candidate, near_tie=atol if near_ties else 0.0)
    differs = reference.predicted_index != candidate.predicted_index
    if near_ties:
        differs &= ~(reference.margins < atol).numpy()
    differs = np.flatnonzero(differs)
    if len(differs):
        i = differs[0]
        raise AssertionError(
            f"{len(differs)} of {len(reference)} predictions differ; first: {name(i)} "
            f"{reference.predictions[i]!r} (reference) vs {candidate.predictions[i]!r}"
        )
    if not stats["max_abs_diff"] <= atol:  # written this way so NaN fails too
        worst = (reference.log_scores - candidate.log_scores).abs().max(-1).values.argmax().item()
        raise AssertionError(
            f"label log-probs differ by {stats['max_abs_diff']:.2e} > {atol:.0e} (worst: {name(worst)})"
        )
    return stats


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion, ``successes`` out of ``n`` (95 % with the default ``z``).

    Unlike p ± z·sqrt(p(1-p)/n) it stays within [0, 1] and does not shrink to a point at 0 or n successes,
    which matters for the few dozen tickets a notebook can score. Two accuracies whose intervals overlap are
    not told apart by these tickets (a conservative reading: no overlap is clearer than a significance test).
    Notebook 01, section 4.
    """
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
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """McNemar's exact test for two classifiers scored on the same items: the two-sided p-value that the items only
    the first got right (``only_first``) and those only the second got right (``only_second``) split as unevenly
    as this by chance. Items both got right or both got wrong say nothing about which is better, so they are not
    arguments: pass the two discordant counts. A paired test: unlike comparing two intervals, it uses the fact that
    both were scored on the same tickets.
    Notebook 01, Going deeper.
    """
    for name, value in (("only_first", only_first), ("only_second", only_second)):
        if value < 0 or int(value) != value:
            raise ValueError(f"{name}={value} must be a whole number >= 0")
    n, k = int(only_first + only_second), int(min(only_first, only_second))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)
