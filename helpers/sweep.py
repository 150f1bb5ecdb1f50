"""Timing on the full-scale workload: every point of a sweep timed on whole batches drawn from the plan of all 600
tickets (notebooks 03 and 04, ``python -m helpers bench``).

A sweep varies one thing. Time a handful of tickets at every batch size and the x-axis varies two: the rows per
batch, and how few, how wide and how padded the batches are that so few tickets make. Here every point plans the
whole pool at its batch size (``plan_batches``: 600 tickets, sorted longest first, cut into batches) and times
whole batches drawn from that plan (``draw_batches``), so what changes from point to point is the batch size, not
the workload.

**The draw is stratified.** The plan's batches, ranked by padded tokens, are cut into ``strata`` groups of equal
count (2: the longer half and the shorter half), and each group gives the whole batches nearest its middle, as
many as make at least ``min_tickets`` tickets in all, at least one per group: so at least 2 batches, and never the
plan's short last batch. A sample from the middle of the sorted order alone would time only median lengths, where
batching gains most, and overstate what the whole plan gains. The groups' middles sit at the same places of the
sorted order whatever the batch size, so the points of a sweep time nearly the same tickets (a reference loop over
the largest point's tickets covers almost all of them), and what the draw leaves out weighs on every point alike.

**The estimate** of the plan's seconds is a ratio estimator: in each group, the drawn batches' measured seconds
over what the machine profile's cost model predicts for them (``CallCost``: per call, per token, per attended
key), times what it predicts for all the group's batches; plus tokenizing at the sample's rate per ticket. The
model carries what differs between batches (rows, padded width, the cached prefix), the measurement its level.

**The interval** adds what the draw cannot know to the repeats' spread: how far a batch's time strays from the
model. That scatter is pooled over every batch drawn in one run (one group's batches, or a point of 2 batches,
cannot measure it alone), and each estimate's interval is its fastest and slowest repeat, widened by twice the
relative error its draw leaves (``PlanEstimate.interval``). The points of a sweep share their tickets, so most of
that error is common to all of them: compare points by their repeats' spread, and quote the interval for one
estimate alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .batching import padding_report, plan_batches
from .scoring import LabelScores
from .timing import Timing

POOL = 600  # the article's tickets: the full-scale plan every point is drawn from
# The batch-size curves: a batched strategy and, at batch 1, its loop (sorted batches of one are the loop).
SWEEP_STRATEGIES = ("sorted", "sorted_prefix")
SWEEP_LOOPS = {"sorted": "loop", "sorted_prefix": "loop_prefix"}
STRATA = 2  # groups of the plan a draw takes batches from: the longer and the shorter half
MIN_TICKETS = 8  # per point at least (and at least one whole batch per group)
Z = 2.0  # the interval's half-width in relative errors (about 95 %)


@dataclass
class Draw:
    """Whole batches drawn from the plan of every ticket (``draw_batches``).

    ``lengths``: every ticket's tokens as planned (after the prefix where it is cached); ``plan``: the plan's
    batches in run order (ticket indices); ``strata``: per group, the plan's batch numbers in it; ``drawn``: per
    group, the batch numbers drawn. ``past``: cached prefix tokens every row attends to; ``tail``: label tokens
    appended to every row (both priced by the cost model).
    Notebook 03, section 6.
    """

    strategy: str
    batch_size: int | None
    token_budget: int | None
    lengths: list[int]
    plan: list[list[int]]
    strata: list[list[int]]
    drawn: list[list[int]]
    past: int = 0
    tail: int = 0

    @property
    def numbers(self) -> list[int]:
        """The drawn batches' numbers in the plan, in run order."""
        return sorted(number for group in self.drawn for number in group)

    @property
    def batches(self) -> list[list[int]]:
        """The drawn batches (ticket indices), in the plan's run order."""
        return [self.plan[number] for number in self.numbers]

    @property
    def tickets(self) -> list[int]:
        """The drawn tickets, in the order ``plan_batches`` cuts back into exactly the drawn batches: run them
        through ``score_batched`` with the same strategy and size."""
        return [i for batch in self.batches for i in batch]

    @property
    def plan_tickets(self) -> int:
        return len(self.lengths)

    @property
    def padding(self) -> float:
        """Padding share of the drawn batches' processed tokens."""
        return padding_report(self.lengths, self.batches).padding_fraction

    @property
    def plan_padding(self) -> float:
        """Padding share of the whole plan's processed tokens."""
        return padding_report(self.lengths, self.plan).padding_fraction

    def predicted_seconds(self, profile, numbers: Sequence[int] | None = None) -> list[float]:
        """The cost model's seconds for each batch of the plan (or those ``numbers``), padding, labels and prefix
        included."""
        numbers = range(len(self.plan)) if numbers is None else numbers
        return [profile.call_seconds(len(self.plan[k]), max(self.lengths[i] for i in self.plan[k]) + self.tail,
                                     self.past) for k in numbers]

    def describe(self) -> str:
        size = (f"token budget {self.token_budget}" if self.strategy == "token_budget"
                else f"{self.strategy} batch {self.batch_size}")
        return (f"{size}: {len(self.numbers)} of the plan's {len(self.plan)} batches, "
                f"{len(self.tickets)} of {self.plan_tickets} tickets; padding {self.padding:.1%} "
                f"(the whole plan: {self.plan_padding:.1%})")


def draw_batches(lengths: Sequence[int], strategy: str = "sorted", batch_size: int = 16, token_budget: int | None = None,
                 past: int = 0, tail: int = 0, min_tickets: int = MIN_TICKETS, strata: int = STRATA) -> Draw:
    """Plan every ticket (``plan_batches``) and draw whole batches from the plan, stratified (the module docstring).

    ``past`` and ``tail``: tokens every row holds besides its own (a cached prefix, label tokens), as
    ``score_batched`` counts them; the token-budget plan counts both in every row. ``min_tickets=None`` draws
    every batch (the full plan).
    Notebook 03, section 6.
    """
    lengths = [int(n) for n in lengths]
    plan = plan_batches(lengths, strategy, batch_size, token_budget, tokens_per_row=past + tail)
    budget = token_budget if strategy == "token_budget" else None
    size = None if strategy == "token_budget" else (1 if strategy == "loop" else batch_size)
    if min_tickets is None:
        every = list(range(len(plan)))
        return Draw(strategy, size, budget, lengths, plan, [every], [every], past, tail)
    if strata < 1 or min_tickets < 1:
        raise ValueError(f"strata and min_tickets must be >= 1, got {strata} and {min_tickets}")
    processed = [len(batch) * max(lengths[i] for i in batch) for batch in plan]
    ranked = sorted(range(len(plan)), key=lambda k: (-processed[k], k))  # longest first, ties in run order
    rows = max(map(len, plan))
    # Whole batches only: a batch of the plan's full row count (a token budget's: any but its last)
    whole = ({k for k in range(len(plan)) if k != len(plan) - 1} or {0}) if strategy == "token_budget" else \
        {k for k in range(len(plan)) if len(plan[k]) == rows}
    if len(whole) < min(strata, 2) and len(plan) > 1:
        raise ValueError(f"{strategy} at {batch_size}: the plan of {len(lengths)} tickets holds {len(whole)} whole "
                         "batch(es), fewer than the 2 a draw needs; use a smaller batch size")
    groups = []
    for group in np.array_split(ranked, min(strata, len(plan))):
        group = list(group)
        if groups and not any(k in whole for k in group):
            groups[-1] += group  # a group of short batches only (a plan's last): its neighbour stands for it
        elif groups and not any(k in whole for k in groups[-1]):
            groups[-1] += group
        elif group:
            groups.append(group)
    share = min_tickets / len(groups)  # tickets each group gives, at least: whole batches nearest its middle
    drawn = []
    for group in groups:
        middle = (len(group) - 1) / 2
        candidates = sorted((k for k in group if k in whole), key=lambda k: (abs(group.index(k) - middle), k))
        least = 1 if len(groups) > 1 else 2  # at least 2 batches in all, where the plan has them
        picked = candidates[:least]
        for k in candidates[least:]:
            if sum(len(plan[j]) for j in picked) >= share:
                break
            picked.append(k)
        drawn.append(sorted(picked))
    return Draw(strategy, size, budget, lengths, plan, [sorted(g) for g in groups], drawn, past, tail)


@dataclass
class PlanEstimate:
    """The whole plan's seconds estimated from timed runs of a draw: ``seconds`` per repeat, ``relative_error``
    (one standard error, relative: what the draw cannot know; NaN where one run has too few batches to tell). Notebook 03, section 6."""

    name: str
    draw: Draw
    seconds: list[float]
    relative_error: float = float("nan")
    ratios: list[float] = field(default_factory=list, repr=False)  # per drawn batch: measured / predicted

    @property
    def n(self) -> int:
        return self.draw.plan_tickets

    @property
    def timing(self) -> Timing:
        """The estimated plan seconds per repeat, for ``helpers.timing.verdict`` and ``within_noise``."""
        return Timing(self.name, list(self.seconds))

    @property
    def items_per_s(self) -> float:
        return self.n / statistics.median(self.seconds)

    @property
    def items_per_s_min(self) -> float:
        return self.n / max(self.seconds)

    @property
    def items_per_s_max(self) -> float:
        return self.n / min(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        """Real (non-padding) tokens of the plan per second."""
        return sum(self.draw.lengths) / statistics.median(self.seconds)

    @property
    def interval(self) -> tuple[float, float]:
        """Items/s: the slowest repeat and the fastest, each moved by ``Z`` relative errors (NaN without one)."""
        if math.isnan(self.relative_error):
            return float("nan"), float("nan")
        return (self.n / (max(self.seconds) * (1 + Z * self.relative_error)),
                self.n / (min(self.seconds) * max(1e-9, 1 - Z * self.relative_error)))

    def __str__(self) -> str:
        low, high = self.interval
        shown = f", interval {low:.2f}-{high:.2f}" if not math.isnan(low) else ""
        return (f"{self.name}: {self.items_per_s:.2f} items/s on all {self.n} tickets (estimated; repeats "
                f"{self.items_per_s_min:.2f}-{self.items_per_s_max:.2f}{shown})")


def _batch_seconds(draw: Draw, run: LabelScores) -> list[float]:
    """Seconds of each drawn batch (in ``draw.numbers`` order) in a ``score_batched`` run of ``draw.tickets``."""
    tickets = draw.tickets
    ran = [[tickets[j] for j in batch] for batch in run.info.get("batches", [])]
    if ran != draw.batches:
        raise ValueError(f"this run did not make the drawn batches ({draw.describe()}): run draw.tickets, in that "
                         "order, with the draw's strategy, batch size and token budget")
    return list(run.info["batch_seconds"])


def estimate_plan(name: str, draw: Draw, runs: Sequence[LabelScores], profile) -> PlanEstimate:
    """The plan's seconds per timed run of the draw (a ratio estimator per group, the module docstring); the
    relative error is left for ``estimate_plans``, which pools the scatter over a whole run's draws. Notebook 03, section 6."""
    if not runs:
        raise ValueError(f"{name}: no timed runs to estimate from")
    predicted_all = draw.predicted_seconds(profile)
    predicted = dict(zip(draw.numbers, draw.predicted_seconds(profile, draw.numbers)))
    per_run = []
    for run in runs:
        measured = dict(zip(draw.numbers, _batch_seconds(draw, run)))
        total = run.info["tokenize_seconds"] / len(draw.tickets) * draw.plan_tickets
        for group, picked in zip(draw.strata, draw.drawn):
            ratio = sum(measured[k] for k in picked) / sum(predicted[k] for k in picked)
            total += ratio * sum(predicted_all[k] for k in group)
        per_run.append((total, measured))
    medians = {k: statistics.median(measured[k] for _, measured in per_run) for k in draw.numbers}
    return PlanEstimate(name, draw, [total for total, _ in per_run],
                        ratios=[medians[k] / predicted[k] for k in draw.numbers])


def estimate_plans(draws: Mapping, runs: Mapping, profile) -> dict:
    """``estimate_plan`` for every draw (key -> ``Draw``; ``runs``: key -> its timed runs), with the relative error
    of each: the batches' scatter around the cost model, pooled over every draw (log ratios about their draw's
    mean), spread over each draw's groups by their predicted shares. Notebook 03, section 6."""
    estimates = {key: estimate_plan(str(key), draw, runs[key], profile) for key, draw in draws.items()}
    residuals, freedom = 0.0, 0
    for estimate in estimates.values():
        logs = np.log(estimate.ratios)
        residuals += float(((logs - logs.mean()) ** 2).sum())
        freedom += len(logs) - 1
    scatter = math.sqrt(residuals / freedom) if freedom >= 2 else float("nan")
    for estimate in estimates.values():
        draw = estimate.draw
        predicted = draw.predicted_seconds(profile)
        total = sum(predicted)
        # each group's share of the plan, over the batches that measured it (none unknown where all were drawn)
        variance = sum((sum(predicted[k] for k in group) / total) ** 2 / len(picked) * (1 - len(picked) / len(group))
                       for group, picked in zip(draw.strata, draw.drawn))
        estimate.relative_error = scatter * math.sqrt(variance)
    return estimates


def estimate_row(key, estimate: PlanEstimate, profile=None) -> dict:
    """A table row of one estimate: ``key`` is (strategy name, batch size[, ...]); items/s are the whole plan's, and
    with ``profile`` what its cost model predicts for the plan (``predicted_items_per_s``). Notebook 04, section 2."""
    draw = estimate.draw
    low, high = estimate.interval
    predicted = {} if profile is None else {
        "predicted_items_per_s": draw.plan_tickets / sum(draw.predicted_seconds(profile))}
    return {"strategy": key[0], "batch_size": key[1], "token_budget": draw.token_budget, **predicted,
            "items_per_s": estimate.items_per_s, "items_per_s_min": estimate.items_per_s_min,
            "items_per_s_max": estimate.items_per_s_max, "interval_low": low, "interval_high": high,
            "tokens_per_s": estimate.tokens_per_s, "padding_fraction": draw.padding, "plan_padding": draw.plan_padding,
            "sample_tickets": len(draw.tickets), "sample_batches": len(draw.numbers), "plan_batches": len(draw.plan),
            "n": draw.plan_tickets, "repeats": len(estimate.seconds)}


def curve(frame, strategy: str):
    """A sweep strategy's points from a frame of rows (``estimate_row``'s columns, one dtype): its loop at batch 1,
    then its own rows, by batch size. Notebook 04, section 4."""
    loop = frame[(frame["strategy"] == SWEEP_LOOPS[strategy]) & (frame["batch_size"] == 1)]
    return pd.concat([loop, frame[frame["strategy"] == strategy]]).sort_values("batch_size")


def describe_curve(rows) -> dict:
    """Where a curve (``curve``) peaked and whether that is beyond the spread of its repeats: ``best`` and ``first``
    rows, ``gain`` (best over first, medians), ``rose`` (the best's slowest repeat beats the first's fastest),
    ``reached`` (the smallest batch size whose fastest repeat reaches the best's slowest: where it stopped gaining),
    ``fell`` (larger sizes slower than the best beyond the spread) and ``text``, one sentence. Notebook 04, section 4."""
    best, first = rows.loc[rows["items_per_s"].idxmax()], rows.iloc[0]
    spread = rows["repeats"].min() >= 2
    rose = bool(spread and best["items_per_s_min"] > first["items_per_s_max"])
    reached = rows[rows["items_per_s_max"] >= best["items_per_s_min"]].iloc[0]
    fell = [int(b) for b, top in zip(rows["batch_size"], rows["items_per_s_max"])
            if spread and b > best["batch_size"] and top < best["items_per_s_min"]]
    gain = best["items_per_s"] / first["items_per_s"]
    if not spread:
        text = f"best at batch {best.batch_size}, {gain:.2f}x batch {first.batch_size} (1 repeat: no spread to judge by)"
    elif best["batch_size"] == first["batch_size"] or not rose:
        text = (f"no batch size beat batch {first.batch_size} beyond the spread (best at {best.batch_size}, "
                f"{gain:.2f}x)")
    else:
        text = (f"rose {gain:.2f}x from batch {first.batch_size} to its best at {best.batch_size}, beyond the spread; "
                f"within noise of the best from batch {reached.batch_size}")
    if fell:
        text += f"; slower beyond the spread at {', '.join(map(str, fell))}"
    return {"best": best, "first": first, "gain": gain, "rose": rose, "reached": int(reached["batch_size"]),
            "fell": fell, "text": text}


def estimates_frame(estimates: Mapping, info, profile, checks: Mapping | None = None, **columns) -> pd.DataFrame:
    """One row per estimate (``estimate_row``), with what produced it: the model, dtype, device and threads
    (``info``, a ``ModelInfo``), the machine (``profile``), each key's agreement with the reference (``checks``:
    key -> ``helpers.checks.agreement``'s dict) and any other ``columns`` (e.g. ``shots``). Notebook 04, section 2."""
    produced = {"model": info.name, "timing_only": info.timing_only, "dtype": info.dtype, "device": info.device,
                "threads": info.threads, "attention": info.attention, "machine": profile.machine,
                "profile": profile.caption(), **columns}
    checks = checks or {}
    return pd.DataFrame([{**estimate_row(key, estimate, profile),
                          **{k: v for k, v in checks.get(key, {}).items() if k != "n"}, **produced}
                         for key, estimate in estimates.items()])
