"""How sure is an accuracy (notebook 01, sections 4-6): Wilson intervals for one accuracy, McNemar's exact test for
two prompts on the same tickets, and the accuracy-coverage curve of routing uncertain tickets to a person.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def coverage_curve(confidence, correct, thresholds=None) -> pd.DataFrame:
    """Route tickets below a confidence threshold to a human: coverage and accuracy of the rest. Notebook 01, section 5."""
    confidence, correct = np.asarray(confidence), np.asarray(correct, dtype=bool)
    if thresholds is None:
        thresholds = np.unique(np.concatenate([[0.0], confidence]))
    rows = []
    for threshold in thresholds:
        kept = confidence >= threshold
        rows.append({
            "threshold": float(threshold),
            "coverage": kept.mean(),
            "accuracy": correct[kept].mean() if kept.any() else np.nan,
            "to_human": int((~kept).sum()),
        })
    return pd.DataFrame(rows)


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
    Notebook 01, section 6.
    """
    for name, value in (("only_first", only_first), ("only_second", only_second)):
        if value < 0 or int(value) != value:
            raise ValueError(f"{name}={value} must be a whole number >= 0")
    n, k = int(only_first + only_second), int(min(only_first, only_second))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_verdict(name_a: str, correct_a, name_b: str, correct_b, alpha: float = 0.05) -> dict:
    """Two classifiers scored on the same tickets, compared by McNemar's exact test: the tickets only one of them
    got right (``only_a``, ``only_b``), the p-value, and a one-line ``verdict`` that names a winner only when
    p < ``alpha``. ``correct_a`` and ``correct_b``: per ticket, right or wrong, in the same ticket order. Notebook 01, section 6."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{name_a} and {name_b} must be scored on the same tickets: got {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    p = mcnemar_exact(only_a, only_b)
    counts = f"{only_a} ticket(s) only {name_a} got right, {only_b} only {name_b}; McNemar's exact p = {p:.3f}"
    if p < alpha:
        better, worse = (name_a, name_b) if only_a > only_b else (name_b, name_a)
        verdict = f"{better} beat {worse} beyond chance on these {len(a)} tickets ({counts})"
    else:
        verdict = f"{name_a} and {name_b} are not distinguishable on these {len(a)} tickets ({counts})"
    return {"only_a": only_a, "only_b": only_b, "p": p, "significant": p < alpha, "verdict": verdict}
