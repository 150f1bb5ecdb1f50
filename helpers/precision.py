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
from dataclasses import dataclass, replace

import torch

from .batching import Batching, NonFiniteScores, score_batched
from .data import encode_prompts
from .prefix_cache import PrefixCache
from .prior import calibrated, job_prior
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
    if not torch.isfinite(half.log_scores).all() or not torch.isfinite(full.log_scores).all():
        raise ValueError("non-finite scores in the calibration sample: this dtype overflows with this model")
    return float(change_in_gaps(half.log_scores, full.log_scores).max())


def threshold_for(error: float, safety: float = SAFETY, floor: float = 0.0) -> float:
    """The rescoring threshold: the calibration's largest margin error times ``safety``, at least ``floor`` (no error
    measured does not prove none: ``calibrate`` floors it at ``rounding_step``). Notebook 05, section 3."""
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
    own, forward = vars(head).get("forward"), head.forward  # an instance's own forward (a hook's wrapper) is put back

    def float32_head(hidden):
        # Logits near 20 stored in 16 bits keep steps of 0.125: rounding them alone would move a margin that much.
        with torch.autocast(device, enabled=False):
            return forward(hidden.float())

    head.forward = float32_head
    try:
        with torch.autocast(device, dtype=getattr(torch, dtype)):
            yield
    finally:
        del head.forward
        if own is not None:
            head.forward = own


def batch_for_few(rows: int, batch_size: int) -> int:
    """Rows per sorted batch for calibration and near ties, sets of any length: at least four batches (each pads only to
    its quarter's longest) of at least ``FEW_PER_BATCH`` rows, at most ``batch_size``. Notebook 05, section 2."""
    return min(batch_size, max(FEW_PER_BATCH, rows // 4))


def run_plan(model, tokenizer, scorer, prompts, plan: dict, **hooks) -> LabelScores:
    """``score_batched`` on ``plan`` (its keywords: strategy, batch_size, token_budget, prefix, progress; the verified
    path's ``**plan``) with ``hooks`` (``Batching``'s on_batch, first). Notebook 05, section 3."""
    sizes = {key: plan[key] for key in ("strategy", "batch_size", "token_budget") if key in plan}
    how = Batching(**sizes, **hooks)
    return score_batched(
        model, tokenizer, scorer, prompts, how, prefix=plan.get("prefix"), progress=plan.get("progress", False)
    )


def rescore(model, tokenizer, scorer, prompts, prefix=None, **plan) -> LabelScores:
    """Prompts in float32 (also in a mixed-precision block), in sorted ``batch_for_few`` batches ("loop" and a token
    budget, which bounds memory, kept). Notebook 05, section 3."""
    if plan.get("strategy") not in ("loop", "token_budget"):
        plan.update(strategy="sorted", batch_size=batch_for_few(len(prompts), plan.get("batch_size") or FEW_PER_BATCH))
    with torch.autocast(model.device.type, enabled=False):
        return run_plan(model, tokenizer, scorer, prompts, dict(plan, prefix=prefix), on_batch=plan.get("on_batch"))


def rounding_step(scores: LabelScores, dtype: str) -> float:
    """The least threshold (a zero error measured is no proof): a ``dtype`` step at the top 2 scores. Notebook 05."""
    return torch.finfo(getattr(torch, dtype)).eps * float(scores.log_scores.topk(2, dim=-1).values.abs().max())


def calibration_rows(tokenizer, prompts, k: int) -> list[int]:
    """``k`` of ``prompts`` spread evenly over their order by token length, the shortest and the longest among them: a
    sample like the job in any row order (a file sorted by length, date or customer), the same rows in every order
    (equal lengths ordered by their text). Notebook 05, section 2."""
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], prompts[i]))
    k = min(k, len(lengths))  # k distinct rows at most
    return sorted(order[round(j * (len(order) - 1) / max(k - 1, 1))] for j in range(k))


@dataclass(frozen=True)
class Calibration:
    """How the verified path finds its threshold: ``rows`` spread over the length order scored in both dtypes, their
    largest margin error times ``safety``; or ``threshold`` as given (``rows`` still keep float32's scores).
    Notebook 05, section 3."""

    rows: int = CALIBRATION
    safety: float = SAFETY
    threshold: float | None = None


def _calibration(calibration: Calibration | int | None) -> Calibration:
    rows = CALIBRATION if calibration is None else calibration
    return calibration if isinstance(calibration, Calibration) else Calibration(rows)


class _Bound:
    """The calibration (``calibrate``): its rows spread over the length order scored in float32 (``on_batch`` of
    ``plan`` gets them, at input positions); ``add`` takes the half-precision pass's batches, run in the job's own
    shapes, until the rows' half scores give the largest margin error and the threshold (or the given one). If every
    calibration row overflows, the threshold is infinite: every row is then rescored (float32's, said by the caller)."""

    def __init__(self, model, tokenizer, scorer, prompts, dtype, calibration: Calibration, plan: dict):
        self.rows = calibration_rows(tokenizer, prompts, calibration.rows)
        on_batch, plan = plan.get("on_batch"), {key: value for key, value in plan.items() if key != "on_batch"}

        def relay(j, scores, full):  # ``on_batch`` gets the rows at input positions, their scores float32's
            return on_batch([self.rows[i] for i in j], scores, full, True)

        relayed = on_batch and relay
        self.first = rescore(model, tokenizer, scorer, [prompts[i] for i in self.rows], on_batch=relayed, **plan)
        self.dtype = dtype
        self.safety = calibration.safety
        self.threshold = calibration.threshold
        self.half = {}
        self.error = None
        self.overflowed = False
        self.seconds, self.last = self.first.info["seconds"], time.perf_counter()  # and the rows' share of half batches

    def add(self, items, scores, *_) -> bool:
        """A half-precision batch (its calibration rows' share of its seconds counted here); True once bounded."""
        now, mine = time.perf_counter(), [j for j, i in enumerate(items) if i in self.rows]
        self.seconds, self.last = self.seconds + (now - self.last) * len(mine) / len(items), now
        self.half.update((items[j], scores[j]) for j in mine)
        if self.error is None and len(self.half) == len(self.rows):
            # a row that overflowed in half precision bounds nothing (it keeps its float32 scores)
            kept = [n for n, i in enumerate(self.rows) if torch.isfinite(self.half[i]).all()]
            self.overflowed = not kept
            if kept:
                half = LabelScores(self.first.labels, torch.stack([self.half[self.rows[n]] for n in kept]))
                self.error = margin_error(half, self.first[kept])
                bound = threshold_for(self.error, self.safety, rounding_step(self.first, self.dtype))
            else:
                self.error, bound = float("inf"), float("inf")
            self.threshold = bound if self.threshold is None else self.threshold
        return self.error is not None


class _Bounded(Exception):
    """``calibrate``'s half-precision pass stops once its rows' batches have run (``score_verified``'s, once every
    calibration row overflowed: everything is rescored in float32 then)."""


def calibrate(model, tokenizer, scorer, prompts, dtype, calibration: Calibration | int | None = None, **plan):
    """The bound: ``calibration``'s rows of ``prompts`` (``calibration_rows``) scored in float32 (``plan``'s
    ``on_batch`` gets those batches, at input positions) and in ``dtype`` in the batches the job's plan puts them in
    (those batches run first, the rest not at all). Returns (those rows, their float32 scores, the largest margin
    error, the threshold, seconds): the error times its safety, at least ``rounding_step``. Notebook 05, section 2."""
    began = time.perf_counter()  # seconds: every pass it runs, all calibration
    bound = _Bound(model, tokenizer, scorer, prompts, dtype, _calibration(calibration), plan)

    def collect(*batch):
        if bound.add(*batch):
            raise _Bounded

    plan = {key: value for key, value in plan.items() if key != "on_batch"}
    with mixed_precision(model, dtype), contextlib.suppress(_Bounded):
        run_plan(model, tokenizer, scorer, prompts, plan, on_batch=collect, first=bound.rows)
    return bound.rows, bound.first, bound.error, bound.threshold, time.perf_counter() - began


def change_in_gaps(half: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Each row's largest change between two dtypes in any two labels' gap (``margin_error`` per row). Notebook 05,
    section 2."""
    change = half.float() - full.float()
    # (a - c) changes by change[a] - change[c]: the largest such difference is the row's max change minus its min.
    return change.amax(-1) - change.amin(-1)


def score_verified(
    model, tokenizer, scorer, prompts, dtype: str, calibration: Calibration | int | None = None, prior=None, **plan
) -> LabelScores:
    """Every prompt's label scores, every label float32's wherever no row's rounding error exceeds the bound.
    ``model``, the float32 model, runs in ``dtype`` through ``mixed_precision`` (``plan["whole"]``: a ``half_copy`` in
    ``dtype`` runs it instead, on its own copy of the prefix cache, its logits rounded too; ``calibrate`` bounds mixed
    precision only). ``calibration`` (``Calibration``, or its row count; default ``CALIBRATION``): rows spread over the
    length order scored in float32, which keep those scores; the half-precision pass scores every prompt in the
    batches of ``plan`` (score_batched's options: strategy, batch_size, token_budget, prefix, progress), those holding
    the calibration's rows first: their half scores give the bound in the shapes it bounds. Every other row under it
    (its margin read after ``prior`` if given) or not finite is rescored in float32 (``rescore``); those rescored rows,
    scored both ways, are checked against the bound: one whose error exceeds it widens it (``safety`` times that error)
    and the rows under the wider bound are rescored too. If every calibration row overflows, every row is rescored.
    ``plan["on_batch"](items, scores, full, exact)`` gets each batch's scores as they land (``exact``: float32's; a
    row may land again, rescored). ``info``: ``margin_error``, ``threshold`` (the final bound), ``calibrated`` (the
    sample's), ``evidence`` (rows scored both ways beyond the sample) and ``evidence_error`` (their largest error),
    ``rescored`` and ``non_finite`` (input positions), ``overflowed``, ``calibration``, ``seconds``, ``items_per_s``,
    ``phase_seconds``. Notebook 05, section 3."""
    start, calibration = time.perf_counter(), _calibration(calibration)
    whole, plan = plan.pop("whole", None), dict(plan, progress=plan.get("progress", False))
    if whole is not None and whole.dtype != getattr(torch, dtype):
        raise ValueError(f"whole= is a {whole.dtype} model, not {dtype}: pass half_copy(model, {dtype!r})")
    run = _Verified(model, tokenizer, scorer, prompts, dtype, calibration, prior, plan)
    began = time.perf_counter()
    runner, rounding = (model, mixed_precision(model, dtype)) if whole is None else (whole, contextlib.nullcontext())
    prefix = plan.get("prefix")
    own = prefix if whole is None or prefix is None else PrefixCache(whole, tokenizer, prefix.text)
    with rounding, contextlib.suppress(NonFiniteScores, _Bounded):  # NonFiniteScores: those rows are in ``broken``
        run_plan(runner, tokenizer, scorer, prompts, dict(run.plan, prefix=own), on_batch=run.checked, first=run.sample)
    run.phases["half"] = time.perf_counter() - began
    if run.bound is not None:  # the calibration rows' share of their half batches counts as calibration
        run.phases["calibration"] = run.bound.seconds
        run.phases["half"] -= run.bound.seconds - run.bound.first.info["seconds"]
    calibrated = run.rescore_near_ties()
    if torch.isnan(run.log_scores).any():  # every row is filled by one of the passes above, or the run stops here
        raise RuntimeError(
            f"rows {torch.isnan(run.log_scores).any(-1).nonzero().flatten().tolist()[:10]} got no scores"
        )
    bound = run.bound
    seconds = time.perf_counter() - start
    rows = len(prompts)
    info = dict(margin_error=bound and bound.error, threshold=run.threshold, calibrated=calibrated, calibration=run.k)
    info.update(
        rescored=sorted(run.rescored), non_finite=sorted(run.broken), overflowed=bool(bound and bound.overflowed)
    )
    info.update(evidence=len(run.evidence), evidence_error=max(run.evidence, default=None), phase_seconds=run.phases)
    info.update(seconds=seconds, items_per_s=rows / seconds)
    return LabelScores(list(scorer.labels), run.log_scores, info, prior=run.shift)


def _no_batch(*batch) -> None:
    """``score_verified``'s ``on_batch`` where none is given: the batch lands nowhere else."""


def _no_bound(bound) -> None:
    """``score_verified``'s ``on_bound`` where none is given: the bound is noted nowhere else."""


class _Verified:
    """``score_verified``'s rows as its passes fill them: the calibration's (float32), the half pass's batches settled
    once the bound is known (``checked``), the near ties rescored until no rescored row's error exceeds the bound."""

    def __init__(self, model, tokenizer, scorer, prompts, dtype, calibration: Calibration, prior, plan: dict):
        self.k, self.safety = min(calibration.rows, len(prompts)), calibration.safety
        if calibration.threshold is None and self.k < 1:
            raise ValueError("no calibration rows and no threshold: calibrate on at least one prompt")
        self.model = model
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.prompts = prompts
        self.on_batch = plan.pop("on_batch", None) or _no_batch
        self.plan = plan
        self.on_bound = plan.pop("on_bound", None) or _no_bound  # a resumed run reads the last one back
        self.noted = False
        self.log_scores = torch.full((len(prompts), len(scorer.labels)), float("nan"))  # a row never filled shows
        self.shift = None if prior is None else prior.for_labels(scorer.labels)
        self.bound = None
        self.threshold = calibration.threshold
        self.phases = {}  # seconds of each
        if self.k:
            sized, options = replace(calibration, rows=self.k), dict(plan, on_batch=self.on_batch)
            self.bound = _Bound(model, tokenizer, scorer, prompts, dtype, sized, options)
            self.log_scores[self.bound.rows] = self.bound.first.log_scores
        self.sample = set(self.bound.rows if self.bound else ())  # they keep their float32 scores
        self.rescored = []  # near ties (rescored)
        self.broken = []  # non-finite rows (rescored)
        self.waiting = []  # batches waiting for the bound
        self.halves = {}  # near ties' half scores
        self.evidence = []  # the near ties' errors

    def checked(self, items, scores, was_full) -> None:
        """A half batch; batches wait until the calibration's rows (run first) bound, then settle."""
        self.waiting.append((items, scores, was_full))
        if self.bound is not None and not self.bound.add(items, scores):
            return
        if self.bound is not None and self.bound.overflowed:
            raise _Bounded  # every calibration row overflowed: the rest of the half pass would bound nothing
        self.threshold = self.threshold if self.bound is None else self.bound.threshold
        if not self.noted:  # the bound is known now
            self.noted = True
            self.on_bound(self.threshold)
        for items, scores, was_full in self.waiting:
            bad = set((~torch.isfinite(scores).all(-1)).nonzero().flatten().tolist())  # overflowed: float32's instead
            near = bad | set(near_ties(LabelScores(self.scorer.labels, scores, prior=self.shift), self.threshold))
            own = [j for j, i in enumerate(items) if i not in self.sample]
            self.broken.extend(items[j] for j in sorted(bad))  # calibration rows too: they keep float32's scores
            self.rescored.extend(items[j] for j in own if j in near)
            self.halves.update((items[j], scores[j]) for j in own if j in near and j not in bad)
            if sure := [j for j in own if j not in near]:
                self.log_scores[[items[j] for j in sure]] = scores[sure]
                self.on_batch([items[j] for j in sure], scores[sure], was_full, False)
        self.waiting.clear()

    def rescore_near_ties(self) -> float:
        """Rescore the near ties in float32; read each, scored both ways, as one more calibration row: where one's
        error exceeds the bound, the bound widens to ``safety`` times it and the rows under it are rescored too.
        Returns the bound as calibrated (before any widening)."""
        if self.bound is not None and self.bound.overflowed:
            self.rescored, self.threshold = [i for i in range(len(self.prompts)) if i not in self.sample], float("inf")
        calibrated, self.phases["rescore"] = self.threshold, 0.0
        while todo := [i for i in self.rescored if torch.isnan(self.log_scores[i]).any()]:

            def landed(items, scores, was_full, todo=todo):  # a float32 batch of near ties
                self.log_scores[[todo[j] for j in items]] = scores
                self.on_batch([todo[j] for j in items], scores, was_full, True)

            chosen = [self.prompts[i] for i in todo]
            passed = rescore(self.model, self.tokenizer, self.scorer, chosen, **dict(self.plan, on_batch=landed))
            self.phases["rescore"] += passed.info["seconds"]
            if (
                wider := _widened(self.threshold, self.safety, self.halves, self.log_scores, self.evidence)
            ) > self.threshold:
                self.threshold = wider
                self.on_bound(wider)
            margins = LabelScores(self.scorer.labels, self.log_scores, prior=self.shift)
            settled = {*self.sample, *self.rescored}
            for i in [i for i in near_ties(margins, self.threshold) if i not in settled]:
                self.halves[i], self.log_scores[i] = self.log_scores[i].clone(), float("nan")  # its half scores
                self.rescored.append(i)
        return calibrated


def _widened(threshold: float, safety: float, halves: dict, log_scores: torch.Tensor, evidence: list) -> float:
    """The bound after the rows rescored so far, each scored both ways, are read as more calibration rows: ``safety``
    times the largest error among them where that exceeds ``threshold``, else ``threshold``. Adds their errors to
    ``evidence`` (once each)."""
    fresh = [i for i in halves if torch.isfinite(halves[i]).all()][len(evidence) :]
    if fresh:
        errors = change_in_gaps(torch.stack([halves[i] for i in fresh]), log_scores[fresh])
        evidence.extend(errors.tolist())
    largest = max(evidence, default=0.0)
    return threshold if largest <= threshold else largest * safety


def settle_job_prior(scores: LabelScores, exact, threshold, rescore_rows, prior_of=job_prior, safety=SAFETY):
    """A verified run's last step, on all its rows at once: the prior ``prior_of(scores)`` (default the job's own; a
    fixed one, or None), every row not already float32's (``exact``) whose calibrated margin is under ``threshold``
    rescored in float32 (``rescore_rows(rows)``: their log-scores), each of those read as one more calibration row
    (one whose error exceeds the bound widens it to ``safety`` times that error), the prior recomputed, until no such
    row is left: every label is then float32's under the returned prior. Returns (those scores, the prior, the rows
    rescored, the bound, their largest error or None). Notebook 05, section 3 (``--prior job``; several processes)."""
    log_scores = scores.log_scores.clone()
    exact = set(exact)
    added = []
    errors = []
    while True:
        prior = prior_of(LabelScores(scores.labels, log_scores))
        result = calibrated(LabelScores(scores.labels, log_scores, scores.info), prior)
        close = [i for i in near_ties(result, threshold) if i not in exact]
        if not close:
            return result, prior, added, threshold, max(errors, default=None)
        half = log_scores[close].clone()  # before the rescored scores replace them
        log_scores[close] = rescore_rows(close)
        added = added + close
        finite = torch.isfinite(half).all(-1)
        errors += change_in_gaps(half[finite], log_scores[close][finite]).tolist()
        largest = max(errors, default=0.0)
        threshold = safety * largest if largest > threshold else threshold
        exact.update(close)


def choose_half(profile) -> tuple[str | None, str]:
    """The half dtype worth a verified path here (notebook 00's profile: matmul at least ``FAST_ENOUGH`` times
    float32's, finite logits), or None, and a line saying why. Notebook 05, section 1; ``classify --dtype auto``."""
    base = profile.matmul_gflops["float32"]
    fast = [name for name in profile.fast_dtypes() if name != "float32"]
    for name in sorted(fast, key=lambda name: name != "bfloat16"):  # bfloat16 first: float32's range, no overflow
        ratio = profile.matmul_gflops[name] / base
        if ratio >= FAST_ENOUGH:
            return name, f"{name} (its matmul runs at {ratio:.1f}x float32's here)"
    halves = ", ".join(f"{n} {flops / base:.2g}x" for n, flops in profile.matmul_gflops.items() if n != "float32")
    return None, f"float32 (half precision is not {FAST_ENOUGH}x faster here: matmul {halves or 'not measured'})"


def closing_lines(runs: list, rescored: int, rows: int, dtype: str, processes: int, prior=None) -> list[str]:
    """What a verified run proved, what it rests on (where the bound came from, the rows checked against it, the
    ``prior`` divided out) and where its time went, from its processes' run records. No lesson builds it:
    ``classify --dtype auto``'s closing lines."""
    same = f"under the same prior ({prior.source})" if prior is not None else "with no prior"
    if not runs:  # every row was scored in float32 (a job no larger than its prior's sample)
        return [f"--dtype auto: every one of the {rows} rows was scored in float32: every label is float32's, {same}"]
    bound, head = max(run["threshold"] for run in runs), f"--dtype auto: {rescored} of {rows} rows rescored in float32"
    if bound == float("inf"):
        overflowed = (
            f"{head}: half precision overflowed on every calibration row of a share, so every row ran in float32"
        )
        return [overflowed, _time_line(runs, processes)]
    top = max(runs, key=lambda run: run["threshold"])
    moved = f"widened to {SAFETY:g}x the largest change a rescored row showed ({top['evidence_error'] or 0:.3g})"
    if top["source"] == "stopped":
        origin = "the stopped run's, as it noted it"
    elif top["threshold"] > top["calibrated"]:
        origin = moved
    elif top["margin_error"] is not None and top["margin_error"] * SAFETY < top["threshold"]:
        origin = f"one {dtype} rounding step at the scores' scale (the calibration rows moved a gap by at most "
        origin += f"{top['margin_error']:.3g})"
    else:
        origin = f"{SAFETY:g}x the largest change rounding made to a gap between two labels on {top['calibration']} "
        origin += "calibration rows, from the shortest to the longest"
    several = f", the largest of {len(runs)} (each process's and the end's)" if len(runs) > 1 else ""
    checked, errors = sum(run["evidence"] for run in runs), [r["evidence_error"] for r in runs if r["evidence_error"]]
    evidence = (
        f" {checked} rescored rows, scored both ways, moved a gap by at most {max(errors):.3g}." if errors else ""
    )
    return [
        f"{head}: those whose top two labels were closer than {bound:.3g}, or not finite",
        f"--dtype auto, the bound: {origin}{several}.{evidence} Every label is the one --dtype float32 gives, {same}, "
        f"provided rounding moved no row's gap by more than {bound:.3g}",
        _time_line(runs, processes),
    ]


def _time_line(runs: list, processes: int) -> str:
    phases = [run["phase_seconds"] for run in runs]
    spent = ", ".join(f"{k} {sum(p.get(k, 0.0) for p in phases):.1f} s" for k in ("calibration", "half", "rescore"))
    summed = f" (summed over {processes} processes)" if processes > 1 else ""
    return f"--dtype auto, where the time went{summed}: {spent}"
