"""Timing the full-scale workload (notebook 04, ``python -m helpers bench``; 03 writes the same rule out in its
race): every contender on the same sample of the reference's 600 tickets, scaled to all 600 by one stated rule, and
checked against the loop.

**The sample** (``sample_tickets``): sort the tickets by token length, longest first (the order sorted batches run
in), cut that order into blocks of ``block`` consecutive tickets, and take every ``every``-th block, starting with
the middle one of the first ``every``. A block of the largest batch size is a whole number of batches at every
smaller power-of-two size, so every contender times the same tickets in whole batches of its own 600-ticket plan,
and every length is represented. ``every=1`` takes every block: the full 600, timed whole.

**The rule** (``scale_to_plan``): the sample's seconds times the padded tokens of the contender's whole plan over
the padded tokens of the sample's batches (about ``every``; exactly 1 when every block is timed).
``benchmarks/full_plan.py`` sets it beside the full run.

**The spread** of a number is the fastest and the slowest of its repeats, each scaled the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .batching import padding_report, plan_batches, score_batched
from .checks import agreement
from .data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from .models import free_memory, is_out_of_memory, load_model, machine_name
from .prefix_cache import PrefixCache
from .scoring import LabelScorer, LabelScores, score_one_by_one

POOL = 600  # the reference's tickets: the full-scale workload
# name -> (batching strategy, uses the prefix cache)
STRATEGIES = {
    "loop": ("loop", False),
    "loop_prefix": ("loop", True),
    "sorted": ("sorted", False),
    "sorted_prefix": ("sorted", True),
}
LOOPS = {"sorted": "loop", "sorted_prefix": "loop_prefix"}  # sorted batches of one are the loop


def sample_tickets(lengths: Sequence[int], block: int, every: int) -> list[int]:
    """Every ``every``-th block of ``block`` tickets in sorted order (longest first), from the middle block of the
    first ``every``; in sorted order. ``every=1``: every ticket. Notebook 03, section 6, writes it out; notebook 04."""
    if block < 1 or every < 1:
        raise ValueError(f"block and every must be >= 1, got block={block}, every={every}")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    blocks = [order[start : start + block] for start in range(0, len(order), block)]
    picked = blocks[every // 2 :: every] or [blocks[len(blocks) // 2]]
    return [int(i) for chunk in picked for i in chunk]


def row_lengths(lengths: Sequence[int], uses_prefix: bool, prefix_length: int) -> list[int]:
    """The tokens a row plans with: whole prompts, or the tokens after a cached prefix. Notebook 04, section 2."""
    return [n - prefix_length for n in lengths] if uses_prefix else list(lengths)


def scale_to_plan(lengths: Sequence[int], sample: Sequence[int], strategy: str, batch_size: int) -> float:
    """Padded tokens of the whole plan over those of the sample's batches: the sample's seconds times this is the
    estimate for every ticket (1.0 when the sample is every ticket). Notebook 04, section 2."""
    whole = padding_report(lengths, plan_batches(lengths, strategy, batch_size)).processed_tokens
    sampled = [lengths[i] for i in sample]
    return whole / padding_report(sampled, plan_batches(sampled, strategy, batch_size)).processed_tokens


@dataclass
class Row:
    """One contender timed on the sample: ``seconds`` per repeat, ``scale`` to the whole plan, the last run's
    scores (checked against the loop), its padding and the plan's. Notebook 04, section 2."""

    name: str
    batch_size: int
    n: int
    scale: float
    sample: list[int]
    seconds: list[float] = field(default_factory=list)
    scores: LabelScores | None = None
    plan_padding: float = 0.0

    @classmethod
    def plan(cls, name: str, batch_size: int, lengths: Sequence[int], sample: list[int], prefix_length: int = 0) -> Row:
        """A row of strategy ``name`` (``STRATEGIES``) at ``batch_size``, to time on ``sample`` of ``lengths``: its
        scale to the whole plan (``scale_to_plan``) and the plan's padding, planned after a cached prefix of
        ``prefix_length`` tokens where the strategy uses it. Notebook 04, section 2."""
        strategy, uses_prefix = STRATEGIES[name]
        planned = row_lengths(lengths, uses_prefix, prefix_length)
        padding = padding_report(planned, plan_batches(planned, strategy, batch_size)).padding_fraction
        scale = scale_to_plan(planned, sample, strategy, batch_size)
        return cls(name, batch_size, len(lengths), scale, sample, plan_padding=padding)

    @property
    def strategy(self) -> str:
        """How it forms batches: ``score_batched``'s strategy."""
        return STRATEGIES[self.name][0]

    @property
    def uses_prefix(self) -> bool:
        return STRATEGIES[self.name][1]

    @property
    def items_per_s(self) -> float:
        """The whole plan's tickets per second, from the median repeat."""
        return self.n / (statistics.median(self.seconds) * self.scale)

    @property
    def spread(self) -> tuple[float, float]:
        """Tickets per second of the slowest and the fastest repeat."""
        return self.n / (max(self.seconds) * self.scale), self.n / (min(self.seconds) * self.scale)

    @property
    def timed(self) -> str:
        return (
            f"all {self.n} timed"
            if len(self.sample) == self.n
            else f"{len(self.sample)} of {self.n} timed, scaled x{self.scale:.2f}"
        )

    def beyond_spread(self, other: Row) -> bool:
        """Whether the two rows' repeats do not overlap (and each has at least two): a difference beyond the noise.
        Notebook 04, Summary."""
        (low, high), (other_low, other_high) = self.spread, other.spread
        return min(len(self.seconds), len(other.seconds)) > 1 and (low > other_high or other_low > high)

    def __str__(self) -> str:
        low, high = self.spread
        return (
            f"{self.name} at {self.batch_size}: {self.items_per_s:.2f} items/s on {self.n} tickets ({self.timed}; "
            f"repeats {low:.2f}-{high:.2f})"
        )


def results_frame(rows: dict, reference: LabelScores, info, shots: int, prefix_tokens: int) -> pd.DataFrame:
    """One line per timed ``Row``: tickets/s of all its plan (median, slowest and fastest repeat), the sample's
    padding beside the plan's, agreement with ``reference`` (the loop) on every sampled ticket, and what produced it
    (model, dtype, device, machine). Its columns are ``runs/benchmark.csv``'s. Notebook 04, section 2."""
    records = []
    for row in rows.values():
        check = agreement(reference, row.scores)
        low, high = row.spread
        records.append(
            dict(
                strategy=row.name,
                batch_size=row.batch_size,
                dtype=info.dtype,
                items_per_s=row.items_per_s,
                items_per_s_min=low,
                items_per_s_max=high,
                n=row.n,
                timed=row.timed,
                sample_tickets=len(row.sample),
                scale=row.scale,
                padding_fraction=row.scores.info["padding_fraction"],
                plan_padding=row.plan_padding,
                shots=shots,
                prefix_tokens=prefix_tokens,
                repeats=len(row.seconds),
                agreement=check["agreement"],
                max_abs_diff=check["max_abs_diff"],
                model=info.name,
                device=info.device,
                threads=info.threads,
                timing_only=info.timing_only,
                machine=machine_name(info.device),
            )
        )
    return pd.DataFrame(records)


def sweep_rows(strategies: Sequence[str], batch_sizes: Sequence[int]) -> list[tuple[str, int]]:
    """(strategy, batch size) rows: the loops once, a sorted strategy at every batch size (at 1: its loop).
    Notebook 04, section 1."""
    rows = []
    for name in strategies:
        for size in [1] if STRATEGIES[name][0] == "loop" else batch_sizes:
            row = (LOOPS[name], 1) if size == 1 and name in LOOPS else (name, size)
            if row not in rows:
                rows.append(row)
    return rows


def run_benchmark(
    model_name: str | None = None,
    shots: int = 3,
    strategies: Sequence[str] = tuple(STRATEGIES),
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    dtypes: Sequence[str] = ("float32",),
    every: int = 10,
    repeats: int = 3,
    n: int = POOL,
    device: str | None = None,
    compile: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """``python -m helpers bench``: notebook 04's sweep. Every (strategy, batch size) row in every dtype, timed on
    the same sample (every ``every``-th block of the sorted order), ``repeats`` rounds in alternating order after a
    warm-up, scaled to all ``n`` tickets, each row's scores checked against the float32 loop on every sampled ticket.
    A row that runs out of device memory is left out with a line. Notebook 04, section 2."""
    unknown = [name for name in strategies if name not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"unknown strategies {unknown}: choose from {', '.join(STRATEGIES)}")
    block = max(batch_sizes)
    if any(b < 1 or block % b for b in batch_sizes) or repeats < 1 or every < 1:
        raise ValueError(f"batch sizes must each divide the largest ({list(batch_sizes)}); repeats and every >= 1")
    texts = make_tickets(n, seed=0, style="article")["text"].tolist()
    examples = few_shot_examples(shots)
    rows, frames, reference = sweep_rows(strategies, batch_sizes), [], None
    for dtype in dtypes:
        model, tokenizer, info = load_model(model_name, dtype=dtype, device=device, verbose=dtype == dtypes[0])
        if compile:
            model.forward = torch.compile(model.forward, dynamic=True)
        scorer = LabelScorer(tokenizer, LABELS)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
        cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
        sample = sample_tickets(lengths, block, every)
        timed = [prompts[i] for i in sample]
        found = {(name, size): Row.plan(name, size, lengths, sample, cache.length) for name, size in rows}
        failed = []

        def run(key, chosen):
            row = found[key]
            prefix = cache if row.uses_prefix else None
            return score_batched(model, tokenizer, scorer, chosen, row.strategy, key[1], prefix=prefix, progress=False)

        # Warm-up: each row on one batch of its size (the longest: out of memory shows there), untimed; first calls
        # allocate memory and pick kernels.
        for key in list(found):
            try:
                run(key, timed[: key[1]])
            except Exception as error:  # only running out of memory costs the row alone; anything else is a bug
                if not is_out_of_memory(error):
                    raise
                failed.append(f"{key[0]} at {key[1]} ({dtype}): out of memory on {model.device.type}")
                del found[key]
                free_memory(model.device)
        keys = list(found)
        for repeat in tqdm(range(repeats), desc=f"{dtype}: {len(keys)} rows", disable=not progress):
            for key in keys if repeat % 2 == 0 else keys[::-1]:
                result = run(key, timed)
                found[key].seconds.append(result.info["seconds"])
                found[key].scores = result
        if reference is None:  # the first dtype's loop, one ticket at a time: what every row must match
            loop = found.get(("loop", 1))  # the loop row already scored every sampled ticket that way
            if loop is not None:
                reference = loop.scores
            else:
                reference = score_one_by_one(model, tokenizer, scorer, timed, desc="reference", progress=progress)
        frame = results_frame(found, reference, info, shots, cache.length)
        frame.attrs["failed"] = failed
        frames.append(frame)
        free_memory(torch.device(info.device))
    results = pd.concat(frames, ignore_index=True)
    results.attrs["failed"] = [line for frame in frames for line in frame.attrs["failed"]]
    loop = results.query("strategy == 'loop' and dtype == 'float32'")
    if len(loop):
        results["speedup_vs_loop"] = results["items_per_s"] / loop["items_per_s"].iloc[0]
    return results


def padding_by_strategy(tokenizer, n: int = POOL, batch_size: int = 32, shots: int = 0, seed: int = 0) -> pd.DataFrame:
    """Padding share of each way of forming batches over ``n`` article tickets (the tokenizer alone, no model):
    everything padded to the longest, arbitrary order, sorted, a token budget of ``batch_size`` median prompts.
    Notebook 04, section 5."""
    from .batching import global_padding_factor

    examples = few_shot_examples(shots)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(n, seed, "article")["text"]]
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    rows = [{"strategy": "global maximum", "padding_fraction": 1 - 1 / global_padding_factor(lengths)}]
    budget = int(batch_size * np.median(lengths))
    for strategy in ("arbitrary", "sorted", "token_budget"):
        report = padding_report(lengths, plan_batches(lengths, strategy, batch_size, budget))
        rows.append({"strategy": strategy, "padding_fraction": report.padding_fraction})
    frame = pd.DataFrame(rows)
    frame["processed_per_real"] = 1 / (1 - frame["padding_fraction"])  # notebook 00's unit: processed / real tokens
    frame.attrs.update(
        prompts=f"{shots}-shot" if shots else "zero-shot", batch_size=batch_size, token_budget=budget, n=n
    )
    return frame
