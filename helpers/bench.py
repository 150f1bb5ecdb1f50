"""Benchmarks: every technique, batch size and dtype in one run, checked against the float32 loop (notebook 04).

Each row of the result is one (strategy, batch size, dtype), timed on whole batches drawn from the plan of all 600
tickets at its size (``helpers.sweep``: the full-scale workload, whatever the batch size) and estimated for that
whole plan. Each strategy is warmed up once (on a GPU each row), then every row is timed ``repeats`` times; the
repeats run the rows in alternating order (forwards, backwards, ...), so a machine that drifts (heat, a neighbour)
spreads over all rows instead of favouring the first. A row reports the whole plan's median, min and max items/s
over its repeats (whole pipeline: tokenizing and forward passes) and the interval the draw leaves, how much of it
was tokenizing, the drawn batches' padding beside the plan's, agreement with the float32 one-at-a-time loop on
every drawn ticket, peak memory, and the share of the machine's measured matmul throughput ("roof") that went
into useful work. Notebook 04 writes the same loop out over the same functions (``row_draw``, ``warm_up``,
``score_draw``, ``reference_rows``, ``helpers.sweep.estimate_plans``).

**Useful work** is what the one-at-a-time loop must compute for a ticket beyond the cached prefix, counted
in multiply-adds x 2, per ticket with s own tokens and c label-continuation tokens:

- every transformer weight matrix (all parameters but the embeddings) on each of the s + c tokens;
- attention: for a token that sees L earlier tokens (prefix included), q.k and p.v cost 4 x heads x head_dim
  x L per layer; the i-th own token sees prefix + i, a continuation token the row and its own branch;
- the output layer (hidden x vocabulary) at the 1 + c scored positions.

Not useful: padding, the prefix (computed once, outside the timing), softmax, norms and the rest of the
elementwise work. The roof is one matmul of the model's MLP shape at a size that keeps the device busy
(``profile.roof_shape``), the fastest of several steady blocks (a maximum, ``profile.matmul_gflops``), so
``roof_fraction`` stays below 1. Where the row's own kernels, timed alone, do more useful work per second than
that measurement, the roof is raised to their rate and the frame says so (``attrs["roof_raised"]``): a roof is
an upper bound of what was measured in the run.

**Kernel ceiling**: the roof fraction the row would reach if its forward passes were nothing but their matmuls
and attention calls, each timed alone on the row's own shapes (``kernel_seconds``). Matmuls run close to the
roof; CPU attention kernels run well below it (the softmax between the two products), and padded batches attend
over padding. ``roof_fraction / kernel_ceiling`` estimates the share of the row's time those kernels take (they
are timed apart, with warm caches); the rest is norms, rotary embeddings, activations, copies and Python, the
work ``torch.compile`` fuses.
"""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .attention import NAME as GQA_ATTENTION
from .batching import NonFiniteScores, score_batched
from .data import LABELS, build_prompt, encode_prompt, encode_prompts, few_shot_examples, make_tickets
from .models import HalfPrecisionError, free_memory, is_out_of_memory, load_model, pick_device
from .prefix_cache import PrefixCache
from .profile import machine_profile, matmul_gflops, roof_shape
from .scoring import LabelScorer, LabelScores, agreement, generate_answer, parse_label
from .sweep import (
    MIN_TICKETS,
    POOL,
    STRATA,
    SWEEP_LOOPS,
    SWEEP_STRATEGIES,
    Draw,
    draw_batches,
    estimate_plans,
    estimate_row,
)
from .timing import Stopwatch

# name -> (batching strategy, uses the prefix cache)
STRATEGIES = {
    "loop": ("loop", False),
    "loop_prefix": ("loop", True),
    "arbitrary": ("arbitrary", False),
    "sorted": ("sorted", False),
    "token_budget": ("token_budget", False),
    "sorted_prefix": ("sorted", True),
}
EXTRA_STRATEGIES = ("generate",)  # the generate + parse baseline of notebook 01 (float32, batch 1)
DEFAULT_STRATEGIES = tuple(STRATEGIES)
# The throughput-against-batch-size curve: SWEEP_STRATEGIES run at every batch size (at batch 1 each is a loop), the
# other batched ones only at ``others_at`` (their comparison needs one point, the curve needs many).
DEFAULT_BATCH_SIZES = None  # by device: SWEEP_BATCH_SIZES
SWEEP_BATCH_SIZES = {"cpu": (1, 2, 4, 8, 16, 32), "gpu": (1, 2, 4, 8, 16, 32, 64, 128, 256)}
DEFAULT_OTHERS_AT = 8
DEFAULT_DTYPES = None  # float32, plus each candidate dtype of the device the machine profile says is not slow
DEFAULT_REPEATS = 3


# --- the machine's roof -----------------------------------------------------------------------------


def non_embedding_parameters(model) -> int:
    """Parameters doing per-token matmuls: everything but the input embedding and the output layer."""
    skip = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        skip.add(id(model.get_output_embeddings().weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def useful_flops(model, lengths: Sequence[int], prefix_tokens: int, scorer: LabelScorer) -> float:
    """FLOPs the loop must spend on these tickets beyond the cached prefix (see the module docstring)."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_key = 4 * config.num_hidden_layers * heads * head_dim  # q.k and p.v, per query token and key
    weights = 2 * non_embedding_parameters(model)
    output = 2 * config.hidden_size * config.vocab_size
    tail = len(scorer.tail)
    tail_keys = int(scorer.tail_offsets.sum()) + tail  # branch token k sees k earlier branch tokens and itself
    total = 0.0
    for s in lengths:
        keys = s * prefix_tokens + s * (s + 1) / 2 + tail * (prefix_tokens + s) + tail_keys
        total += weights * (s + tail) + per_key * keys + output * (1 + tail)
    return total


def matmul_roof(model, dtype: torch.dtype) -> float:
    """Measured FLOP/s of the model's MLP matmul in ``dtype`` (the profile's measurement, for a dtype it lacks)."""
    gflops = matmul_gflops(model.device, dtype, roof_shape(model, model.device))
    return gflops * 1e9 if gflops else float("nan")


# --- what the matmul and attention kernels alone would take ------------------------------------------------


@torch.inference_mode()
def kernel_seconds(model, shapes: Sequence[tuple[int, int]], past_length: int = 0, scored: int = 1,
                   masked: bool = False) -> float:
    """Seconds the matmuls and the attention kernel alone would take for forward passes of these (rows, width) shapes.

    An estimate of the least time any implementation running these shapes on these kernels needs: per distinct
    shape, one decoder layer's linear layers and its attention call (SDPA over ``past_length`` cached keys plus the
    row's own, padding and all, with the key/value heads the model's attention gives it), each timed alone (the best of
    up to five runs, after a warm-up, so with warm caches) and counted once per layer and pass, plus the output
    layer at ``scored`` positions per row. Whatever a pipeline spends beyond this goes to norms, rotary embeddings, activations,
    residual adds, cache copies and Python. ``masked``: a 4D mask even for one unpadded row (tree-shaped label
    continuations). NaN for a model whose layers hold no ``nn.Linear`` (nothing to time); every layer is assumed
    to be shaped like the first.
    """
    from .profile import _time_call

    config, device, dtype = model.config, model.device, model.dtype
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = getattr(model.get_decoder(), "layers", None)
    weights = [m.weight for m in layers[0].modules() if isinstance(m, torch.nn.Linear)] if layers else []
    if not weights:
        return float("nan")
    output = model.get_output_embeddings().weight
    # sdpa_gqa reads the shared key/value heads; transformers' sdpa copies them per query head first.
    gqa = config._attn_implementation == GQA_ATTENTION and heads != kv_heads
    total = 0.0
    for (rows, width), count in collections.Counter(shapes).items():
        tokens = rows * width
        inputs = {k: torch.randn(tokens, k, device=device, dtype=dtype) for k in {w.shape[1] for w in weights}}
        linear = _time_call(lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights], device, 0.05, 5)
        query = torch.randn(rows, heads, width, head_dim, device=device, dtype=dtype)
        keys = torch.randn(rows, kv_heads if gqa else heads, past_length + width, head_dim, device=device, dtype=dtype)
        # One unpadded row with nothing cached runs causal without a mask; anything else needs one.
        mask = None if rows == 1 and past_length == 0 and not masked else torch.ones(
            rows, 1, width, past_length + width, dtype=torch.bool, device=device).tril(past_length)
        attend = _time_call(lambda: torch.nn.functional.scaled_dot_product_attention(
            query, keys, keys, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa), device, 0.05, 5)
        hidden = torch.randn(rows * scored, config.hidden_size, device=device, dtype=dtype)
        logits = _time_call(lambda: torch.nn.functional.linear(hidden, output), device, 0.05, 5)
        total += count * (config.num_hidden_layers * (linear + attend) + logits)
    return total


# --- peak memory ---------------------------------------------------------------------------------------


def _resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_memory(device: torch.device):
    """Yields a dict whose ``mb`` is the peak after the block: CUDA's own peak allocation counter; on Apple's MPS
    the memory its tensors hold, sampled every 10 ms; on a Linux CPU the process's resident memory, sampled; on
    other CPUs the process's high-water mark (which includes everything before the block)."""
    result = {"mb": float("nan")}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        result["mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        return
    if device.type == "mps":
        read = torch.mps.current_allocated_memory
    elif os.path.exists("/proc/self/statm"):
        read = _resident_bytes
    else:  # macOS or Windows on the CPU: the process high-water mark is the best we have
        import resource

        yield result
        result["mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return
    peak = [read()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], read())
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()
        result["mb"] = max(peak[0], read()) / 2**20


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


def sweep_batch_sizes(device: torch.device | str) -> tuple[int, ...]:
    """The default batch sizes of the sweep: 1 to 32 on a CPU (32 is the article's), 1 to 256 on a GPU (which
    saturates far later). Batch 1 is the loop."""
    return SWEEP_BATCH_SIZES["cpu" if torch.device(device).type == "cpu" else "gpu"]


def plan_rows(strategies: Sequence[str], batch_sizes: Sequence[int], others_at: int | None = None,
              ) -> list[tuple[str, int]]:
    """(strategy, batch size) rows: loop-style strategies once at batch 1; the sweep's strategies at every batch
    size; the other batched ones at every batch size too, or only at ``others_at`` when it is given.

    A sweep's strategy at batch 1 is a loop (sorted batches of one are the loop, with the prefix cache the loop with
    it): that point is the loop's row, added where the strategies do not name it.
    """
    single = ("loop", "loop_prefix", "generate")
    rows = [(name, 1) for name in strategies if name in single]
    for name in strategies:
        if name in single:
            continue
        for size in batch_sizes if others_at is None or name in SWEEP_STRATEGIES else [others_at]:
            row = (SWEEP_LOOPS[name], 1) if size == 1 and name in SWEEP_LOOPS else (name, size)
            if row not in rows:
                rows.append(row)
    return rows


def warm_up_rows(rows: Sequence[tuple[str, int]], every_row: bool = False) -> set[tuple[str, int]]:
    """The (strategy, batch size) rows that get a warm-up: each strategy's largest batch size (the largest batch
    allocates the most), or every row where ``every_row`` (a GPU, which picks kernels per shape)."""
    if every_row:
        return set(rows)
    largest: dict[str, int] = {}
    for name, size in rows:
        largest[name] = max(size, largest.get(name, size))
    return set(largest.items())


def row_draw(name: str, size: int, lengths: Sequence[int], prefix_length: int, tail: int,
             min_tickets: int | None = MIN_TICKETS, strata: int = STRATA) -> Draw:
    """The batches a benchmark row times, drawn from the plan of every prompt (``helpers.sweep.draw_batches``).

    ``lengths``: the whole prompts' tokens; a row with the prefix cache plans the tokens after its
    ``prefix_length``. A token-budget row's budget is the batch size x the median prompt, so that each batch size has
    a token-budget twin of the same average size; generate + parse draws as the loop does.
    """
    strategy, cached = STRATEGIES.get(name, ("loop", False))
    budget = int(size * np.median(lengths)) if strategy == "token_budget" else None
    planned = [n - prefix_length for n in lengths] if cached else list(lengths)
    return draw_batches(planned, strategy, size, budget, past=prefix_length if cached else 0, tail=tail,
                        min_tickets=min_tickets, strata=strata)


def score_draw(model, tokenizer, scorer, prompts: Sequence[str], draw: Draw, prefix=None) -> LabelScores:
    """``score_batched`` on a draw's tickets (``prompts``: every ticket's prompt), planned as the draw was: the
    row function of the benchmark and of notebook 04's sweep."""
    return score_batched(model, tokenizer, scorer, [prompts[i] for i in draw.tickets], draw.strategy,
                         batch_size=draw.batch_size or 1, token_budget=draw.token_budget, prefix=prefix, progress=False)


def generate_draw(model, tokenizer, prompts, draw: Draw, labels) -> tuple[LabelScores, list[str | None]]:
    """Generate + parse (notebook 01's baseline) on a draw's tickets, one at a time, each ticket timed: a run
    ``estimate_plan`` reads (its scores are zeros: generation scores no labels), and the parsed labels."""
    start = time.perf_counter()
    parsed, seconds = [], []
    for i in draw.tickets:
        with Stopwatch(model.device) as clock:
            parsed.append(parse_label(generate_answer(model, tokenizer, prompts[i]), labels))
        seconds.append(clock.seconds)
    info = {"batches": [[j] for j in range(len(draw.tickets))], "batch_seconds": seconds, "tokenize_seconds": 0.0,
            "seconds": time.perf_counter() - start, "n": len(draw.tickets)}
    return LabelScores(list(labels), torch.zeros(len(draw.tickets), len(labels)), info), parsed


def warm_up(model, tokenizer, scorer, prompts, draw: Draw, prefix=None, whole: bool = False) -> float:
    """Run some of a draw untimed and return its seconds: first calls allocate memory and pick kernels. On a GPU its
    first (longest) batch, whose shape is the costliest to meet first; on a CPU, where a warm-up only needs the
    code paths run once, whole batches from its short end, at least 4 tickets. ``whole``: all of it (torch.compile
    builds its kernels for every shape a run meets)."""
    if whole:
        picked = draw.tickets
    elif model.device.type != "cpu":
        picked = draw.batches[0]
    else:
        picked = []
        for batch in reversed(draw.batches):
            if len(picked) >= 4:
                break
            picked = [*batch, *picked]
    first = [prompts[i] for i in picked]
    with Stopwatch(model.device) as clock:
        score_batched(model, tokenizer, scorer, first, draw.strategy, batch_size=draw.batch_size or 1,
                      token_budget=draw.token_budget, prefix=prefix, progress=False)
    return clock.seconds


def warm_up_fitting(model, tokenizer, scorer, prompts, draws: Mapping, prefix: Mapping,
                    rows: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Warm up the rows ``warm_up_rows`` names (each strategy's largest batch size, the most memory its rows need)
    and return the rows that fit the device's memory. A warm-up that runs out of memory (CUDA, MPS) drops its row
    and every larger size of its strategy, said in one line; the next size down warms up instead."""
    kept = list(rows)
    while True:
        for row in sorted(warm_up_rows(kept)):
            try:
                warm_up(model, tokenizer, scorer, prompts, draws[row], prefix[row])
            except Exception as error:  # running out of memory costs its rows; anything else is a bug
                if not is_out_of_memory(error):
                    raise
                free_memory(model.device)
                dropped = [r for r in kept if r[0] == row[0] and r[1] >= row[1]]
                kept = [r for r in kept if r not in dropped]
                print(f"{row[0]} at batch {row[1]}: out of memory on {model.device.type}; left out "
                      f"(batch sizes {', '.join(str(r[1]) for r in dropped)})")
                break
        else:
            return kept


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


def _row_kernel_seconds(model, run: LabelScores, scorer: LabelScorer) -> float:
    """``kernel_seconds`` of the forward passes a ``score_batched`` run made (its ``info["forward_passes"]``)."""
    by_past = collections.defaultdict(list)
    for rows, width, past in run.info["forward_passes"]:
        by_past[past].append((rows, width))
    return sum(kernel_seconds(model, shapes, past, 1 + len(scorer.tail), masked=scorer.is_tree)
               for past, shapes in by_past.items())


def roof_table(model, scorer, draws: Mapping, runs: Mapping, lengths: Sequence[int], prefix_length: int,
               profile) -> tuple[dict, tuple[float, float] | None]:
    """How much of the machine each row's drawn batches used (the module docstring): per key of ``draws`` (its
    ``runs``: timed ``score_batched`` runs), ``useful_gflops``, ``roof_gflops``, ``roof_fraction`` and
    ``kernel_ceiling``; and (the profile's roof, the raised one) in GFLOP/s where a row's kernels beat the profile's
    roof, else None. ``lengths``: every prompt's tokens, of which ``prefix_length`` are cached."""
    useful = {key: useful_flops(model, [lengths[i] - prefix_length for i in draw.tickets], prefix_length, scorer)
              for key, draw in draws.items()}
    kernels = {key: _row_kernel_seconds(model, runs[key][-1], scorer) for key in draws}
    dtype = str(model.dtype).removeprefix("torch.")
    measured = profile.matmul_gflops.get(dtype)
    roof = measured * 1e9 if measured else matmul_roof(model, model.dtype)
    raised = None
    fastest = max((useful[key] / kernels[key] for key in draws if kernels[key] > 0), default=0.0)
    if fastest > roof:  # the kernels beat the profile's roof: an upper bound cannot be below what was measured
        raised, roof = (roof / 1e9, fastest / 1e9), fastest
    table = {}
    for key in draws:
        per_s = useful[key] / statistics.median(run.info["seconds"] for run in runs[key])
        table[key] = {"useful_gflops": per_s / 1e9, "roof_gflops": roof / 1e9, "roof_fraction": per_s / roof,
                      "kernel_ceiling": useful[key] / kernels[key] / roof}
    return table, raised


def reference_rows(reference: LabelScores, tickets: Sequence[int], draw: Draw) -> LabelScores:
    """The rows of ``reference`` (scores of ``tickets``, in that order) for a draw's tickets, in the draw's order."""
    row_of = {ticket: row for row, ticket in enumerate(tickets)}
    return LabelScores(reference.labels, reference.log_scores[[row_of[i] for i in draw.tickets]])


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
