"""Classify your own CSV or JSONL file: ``classify_file`` and ``python -m helpers classify`` (real use, after 01-03).
Every row comes out once, in input order, with its prediction columns, scored on the fastest verified path, resumable
(``helpers.resume``), in several processes under ``torchrun`` or ``accelerate launch`` (rank 0 writes)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from . import precision, resume, tables
from .batching import STRATEGIES, NonFiniteScores
from .checks import tolerance_for, verify_sample
from .data import encode_prompts, uses_chat_template
from .engine import (
    SPOT_EVERY,
    Engine,
    EngineError,
    SpotCheck,
    check_engine,
    check_golden_set,
    engine_identity,
    run_in_chunks,
    start_engine,
)
from .head import FOLDS, LabelHead, answer_states, fit_head, load_head, save_head
from .precision import (
    calibration_rows,
    choose_half,
    closing_lines,
    near_ties,
    run_plan,
    score_verified,
    settle_job_prior,
)
from .prefix_cache import PrefixCache, prefix_length
from .prior import PRIORS, Prior, calibrated, content_free_prior, mean_prior, sample_prior, save_prior
from .processes import Processes
from .profile import machine_profile
from .scoring import LabelScorer, LabelScores
from .tables import InputError, rows_text

# Rows per batch by default. On 300 article rows (3 shots, prefix cache, 2-core Xeon) float32 ran 4.3-5.2 items/s at
# 8 and 4.5-4.9 at 16, within noise; --dtype auto's half-precision pass 6.8-8.1 at 8 and 8.8-9.0 at 16.
BATCH_SIZE = 16
# A run where this share of the rows (of at least COLLAPSE_MIN_ROWS) gets one label ends with a warning.
COLLAPSE_SHARE = 0.9
COLLAPSE_MIN_ROWS = 10
# The label prior divided out of every row by default (helpers.prior; benchmarks/priors_imbalanced.py's table in
# docs/classify.md): the job's own mean, whose balanced accuracy on 10-row jobs stayed within 5 points of 80-row jobs';
# a job of fewer rows, whose mean would be mostly its own rows, gets the content-free prior.
PRIOR = "job"
JOB_PRIOR_MIN_ROWS = 10
# The job's prior is the mean probability of this many of its rows, spread over its length order (every row of a smaller
# job), scored before the others as a float32 run scores them: under --dtype auto too, so both precisions divide out
# the same prior. On 600 tickets (embedded model, 6 shots, float32) it moved accuracy at most 0.5 points from the whole
# job's mean (article 42.5 % -> 42.3 %, varied 42.3 % -> 42.8 %) and changed 5 and 17 labels, near ties after the
# prior; 64 rows changed 18 and 42. Under --dtype auto these rows run in float32 (docs/classify.md says what it costs).
PRIOR_ROWS = 128


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
    engine: str | None = None  # the engine that scored the rows (helpers.engine), if any

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
        cache = prefix if self.prefix_cache else " · no prefix cache"
        return f"{rows} overall · {where}" + (f" · scored by {self.engine}" if self.engine else cache)


@dataclass(frozen=True)
class Options:
    """``classify_file``'s options: the command's flags (``python -m helpers classify --help``; docs/classify.md)."""

    text_column: str = "text"
    model_name: str | None = None
    dtype: str | None = None
    strategy: str = "sorted"
    batch_size: int = BATCH_SIZE
    token_budget: int | None = None
    prefix_cache: bool = True
    whole_answers: bool | None = None
    examples_path: str | Path | None = None
    verify: int = 0
    prior: str | None = None
    label_column: str = "label"
    prior_from: str | Path | None = None
    save_prior: str | Path | None = None
    truncate: bool = False
    overwrite: bool = False
    restart: bool = False
    progress: bool = True
    device: str | None = None
    engine: str | None = None
    spot_check: int = SPOT_EVERY
    save_golden: str | Path | None = None
    fit_head: str | Path | None = None
    save_head: str | Path | None = None
    head_from: str | Path | None = None

    def check(self) -> None:
        """The options' own errors, one line each, before anything is read."""
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if self.prior not in (None, *PRIORS):
            raise InputError(f"unknown prior {self.prior!r}: use one of {', '.join(PRIORS)}")
        if self.prior_from is not None and self.prior is not None:
            raise InputError(f"--prior-from {self.prior_from} and --prior {self.prior}: give one of them")
        if self.label_column != "label" and self.prior != "labelled":
            raise InputError(f"--label-column {self.label_column}: only --prior labelled reads it")
        if self.save_prior is not None and (self.prior == "none" or (self.head and not self.prior)):
            why = (
                "--prior none"
                if self.prior == "none"
                else "a fitted head divides out none of its own (its bias is one)"
            )
            raise InputError(f"--save-prior with {why}: there is no prior to save")
        if self.save_golden is not None and not self.engine:
            raise InputError(f"--save-golden {self.save_golden} saves the golden set an engine passed: give --engine")
        saving = (
            ("--save-prior", self.save_prior),
            ("--save-head", self.save_head),
            ("--save-golden", self.save_golden),
        )
        for option, path in saving:
            if path is not None and not Path(path).parent.is_dir():
                raise InputError(f"{option} {path}: its folder does not exist")
        self._check_head()
        floors = {"--batch-size": (self.batch_size, 1), "--token-budget": (self.token_budget, 1)}
        floors.update({"--verify": (self.verify, 0), "--spot-check": (self.spot_check, 0)})
        for option, (value, least) in floors.items():
            if value is not None and value < least:
                raise InputError(f"{option} must be >= {least}, got {value}")

    def _check_head(self) -> None:
        if self.fit_head is not None and self.head_from is not None:
            raise InputError(f"--fit-head {self.fit_head} and --head-from {self.head_from}: give one of them")
        if self.save_head is not None and self.fit_head is None:
            raise InputError(f"--save-head {self.save_head} saves the head this run fits: give --fit-head LABELLED")
        if self.engine and (self.fit_head or self.head_from):
            why = "a fitted head reads the model's hidden state, which the engine does not return: drop --engine"
            raise InputError(f"--engine {self.engine}: {why}")

    @property
    def head(self) -> bool:
        """Whether the run scores with a fitted label head (``helpers.head``) instead of the labels' tokens."""
        return self.fit_head is not None or self.head_from is not None

    @property
    def plan(self) -> dict:
        """The batching plan every pass runs (score_batched's strategy, batch_size, token_budget)."""
        strategy = "token_budget" if self.token_budget else self.strategy
        return dict(strategy=strategy, batch_size=self.batch_size, token_budget=self.token_budget)


@dataclass
class Job:
    """What the run reads before any model loads: labels, output path, input table, few-shot examples; with
    ``--prior labelled`` each row's own label (its ``label`` column); what a saved prior is valid for."""

    labels: list[str]
    output: Path
    table: Any
    examples: list
    gold: list[str] | None = None
    scope: dict | None = None  # what a saved prior or head is valid for (helpers.prior.prior_scope)
    made_by: tuple = ()  # the model's resolved name and the prompt format
    labelled: list = field(default_factory=list)  # --fit-head's (text, label) rows
    prior: str = PRIOR  # the prior's name (PRIORS, or "file": --prior-from)
    prior_file: Prior | None = None  # --prior-from's, read before the model loads

    @classmethod
    def read(cls, input_path, labels, output_path, options: Options) -> Job:
        options.check()
        checked = tables.parse_labels(labels)
        output = tables.check_output_path(output_path, options.overwrite, source=input_path)
        table = tables.read_table(input_path, options.text_column)
        tables.check_columns(table, checked, raw=options.prior != "none")
        examples = tables.read_examples(options.examples_path, checked) if options.examples_path else []
        labelled = tables.read_examples(options.fit_head, checked, "labelled rows") if options.fit_head else []
        if options.fit_head and (unseen := [label for label in checked if label not in [y for _, y in labelled]]):
            raise InputError(f"--fit-head {options.fit_head}: no row is labelled {unseen}: fitting needs one of each")
        gold = [record.get(options.label_column) for record in table.records] if options.prior == "labelled" else None
        if gold is not None and (wrong := [n for n, label in enumerate(gold, start=1) if label not in checked]):
            why = f"--prior labelled needs a {options.label_column!r} column holding one of {', '.join(checked)}"
            why += " on every row (--label-column names it)"
            raise InputError(f"{table.path}: {rows_text(wrong)}: {why}")
        if gold is not None and (unseen := [label for label in checked if label not in gold]):
            raise InputError(f"{table.path}: --prior labelled needs a row of each label: none is labelled {unseen}")
        return cls(checked, output, table, examples, gold, labelled=labelled, prior=_prior_name(options, len(table)))


def _prior_name(options: Options, rows: int) -> str:
    """The prior a run divides out: as asked, else by the job's size; none under a fitted head (its bias is one)."""
    if options.prior_from:
        return "file"
    default = PRIOR if rows >= JOB_PRIOR_MIN_ROWS else "content-free"
    return options.prior or ("none" if options.head else default)


@dataclass
class Passes:
    """The scoring passes of one run, over the job's prompts by input row: the model (float32 under ``--dtype auto``),
    its tokenizer and label scorer, the prefix cache, the batching plan, and the verified path's half dtype."""

    model: Any
    tokenizer: Any
    scorer: LabelScorer
    prompts: list[str]
    plan: dict
    half: str | None = None
    prior: Prior | None = (
        None  # known before the first row (the job's sample, content-free, a file's): ties read after it
    )
    engine: Engine | None = None  # --engine: it scores the rows (the package's model: the golden set, --verify)
    spot: SpotCheck | None = None  # --engine: its rows checked against the package's as they land
    longest: int = 0  # the longest prompt's tokens and its longest label's: the engine's context (max_len)
    reload: Callable | None = None  # loads the package's model again (--verify after the engine's job released it)

    def release(self) -> None:
        """Free the package's model for the engine's job (its golden set, its spot checks' references and the prior
        are scored): on a GPU it no longer holds memory beside the engine's. ``checking_model`` loads it again."""
        from .models import free_memory

        device = self.model.device
        self.model = None
        self.plan.pop("prefix", None)  # the prefix cache holds the model too
        free_memory(device)

    def checking_model(self):
        """The package's float32 model, loaded again where the engine's job released it (``release``)."""
        if self.model is None:
            self.model = self.reload()[0]
        return self.model

    def share(self, rows: list[int], land: Callable, note: Callable | None = None) -> dict:
        """Score ``rows`` (input rows) on the fastest verified path; ``land(rows, scores, full, exact)`` as each batch
        lands, ``note(bound)`` as the verified path's bound is set or widened. Returns its run record, else {}."""

        def landed(items, scores, full, exact=self.half is None and self.exact):
            land([rows[j] for j in items], scores, full, exact)

        if self.engine is not None:
            self.score_exactly(rows, land)
            return {}
        chosen = [self.prompts[i] for i in rows]
        if self.half is None:
            run_plan(self.model, self.tokenizer, self.scorer, chosen, self.plan, on_batch=landed)
            return {}
        options = dict(self.plan, on_batch=landed, on_bound=note, progress=False)
        verified = score_verified(
            self.model, self.tokenizer, self.scorer, chosen, self.half, prior=self.prior, **options
        )
        run = {key: verified.info[key] for key in RUN_RECORD}
        return dict(run, rescored=[rows[j] for j in verified.info["rescored"]], source="process")

    @property
    def exact(self) -> bool:
        """Whether ``score_exactly`` gives float32's scores (not where a half dtype was asked for by name)."""
        if self.engine is not None:
            return self.engine.dtype == "float32"
        return self.model.dtype == torch.float32

    def score_exactly(self, rows: list[int], land: Callable) -> None:
        """``rows`` (input rows) as a float32 run scores them: by the engine, or by the package's model with autocast
        off, in sorted batches of ``precision.batch_for_few`` rows; ``land(rows, scores, full, exact)`` as each batch
        lands. In the run's dtype where one was named (``exact`` says which)."""

        def landed(items, scores, full=False):  # items: positions in ``rows``
            land([rows[j] for j in items], scores, full, self.exact)

        chosen = [self.prompts[i] for i in rows]
        if self.engine is not None:

            def checked(items, scores):  # the spot check names input rows
                self.spot([rows[j] for j in items], scores)

            ids = encode_prompts(self.tokenizer, chosen)
            run_in_chunks(self.engine, ids, range(len(rows)), landed, checked if self.spot else None)
        else:
            precision.rescore(self.model, self.tokenizer, self.scorer, chosen, **dict(self.plan, on_batch=landed))

    def rescore(self, rows: list[int]) -> torch.Tensor:
        """``rows``' log-scores in float32."""
        chosen = [self.prompts[i] for i in rows]
        return precision.rescore(
            self.model, self.tokenizer, self.scorer, chosen, **dict(self.plan, progress=False)
        ).log_scores

    def calibrate(self) -> tuple[list[int], LabelScores, dict]:
        """A bound measured now, on the whole job (a resumed run's rows were scored under an earlier one)."""
        options = dict(self.plan, progress=False)
        rows, first, error, bound, seconds = precision.calibrate(
            self.model, self.tokenizer, self.scorer, self.prompts, self.half, **options
        )
        run = dict(NO_RUN, threshold=bound, calibrated=bound, margin_error=error, calibration=len(rows), source="end")
        return rows, first, dict(run, phase_seconds=dict(calibration=seconds))


# What each process's verified path reports to rank 0; a bound from elsewhere (the end, a stopped run) fills the rest.
RUN_RECORD = ("threshold", "calibrated", "margin_error", "calibration", "evidence", "evidence_error", "phase_seconds")
NO_RUN = dict(margin_error=None, calibration=0, evidence=0, evidence_error=None, phase_seconds={}, rescored=[])


def classify_file(
    input_path: str | Path,
    labels: str | Sequence[str],
    output_path: str | Path,
    options: Options | None = None,
    say: Callable[[str], None] | None = None,
    **chosen,
) -> ClassifyResult:
    """Classify every row of a CSV/JSONL file and write them with their predictions to ``output_path``: the checks that
    need no model, the labels as tokens, resuming, the model, the precision, this process's share of the rows; then on
    rank 0 the bound and prior settled, verification and the atomic write. ``options`` (or its fields as keywords,
    e.g. ``dtype="auto"``): ``Options``, the command's; ``say`` gets rank 0's messages (default: stderr)."""
    options = replace(options or Options(), **chosen)
    with contextlib.ExitStack() as stack:
        return _classify(input_path, labels, output_path, options, say, stack)


def _to_stderr(message: str) -> None:
    """Rank 0's messages where no ``say`` was given."""
    print(message, file=sys.stderr)


def _say_nothing(message: str) -> None:
    """The other ranks' messages: rank 0 says them."""


def _classify(input_path, labels, output_path, options: Options, say, stack: contextlib.ExitStack) -> ClassifyResult:
    """``classify_file``'s run up to its passes; ``stack`` closes the engine it starts and puts back the LM head that a
    fitted head replaced."""
    start = time.perf_counter()
    group = Processes(options.device)
    tell = (say or _to_stderr) if group.main else _say_nothing
    job = group.step(partial(Job.read, input_path, labels, output_path, options))
    options = _one_model(group, options, tell)
    tokenizer, scorer = group.step(partial(_label_scorer, job.labels, options))
    job.prior_file, head = group.step(partial(_scope_files, job, options, tokenizer, scorer))
    fingerprint = group.step(partial(_fingerprint, job, scorer, options, group.device, head))
    progress = _read_progress(group, job, options, fingerprint)
    _say_how(tell, options, tokenizer, scorer, progress.done, len(job.table), job.output)
    if options.engine:  # a missing or mismatched engine environment is one line before any model loads
        group.step(partial(check_engine, options, group))
    from .models import load_model

    auto = options.dtype == "auto"
    float32 = auto or options.engine is not None  # an engine's golden set and --verify compare with the float32 model
    wanted = dict(dtype="float32" if float32 else options.dtype, device=group.device, verbose=group.main, say=tell)
    model, tokenizer, info = group.step(partial(load_model, options.model_name, tokenizer=tokenizer, **wanted))
    half = _precision(group, options, model, info, job, tell) if auto else None
    if auto:  # one precision per run: a resumed run reads it back (resume.resolved)
        progress.fingerprint["resolved"] = half or "float32"
    passes, cut = group.step(partial(_passes, model, tokenizer, scorer, job, options, half))
    passes.reload = partial(load_model, options.model_name, tokenizer=tokenizer, **dict(wanted, verbose=False))
    del model  # the passes hold it from here on: the engine's job releases it (Passes.release)
    if options.head:  # fitted on rank 0, handed out, in the LM head's place for the rest of the run
        head = head or group.decide(partial(_fitted_head, passes, job, options, tell))
        stack.enter_context(head.installed(passes.model))
        passes.scorer = head.scorer()
    engine = group.step(partial(_checked_engine, passes, job, options, group, stack, tell)) if options.engine else None
    if cut:
        tell(f"cut {len(cut)} row(s) to fit the context (kept each text's head): {rows_text(cut, limit=10)}")
    dtype = f"{half} verified in float32" if half else engine.dtype if engine else info.dtype
    where, engine_name = (info.name, dtype, info.device, group.count), engine and engine.describe()
    outcome = ClassifyResult(None, len(job.table), 0.0, *where, options.prefix_cache, engine=engine_name)
    outcome.truncated_rows = cut
    _score_and_conclude(group, passes, job, progress, outcome, options, tell)
    if passes.spot:
        tell(passes.spot.line())
    outcome.seconds = time.perf_counter() - start
    if group.main:
        tell(outcome.summary())
    if group.main and (warning := collapse_warning(outcome.predictions, job.labels, len(job.examples), job.prior)):
        outcome.warnings.append(warning)
        tell(warning)
    return outcome


@dataclass
class Progress:
    """What the job's progress files hold before any row is scored, read by every process: the job's fingerprint
    (``resume.fingerprint``), the rows done {row: (scores, full, exact)}, the stopped run's largest bound."""

    fingerprint: dict
    done: dict
    earlier: float | None


def _read_progress(group: Processes, job: Job, options: Options, fingerprint: dict) -> Progress:
    """Under several processes, their output folder checked to be one; --overwrite removes another job's progress
    (the writer alone; the same job's still resumes), --restart this job's too. Rank 0 reads every progress file
    before any process appends to its own, and hands out what was decided: the rows done (the other processes need
    only which; rank 0 keeps their scores) and the stopped run's largest bound."""
    group.check_shared(job.output.parent, job.output.name)  # one folder for every process's progress files
    keep = None if options.restart else fingerprint  # --restart: this job's progress too
    wanted = options.restart or options.overwrite
    group.step(lambda: wanted and group.main and resume.remove_progress(job.output, keep=keep))
    done = group.step(lambda: resume.read_progress(job.output, fingerprint) if group.main else {})
    rows = group.decide(lambda: sorted(done))
    done = done if group.main else dict.fromkeys(rows)
    earlier = group.decide(partial(resume.recorded_bound, job.output))  # the stopped run's bound, if it noted one
    return Progress(fingerprint, done, earlier)


def _score_and_conclude(group, passes: Passes, job: Job, progress: Progress, outcome, options: Options, tell) -> None:
    """The prior known before the first row, this process's share of the rows, gathered; on rank 0 the end of the run
    (``_conclude``)."""
    bar = options.progress and group.main
    fixed, sampled = _known_prior(group, passes, job, progress, bar)
    passes.prior, done = fixed, progress.done
    mine = group.share([i for i in range(len(job.table)) if i not in done and i not in sampled])
    if passes.engine is not None:  # the package's part is done before the engine's job: its model is freed for it
        if passes.spot:
            passes.spot.prepare(mine)
        passes.release()
        tell("the package's model is released for the engine's job (--verify loads it again)")
    fingerprint = progress.fingerprint
    scored, run = group.step(partial(_score_share, passes, mine, job.output, group, fingerprint, bar, len(done)))
    pairs, runs = group.gather(list(scored.items())), [run for run in group.gather([run]) if run]
    outcome.resumed, outcome.computed = len(done), len(pairs) + len(sampled)
    if group.main:
        rows = {**dict(pairs), **done, **sampled}
        gathered = Gathered(rows, runs, job.prior, fixed, bool(done), job.gold, progress.earlier)
        _conclude(passes, job, gathered, outcome, options, tell)


@dataclass
class Gathered:
    """What every process scored, on rank 0: each input row's (log-scores, ran in full, float32's) with the resumed
    ones, the verified path's run records, the prior's name and its value known before the first row (the job's
    sample, content-free, a file's), whether rows resumed."""

    rows: dict
    runs: list
    prior: str
    fixed: Prior | None
    resumed: bool
    gold: list[str] | None = None
    earlier: float | None = None  # the largest bound the stopped run noted

    def rule(self) -> Callable[[LabelScores], Prior | None]:
        """The prior the run divides out, from its scores: fitted to its labelled rows, or fixed before the first row
        (the job's sample, content-free, a file's)."""

        def fitted(scores):
            return sample_prior(scores, self.gold)

        def known(scores):
            return self.fixed

        return fitted if self.prior == "labelled" else known


def _conclude(passes: Passes, job: Job, gathered: Gathered, outcome: ClassifyResult, options: Options, tell) -> None:
    """Rank 0's end of the run: the bound and the prior settled, ``--verify``, what was proven said, the write."""
    rows = gathered.rows
    runs = gathered.runs
    fixed = gathered.fixed
    half = passes.half
    if sorted(rows) != list(range(len(job.table))) or outcome.computed + outcome.resumed != len(rows):
        raise RuntimeError(f"gathered {len(rows)} results for {len(job.table)} rows: some rows are missing or doubled")
    outcome.full_prompt_rows = sorted(i + 1 for i, (_, full, _) in rows.items() if full)
    scores = LabelScores(job.labels, torch.tensor([rows[i][0] for i in range(len(rows))]))
    rescored = {i for run in runs for i in run["rescored"]}
    exact = {i for i, (_, _, was_exact) in rows.items() if was_exact}
    if half and len(exact) < len(rows):  # every label float32's under the prior, under the processes' largest bound
        scores, fixed, added, runs = _settle(passes, scores, exact, runs, gathered)
        rescored |= set(added)
    else:
        fixed = gathered.rule()(scores)
    outcome.rescored = sorted(i + 1 for i in rescored)
    if options.verify:
        outcome.verification = _verify(passes, scores, options.verify, fixed, tell)
    if fixed is not None:
        scores, outcome.prior = calibrated(scores, fixed), fixed
        tell(f"{fixed}: divided out of every row's label probabilities (the raw_p_ columns: without it)")
    if options.save_prior:  # a later job divides the same prior out (--prior-from), whatever else its file holds
        save_prior(fixed, options.save_prior, job.scope)
        tell(f"prior saved to {options.save_prior}: pass --prior-from {options.save_prior} to later jobs")
    outcome.predictions = scores.predictions
    if half:
        for line in closing_lines(runs, len(outcome.rescored), len(job.table), half, outcome.processes, fixed):
            tell(line)
    elif outcome.dtype != "float32":  # a half dtype asked for by name: unverified, its near ties said
        atol = tolerance_for(outcome.dtype).atol
        ties = len(near_ties(scores, atol))
        near = f"{ties} of {len(scores)} rows have their top two labels within {atol:g}, near ties that rounding may"
        tell(f"{outcome.dtype}, unverified: {near} order either way (--dtype auto rescores such rows in float32)")
    tables.write_results(job.table, scores, job.output)
    resume.remove_progress(job.output)  # the output holds every row now
    outcome.output = job.output


def _checked_engine(passes: Passes, job: Job, options: Options, group: Processes, stack, tell) -> Engine:
    """``--engine``: the engine started, sized to the job's longest prompt (not the model's whole context, for which
    it would size its cache), closed with ``stack``; then held to the package on the golden set before any row is
    scored (a mismatch stops the run, nothing written), and its spot check set."""
    from .models import free_memory

    free_memory(
        group.device
    )  # what the package's loading left cached on a GPU goes back before the engine sizes itself
    engine = stack.enter_context(start_engine(options, passes.scorer, group, max_len=passes.longest))
    save = (options.save_golden, job.scope) if options.save_golden else None
    passes.engine = check_golden_set(engine.ready(), passes.tokenizer, passes.prompts, passes.rescore, tell, save)
    passes.spot = SpotCheck(engine, passes.rescore, options.spot_check)
    return engine


def _one_model(group: Processes, options: Options, tell) -> Options:
    """``options`` with the model every process loads: resolved on rank 0 (the default is Qwen where it is cached,
    else the embedded model, which a machine's cache decides) and handed out, so that no process scores its share
    with another model; one that cannot load it stops them all (``Processes.step``)."""
    from .models import DEFAULT_MODEL, EMBEDDED_NAME, resolve_name

    resolved, reason = group.decide(partial(resolve_name, options.model_name))
    if reason:
        tell(f"{DEFAULT_MODEL} is {reason}: using the embedded {EMBEDDED_NAME} instead.")
    return replace(options, model_name=resolved)


def _label_scorer(labels: list[str], options: Options):
    """The tokenizer and the labels as tokens, before the model loads (labels only whole answers tell apart stop)."""
    from .models import load_tokenizer

    tokenizer = load_tokenizer(options.model_name)
    try:
        return tokenizer, LabelScorer(tokenizer, labels, complete=options.whole_answers)
    except ValueError as error:
        raise InputError(f"{'--whole-answers' if options.whole_answers else '--labels'}: {error}") from None


def _scope_files(job: Job, options: Options, tokenizer, scorer) -> tuple[Prior | None, LabelHead | None]:
    """``--prior-from``'s prior and ``--head-from``'s head, each checked against what this job's scores depend on
    (``prior_scope``), before the model loads. Sets ``job.made_by`` (the fingerprint's model and prompt format) and
    ``job.scope`` (what ``--save-prior`` and ``--save-head`` record)."""
    from .models import resolve_name
    from .prior import load_prior, prior_scope

    job.made_by = resolve_name(options.model_name)[0], "chat" if uses_chat_template(tokenizer) else "plain"
    job.scope = prior_scope(job.made_by[0], job.labels, job.examples, job.made_by[1], scorer.complete)
    loaded = []
    for option, path, load in (
        ("--prior-from", options.prior_from, load_prior),
        ("--head-from", options.head_from, load_head),
    ):
        try:
            loaded.append(load(path, job.scope) if path else None)
        except ValueError as error:
            raise InputError(f"{option} {error}") from None
    return loaded[0], loaded[1]


def _fitted_head(passes: Passes, job: Job, options: Options, tell) -> LabelHead:
    """``--fit-head``: the labels' LM-head rows fitted to the labelled rows' mean hidden states over their own
    tokens, in this job's prompt (its examples and format), kept beside the progress files (a resumed run reads it
    back) and saved with ``--save-head``. Rank 0's, said in one line."""
    kept, labelled = resume.head_path(job.output), _labelled_digest(job)
    with contextlib.suppress(ValueError):  # none kept, or another job's: fitted anew
        head = load_head(kept, job.scope)
        if head.info.get("labelled") == labelled:
            tell(f"--fit-head: the head the stopped run fitted on {head.info['fitted_on']} rows, read back")
            return head
    head = _fit_labelled(passes, job, options, tell)
    head.info["labelled"] = labelled
    save_head(head, kept, job.scope)
    if options.save_head:
        save_head(head, options.save_head, job.scope)
        tell(f"head saved to {options.save_head}: pass --head-from {options.save_head} to later jobs")
    return head


def _labelled_digest(job: Job) -> str:
    return hashlib.sha256(json.dumps(job.labelled).encode()).hexdigest()[:16]


def _fit_labelled(passes: Passes, job: Job, options: Options, tell) -> LabelHead:
    texts, tokenizer = [text for text, _ in job.labelled], passes.tokenizer
    limit = tables.context_limit(passes.model, tokenizer, options.model_name or "the model")
    fit = (options.truncate, str(options.fit_head))
    prompts, cut, _ = tables.prepare_prompts(tokenizer, texts, job.labels, job.examples, limit, *fit)
    if cut:
        tell(f"--fit-head: cut {len(cut)} labelled row(s) to fit the context: {rows_text(cut, limit=10)}")
    # The head reads the mean final state over each ticket's own tokens (after the shared prefix): on the hand-written
    # tickets it beats the answer position alone (docs/classify.md).
    ticket = prefix_length(tokenizer, labels=job.labels, examples=job.examples)
    states = answer_states(passes.model, tokenizer, prompts, passes.plan["batch_size"], mean_from=ticket)
    gold = [label for _, label in job.labelled]
    head = fit_head(LabelHead.from_lm_head(passes.model, passes.scorer), states, gold, mean_from=ticket)
    info = head.info
    fitted = f"a label head (on each row's mean state) fitted on {info['fitted_on']} rows of {options.fit_head}"
    pull = f"pull towards the LM head's rows {info['strength']:g}, by {FOLDS}-fold cross-validation"
    tell(f"{fitted} ({pull}; {info['training_accuracy']:.0%} of its own rows right): it scores every row")
    return head


def _fingerprint(job: Job, scorer, options: Options, device, head: LabelHead | None = None) -> dict:
    from .models import pick_dtype, weights_identity

    scoring = {"complete": scorer.complete, "method": scorer.method, "truncate": options.truncate}
    if options.head:  # the head's numbers, or what it is fitted on (a resumed run reads the fitted head back)
        scoring["head"] = head.digest() if head is not None else f"fitted on {_labelled_digest(job)}"
    auto = options.dtype == "auto"
    if auto:  # which rows the half pass rescores depends on the prior (progress files hold raw scores otherwise)
        scoring["prior"] = str(job.prior_file or job.prior)
    if options.engine:  # an engine's float32 sums in another order than the package's, another version's in its own
        scoring["engine"] = engine_identity(options.engine)
    dtype, (model, prompt_format) = "auto" if auto else str(pick_dtype(options.dtype, device)), job.made_by
    if options.engine:  # the dtype the engine runs, whatever the device's default
        dtype = options.dtype or "float32"
    weights = weights_identity(model)
    fields = options.text_column, job.labels, model, weights, dtype, job.examples, prompt_format, scoring
    return resume.fingerprint(job.table.path, *fields)


def _say_how(tell, options: Options, tokenizer, scorer, done: dict, rows: int, output: Path) -> None:
    """The lines that say how the job will run, before the model loads."""
    if done:
        tell(f"resuming: {len(done):,} of {rows:,} rows done (progress files beside {output}); scoring the rest")
    if not uses_chat_template(tokenizer):
        plain = "plain prompts, the instruction, examples and text as text, each label scored after 'Category:'"
        tell(f"{options.model_name or 'the model'}: its tokenizer has no chat template (a base model?): {plain}")
    if scorer.complete and not options.head:
        why = "--whole-answers"
        if scorer.overlaps:
            why = f"needed: {scorer.overlaps[0][1]!r} starts with all of {scorer.overlaps[0][0]!r}'s tokens"
        tell(f"scoring whole answers, each label followed by the end-of-answer marker ({why})")


def _precision(group: Processes, options: Options, model, info, job: Job, tell) -> str | None:
    """``--dtype auto``'s half dtype (None: float32), chosen once for the whole run: as the stopped run of this job
    recorded it, else by rank 0's machine profile (notebook 00), handed to every process. ``--prior labelled`` fits
    every row's scores, which must then be float32's: it runs in float32."""
    recorded = group.decide(partial(resume.resolved, job.output))  # read on rank 0, handed out
    if recorded is not None:
        tell(f"--dtype auto: {recorded}, as the stopped run of this job resolved it (one precision per run)")
        return None if recorded == "float32" else recorded
    if job.prior == "labelled":
        tell("--dtype auto: float32 (--prior labelled is fitted to every row's scores, so every row runs in float32)")
        return None
    if job.prior == "job" and len(job.table) <= PRIOR_ROWS:
        sample = f"the job's prior scores up to {PRIOR_ROWS} rows in float32, and this job has {len(job.table)}"
        tell(f"--dtype auto: float32 ({sample}: none is left for half precision)")
        return None
    half, why = group.decide(lambda: choose_half(machine_profile(model, info, say=tell)))
    shared = f" (chosen on process 0 for all {group.count})" if group.count > 1 else ""
    tell(f"--dtype auto: {why}{shared}" + (", matmuls only, verified: near ties rescored in float32" if half else ""))
    return half


def _passes(model, tokenizer, scorer, job: Job, options: Options, half):
    """The run's ``Passes`` and the rows cut to fit (1-based), on every process."""
    # scorer: built on the tokenizer the model was loaded with (its token ids index this vocabulary)
    end_tokens = max(len(t) - len(label) for t, label in zip(scorer.token_ids, scorer.label_ids))
    limit = tables.context_limit(model, tokenizer, options.model_name or "the model")
    texts, fit = [record[options.text_column] for record in job.table.records], (options.truncate, str(job.table.path))
    prompts, cut, longest = tables.prepare_prompts(tokenizer, texts, job.labels, job.examples, limit, *fit, end_tokens)
    plan = options.plan
    if options.prefix_cache:  # float32 in every pass, also --dtype auto's half-precision ones (helpers.precision)
        plan["prefix"] = PrefixCache.for_prompts(model, tokenizer, labels=job.labels, examples=job.examples)
    labels = max(len(ids) for ids in scorer.token_ids)  # as scored after a prompt (a leading space, an end marker)
    return Passes(model, tokenizer, scorer, prompts, plan, half, longest=longest + labels), cut


def _score_share(
    passes: Passes, mine: list[int], output: Path, group: Processes, fingerprint: dict, bar_on: bool, done: int
):
    """This process's rows, each landing in its progress file as its batch finishes: {row: (scores, full, exact)},
    and the verified path's run record."""
    scored, run = {}, {}
    if not mine:
        return scored, run
    writer = resume.ProgressWriter(output, group.rank, fingerprint)
    bar = tqdm(total=done + len(mine), initial=done, desc="classify", disable=not bar_on)
    try:
        run = passes.share(mine, _lander(writer, scored, bar), writer.bound)
    except (EngineError, KeyboardInterrupt) as error:  # a dead, hung or interrupted run: say what it kept
        why = str(error).splitlines()[0] if str(error) else "interrupted"
        kept = f"{done + len(scored)} of the job's rows are kept in {output.name}'s progress files"  # this process's
        raise Stopped(f"{why}; {kept}: rerun the same command to resume") from error
    finally:
        writer.close()
        bar.close()
    return scored, run


class Stopped(RuntimeError):
    """A run stopped part-way (its engine failed, or Ctrl-C): one line saying why and how many rows it kept."""


def _known_prior(group: Processes, passes: Passes, job: Job, progress: Progress, bar_on: bool):
    """The prior known before the first row is scored, computed in float32 under --dtype auto as a float32 run computes
    it, so both precisions divide out the same one: a file's, the content-free one (every process alike) or the job's
    from its sample (``_job_prior``, on rank 0, handed out); None for none and a labelled sample's (fitted at the end).
    Returns (the prior, {row: (scores, full, exact)} the job's sample scored now)."""
    if job.prior == "content-free":
        tokenizer, examples = passes.tokenizer, job.examples
        return group.step(partial(content_free_prior, passes.model, tokenizer, passes.scorer, examples)), {}
    if job.prior != "job":
        return job.prior_file, {}
    sampled, fixed = group.decide(partial(_job_prior, passes, progress.done, job.output, progress.fingerprint, bar_on))
    for row in sampled:  # a resumed row of the sample that was not float32's, scored again
        progress.done.pop(row, None)
    return fixed, sampled


def _job_prior(passes: Passes, done: dict, output: Path, fingerprint: dict, bar_on: bool) -> tuple[dict, Prior]:
    """Rank 0's ``--prior job``: the mean probabilities of ``PRIOR_ROWS`` rows spread over the job's length order
    (``calibration_rows``), scored as a float32 run scores them (``Passes.score_exactly``: in float32 under --dtype
    auto) unless a stopped run did; the rows it scored land in its progress file. Returns ({row: (scores, full,
    exact)} scored now, the prior)."""
    sample = calibration_rows(passes.tokenizer, passes.prompts, PRIOR_ROWS)
    # The sample's rows a stopped run did not score (or, from older progress files, scored in half precision). Scored
    # in other batches than an uninterrupted run's, their scores, and so the prior, can differ from its in the last
    # bits (as any float32 scores do between batch shapes): a label moves only where two labels tie to that digit.
    todo = [i for i in sample if i not in done or (passes.exact and not done[i][2])]
    scored = {}
    if todo:
        writer = resume.ProgressWriter(output, 0, fingerprint)
        bar = tqdm(total=len(todo), desc="the job's prior", disable=not bar_on)
        try:
            passes.score_exactly(todo, _lander(writer, scored, bar))
        finally:
            writer.close()
            bar.close()
    rows = {**done, **scored}
    scores = LabelScores(passes.scorer.labels, torch.tensor([rows[i][0] for i in sample]))
    dtype = passes.engine.dtype if passes.engine is not None else str(passes.model.dtype).removeprefix("torch.")
    spread = f"{len(sample)} of the job's {len(passes.prompts)} rows spread over its lengths"
    if len(sample) == len(passes.prompts):
        spread = f"the job's {len(sample)} rows"
    return scored, mean_prior(scores, f"{spread}, in {dtype}")


def _lander(writer: resume.ProgressWriter, scored: dict, bar) -> Callable:
    """A ``land(rows, log_scores, full, exact)`` that writes each batch to ``writer``'s progress file, keeps its rows in
    ``scored`` and moves ``bar`` by the rows new to it (a rescored row lands again)."""

    def land(rows, log_scores, full, exact):
        if torch.isnan(log_scores).any():  # never land a row as done that the run will reject
            raise NonFiniteScores(f"NaN scores for rows {[i + 1 for i in rows][:10]}: check the dtype")
        writer.append(rows, log_scores.tolist(), full, exact)
        fresh = [i for i in rows if i not in scored]  # a rescored row lands again: counted once
        scored.update((i, (row, full, exact)) for i, row in zip(rows, log_scores.tolist()))
        bar.update(len(fresh))

    return land


def _settle(passes: Passes, scores: LabelScores, exact: set, runs: list, gathered: Gathered):
    """A verified run's last step, on rank 0 (``settle_job_prior``): every row not float32's whose margin under the
    prior the run ends with is under the largest bound (the processes', the stopped run's, and where rows were resumed
    or none was scored, one measured now: ``Passes.calibrate``) is rescored in float32, each read as evidence that
    widens the bound where it exceeds it. Returns (scores, prior, rows rescored, runs)."""
    log_scores = scores.log_scores.clone()
    if gathered.resumed or not runs:
        rows, first, run = passes.calibrate()
        runs = [*runs, run]
        log_scores[rows] = first.log_scores
        exact = exact | set(rows)
    if gathered.earlier is not None:  # the resumed half rows were scored under it
        runs = [*runs, dict(NO_RUN, threshold=gathered.earlier, calibrated=gathered.earlier, source="stopped")]
    bound = max(run["threshold"] for run in runs)
    settled = settle_job_prior(LabelScores(scores.labels, log_scores), exact, bound, passes.rescore, gathered.rule())
    result, prior, added, final, error = settled
    if added:  # the rows rescored here were scored both ways too
        runs = [*runs, dict(NO_RUN, threshold=final, calibrated=bound, evidence=len(added), evidence_error=error)]
        runs[-1]["source"] = "settle"
    return result, prior, added, runs


def _verify(passes: Passes, scores: LabelScores, k: int, fixed, tell) -> dict:
    """--verify: under --dtype auto float32's labels, under the prior the run ends with (its promise)."""
    half, engine = passes.half, passes.engine
    shift = (fixed.for_labels(scores.labels) if fixed is not None else 0.0) if half else None
    model = passes.checking_model()
    tokenizer = passes.tokenizer
    scorer = passes.scorer
    dtype = half or (engine and engine.dtype)
    stats = verify_sample(model, tokenizer, scorer, passes.prompts, scores.log_scores, k, dtype=dtype, shift=shift)
    ties = f" ({stats['near_ties']} near-tie(s) within {stats['atol']:g} counted as agreement, max log-prob"
    ties += f" difference {stats['max_abs_diff']:.1e})"
    agree = f"all agree{'' if stats['exact'] else ties}"
    tell(f"verified {len(stats['rows'])} random rows against the one-at-a-time reference: {agree}")
    return stats
