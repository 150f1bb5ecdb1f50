"""Classify your own CSV or JSONL file: ``classify_file`` and ``python -m helpers classify`` (real use, after 01-03).
Every row comes out once, in input order, with its prediction columns, scored on the fastest verified path, resumable
(``helpers.resume``), in several processes under ``torchrun`` or ``accelerate launch`` (rank 0 writes)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import resume, tables
from .batching import STRATEGIES, NonFiniteScores, score_batched
from .checks import assert_agrees, tolerance_for
from .data import build_prompt, encode_prompt, uses_chat_template
from .precision import calibrate, choose_half, near_ties, rescore, score_verified, settle_job_prior
from .prefix_cache import PrefixCache
from .prior import PRIORS, Prior, calibrated, content_free_prior, job_prior
from .profile import machine_profile
from .scoring import LabelScorer, LabelScores, score_one_by_one
from .tables import InputError, one_line, rows_text

# Rows per batch by default. On 300 article rows (3 shots, prefix cache, 2-core Xeon) float32 ran 4.3-5.2 items/s at
# 8 and 4.5-4.9 at 16, within noise; --dtype auto's half-precision pass 6.8-8.1 at 8 and 8.8-9.0 at 16.
BATCH_SIZE = 16
# A run where this share of the rows (of at least COLLAPSE_MIN_ROWS) gets one label ends with a warning.
COLLAPSE_SHARE = 0.9
COLLAPSE_MIN_ROWS = 10
# The label prior divided out of every row by default (helpers.prior; benchmarks/priors.py's table in docs/classify.md):
# the job's own mean; a job of fewer rows, whose mean would be mostly its own rows, gets the content-free prior.
PRIOR = "job"
JOB_PRIOR_MIN_ROWS = 30


class ProcessFailure(RuntimeError):
    """A failure every process of a data-parallel run has learned of; each stops with its message."""


def prepare_prompts(tokenizer, texts, labels, examples, max_tokens: int, truncate: bool, source="input", end_tokens=0):
    """(prompts, rows cut): a prompt too long for the model is an error, or cut at the head with ``truncate``."""
    label_room = max(len(encode_prompt(tokenizer, label)) for label in labels) + end_tokens
    overhead = len(encode_prompt(tokenizer, build_prompt(tokenizer, "", labels, examples)))
    budget = max_tokens - label_room - overhead
    if budget < 1:
        alone = f"the instruction and few-shot examples alone take {overhead} of the model's {max_tokens} tokens"
        raise InputError(alone)

    def too_long(prompt: str) -> bool:
        return len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens

    prompts, cut = [], []
    for row, text in enumerate(texts, start=1):
        prompt = build_prompt(tokenizer, text, labels, examples)
        if too_long(prompt):
            cut.append(row)
        if too_long(prompt) and truncate:
            # Keep the head: a ticket's start usually says what it is about. Decoding and re-encoding can shift a
            # token or two, so shrink until the prompt really fits.
            ids, keep = encode_prompt(tokenizer, text), budget
            while too_long(prompt) and keep > 0:
                prompt = build_prompt(tokenizer, tokenizer.decode(ids[:keep]), labels, examples)
                keep -= 8
            if too_long(prompt):
                raise InputError(f"{source}: row {row}: cannot be cut to fit the model's {max_tokens}-token context")
        prompts.append(prompt)
    if cut and not truncate:
        context = f"longer than the model's {max_tokens}-token context; pass --truncate to keep each ticket's head"
        raise InputError(f"{source}: {rows_text(cut)}: {context}")
    return prompts, cut


def verify_sample(model, tokenizer, scorer, prompts, log_scores, k: int, seed=0, dtype=None, shift=None) -> dict:
    """Re-run ``k`` random rows one at a time; raise on a disagreement beyond ``tolerance_for`` the scores' dtype.
    ``shift``: a verified half-precision run's (``--dtype auto``): labels identical to float32's after it (the run's
    prior, or 0.0), log-probs within the dtype's tolerance."""
    rows = sorted(np.random.default_rng(seed).choice(len(prompts), size=min(k, len(prompts)), replace=False).tolist())
    reference = score_one_by_one(model, tokenizer, scorer, [prompts[i] for i in rows], progress=False)
    numbers, exact, shift = [r + 1 for r in rows], shift is not None, 0.0 if shift is None else shift
    tolerance = replace(tolerance := tolerance_for(dtype or model.dtype), near_ties=tolerance.near_ties and not exact)
    candidate = LabelScores(scorer.labels, log_scores[rows] - shift)
    reference = LabelScores(scorer.labels, reference.log_scores - shift)
    try:
        stats = assert_agrees(reference, candidate, tolerance, item_names=[f"row {n}" for n in numbers])
    except AssertionError as error:
        raise RuntimeError(f"verification failed on sampled rows {numbers}: {error}") from None
    return {**stats, "rows": numbers, "atol": tolerance.atol, "exact": not tolerance.near_ties}


def collapse_warning(predictions: Sequence[str], labels: Sequence[str], examples: int = 0, prior="none") -> str | None:
    """One line when predictions collapse onto one label (a zero-shot small model often does), else None."""
    counts = Counter(predictions)
    if len(predictions) < COLLAPSE_MIN_ROWS or counts.most_common(1)[0][1] < COLLAPSE_SHARE * len(predictions):
        return None
    (label, top), rows = counts.most_common(1)[0], len(predictions)
    distribution = ", ".join(f"{name} {counts[name]}" for name in labels)
    advice = "give it a few labelled examples with --examples FILE (columns text, label)"
    if examples:
        advice = f"its {examples} example(s) were not enough: give at least one per label, clearer ones, or try a "
        advice += "larger model (--model)"
    advice += "; or divide out its label prior with --prior job" if prior == "none" else ""
    divided = " even with its label prior divided out" if prior != "none" else ""
    apart = f"the model may not be telling the labels apart{divided}; {advice}"
    return f"warning: {top} of {rows} rows ({top / rows:.0%}) got {label!r} ({distribution}): {apart}"


@dataclass
class ClassifyResult:
    """What a run did. ``output`` is None on processes other than the writer (rank 0)."""

    output: Path | None
    rows: int
    seconds: float
    model: str
    dtype: str
    device: str
    processes: int
    prefix_cache: bool
    predictions: list[str] = field(default_factory=list)
    full_prompt_rows: list[int] = field(default_factory=list)
    truncated_rows: list[int] = field(default_factory=list)
    verification: dict | None = None
    warnings: list[str] = field(default_factory=list)
    resumed: int = 0  # rows read back from the progress files of a stopped run
    computed: int | None = None  # rows scored by this run (None: all of them)
    rescored: list[int] = field(default_factory=list)  # --dtype auto: rows rescored in float32 (1-based)
    prior: Prior | None = None  # the label prior divided out (helpers.prior)

    def summary(self) -> str:
        full, scored = self.full_prompt_rows, self.rows if self.computed is None else self.computed
        prefix = " · prefix cache: every row token-clean"
        if full:
            prefix = f" · prefix cache: {len(full)} row(s) not token-clean at the prefix boundary ran in full"
            prefix += f" ({rows_text(full)})"
        resumed = f" ({self.resumed} resumed from a stopped run; the speed is this run's {scored} rows)"
        speed = f"{scored / self.seconds:.2f} items/s"
        rows = f"{self.rows} rows -> {self.output}{resumed if self.resumed else ''} · {speed}"
        where = f"{self.model} · {self.dtype} · {self.device} · {self.processes} process(es)"
        return f"{rows} overall · {where}" + (prefix if self.prefix_cache else " · no prefix cache")


def _step(state, work: Callable[[], Any]) -> Any:
    """Run ``work`` on every process, then tell every process whether any failed: a process failing alone would
    leave the others waiting in the next collective. Each stops with the lowest failing rank's message."""
    from accelerate.utils import gather_object

    try:
        result, error = work(), None
    except Exception as caught:  # reported to every process below, then raised
        result, error = None, caught
    if state.num_processes > 1:
        reports = gather_object([(state.process_index, None if error is None else one_line(error))])
        failed = [(rank, message) for rank, message in reports if message is not None]
        if failed:
            raise ProcessFailure(f"process {failed[0][0]} of {state.num_processes}: {failed[0][1]}") from error
    if error is not None:
        raise error
    return result


def classify_file(
    input_path: str | Path,
    labels: str | Sequence[str],
    output_path: str | Path,
    *,
    text_column: str = "text",
    model_name: str | None = None,
    dtype: str | None = None,
    strategy: str = "sorted",
    batch_size: int = BATCH_SIZE,
    token_budget: int | None = None,
    prefix_cache: bool = True,
    whole_answers: bool | None = None,
    examples_path: str | Path | None = None,
    verify: int = 0,
    prior: str | None = None,
    truncate: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    device: str | None = None,
    say: Callable[[str], None] | None = None,
) -> ClassifyResult:
    """Classify every row of a CSV/JSONL file and write them with their predictions to ``output_path``: the checks that
    need no model first, then the labels as tokens, the model, this process's share of the rows, and on rank 0
    verification and the atomic write. ``say`` gets rank 0's messages (default: stderr); options as the command's."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from .models import load_model, load_tokenizer, pick_device, pick_dtype, resolve_name

    start = time.perf_counter()
    try:
        wanted = pick_device(device)
    except RuntimeError as error:  # an unavailable device, said before anything loads
        raise InputError(str(error)) from None
    state = PartialState(cpu=wanted.type == "cpu")  # one process per GPU under a launcher; CPU processes use gloo
    if state.num_processes > 1 and wanted.type == "mps":
        raise InputError("several processes on one Apple GPU do not pay: run classify as one process with --device mps")
    run_device, main = state.device if state.num_processes > 1 else wanted, state.is_main_process
    tell = (say or (lambda message: print(message, file=sys.stderr))) if main else (lambda message: None)

    def check():
        checked = tables.parse_labels(labels)
        if strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        if prior not in (None, *PRIORS):
            raise InputError(f"unknown prior {prior!r}: use one of {', '.join(PRIORS)}")
        floors = {"--batch-size": (batch_size, 1), "--token-budget": (token_budget, 1), "--verify": (verify, 0)}
        for option, (value, least) in floors.items():
            if value is not None and value < least:
                raise InputError(f"{option} must be >= {least}, got {value}")
        output = tables.check_output_path(output_path, overwrite, source=input_path)
        table = tables.read_table(input_path, text_column)
        tables.check_columns(table, checked, raw=prior != "none")
        return checked, output, table, tables.read_examples(examples_path, checked) if examples_path else []

    checked_labels, output, table, examples = _step(state, check)
    prior = prior or (PRIOR if len(table) >= JOB_PRIOR_MIN_ROWS else "content-free")  # the default, by job size
    plan = dict(strategy="token_budget" if token_budget else strategy, batch_size=batch_size, token_budget=token_budget)

    def label_scorer():  # before the model loads: labels only whole answers tell apart may stop here, in one line
        tokenizer = load_tokenizer(model_name)
        try:
            return tokenizer, LabelScorer(tokenizer, checked_labels, complete=whole_answers)
        except ValueError as error:
            raise InputError(f"{'--whole-answers' if whole_answers else '--labels'}: {error}") from None

    first_tokenizer, scorer = _step(state, label_scorer)
    prompt_format = "chat" if uses_chat_template(first_tokenizer) else "plain"
    auto = dtype == "auto"  # the verified half-precision path where it pays (helpers.precision), else float32
    scoring = {"complete": scorer.complete, "method": scorer.method, "truncate": truncate}
    if auto:  # which rows the half pass rescores depends on the prior (progress files hold raw scores otherwise)
        scoring["prior"] = prior
    model_dtype = (resolve_name(model_name)[0], "auto" if auto else str(pick_dtype(dtype, run_device)))
    job = resume.fingerprint(table.path, text_column, checked_labels, *model_dtype, examples, prompt_format, scoring)
    # --overwrite removes another job's progress (the writer alone; the same job's still resumes), and every process
    # reads every progress file before any appends to its own: _step waits for all of them each time.
    _step(state, lambda: overwrite and main and resume.remove_progress(output, keep=job))
    done = _step(state, lambda: resume.read_progress(output, job))
    if done:
        tell(f"resuming: {len(done):,} of {len(table):,} rows done (progress files beside {output}); scoring the rest")
    if prompt_format == "plain":
        plain_prompts = "plain prompts, the instruction, examples and text as text, each label scored after 'Category:'"
        tell(f"{model_name or 'the model'}: its tokenizer has no chat template (a base model?): {plain_prompts}")
    if scorer.complete:
        why = "--whole-answers"
        if scorer.overlaps:
            why = f"needed: {scorer.overlaps[0][1]!r} starts with all of {scorer.overlaps[0][0]!r}'s tokens"
        tell(f"scoring whole answers, each label followed by the end-of-answer marker ({why})")

    def score_share():
        # load_model shares the cores out among this machine's processes (LOCAL_WORLD_SIZE)
        model, tokenizer, info = load_model(
            model_name, dtype="float32" if auto else dtype, device=run_device, verbose=main, tokenizer=first_tokenizer
        )
        half, why = choose_half(machine_profile(model, info, verbose=main)) if auto else (None, "")
        if auto:
            tell(f"--dtype auto: {why}" + (", matmuls only, verified: near ties rescored in float32" if half else ""))
        # scorer: label_scorer's, built on the tokenizer the model was loaded with (its token ids index this vocabulary)
        end_tokens = max(len(t) - len(label) for t, label in zip(scorer.token_ids, scorer.label_ids))
        # The model's context in tokens (tokenizers report a huge sentinel when they do not know).
        limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
        limit, source = int(min(limit for limit in limits if limit and limit < 1e9)), str(table.path)
        texts = [record[text_column] for record in table.records]
        prompts, cut = prepare_prompts(tokenizer, texts, checked_labels, examples, limit, truncate, source, end_tokens)
        prefix = None
        if prefix_cache:  # float32 in every pass, also --dtype auto's half-precision ones (helpers.precision)
            prefix = PrefixCache.for_prompts(model, tokenizer, labels=checked_labels, examples=examples)
        # Once, in float32 under --dtype auto, alike on every process and resumed run; the job prior needs all rows.
        fixed = content_free_prior(model, tokenizer, scorer, examples) if prior == "content-free" else None
        with state.split_between_processes([i for i in range(len(table)) if i not in done]) as mine:
            mine = list(mine)
        shard, rescored, run = [], [], {}  # run: the verified path's threshold, calibration rows and phase seconds
        if mine:  # each finished batch lands in this process's progress file before the next runs
            writer = resume.ProgressWriter(output, state.process_index, job)
            bar = tqdm(total=len(done) + len(mine), initial=len(done), desc="classify", disable=not (main and progress))
            final, ran_full = {}, set()

            def landed(items, log_scores, full):
                if torch.isnan(log_scores).any():  # never land a row as done that the run will reject
                    raise NonFiniteScores(f"NaN scores for rows {[mine[j] + 1 for j in items][:10]}: check the dtype")
                writer.append([mine[j] for j in items], log_scores.tolist(), full)
                final.update(zip(items, log_scores.tolist()))
                ran_full.update(items if full else [])
                bar.update(len(items))

            try:
                share, options = [prompts[i] for i in mine], dict(plan, prefix=prefix, on_batch=landed)
                if half is None:
                    score_batched(model, tokenizer, scorer, share, progress=False, **options)
                else:  # rows spread over the lengths calibrate the bound and land in float32 (helpers.precision)
                    verified = score_verified(model, tokenizer, scorer, share, half, prior=fixed, **options)
                    rescored = verified.info["rescored"]
                    run = {key: verified.info[key] for key in ("threshold", "calibration", "phase_seconds")}
            finally:
                writer.close()
                bar.close()
            shard, rescored = [(i, final[j], j in ran_full) for j, i in enumerate(mine)], [mine[j] for j in rescored]
        return model, tokenizer, info, scorer, prompts, cut, shard, half, rescored, (fixed, prefix, run)

    model, tokenizer, info, scorer, prompts, cut, shard, half, rescored, (fixed, prefix, run) = _step(
        state, score_share
    )
    if cut:
        tell(f"cut {len(cut)} row(s) to fit the context (kept each text's head): {rows_text(cut, limit=10)}")
    gather = gather_object if state.num_processes > 1 else list  # one process: its own rows
    gathered, rescored, runs = gather(shard), gather(rescored), [run for run in gather([run]) if run]
    processes, scored_in = state.num_processes, f"{half} verified in float32" if half else info.dtype
    outcome = ClassifyResult(None, len(table), 0.0, info.name, scored_in, info.device, processes, prefix_cache)
    outcome.rescored = sorted(i + 1 for i in rescored)
    outcome.truncated_rows, outcome.resumed, outcome.computed = cut, len(done), len(gathered)
    if not main:
        outcome.seconds = time.perf_counter() - start
        return outcome
    gathered += [(i, row, full) for i, (row, full) in done.items()]
    if sorted(i for i, _, _ in gathered) != list(range(len(table))):
        raise RuntimeError(f"gathered {len(gathered)} results for {len(table)} rows: some rows are missing or doubled")
    log_scores = torch.tensor([row for _, row, _ in sorted(gathered, key=lambda item: item[0])])
    outcome.full_prompt_rows = sorted(i + 1 for i, _, full in gathered if full)
    scores = LabelScores(checked_labels, log_scores)
    if prior == "job" and half:  # its labels float32's under the prior they end with (helpers.precision)
        scores, fixed, added, runs = _settle(
            model, tokenizer, scorer, prompts, scores, half, prefix, plan, runs, rescored, bool(done)
        )
        outcome.rescored = sorted({*outcome.rescored, *(i + 1 for i in added)})
    elif prior == "job":
        fixed = job_prior(scores)
    if verify:  # under --dtype auto: float32's labels, under the prior the run ends with (its promise)
        shift = (fixed.for_labels(checked_labels) if fixed is not None else 0.0) if half else None
        stats = verify_sample(model, tokenizer, scorer, prompts, scores.log_scores, verify, dtype=half, shift=shift)
        outcome.verification = stats
        ties = f" ({stats['near_ties']} near-tie(s) within {stats['atol']:g} counted as agreement, max log-prob"
        ties += f" difference {stats['max_abs_diff']:.1e})"
        agree = f"all agree{'' if stats['exact'] else ties}"
        tell(f"verified {len(stats['rows'])} random rows against the one-at-a-time reference: {agree}")
    if fixed is not None:
        scores, outcome.prior = calibrated(scores, fixed), fixed
        tell(f"{fixed}: divided out of every row's label probabilities (the raw_p_ columns: without it)")
    outcome.predictions = scores.predictions
    if half:
        bound = "every row resumed, each under the bound of the run that scored it"
        if runs:  # the largest of the processes' thresholds (and _settle's)
            bound = f"top two labels closer than {max(run['threshold'] for run in runs):.3g}, the bound calibrated on "
            bound += f"{sum(run['calibration'] for run in runs)} rows spread over the length order, or not finite"
        rescored = f"{len(outcome.rescored)} of {len(table)} rows rescored in float32"
        tell(f"--dtype auto: {rescored} ({bound}): every label is float32's")
        phases = [run["phase_seconds"] for run in runs]
        spent = ", ".join(f"{k} {sum(p.get(k, 0.0) for p in phases):.1f} s" for k in ("calibration", "half", "rescore"))
        summed = f" (summed over {processes} processes)" if processes > 1 else ""
        tell(f"--dtype auto, where the time went{summed}: {spent}")
    elif info.dtype != "float32":  # a half dtype asked for by name: unverified, its near ties said
        atol = tolerance_for(info.dtype).atol
        ties = len(near_ties(scores, atol))
        near = f"{ties} of {len(scores)} rows have their top two labels within {atol:g}, near ties that rounding may"
        tell(f"{info.dtype}, unverified: {near} order either way (--dtype auto rescores such rows in float32)")
    tables.write_results(table, scores, output)
    resume.remove_progress(output)  # the output holds every row now
    outcome.output, outcome.seconds = output, time.perf_counter() - start
    tell(outcome.summary())
    if warning := collapse_warning(outcome.predictions, checked_labels, examples=len(examples), prior=prior):
        outcome.warnings.append(warning)
        tell(warning)
    return outcome


def _settle(model, tokenizer, scorer, prompts, scores, half, prefix, plan, runs, rescored, resumed: bool):
    """The job prior on a verified run (``settle_job_prior``), on rank 0: under the processes' largest threshold and,
    where rows were resumed (scored against an earlier bound) or none was scored, one measured now (``calibrate``,
    added to ``runs``). Returns settle_job_prior's (scores, prior, rows rescored), and the runs."""
    options, exact, log_scores = dict(plan, progress=False), set(rescored), scores.log_scores.clone()
    if resumed or not runs:
        rows, first, _, bound, seconds = calibrate(model, tokenizer, scorer, prompts, half, prefix, **options)
        runs = [*runs, dict(threshold=bound, calibration=len(rows), phase_seconds=dict(calibration=seconds))]
        log_scores[rows], exact = first.log_scores, exact | set(rows)

    def rows_in_float32(rows):
        return rescore(model, tokenizer, scorer, [prompts[i] for i in rows], prefix, **options).log_scores

    bound = max(run["threshold"] for run in runs)
    return *settle_job_prior(LabelScores(scores.labels, log_scores), exact, bound, rows_in_float32), runs
