"""Benchmarks: every technique, batch size and dtype in one run, checked against the float32 loop (notebook 04).

Each row of the result is one (strategy, batch size, dtype): median items/s over repeats after a warm-up,
padding, agreement with the float32 one-at-a-time loop, peak memory, and the share of the machine's
measured matmul throughput ("roof") that went into useful work.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .batching import score_batched
from .data import LABELS, build_prompt, encode_prompt, few_shot_examples, make_tickets
from .models import load_model
from .prefix_cache import PrefixCache
from .profile import machine_profile, matmul_gflops, roof_shape
from .scoring import LabelScorer, LabelScores, agreement, generate_answer, parse_label

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
DEFAULT_BATCH_SIZES = (4, 16)
DEFAULT_DTYPES = None  # float32, plus bfloat16 where the machine profile says it is not slow


# --- the machine's roof -----------------------------------------------------------------------------


def non_embedding_parameters(model) -> int:
    """Parameters doing per-token matmuls: everything but the input embedding and the output layer."""
    skip = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        skip.add(id(model.get_output_embeddings().weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def matmul_roof(model, dtype: torch.dtype) -> float:
    """Measured FLOP/s of the model's MLP matmul in ``dtype`` (the profile's measurement, for a dtype it lacks)."""
    gflops = matmul_gflops(model.device, dtype, roof_shape(model, model.device))
    return gflops * 1e9 if gflops else float("nan")


# --- peak memory ---------------------------------------------------------------------------------------


@contextmanager
def peak_memory(device: torch.device):
    """Yields a dict whose ``mb`` is the peak after the block: CUDA allocations, else process RSS."""
    result = {"mb": float("nan")}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        result["mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        return
    statm = "/proc/self/statm"
    if not os.path.exists(statm):  # macOS, Windows: the process high-water mark is the best we have
        import resource

        yield result
        result["mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return
    page = os.sysconf("SC_PAGE_SIZE")
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with open(statm) as handle:
                peak[0] = max(peak[0], int(handle.read().split()[1]) * page)
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()
        result["mb"] = peak[0] / 2**20


# --- the benchmark -----------------------------------------------------------------------------------


def _validate(strategies: Sequence[str], batch_sizes: Sequence[int], repeats: int, n: int) -> None:
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


def _time_generate(model, tokenizer, prompts, reference: LabelScores) -> dict:
    start = time.perf_counter()
    parsed = [parse_label(generate_answer(model, tokenizer, p), reference.labels) for p in prompts]
    seconds = time.perf_counter() - start
    same = np.mean([label == ref for label, ref in zip(parsed, reference.predictions)])
    return {"items_per_s": len(prompts) / seconds, "agreement": float(same), "max_abs_diff": np.nan,
            "padding_fraction": 0.0, "unparseable": float(np.mean([p is None for p in parsed]))}


def _time_scoring(model, tokenizer, scorer, prompts, lengths, options, repeats, reference=None):
    """Warm-up on one batch of the longest items (first calls allocate and pick kernels), then the
    median of ``repeats`` timed runs. Returns the measurements (agreement of the last run with
    ``reference``, or with itself when this run is the reference) and the last run's scores."""
    longest = sorted(range(len(prompts)), key=lambda i: -lengths[i])[: min(options["batch_size"], 8)]
    score_batched(model, tokenizer, scorer, [prompts[i] for i in longest], **options)
    runs = [score_batched(model, tokenizer, scorer, prompts, **options) for _ in range(repeats)]
    seconds = statistics.median(run.info["seconds"] for run in runs)
    measured = {"items_per_s": len(prompts) / seconds, **agreement(reference or runs[-1], runs[-1]),
                "padding_fraction": runs[-1].info["padding_fraction"], "unparseable": 0.0}
    return measured, runs[-1]


def run_benchmark(
    model_name: str | None = None,
    n: int = 24,
    style: str = "article",
    shots: int = 6,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    dtypes: Sequence[str] | None = DEFAULT_DTYPES,
    repeats: int = 1,
    device: str | None = None,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (strategy, batch size, dtype); agreement is measured against the float32 loop.

    ``token_budget`` rows use a budget of batch size x the median prompt length, so each batch size
    has a token-budget twin of the same average size. Loop-style strategies run once, at batch 1.
    ``dtypes=None`` runs float32, plus bfloat16 unless the machine profile measured its matmul below half
    of float32's (a line says so); a list runs exactly those. Every row records the machine profile, and
    the roof is the profile's matmul throughput in the row's dtype.
    """
    _validate(strategies, batch_sizes, repeats, n)
    model, _, info = load_model(model_name, dtype="float32", device=device, verbose=True)
    profile = machine_profile(model, info, verbose=progress)
    skipped: list[str] = []
    if dtypes is None:
        dtypes, skipped = profile.choose_dtypes(None)
        for line in skipped:
            print(line)
    del model
    texts = make_tickets(n, seed=seed, style=style)["text"].tolist()
    rows: list[dict] = []
    reference: LabelScores | None = None
    # float32 first: its loop is the reference every other row is compared with.
    ordered = sorted(dict.fromkeys(dtypes), key=lambda d: d != "float32")
    if "float32" not in ordered:
        ordered.insert(0, "float32")
    for dtype in ordered:
        model, tokenizer, info = load_model(model_name, dtype=dtype, device=device, verbose=False)
        examples = few_shot_examples(shots)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        scorer = LabelScorer(tokenizer, LABELS)
        prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
        lengths = [len(encode_prompt(tokenizer, p)) for p in prompts]
        # Useful work: the tickets' own tokens through the non-embedding weights (not padding, not the prefix).
        useful_flops = 2 * non_embedding_parameters(model) * (sum(lengths) - prefix.length * len(prompts))
        measured_roof = profile.matmul_gflops.get(dtype)
        roof = measured_roof * 1e9 if measured_roof else matmul_roof(model, model.dtype)
        options = dict(strategy="loop", batch_size=1, token_budget=None, prefix=None, progress=False)
        if reference is None:  # the float32 loop: the reference, and the "loop" row's timing
            with peak_memory(model.device) as loop_memory:
                loop_measured, reference = _time_scoring(model, tokenizer, scorer, prompts, lengths, options, repeats)
        if dtype not in dtypes:
            continue
        plan = [(name, 1) for name in strategies if name in ("loop", "loop_prefix", "generate")]
        plan += [(name, b) for name in strategies if name not in ("loop", "loop_prefix", "generate") for b in batch_sizes]
        for name, batch_size in tqdm(plan, desc=f"benchmark {dtype}", disable=not progress):
            budget = None
            if name == "generate":
                if dtype != "float32":
                    continue
                with peak_memory(model.device) as memory:
                    measured = _time_generate(model, tokenizer, prompts, reference)
            elif name == "loop" and dtype == "float32":
                measured, memory = loop_measured, loop_memory
            else:
                strategy, uses_prefix = STRATEGIES[name]
                if strategy == "token_budget":
                    budget = int(batch_size * np.median(lengths))
                options = dict(strategy=strategy, batch_size=batch_size, token_budget=budget,
                               prefix=prefix if uses_prefix else None, progress=False)
                with peak_memory(model.device) as memory:
                    measured, _ = _time_scoring(model, tokenizer, scorer, prompts, lengths, options, repeats, reference)
            # Generated tokens are not ticket tokens: no roof fraction for the generate row.
            useful = np.nan if name == "generate" else useful_flops * measured["items_per_s"] / len(prompts)
            rows.append({
                "strategy": name,
                "batch_size": batch_size,
                "token_budget": budget,
                "dtype": dtype,
                "items_per_s": measured["items_per_s"],
                "padding_fraction": measured["padding_fraction"],
                "agreement": measured["agreement"],
                "max_abs_diff": measured.get("max_abs_diff", np.nan),
                "unparseable": measured["unparseable"],
                "peak_memory_mb": memory["mb"],
                "useful_gflops": useful / 1e9,
                "roof_gflops": roof / 1e9,
                "roof_fraction": useful / roof,
                "model": info.name,
                "timing_only": info.timing_only,
                "device": info.device,
                "threads": info.threads,
                "n": len(prompts),
                "shots": shots,
                "prefix_tokens": prefix.length,
                "repeats": repeats,
                "machine": profile.machine,
                "profile": profile.caption(),
            })
        del model
    frame = pd.DataFrame(rows)
    frame["speedup_vs_loop"] = frame["items_per_s"] / loop_measured["items_per_s"]
    frame.attrs["loop_items_per_s"] = loop_measured["items_per_s"]  # measured even when "loop" is no row
    frame.attrs["profile"] = profile
    frame.attrs["skipped_dtypes"] = skipped
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
    return pd.DataFrame(rows)
