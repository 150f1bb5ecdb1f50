"""Benchmarks: every technique, batch size and dtype in one run, checked against the float32 loop (notebook 04).

Each row of the result is one (strategy, batch size, dtype). Each strategy is warmed up once (on a GPU each
row), then every row is timed ``repeats`` times; the repeats run the rows in alternating order (forwards,
backwards, ...), so a machine that drifts (heat, a neighbour) spreads over all rows instead of favouring the
first. A row reports the median, min and max items/s over its repeats (whole pipeline: tokenizing and forward
passes), how much of that was tokenizing, padding, agreement with the float32 one-at-a-time loop, peak memory,
and the share of the machine's measured matmul throughput ("roof") that went into useful work.

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
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .attention import NAME as GQA_ATTENTION
from .batching import score_batched
from .data import (
    LABELS,
    build_prompt,
    encode_prompt,
    encode_prompts,
    few_shot_examples,
    make_tickets,
)
from .models import load_model, pick_device
from .prefix_cache import PrefixCache
from .profile import machine_profile, matmul_gflops, roof_shape
from .scoring import LabelScorer, LabelScores, agreement, generate_answer, parse_label
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
# The throughput-against-batch-size curve: these strategies run at every batch size, the other batched ones only at
# ``others_at`` (their comparison needs one point, the curve needs many).
SWEEP_STRATEGIES = ("sorted", "sorted_prefix")
DEFAULT_BATCH_SIZES = None  # by device: SWEEP_BATCH_SIZES
SWEEP_BATCH_SIZES = {"cpu": (2, 4, 8, 16, 32), "gpu": (2, 4, 8, 16, 32, 64, 128)}
# With fewer tickets than the largest size: 5 of these, from 2 to the ticket count (at least SWEEP_FLOOR).
NICE_BATCH_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SWEEP_FLOOR = 8
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


def _validate(strategies: Sequence[str], batch_sizes: Sequence[int], repeats: int, n: int, attention=None) -> None:
    known = (*STRATEGIES, *EXTRA_STRATEGIES)
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}: choose from {', '.join(known)}")
    if not strategies:
        raise ValueError("no strategies to benchmark")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if repeats < 1 or n < 1:
        raise ValueError(f"repeats and n must be >= 1, got repeats={repeats}, n={n}")
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention {attention!r}: choose from {', '.join(map(str, ATTENTION_CHOICES[1:]))}")


def _time_generate(model, tokenizer, prompts, reference: LabelScores) -> dict:
    with Stopwatch(model.device) as clock:
        parsed = [parse_label(generate_answer(model, tokenizer, p), reference.labels) for p in prompts]
    seconds = clock.seconds
    same = np.mean([label == ref for label, ref in zip(parsed, reference.predictions)])
    rate = len(prompts) / seconds
    return {"items_per_s": rate, "items_per_s_min": rate, "items_per_s_max": rate, "tokenize_share": np.nan,
            "agreement": float(same), "max_abs_diff": np.nan, "padding_fraction": 0.0,
            "unparseable": float(np.mean([p is None for p in parsed]))}


def sweep_batch_sizes(device: torch.device | str, n: int | None = None) -> tuple[int, ...]:
    """The default batch sizes of the sweep: 2 to 32 on a CPU, 2 to 128 on a GPU (which saturates later).

    ``n``: the tickets of the run. A batch larger than ``n`` would only repeat the batch of ``n``, so with fewer
    tickets than the largest size the sweep is 5 sizes from 2 to ``n`` (a slow machine still gets a curve); below
    ``SWEEP_FLOOR`` tickets, every size from 2 to ``n``, 5 of them where more fit (6 or 7 tickets still give a
    curve of 5 points), else the fewer that fit."""
    sizes = SWEEP_BATCH_SIZES["cpu" if torch.device(device).type == "cpu" else "gpu"]
    if n is None or n >= sizes[-1]:
        return sizes
    fitting = [size for size in NICE_BATCH_SIZES if size <= n] if n >= SWEEP_FLOOR else list(range(2, n + 1))
    if len(fitting) < 5:
        return tuple(fitting) or (1,)
    return tuple(fitting[round(i * (len(fitting) - 1) / 4)] for i in range(5))


def plan_rows(strategies: Sequence[str], batch_sizes: Sequence[int], others_at: int | None = None,
              n: int | None = None) -> list[tuple[str, int]]:
    """(strategy, batch size) rows: loop-style strategies once at batch 1; the sweep's strategies at every batch
    size; the other batched ones at every batch size too, or only at ``others_at`` when it is given.

    With ``n``, the ticket count: arbitrary order at a batch size that holds all ``n`` tickets is left out where
    sorted runs at such a size too (one batch of every ticket either way: the same work, timed twice).
    """
    single = ("loop", "loop_prefix", "generate")
    rows = ([(name, 1) for name in strategies if name in single]
            + [(name, b) for name in strategies if name not in single
               for b in (batch_sizes if others_at is None or name in SWEEP_STRATEGIES else [others_at])])
    if n is not None and any(name == "sorted" and b >= n for name, b in rows):
        rows = [(name, b) for name, b in rows if not (name == "arbitrary" and b >= n)]
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


def _timed_rows(tokenizer, scorer, prompts, lengths, configs, repeats, progress, desc):
    """Warm up, then time every config ``repeats`` times in alternating order.

    ``configs``: (strategy name, batch size, compiled) -> (model, ``score_batched`` options, compiled). Eager
    configs warm up as ``warm_up_rows`` says (every row on a GPU, where a warm-up is cheap), on one batch of the
    longest prompts (up to 8): first calls allocate and pick kernels. A compiled config warms up on a full pass of
    its own, which is when torch.compile builds its kernels for the shapes the run meets. Returns, per config, its
    runs' ``LabelScores``, the peak memory over its runs and its warm-up seconds (NaN for an eager config whose
    strategy another config warmed up).
    """
    runs = {key: [] for key in configs}
    memory = dict.fromkeys(configs, 0.0)
    warmup = dict.fromkeys(configs, float("nan"))
    longest = sorted(range(len(prompts)), key=lambda i: -lengths[i])  # in tokens
    eager = [key[:2] for key, (_, _, compiled) in configs.items() if not compiled]
    on_gpu = any(model.device.type != "cpu" for model, _, _ in configs.values())
    warmed = warm_up_rows(eager, every_row=on_gpu)
    for key, (model, options, compiled) in configs.items():
        if not compiled and key[:2] not in warmed:
            continue
        subset = prompts if compiled else [prompts[i] for i in longest[: min(options["batch_size"], 8)]]
        with Stopwatch(model.device) as clock:
            score_batched(model, tokenizer, scorer, subset, **options)
        warmup[key] = clock.seconds
    keys = list(configs)
    with tqdm(total=repeats * len(keys), desc=desc, disable=not progress) as bar:
        for repeat in range(repeats):
            for key in keys if repeat % 2 == 0 else keys[::-1]:
                model, options, _ = configs[key]
                with peak_memory(model.device) as peak:
                    runs[key].append(score_batched(model, tokenizer, scorer, prompts, **options))
                memory[key] = max(memory[key], peak["mb"])
                bar.update()
    return runs, memory, warmup


def _row_kernel_seconds(model, run: LabelScores, scorer: LabelScorer) -> float:
    """``kernel_seconds`` of the forward passes a ``score_batched`` run made (its ``info["forward_passes"]``)."""
    by_past = collections.defaultdict(list)
    for rows, width, past in run.info["forward_passes"]:
        by_past[past].append((rows, width))
    return sum(kernel_seconds(model, shapes, past, 1 + len(scorer.tail), masked=scorer.is_tree)
               for past, shapes in by_past.items())


def _summarise(runs: list[LabelScores], reference: LabelScores) -> dict:
    rates = [run.info["items_per_s"] for run in runs]
    seconds = [run.info["seconds"] for run in runs]
    tokenize = [run.info["tokenize_seconds"] for run in runs]
    n = runs[0].info["n"]
    return {"items_per_s": n / statistics.median(seconds), "items_per_s_min": min(rates),
            "items_per_s_max": max(rates), "tokenize_share": statistics.median(tokenize) / statistics.median(seconds),
            **agreement(reference, runs[-1]), "padding_fraction": runs[-1].info["padding_fraction"],
            "unparseable": 0.0}


def run_benchmark(
    model_name: str | None = None,
    n: int = 24,
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
) -> pd.DataFrame:
    """One row per (strategy, batch size, dtype); agreement is measured against the float32 loop.

    ``batch_sizes=None``: the device's sweep (``sweep_batch_sizes``: 2 to 32 on a CPU, to 128 on a GPU; 5 sizes up to
    ``n`` where ``n`` is smaller).
    ``others_at``: batched strategies outside ``SWEEP_STRATEGIES`` run only at this batch size (None: at every one);
    arbitrary order at a size that holds every ticket is left out where sorted runs there too (``plan_rows``).

    ``token_budget`` rows use a budget of batch size x the median prompt length, so each batch size
    has a token-budget twin of the same average size. Loop-style strategies run once, at batch 1.
    ``dtypes=None`` runs float32, plus each half-precision dtype the machine profile measured on this device
    (``dtype_candidates``) unless its matmul ran below half of float32's (a line says so); a list runs exactly those. Every row records the machine profile, and
    the roof is the profile's matmul throughput in the row's dtype. ``attention`` goes to ``load_model``.
    ``compile``: strategies that also get a row run through ``torch.compile`` (``compiled`` column; the float32
    reference loop stays eager). Its ``warmup_s`` includes the compiling, so a reader can weigh it against the
    seconds it saves per run. On a CPU, eager rows warm up once per strategy, at its largest batch size: ``warmup_s``
    is NaN on the others.
    """
    if batch_sizes is None:
        batch_sizes = sweep_batch_sizes(pick_device(device), n)
    _validate(strategies, batch_sizes, repeats, n, attention)
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
    texts = make_tickets(n, seed=seed, style=style)["text"].tolist()
    rows: list[dict] = []
    raised: dict[str, tuple[float, float]] = {}
    reference: LabelScores | None = None
    loop_rate = None
    planned = plan_rows(strategies, batch_sizes, others_at, n)
    # float32 first: its loop is the reference every other row is compared with.
    ordered = sorted(dict.fromkeys(dtypes), key=lambda d: d != "float32")
    if "float32" not in ordered:
        ordered.insert(0, "float32")
    for dtype in ordered:
        model, tokenizer, info = load_model(model_name, dtype=dtype, device=device, verbose=False, attention=attention)
        examples = few_shot_examples(shots)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        scorer = LabelScorer(tokenizer, LABELS)
        prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
        lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
        if dtype == "float32":
            # Where notebook 03's saturation curve puts the knee: the batch whose rows together reach the tokens per
            # call at which the profile's prefill throughput was at 90 % of its peak.
            own = float(np.median(lengths))
            knees = {"sorted": profile.saturation_tokens / own,
                     "sorted_prefix": profile.saturation_tokens / max(1.0, own - prefix.length)}
        useful = useful_flops(model, [length - prefix.length for length in lengths], prefix.length, scorer)
        measured_roof = profile.matmul_gflops.get(dtype)
        roof = measured_roof * 1e9 if measured_roof else matmul_roof(model, model.dtype)
        plan = planned if dtype in dtypes else []
        compiled_model = None
        if any(name in compile for name, _ in plan):
            compiled_model = load_model(model_name, dtype=dtype, device=device, verbose=False, attention=attention)[0]
            compiled_model.forward = torch.compile(compiled_model.forward, dynamic=True)
        configs = {}
        row_keys = []  # the rows of this dtype, in plan order: (strategy name, batch size, compiled)
        for name, batch_size in plan:
            if name == "generate":
                row_keys += [(name, batch_size, False)] if dtype == "float32" else []
                continue
            strategy, uses_prefix = STRATEGIES[name]
            budget = int(batch_size * np.median(lengths)) if strategy == "token_budget" else None
            for compiled in (False, True) if name in compile else (False,):
                row_model = compiled_model if compiled else model
                options = dict(strategy=strategy, batch_size=batch_size, token_budget=budget, progress=False,
                               prefix=prefix if uses_prefix else None)
                configs[name, batch_size, compiled] = (row_model, options, compiled)
                row_keys.append((name, batch_size, compiled))
        if dtype == "float32":  # the float32 loop: the reference, timed with the other rows
            configs.setdefault(("loop", 1, False), (model, dict(strategy="loop", batch_size=1, token_budget=None,
                                                                prefix=None, progress=False), False))
        runs, memory, warmup = _timed_rows(tokenizer, scorer, prompts, lengths, configs, repeats, progress,
                                           f"benchmark {dtype} ({repeats} repeats)")
        if dtype == "float32":
            reference = runs["loop", 1, False][-1]
            loop_rate = _summarise(runs["loop", 1, False], reference)["items_per_s"]
        kernels = {}  # (strategy, batch size) -> kernel-only seconds of its forward passes (compiled rows share it)
        for key in row_keys:
            if key[0] != "generate" and key[:2] not in kernels:
                kernels[key[:2]] = _row_kernel_seconds(model, runs[key][-1], scorer)
        fastest = max((useful / seconds for seconds in kernels.values() if seconds > 0), default=0.0)
        if fastest > roof:  # the kernels beat the profile's roof: an upper bound cannot be below what was measured
            raised[dtype] = (roof / 1e9, fastest / 1e9)
            roof = fastest
        for key in row_keys:
            name, batch_size, compiled = key
            if name == "generate":
                with peak_memory(model.device) as peak:
                    measured = _time_generate(model, tokenizer, prompts, reference)
                mb, warm, budget, ceiling = peak["mb"], np.nan, None, np.nan
            else:
                measured, mb, warm = _summarise(runs[key], reference), memory[key], warmup[key]
                budget = configs[key][1]["token_budget"]
                ceiling = useful / kernels[name, batch_size] / roof
            # Generated tokens are not ticket tokens: no roof fraction for the generate row.
            useful_per_s = np.nan if name == "generate" else useful * measured["items_per_s"] / len(prompts)
            rows.append({
                "strategy": name,
                "batch_size": batch_size,
                "token_budget": budget,
                "dtype": dtype,
                "compiled": compiled,
                **measured,
                "peak_memory_mb": mb,
                "warmup_s": warm,
                "useful_gflops": useful_per_s / 1e9,
                "roof_gflops": roof / 1e9,
                "roof_fraction": useful_per_s / roof,
                "kernel_ceiling": ceiling,
                "model": info.name,
                "timing_only": info.timing_only,
                "device": info.device,
                "threads": info.threads,
                "attention": info.attention,
                "n": len(prompts),
                "shots": shots,
                "prefix_tokens": prefix.length,
                "repeats": repeats,
                "machine": profile.machine,
                "profile": profile.caption(),
            })
        del model, compiled_model
    frame = pd.DataFrame(rows)
    frame["speedup_vs_loop"] = frame["items_per_s"] / loop_rate
    frame.attrs["loop_items_per_s"] = loop_rate  # measured even when "loop" is no row
    frame.attrs["profile"] = profile
    frame.attrs["skipped_dtypes"] = skipped
    # dtype -> (the profile's roof, the raised roof) in GFLOP/s, where a row's kernels ran faster than the profile's.
    frame.attrs["roof_raised"] = raised
    # (strategy, batch size) rows plan_rows left out: arbitrary order where one batch holds every ticket
    frame.attrs["left_out"] = [row for row in plan_rows(strategies, batch_sizes, others_at) if row not in planned]
    frame.attrs["predicted_knee"] = knees  # strategy -> batch size (rows) where the curve should flatten
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
