"""Benchmarks: every technique, batch size and dtype in one run, checked against the float32 loop (notebook 04).

Each row of the result is one (strategy, batch size, dtype), timed on whole batches drawn from the plan of all 600
tickets at its size (``helpers.sweep``: the full-scale workload, whatever the batch size) and estimated for that
whole plan. Each strategy is warmed up once (on a GPU each row), then every row is timed ``repeats`` times; the
repeats run the rows in alternating order (forwards, backwards, ...), so a machine that drifts (heat, a neighbour)
spreads over all rows instead of favouring the first. A row reports the whole plan's median, min and max items/s
over its repeats (whole pipeline: tokenizing and forward passes) and the interval the draw leaves, how much of it
was tokenizing, the drawn batches' padding beside the plan's, agreement with the float32 one-at-a-time loop on
every drawn ticket, peak memory, and the share of the machine's measured matmul throughput ("roof") that went
into useful work. Notebook 04's section 2 writes the same loop out over the same functions (``helpers.rows``,
``helpers.sweep.estimate_plans``); this module serves ``python -m helpers bench``.

The roofs and kernel ceilings of each row: ``helpers.roofs``; the rows themselves: ``helpers.rows``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .attention import NAME as GQA_ATTENTION
from .batching import NonFiniteScores, score_batched
from .data import LABELS, build_prompt, encode_prompt, encode_prompts, few_shot_examples, make_tickets
from .models import load_model
from .models import HalfPrecisionError, free_memory, is_out_of_memory, pick_device
from .prefix_cache import PrefixCache
from .profile import machine_profile
from .scoring import LabelScorer, LabelScores
from .checks import agreement
from .sweep import MIN_TICKETS, POOL, STRATA, estimate_plans, estimate_row
from .rows import (STRATEGIES, generate_draw, plan_rows, reference_rows, row_draw, score_draw, sweep_batch_sizes,
                   warm_up, warm_up_rows)
from .roofs import peak_memory, roof_table

EXTRA_STRATEGIES = ("generate",)  # the generate + parse baseline of notebook 01 (float32, batch 1)
DEFAULT_STRATEGIES = tuple(STRATEGIES)
# The throughput-against-batch-size curve: SWEEP_STRATEGIES run at every batch size (at batch 1 each is a loop), the
# other batched ones only at ``others_at`` (their comparison needs one point, the curve needs many).
DEFAULT_BATCH_SIZES = None  # by device: SWEEP_BATCH_SIZES
DEFAULT_OTHERS_AT = 8
DEFAULT_DTYPES = None  # float32, plus each candidate dtype of the device the machine profile says is not slow
DEFAULT_REPEATS = 3


# --- the machine's roof -----------------------------------------------------------------------------


# --- what the matmul and attention kernels alone would take ------------------------------------------------


# --- peak memory ---------------------------------------------------------------------------------------


# --- the benchmark -----------------------------------------------------------------------------------


ATTENTION_CHOICES = (None, "auto", "sdpa", GQA_ATTENTION, "eager")


def _validate(strategies: Sequence[str], batch_sizes: Sequence[int], repeats: int, pool: int, attention=None) -> None:
    known = (*STRATEGIES, *EXTRA_STRATEGIES)
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}: choose from {', '.join(known)}")
    if not strategies:
        raise ValueError("no strategies to benchmark")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if repeats < 1 or pool < 1:
        raise ValueError(f"repeats and the pool must be >= 1, got repeats={repeats}, pool={pool}")
    too_big = [b for b in batch_sizes if 2 * b > pool]
    if too_big:
        raise ValueError(f"batch sizes {too_big} leave fewer than 2 whole batches in a plan of {pool} tickets: use at "
                         f"most {pool // 2}")
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention {attention!r}: choose from {', '.join(map(str, ATTENTION_CHOICES[1:]))}")


def _timed_rows(tokenizer, scorer, prompts, configs, repeats, progress, desc):
    """Warm up, then time every config ``repeats`` times in alternating order.

    ``configs``: (strategy name, batch size, compiled) -> (model, draw, prefix, compiled). Eager configs warm up as
    ``warm_up_rows`` says (every row on a GPU, where a warm-up is cheap), on a part of their draw (``warm_up``).
    A compiled config warms up on a full run of its draw, which is when torch.compile builds its kernels for the
    shapes the run meets. Returns, per config, its runs'
    ``LabelScores``, the peak memory over its runs and its warm-up seconds (NaN for an eager config whose
    strategy another config warmed up); and, per config that ran out of device memory, the reason (its other
    runs are dropped, the device's cache freed, and the rest go on).
    """
    runs = {key: [] for key in configs}
    memory = dict.fromkeys(configs, 0.0)
    warmup = dict.fromkeys(configs, float("nan"))
    failed: dict = {}

    def attempt(key, work):
        try:
            return work()
        except Exception as error:  # only running out of memory costs the row alone; anything else is a bug
            if not is_out_of_memory(error):
                raise
            failed[key] = f"out of memory at batch {key[1]} on {configs[key][0].device.type}"
            runs.pop(key, None)
            free_memory(configs[key][0].device)

    eager = [key[:2] for key, config in configs.items() if not config[3]]
    on_gpu = any(model.device.type != "cpu" for model, *_ in configs.values())
    warmed = warm_up_rows(eager, every_row=on_gpu)
    for key, (model, draw, prefix, compiled) in configs.items():
        if compiled or key[:2] in warmed:
            seconds = attempt(key, lambda: warm_up(model, tokenizer, scorer, prompts, draw, prefix, whole=compiled))
            warmup[key] = float("nan") if seconds is None else seconds
    keys = list(configs)
    with tqdm(total=repeats * len(keys), desc=desc, disable=not progress) as bar:
        for repeat in range(repeats):
            for key in keys if repeat % 2 == 0 else keys[::-1]:
                if key not in failed:
                    model, draw, prefix, _ = configs[key]
                    with peak_memory(model.device) as peak:
                        run = attempt(key, lambda: score_draw(model, tokenizer, scorer, prompts, draw, prefix))
                    if run is not None:
                        runs[key].append(run)
                        memory[key] = max(memory[key], peak["mb"])
                bar.update()
    return runs, memory, warmup, failed


def run_benchmark(
    model_name: str | None = None,
    pool: int = POOL,
    style: str = "article",
    shots: int = 6,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    batch_sizes: Sequence[int] | None = DEFAULT_BATCH_SIZES,
    dtypes: Sequence[str] | None = DEFAULT_DTYPES,
    repeats: int = DEFAULT_REPEATS,
    device: str | None = None,
    seed: int = 0,
    progress: bool = True,
    attention: str | None = "auto",
    compile: Sequence[str] = (),
    others_at: int | None = None,
    min_tickets: int | None = MIN_TICKETS,
    strata: int = STRATA,
) -> pd.DataFrame:
    """One row per (strategy, batch size, dtype), each timed on whole batches drawn from the plan of all ``pool``
    tickets (``helpers.sweep``) and estimated for that whole plan; agreement against the float32 loop on the same
    tickets.

    ``batch_sizes=None``: the device's sweep (``sweep_batch_sizes``: 1 to 32 on a CPU, to 256 on a GPU; batch 1 of
    a sweep's strategy is the loop row). ``others_at``: batched strategies outside ``SWEEP_STRATEGIES`` run only at
    this batch size (None: at every one). ``min_tickets``: tickets drawn per row at least (whole batches, at least
    one per stratum of ``strata``); None: every batch of the plan (the full run).

    ``token_budget`` rows use a budget of batch size x the median prompt length, so each batch size
    has a token-budget twin of the same average size. Loop-style strategies run once, at batch 1.
    ``dtypes=None`` runs float32, plus each half-precision dtype the machine profile measured on this device
    (``dtype_candidates``) unless its matmul ran below half of float32's (a line says so); a list runs exactly
    those. Every row records the machine profile, and the roof is the profile's matmul throughput in the row's
    dtype. ``attention`` goes to ``load_model``. ``compile``: strategies that also get a row run through
    ``torch.compile`` (``compiled`` column; the float32 reference loop stays eager). Its ``warmup_s`` includes the
    compiling, so a reader can weigh it against the seconds it saves per run. On a CPU, eager rows warm up once per
    strategy, at its largest batch size: ``warmup_s`` is NaN on the others.

    Items/s are the whole plan's, estimated (median, min and max over the repeats; ``interval_low`` and
    ``interval_high`` add what the draw cannot know, ``helpers.sweep``); padding is the drawn batches', beside the
    plan's (``plan_padding``); roof fraction, kernel ceiling and peak memory are the drawn batches'.
    """
    if batch_sizes is None:
        batch_sizes = sweep_batch_sizes(pick_device(device))
    _validate(strategies, batch_sizes, repeats, pool, attention)
    if others_at is not None and others_at < 1:
        raise ValueError(f"others_at must be >= 1 (or None: every batch size), got {others_at}")
    not_run = [name for name in compile if name not in strategies or name == "generate"]
    if not_run:
        raise ValueError(f"cannot compile {not_run}: name strategies of this run (not generate)")
    model, _, info = load_model(model_name, dtype="float32", device=device, verbose=True, attention=attention)
    profile = machine_profile(model, info, verbose=progress)
    skipped: list[str] = []
    if dtypes is None:
        dtypes, skipped = profile.choose_dtypes(None)
        for line in skipped:
            print(line)
    del model
    texts = make_tickets(pool, seed=seed, style=style)["text"].tolist()
    rows: list[dict] = []
    failed: list[dict] = []  # rows that could not run: out of memory, or a dtype that overflows
    raised: dict[str, tuple[float, float]] = {}
    reference: LabelScores | None = None
    loop_rate = None
    planned = plan_rows(strategies, batch_sizes, others_at)
    # float32 first: its loop is the reference every other row is compared with.
    ordered = sorted(dict.fromkeys(dtypes), key=lambda d: d != "float32")
    if "float32" not in ordered:
        ordered.insert(0, "float32")
    for dtype in ordered:
        kept = len(rows)
        model = compiled_model = None
        try:
            model, tokenizer, info = load_model(model_name, dtype=dtype, device=device, verbose=False, attention=attention)
            examples = few_shot_examples(shots)
            prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
            scorer = LabelScorer(tokenizer, LABELS)
            prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
            lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
            # Every row's batches, drawn from the plan of every prompt; the loop's, the reference, is timed with them.
            draws = {row: row_draw(*row, lengths, prefix.length, len(scorer.tail), min_tickets, strata)
                     for row in [*planned, ("loop", 1)]}
            checked = sorted({i for draw in draws.values() for i in draw.tickets})  # every timed ticket
            plan = [row for row in planned if row[0] != "generate" or dtype == "float32"] if dtype in dtypes else []
            compiled_model = None
            if any(name in compile for name, _ in plan):
                compiled_model = load_model(model_name, dtype=dtype, device=device, verbose=False, attention=attention)[0]
                compiled_model.forward = torch.compile(compiled_model.forward, dynamic=True)
            configs = {}
            row_keys = []  # the rows of this dtype, in plan order: (strategy name, batch size, compiled)
            for name, size in plan:
                if name == "generate":
                    row_keys.append((name, size, False))
                    continue
                for compiled in (False, True) if name in compile else (False,):
                    configs[name, size, compiled] = (compiled_model if compiled else model, draws[name, size],
                                                     prefix if STRATEGIES[name][1] else None, compiled)
                    row_keys.append((name, size, compiled))
            if dtype == "float32":  # the float32 loop: the reference, timed with the other rows
                configs.setdefault(("loop", 1, False), (model, draws["loop", 1], None, False))
            runs, memory, warmup, lost = _timed_rows(tokenizer, scorer, prompts, configs, repeats, progress,
                                                     f"benchmark {dtype} ({repeats} repeats)")
            if ("loop", 1, False) in lost and dtype == "float32":
                raise RuntimeError(f"the float32 loop, every row's reference, {lost['loop', 1, False]}")
            for key, reason in lost.items():
                failed.append({"strategy": key[0], "batch_size": key[1], "dtype": dtype, "reason": reason})
                print(f"{key[0]} at batch {key[1]} ({dtype}): {reason}; its row is left out, the others go on")
            row_keys = [key for key in row_keys if key not in lost]
            parsed = {}
            for key in row_keys:
                if key[0] == "generate":
                    with peak_memory(model.device) as peak:
                        run, parsed[key] = generate_draw(model, tokenizer, prompts, draws[key[:2]], LABELS)
                    runs[key], memory[key] = [run], peak["mb"]
            # Generation's time per ticket strays from the prefill cost model far more than a forward's: its own scatter.
            timed = [key for key in runs if key[0] != "generate"]
            priced = profile.in_dtype(dtype)  # a call's arithmetic in this dtype, its fixed cost as measured
            estimates = {**estimate_plans({key: draws[key[:2]] for key in timed}, {key: runs[key] for key in timed}, priced),
                         **estimate_plans({key: draws[key[:2]] for key in parsed}, {key: runs[key] for key in parsed}, priced)}
            if dtype == "float32":
                # The reference: every timed ticket one at a time (the loop row's own tickets are among them).
                reference = score_batched(model, tokenizer, scorer, [prompts[i] for i in checked], "loop", progress=False)
                loop_rate = estimates["loop", 1, False].items_per_s
            # Roof fraction and kernel ceiling are the drawn batches': useful work over their measured seconds.
            scored = [key for key in row_keys if key[0] != "generate"]
            roofs, roof_raised = roof_table(model, scorer, {key: draws[key[:2]] for key in scored},
                                            {key: runs[key] for key in scored}, lengths, prefix.length, profile)
            if roof_raised:
                raised[dtype] = roof_raised
            for key in row_keys:
                name, size, compiled = key
                draw, estimate = draws[name, size], estimates[key]
                expected = reference_rows(reference, checked, draw)
                if name == "generate":
                    labels = parsed[key]
                    measured = {"agreement": float(np.mean([a == b for a, b in zip(labels, expected.predictions)])),
                                "max_abs_diff": np.nan, "near_ties": 0, "tokenize_share": np.nan,
                                "unparseable": float(np.mean([label is None for label in labels]))}
                    used = dict.fromkeys(("useful_gflops", "roof_gflops", "roof_fraction", "kernel_ceiling"), np.nan)
                else:
                    measured = {**agreement(expected, runs[key][-1]), "unparseable": 0.0,
                                "tokenize_share": statistics.median(r.info["tokenize_seconds"] / r.info["seconds"]
                                                                    for r in runs[key])}
                    del measured["n"]
                    used = roofs[key]  # generated tokens are not ticket tokens: no roof fraction for generate
                rows.append({
                    **estimate_row(key[:2], estimate, profile),
                    "dtype": dtype,
                    "compiled": compiled,
                    **measured,
                    "peak_memory_mb": memory[key],
                    "warmup_s": warmup.get(key, np.nan),
                    **used,
                    "model": info.name,
                    "timing_only": info.timing_only,
                    "device": info.device,
                    "threads": info.threads,
                    "attention": info.attention,
                    "shots": shots,
                    "prefix_tokens": prefix.length,
                    "machine": profile.machine,
                    "profile": profile.caption(),
                })
            del model, compiled_model
        except (HalfPrecisionError, NonFiniteScores) as error:
            if dtype == "float32":
                raise
            del rows[kept:]  # a half dtype that overflows costs its own rows only
            model = compiled_model = None
            free_memory(pick_device(device))  # before the next dtype loads
            reason = str(error).splitlines()[0]
            failed = [lost for lost in failed if lost["dtype"] != dtype]  # one line per row, this reason
            failed += [{"strategy": name, "batch_size": size, "dtype": dtype, "reason": reason} for name, size in planned]
            print(f"{dtype}: {reason}; its rows are left out, the others go on")
    frame = pd.DataFrame(rows)
    frame["speedup_vs_loop"] = frame["items_per_s"] / loop_rate
    frame.attrs["loop_items_per_s"] = loop_rate  # measured even when "loop" is no row
    frame.attrs["profile"] = profile
    frame.attrs["skipped_dtypes"] = skipped
    # dtype -> (the profile's roof, the raised roof) in GFLOP/s, where a row's kernels ran faster than the profile's.
    frame.attrs["roof_raised"] = raised
    frame.attrs["failed"] = failed  # {strategy, batch_size, dtype, reason} per row left out
    frame.attrs["checked_tickets"] = len(checked)  # tickets every row's agreement was checked on (the last dtype's)
    return frame


def padding_by_strategy(tokenizer, n: int = 600, batch_size: int = 32, style: str = "article", seed: int = 0) -> pd.DataFrame:
    """Padding fraction of each batch plan on the zero-shot prompts (tokenizer only, no model run)."""
    from .batching import global_padding_factor, padding_report, plan_batches

    texts = make_tickets(n, seed, style)["text"]
    lengths = [len(encode_prompt(tokenizer, build_prompt(tokenizer, text))) for text in texts]
    rows = [{"strategy": "global maximum", "padding_fraction": 1 - 1 / global_padding_factor(lengths)}]
    budget = int(batch_size * np.median(lengths))
    for strategy in ("arbitrary", "sorted", "token_budget"):
        report = padding_report(lengths, plan_batches(lengths, strategy, batch_size, budget))
        rows.append({"strategy": strategy, "padding_fraction": report.padding_fraction})
    frame = pd.DataFrame(rows)
    frame.attrs.update(prompts="zero-shot", batch_size=batch_size, token_budget=budget, n=n, style=style)
    return frame
