"""Classify your own CSV or JSONL file: ``classify_file`` and ``python -m helpers classify`` (real use, after 01-03).

Every input row comes out once, in input order, with ``predicted_label``, ``confidence`` and one ``p_<label>``
column per label, computed on the fastest verified path (prefix cache + length-sorted batches). Everything
that can be checked without the model is checked before it loads; bad input stops with one line naming the
file, row and column; nothing is silently dropped, and the output appears whole or not at all. Under
``torchrun`` or ``accelerate launch`` each process scores a share and rank 0 writes the whole output; a
failure on any process stops every process with that failure's message.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tqdm.auto import tqdm

from . import resume
from .tables import (InputError, _one_line, _rows_text, check_columns, check_output_path, parse_labels,
                     prediction_columns, read_examples, read_table, result_records, write_records)
from .batching import STRATEGIES, NonFiniteScores, score_batched
from .data import build_prompt, encode_prompt, uses_chat_template
from .prefix_cache import PrefixCache
from .scoring import LabelScorer, LabelScores, score_one_by_one
from .checks import assert_agrees, tolerance_for

# A run where this share of the rows (of at least COLLAPSE_MIN_ROWS) gets one label ends with a warning.
COLLAPSE_SHARE = 0.9
COLLAPSE_MIN_ROWS = 10


class ProcessFailure(RuntimeError):
    """A failure every process of a data-parallel run has learned of; each stops with its message."""


# --- reading ------------------------------------------------------------------------------------------


# --- writing ------------------------------------------------------------------------------------------


# --- prompts and checks -------------------------------------------------------------------------------


@dataclass
class PreparedPrompts:
    prompts: list[str]
    truncated_rows: list[int]


def prepare_prompts(
    tokenizer,
    texts: Sequence[str],
    labels: Sequence[str],
    examples: Sequence[tuple[str, str]],
    max_tokens: int,
    truncate: bool,
    source: str = "input",
    end_tokens: int = 0,
) -> PreparedPrompts:
    """Prompts for every text; a prompt too long for the model is an error, or cut at the head with ``truncate``."""
    # Room for the longest label (with its end-of-answer marker when whole answers are scored).
    label_room = max(len(tokenizer(label, add_special_tokens=False)["input_ids"]) for label in labels) + end_tokens
    overhead = len(encode_prompt(tokenizer, build_prompt(tokenizer, "", labels, examples)))
    budget = max_tokens - label_room - overhead
    if budget < 1:
        raise InputError(f"the instruction and few-shot examples alone take {overhead} of the model's {max_tokens} tokens")
    prompts, too_long = [], []
    for row, text in enumerate(texts, start=1):
        prompt = build_prompt(tokenizer, text, labels, examples)
        if len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens:
            too_long.append(row)
            if truncate:
                # Keep the head: the start of a ticket usually says what it is about. Decoding and
                # re-encoding can shift a token or two, so shrink until the prompt really fits.
                ids, keep = tokenizer(text, add_special_tokens=False)["input_ids"], budget
                while len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens and keep > 0:
                    prompt = build_prompt(tokenizer, tokenizer.decode(ids[:keep]), labels, examples)
                    keep -= 8
                if len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens:
                    raise InputError(f"{source}: row {row}: cannot be cut to fit the model's {max_tokens}-token context")
        prompts.append(prompt)
    if too_long and not truncate:
        raise InputError(
            f"{source}: {_rows_text(too_long)}: longer than the model's {max_tokens}-token context; "
            "pass --truncate to keep each ticket's head"
        )
    return PreparedPrompts(prompts, too_long)


def context_length(model, tokenizer) -> int:
    """The model's context in tokens (tokenizers report a huge sentinel when they do not know)."""
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    return int(min(limit for limit in limits if limit and limit < 1e9))


def verify_sample(model, tokenizer, scorer, prompts, log_scores, k: int, seed: int = 0) -> dict:
    """Re-run ``k`` random rows through the one-at-a-time reference; raise on any disagreement.

    ``tolerance_for(model.dtype)``: float32, identical labels and log-probs within ``FLOAT32_ATOL``; lower
    precision, log-probs within its ``LOW_PRECISION_ATOL``, and a label flip where the reference's top two labels
    are closer than that is a near-tie, counted as agreement (rounding may order them either way).
    """
    rows = sorted(np.random.default_rng(seed).choice(len(prompts), size=min(k, len(prompts)), replace=False).tolist())
    reference = score_one_by_one(model, tokenizer, scorer, [prompts[i] for i in rows], progress=False)
    candidate = LabelScores(scorer.labels, log_scores[rows])
    tolerance = tolerance_for(model.dtype)
    try:
        stats = assert_agrees(reference, candidate, tolerance, item_names=[f"row {r + 1}" for r in rows])
    except AssertionError as error:
        raise RuntimeError(f"verification failed on sampled rows {[r + 1 for r in rows]}: {error}") from None
    return {**stats, "rows": [r + 1 for r in rows], "atol": tolerance.atol, "exact": not tolerance.near_ties}


def collapse_warning(predictions: Sequence[str], labels: Sequence[str], share: float = COLLAPSE_SHARE,
                     min_rows: int = COLLAPSE_MIN_ROWS, examples: int = 0) -> str | None:
    """One line when predictions collapse onto one label (a zero-shot small model often does), else None.
    ``examples``: how many few-shot examples the run had; the advice differs with and without them."""
    if len(predictions) < min_rows:
        return None
    counts = Counter(predictions)
    label, top = counts.most_common(1)[0]
    if top < share * len(predictions):
        return None
    distribution = ", ".join(f"{name} {counts[name]}" for name in labels)
    advice = ("give it a few labelled examples with --examples FILE (columns text, label)" if not examples else
              f"its {examples} example(s) were not enough: give at least one per label, clearer ones, or try a "
              "larger model (--model)")
    return (f"warning: {top} of {len(predictions)} rows ({top / len(predictions):.0%}) got {label!r} "
            f"({distribution}): the model may not be telling the labels apart; {advice}")


# --- the whole run ------------------------------------------------------------------------------------


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

    def summary(self) -> str:
        if self.prefix_cache:
            full = len(self.full_prompt_rows)
            prefix = (" · prefix cache: every row token-clean" if not full else
                      f" · prefix cache: {full} row(s) not token-clean at the prefix boundary ran in full "
                      f"({_rows_text(self.full_prompt_rows)})")
        else:
            prefix = " · no prefix cache"
        scored = self.rows if self.computed is None else self.computed
        resumed = f" ({self.resumed} resumed from a stopped run; the speed is this run's {scored} rows)" if self.resumed else ""
        return (f"{self.rows} rows -> {self.output}{resumed} · {scored / self.seconds:.2f} items/s overall · "
                f"{self.model} · {self.dtype} · {self.device} · {self.processes} process(es){prefix}")


def _step(state, work: Callable[[], Any]) -> Any:
    """Run ``work`` on every process, then tell every process whether any failed.

    Without this, a process that fails alone would leave the others waiting in the next collective.
    Here every process stops with the message of the lowest-numbered process that failed. Work that only
    rank 0 does after the last step (verification, writing) needs no relay: the others have finished.
    """
    from accelerate.utils import gather_object

    try:
        result, error = work(), None
    except Exception as caught:  # reported to every process below, then raised
        result, error = None, caught
    if state.num_processes > 1:
        reports = gather_object([(state.process_index, None if error is None else _one_line(error))])
        failed = [(rank, message) for rank, message in reports if message is not None]
        if failed:
            rank, message = failed[0]
            raise ProcessFailure(f"process {rank} of {state.num_processes}: {message}") from error
    if error is not None:
        raise error
    return result


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def classify_file(
    input_path: str | Path,
    labels: str | Sequence[str],
    output_path: str | Path,
    *,
    text_column: str = "text",
    model_name: str | None = None,
    dtype: str | None = None,
    strategy: str = "sorted",
    batch_size: int = 8,
    token_budget: int | None = None,
    prefix_cache: bool = True,
    whole_answers: bool | None = None,
    examples_path: str | Path | None = None,
    verify: int = 0,
    truncate: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    device: str | None = None,
    say: Callable[[str], None] = _say,
) -> ClassifyResult:
    """Classify every row of a CSV/JSONL file and write them, with their predictions, to ``output_path``.

    Order of work: every check that needs no model (labels, options, input, text column, output path,
    column clashes, few-shot file), then the labels as tokens (the tokenizer alone), then the model, then scoring
    (this process's share of the rows), then, on rank 0 only, verification and the atomic write. ``say`` receives the messages for a person
    (stderr by default), from rank 0 only. ``device``: "cpu", "cuda", "mps" or "auto" (CUDA, then MPS, then the
    CPU); None reads ``$SLM_DEVICE``, else auto. Under a launcher each process takes its own GPU.
    ``whole_answers``: score each label followed by the chat template's end-of-answer marker (``LabelScorer``'s
    ``complete``); None does so only when a label's tokens start another's (``account`` / ``account change``).
    """
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from .models import load_model, load_tokenizer, resolve_name

    from .models import pick_device, pick_dtype

    start = time.perf_counter()
    try:
        wanted = pick_device(device)  # auto: CUDA, then MPS, then the CPU
    except RuntimeError as error:  # an unavailable device, said before anything loads
        raise InputError(str(error)) from None
    # One process per GPU under torchrun / accelerate launch; CPU processes talk over gloo.
    state = PartialState(cpu=wanted.type == "cpu")
    if state.num_processes > 1 and wanted.type == "mps":
        raise InputError("several processes on one Apple GPU do not pay: run classify as one process with --device mps")
    run_device = state.device if state.num_processes > 1 else wanted  # each process's own GPU under a launcher
    main = state.is_main_process
    tell = say if main else (lambda message: None)

    def check():
        checked_labels = parse_labels(labels)
        if strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        if batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {batch_size}")
        if token_budget is not None and token_budget < 1:
            raise InputError(f"--token-budget must be >= 1, got {token_budget}")
        if verify < 0:
            raise InputError(f"--verify must be >= 0, got {verify}")
        output = check_output_path(output_path, overwrite, source=input_path)
        table = read_table(input_path, text_column)
        check_columns(table, checked_labels)
        examples = read_examples(examples_path, checked_labels) if examples_path else []
        return checked_labels, output, table, examples

    checked_labels, output, table, examples = _step(state, check)
    run_strategy = "token_budget" if token_budget else strategy

    def label_scorer():
        # The labels as tokens, before the model loads: labels only whole answers tell apart, with a template
        # that marks no end of an answer, stop here in one line.
        tokenizer = load_tokenizer(model_name)
        try:
            return tokenizer, LabelScorer(tokenizer, checked_labels, complete=whole_answers)
        except ValueError as error:
            raise InputError(f"{'--whole-answers' if whole_answers else '--labels'}: {error}") from None

    first_tokenizer, scorer = _step(state, label_scorer)
    plain = not uses_chat_template(first_tokenizer)
    job = resume.fingerprint(
        table.path, text_column, checked_labels, resolve_name(model_name)[0], str(pick_dtype(dtype, run_device)),
        examples, "plain" if plain else "chat",
        {"complete": scorer.complete, "method": scorer.method, "truncate": truncate})

    def discard_other_jobs():
        # --overwrite: progress of another job goes (start again); the same job's still resumes. Only the writer
        # removes, and every process waits for it (_step) before reading.
        if overwrite and main:
            resume.remove_other_jobs(output, job)

    def progress_so_far():
        # Every process reads every progress file before any appends to its own: _step waits for all of them.
        return resume.read_progress(output, job)

    _step(state, discard_other_jobs)
    done = _step(state, progress_so_far)
    if done:
        tell(f"resuming: {len(done):,} of {len(table):,} rows done (progress files beside {output}); scoring the rest")
    if plain:
        tell(f"{model_name or 'the model'}: its tokenizer has no chat template (a base model?): plain prompts, the "
             f"instruction, examples and text as text, each label scored after 'Category:'")
    if scorer.complete:
        why = ("--whole-answers" if not scorer.overlaps else
               f"needed: {scorer.overlaps[0][1]!r} starts with all of {scorer.overlaps[0][0]!r}'s tokens")
        tell(f"scoring whole answers, each label followed by the end-of-answer marker ({why})")

    def score_share():
        # load_model shares the cores out among this machine's processes (LOCAL_WORLD_SIZE)
        model, tokenizer, info = load_model(model_name, dtype=dtype, device=run_device, verbose=main)
        # The labels as the loaded model's tokenizer splits them (the same as above unless the model name resolved
        # differently in between, e.g. the hub came back): token ids must index this model's vocabulary.
        scorer = LabelScorer(tokenizer, checked_labels, complete=whole_answers)
        prepared = prepare_prompts(tokenizer, table.texts, checked_labels, examples,
                                   context_length(model, tokenizer), truncate, source=str(table.path),
                                   end_tokens=max(len(t) - len(l) for t, l in zip(scorer.token_ids, scorer.label_ids)))
        prefix = (PrefixCache.for_prompts(model, tokenizer, labels=checked_labels, examples=examples)
                  if prefix_cache else None)
        with state.split_between_processes([i for i in range(len(table)) if i not in done]) as mine:
            mine = list(mine)
        shard = []
        if mine:
            # Each finished batch lands in this process's progress file (helpers.resume) before the next runs.
            writer = resume.ProgressWriter(output, state.process_index, job)
            bar = tqdm(total=len(done) + len(mine), initial=len(done), desc="classify", disable=not (main and progress))

            def landed(items, log_scores, full):
                if torch.isnan(log_scores).any():  # never land a row as done that the run will reject
                    raise NonFiniteScores(f"NaN scores for rows {[mine[j] + 1 for j in items][:10]}: check the dtype")
                writer.append([mine[j] for j in items], log_scores.tolist(), full)
                bar.update(len(items))

            try:
                result = score_batched(model, tokenizer, scorer, [prepared.prompts[i] for i in mine], run_strategy,
                                       batch_size, token_budget, prefix, progress=False, on_batch=landed)
            finally:
                writer.close()
                bar.close()
            full = set(result.info["full_prompt_items"])
            shard = [(i, row.tolist(), j in full) for j, (i, row) in enumerate(zip(mine, result.log_scores))]
        return model, tokenizer, info, scorer, prepared, shard

    model, tokenizer, info, scorer, prepared, shard = _step(state, score_share)
    if prepared.truncated_rows:
        tell(f"cut {len(prepared.truncated_rows)} row(s) to fit the context (kept each text's head): "
             f"{_rows_text(prepared.truncated_rows, limit=10)}")
    gathered = gather_object(shard) if state.num_processes > 1 else shard
    outcome = ClassifyResult(None, len(table), 0.0, info.name, info.dtype, info.device, state.num_processes,
                             prefix_cache, truncated_rows=prepared.truncated_rows)
    if not main:
        outcome.seconds = time.perf_counter() - start
        return outcome
    computed = len(gathered)
    gathered = [*gathered, *((i, row, full) for i, (row, full) in done.items())]
    indices = [i for i, _, _ in gathered]
    if sorted(indices) != list(range(len(table))):
        raise RuntimeError(f"gathered {len(indices)} results for {len(table)} rows: some rows are missing or doubled")
    log_scores = torch.zeros((len(table), len(checked_labels)))
    for i, row, _ in gathered:
        log_scores[i] = torch.tensor(row)
    outcome.full_prompt_rows = sorted(i + 1 for i, _, full in gathered if full)
    if verify:
        stats = verify_sample(model, tokenizer, scorer, prepared.prompts, log_scores, verify)
        outcome.verification = stats
        ties = "" if stats["exact"] else (f" ({stats['near_ties']} near-tie(s) within {stats['atol']:g} counted as "
                                          f"agreement, max log-prob difference {stats['max_abs_diff']:.1e})")
        tell(f"verified {len(stats['rows'])} random rows against the one-at-a-time reference: all agree{ties}")
    scores = LabelScores(checked_labels, log_scores)
    outcome.predictions = scores.predictions
    write_records(result_records(table, scores), [*table.columns, *prediction_columns(checked_labels)], output)
    resume.remove_progress(output)  # the output holds every row now
    outcome.output = output
    outcome.resumed = len(done)
    outcome.computed = computed
    outcome.seconds = time.perf_counter() - start
    tell(outcome.summary())
    warning = collapse_warning(outcome.predictions, checked_labels, examples=len(examples))
    if warning:
        outcome.warnings.append(warning)
        tell(warning)
    return outcome
