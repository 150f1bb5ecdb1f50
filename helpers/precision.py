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
from .prefix_cache import PrefixCache
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


def rescore(model, tokenizer, scorer, prompts, prefix=None, **plan) -> LabelScores:
    """Prompts in float32 (also in a mixed-precision block), in sorted ``batch_for_few`` batches ("loop" and a token
    budget, which bounds memory, kept). Notebook 05, section 3."""
    if plan.get("strategy") not in ("loop", "token_budget"):
        plan.update(strategy="sorted", batch_size=batch_for_few(len(prompts), plan.get("batch_size") or FEW_PER_BATCH))
    with torch.autocast(model.device.type, enabled=False):
        return score_batched(model, tokenizer, scorer, prompts, prefix=prefix, **plan)


def rounding_step(scores: LabelScores, dtype: str) -> float:
    """The least threshold (a zero error measured is no proof): a ``dtype`` step at the top 2 scores. Notebook 05."""
    return torch.finfo(getattr(torch, dtype)).eps * float(scores.log_scores.topk(2, dim=-1).values.abs().max())


def calibration_rows(tokenizer, prompts, k: int) -> list[int]:
    """``k`` of ``prompts`` spread evenly over their order by token length, the shortest and the longest among them: a
    sample like the job in any row order (a file sorted by length, date or customer). Notebook 05, section 2."""
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    order, k = sorted(range(len(lengths)), key=lambda i: lengths[i]), min(k, len(lengths))  # k distinct rows at most
    return sorted(order[round(j * (len(order) - 1) / max(k - 1, 1))] for j in range(k))


class _Bound:
    """The calibration (``calibrate``): ``k`` rows spread over the length order scored in float32 (``on_batch`` gets
    them, at input positions); ``add`` takes the half-precision pass's batches, run in the job's own shapes, until the
    rows' half scores give the largest margin error and the threshold (``threshold`` if given)."""

    def __init__(self, model, tokenizer, scorer, prompts, dtype, prefix, on_batch, k, safety, plan, threshold=None):
        self.rows = calibration_rows(tokenizer, prompts, k)
        relay = on_batch and (lambda j, *batch: on_batch([self.rows[i] for i in j], *batch))
        self.first = rescore(model, tokenizer, scorer, [prompts[i] for i in self.rows], prefix, on_batch=relay, **plan)
        self.dtype, self.safety, self.threshold, self.half, self.error = dtype, safety, threshold, {}, None
        self.seconds, self.last = self.first.info["seconds"], time.perf_counter()  # and the rows' share of half batches

    def add(self, items, scores, *_) -> bool:
        """A half-precision batch (its calibration rows' share of its seconds counted here); True once bounded."""
        now, mine = time.perf_counter(), [j for j, i in enumerate(items) if i in self.rows]
        self.seconds, self.last = self.seconds + (now - self.last) * len(mine) / len(items), now
        self.half.update((items[j], scores[j]) for j in mine)
        if self.error is None and len(self.half) == len(self.rows):
            # a row that overflowed in half precision bounds nothing (it keeps its float32 scores); all of them: stop
            kept = [n for n, i in enumerate(self.rows) if torch.isfinite(self.half[i]).all()] or range(len(self.rows))
            half = LabelScores(self.first.labels, torch.stack([self.half[self.rows[n]] for n in kept]))
            self.error = margin_error(half, self.first[kept])
            bound = threshold_for(self.error, self.safety, rounding_step(self.first, self.dtype))
            self.threshold = bound if self.threshold is None else self.threshold
        return self.error is not None


class _Bounded(Exception):
    """``calibrate``'s half-precision pass stops once its rows' batches have run."""


def calibrate(model, tokenizer, scorer, prompts, dtype, prefix=None, on_batch=None, k=None, safety=SAFETY, **plan):
    """The bound: ``k`` of ``prompts`` (``calibration_rows``; default ``CALIBRATION``) scored in float32 (``on_batch``
    gets those batches, at input positions) and in ``dtype`` in the batches the job's plan puts them in (those batches
    run first, the rest not at all). Returns (those rows, their float32 scores, the largest margin error, the
    threshold, seconds): the error times ``safety``, at least ``rounding_step``. Notebook 05, section 2."""
    k, began = CALIBRATION if k is None else k, time.perf_counter()  # seconds: every pass it runs, all calibration
    bound = _Bound(model, tokenizer, scorer, prompts, dtype, prefix, on_batch, k, safety, plan)

    def collect(*batch):
        if bound.add(*batch):
            raise _Bounded

    with mixed_precision(model, dtype), contextlib.suppress(_Bounded):
        score_batched(model, tokenizer, scorer, prompts, prefix=prefix, on_batch=collect, first=bound.rows, **plan)
    return bound.rows, bound.first, bound.error, bound.threshold, time.perf_counter() - began


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
    whole=None,
    **plan,
) -> LabelScores:
    """Every prompt's label scores, every label float32's wherever the calibration's bound holds. ``model``, the float32
    model, runs in ``dtype`` through ``mixed_precision`` (``whole``: a ``half_copy`` in ``dtype`` runs it instead, on
    its own copy of ``prefix``, its logits rounded too, as its measured error shows; ``calibrate`` bounds mixed
    precision only). ``calibration`` prompts spread over the length order (default ``CALIBRATION``) are scored in
    float32 and keep those scores; the half-precision pass scores every prompt in the batches of ``plan``, those holding
    the calibration's rows first: their half scores give the bound (``calibrate``) in the shapes it bounds and the
    threshold (or ``threshold`` as given). Every other row under it (its margin read after ``prior`` if given) or not
    finite is rescored in float32 (``rescore``). ``prefix``: the float32 ``PrefixCache``; ``on_batch`` gets each batch's
    final scores. ``info``: ``margin_error``, ``threshold``, ``rescored`` and ``non_finite`` (input positions),
    ``calibration``, ``seconds``, ``items_per_s``, ``phase_seconds`` (calibration: its float32 pass and its rows' share
    of their half batches). Notebook 05, section 3."""
    start = time.perf_counter()
    plan.setdefault("progress", False)
    k = min(CALIBRATION if calibration is None else calibration, len(prompts))
    if threshold is None and k < 1:
        raise ValueError("no calibration rows and no threshold: calibrate on at least one prompt")
    if whole is not None and whole.dtype != getattr(torch, dtype):
        raise ValueError(f"whole= is a {whole.dtype} model, not {dtype}: pass half_copy(model, {dtype!r})")
    log_scores = torch.full((len(prompts), len(scorer.labels)), float("nan"))  # a row never filled shows
    shift = None if prior is None else prior.for_labels(scorer.labels)
    bound, phases = None, {}  # seconds of each phase: calibration, the half-precision pass, the rescoring
    if k:
        bound = _Bound(model, tokenizer, scorer, prompts, dtype, prefix, on_batch, k, safety, plan, threshold)
        log_scores[bound.rows] = bound.first.log_scores
    sample = set(bound.rows if bound else ())  # they keep their float32 scores
    rescored, broken, waiting = [], [], []  # near ties and non-finite rows (rescored last); batches not yet settled

    def checked(items, scores, was_full):  # a half batch; batches wait until the calibration's rows (run first) bound
        nonlocal threshold
        waiting.append((items, scores, was_full))
        if bound is not None and not bound.add(items, scores):
            return
        threshold = threshold if bound is None else bound.threshold
        for items, scores, was_full in waiting:
            bad = set((~torch.isfinite(scores).all(-1)).nonzero().flatten().tolist())  # overflowed: float32's instead
            near = bad | set(near_ties(LabelScores(scorer.labels, scores, prior=shift), threshold))
            own = [j for j, i in enumerate(items) if i not in sample]
            broken.extend(items[j] for j in sorted(bad))  # calibration rows too: they keep float32's scores
            rescored.extend(items[j] for j in own if j in near)
            if sure := [j for j in own if j not in near]:
                log_scores[[items[j] for j in sure]] = scores[sure]
                if on_batch is not None:
                    on_batch([items[j] for j in sure], scores[sure], was_full)
        waiting.clear()

    def landed(items, scores, was_full):  # a float32 batch of near ties
        log_scores[[rescored[j] for j in items]] = scores
        if on_batch is not None:
            on_batch([rescored[j] for j in items], scores, was_full)

    began = time.perf_counter()
    runner, rounding = (model, mixed_precision(model, dtype)) if whole is None else (whole, contextlib.nullcontext())
    own = prefix if whole is None or prefix is None else PrefixCache(whole, tokenizer, prefix.text)
    with rounding, contextlib.suppress(NonFiniteScores):  # NonFiniteScores: those rows are in ``broken``
        score_batched(runner, tokenizer, scorer, prompts, prefix=own, on_batch=checked, first=sample, **plan)
    phases["half"] = time.perf_counter() - began
    if bound is not None:  # the calibration rows' share of their half batches counts as calibration
        phases["calibration"] = bound.seconds
        phases["half"] -= bound.seconds - bound.first.info["seconds"]
    if rescored:
        chosen = [prompts[i] for i in rescored]
        phases["rescore"] = rescore(model, tokenizer, scorer, chosen, prefix, on_batch=landed, **plan).info["seconds"]
    if torch.isnan(log_scores).any():  # every row is filled by one of the passes above, or the run stops here
        raise RuntimeError(f"rows {torch.isnan(log_scores).any(-1).nonzero().flatten().tolist()[:10]} got no scores")
    seconds = time.perf_counter() - start
    info = dict(margin_error=bound and bound.error, threshold=threshold, rescored=sorted(rescored), calibration=k)
    info.update(seconds=seconds, non_finite=sorted(broken), phase_seconds=phases, items_per_s=len(prompts) / seconds)
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
        log_scores[close], added = rescore_rows(close), added + close
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
