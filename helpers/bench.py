"""Timing the full-scale workload (notebooks 03 and 04, ``python -m helpers bench``): every contender on the same
sample of the reference's 600 tickets, scaled to all 600 by one stated rule, and checked against the loop.

**The sample** (``sample_blocks``): the tickets sorted longest first, cut into blocks of the largest batch size (a
whole number of batches at every size), of every ``every`` consecutive ones (a *stratum*) the one most like the
stratum timed: in mean length and in token-weighted mean length (``_most_like``).
**The rule** (``Row.plan``): each timed block's seconds times its stratum's padded tokens over its own, as the
contender plans them (why per stratum, and ``benchmarks/full_plan.py``'s check against the full run: docs/scales.md).
``every=1`` times all 600. **The spread** of a number is its fastest and slowest repeat, each scaled the same way."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .batching import global_padding_factor, padding_report, plan_batches, score_batched
from .checks import agreement
from .data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from .models import free_memory, is_out_of_memory, load_model, machine_name
from .prefix_cache import PrefixCache
from .scoring import LabelScorer, LabelScores, score_one_by_one
from .timing import Timing

POOL = 600  # the reference's tickets: the full-scale workload
# name -> (batching strategy, uses the prefix cache): loop, loop_prefix, sorted, sorted_prefix
STRATEGIES = {base + tail: (base, bool(tail)) for base in ("loop", "sorted") for tail in ("", "_prefix")}
LOOPS = {"sorted": "loop", "sorted_prefix": "loop_prefix"}  # sorted batches of one are the loop


def sample_blocks(lengths: Sequence[int], block: int, every: int) -> tuple[list[list[int]], list[list[int]]]:
    """The timed blocks and their strata (the module's sample). Notebook 03, section 4; notebook 04, section 1."""
    if block < 1 or every < 1:
        raise ValueError(f"block and every must be >= 1, got block={block}, every={every}")
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    blocks = [order[start : start + block] for start in range(0, len(order), block)]
    strata = [blocks[start : start + every] for start in range(0, len(blocks), every)]
    picked = [_most_like(stratum, lengths) for stratum in strata]
    return picked, [[i for chunk in stratum for i in chunk] for stratum in strata]


def _most_like(stratum: list[list[int]], lengths: Sequence[int]) -> list[int]:
    """The block of ``stratum`` most like it in the two things a block's seconds follow: its mean length (a fixed cost
    per call, per ticket for the loop, is paid once per so many tokens) and its token-weighted mean length (the mean
    length of the row a token sits in: attention's cost per token grows with it). Scaled by tokens, a block shorter
    than its stratum scales its fixed costs by more than the stratum's calls (the loop reads slow); a block whose
    tokens sit in shorter rows than its stratum's makes each token too cheap (sorted batches read fast). The block
    whose worse of the two mismatches is the smallest, the middle one among equals."""

    def shape(items) -> tuple[float, float]:  # mean length, token-weighted mean length
        chosen = np.asarray([lengths[i] for i in items], dtype=float)
        return float(chosen.mean()), float((chosen**2).sum() / chosen.sum())

    mean, weighted = shape([i for chunk in stratum for i in chunk])
    middle = (len(stratum) - 1) / 2

    def unlike(k: int) -> tuple[float, float]:  # the worse relative mismatch, then the distance from the middle
        block_mean, block_weighted = shape(stratum[k])
        return round(max(abs(block_mean / mean - 1), abs(block_weighted / weighted - 1)), 6), abs(k - middle)

    return stratum[min(range(len(stratum)), key=unlike)]


def processed_tokens(lengths: Sequence[int], items: Sequence[int], strategy: str, batch_size: int) -> int:
    """Padded tokens of a plan of ``items`` alone (their lengths in ``lengths``). Notebook 03, section 4."""
    chosen = [lengths[i] for i in items]
    return padding_report(chosen, plan_batches(chosen, strategy, batch_size)).processed_tokens


@dataclass
class Row:
    """One contender timed on the sample: its ``blocks`` and their ``weights`` (the rule), each repeat's estimate of the
    whole plan (``seconds``; its blocks' own: ``block_seconds``). Notebook 03, section 4; notebook 04, section 1."""

    name: str
    batch_size: int
    n: int
    blocks: list[list[int]]
    weights: list[float]
    seconds: list[float] = field(default_factory=list)
    block_seconds: list[list[float]] = field(default_factory=list)
    scores: LabelScores | None = None
    plan_padding: float = 0.0

    @classmethod
    def plan(cls, name: str, batch_size: int, lengths: Sequence[int], blocks_and_strata, prefix_length=0) -> Row:
        """A row of strategy ``name`` at ``batch_size`` on ``sample_blocks``' blocks and strata of ``lengths``: block
        weights by the rule, the plan's padding (after a ``prefix_length`` cache, if used). Notebook 04, section 1."""
        strategy, uses_prefix = STRATEGIES[name]
        planned = [n - prefix_length for n in lengths] if uses_prefix else list(lengths)  # tokens after the prefix

        def padded(items):  # the tokens the plan processes for ``items``, padding included
            return processed_tokens(planned, items, strategy, batch_size)

        blocks, strata = blocks_and_strata
        padding = 1 - sum(planned) / padded(range(len(planned)))
        weights = [padded(stratum) / padded(chunk) for chunk, stratum in zip(blocks, strata)]
        return cls(name, batch_size, len(lengths), [list(b) for b in blocks], weights, plan_padding=padding)

    @property
    def strategy(self) -> str:
        return STRATEGIES[self.name][0]

    @property
    def uses_prefix(self) -> bool:
        return STRATEGIES[self.name][1]

    @property
    def sample(self) -> list[int]:
        return [i for chunk in self.blocks for i in chunk]

    def estimate(self, block_seconds: Sequence[float]) -> float:
        """The whole plan's seconds from one run's seconds per block: each block counts for its stratum."""
        return sum(weight * seconds for weight, seconds in zip(self.weights, block_seconds, strict=True))

    @property
    def timing(self) -> Timing:
        """The repeats' estimates as a ``Timing``: ``judge`` and ``verdict`` compare rows by the series' one rule."""
        return Timing(f"{self.name.replace('_', ' + ')} at {self.batch_size}", list(self.seconds))

    @property
    def items_per_s(self) -> float:
        return self.n / statistics.median(self.seconds)

    @property
    def spread(self) -> tuple[float, float]:
        return self.n / max(self.seconds), self.n / min(self.seconds)

    @property
    def timed(self) -> str:
        if len(self.sample) == self.n:
            return f"all {self.n} timed"
        return f"{len(self.sample)} of {self.n} timed, scaled x{self.n / len(self.sample):.1f} by strata"

    def __str__(self) -> str:
        low, high = self.spread
        return f"{self.timing.name}: {self.items_per_s:.2f} items/s ({self.timed}; repeats {low:.2f}-{high:.2f})"


def results_frame(rows: dict, reference: LabelScores, info, shots: int, prefix_tokens: int) -> pd.DataFrame:
    """One line per timed ``Row`` (``runs/benchmark.csv``'s columns): tickets/s of its plan (median, slowest and fastest
    repeat), the sample's and plan's padding, agreement with ``reference``, what produced it. Notebook 04, section 1."""
    records, machine = [], machine_name(info.device)
    for row in rows.values():
        check, (low, high) = agreement(reference, row.scores), row.spread
        rate = dict(items_per_s=row.items_per_s, items_per_s_min=low, items_per_s_max=high, repeats=len(row.seconds))
        sample = dict(n=row.n, timed=row.timed, sample_tickets=len(row.sample))
        padding = dict(padding_fraction=row.scores.info["padding_fraction"], plan_padding=row.plan_padding)
        prompt = dict(prefix=row.uses_prefix, shots=shots, prefix_tokens=prefix_tokens)
        agreed = dict(agreement=check["agreement"], max_abs_diff=check["max_abs_diff"])
        where = dict(model=info.name, device=info.device, threads=info.threads, timing_only=info.timing_only)
        row_key = dict(strategy=row.name, batch_size=row.batch_size, dtype=info.dtype)
        records.append({**row_key, **rate, **sample, **padding, **prompt, **agreed, **where, "machine": machine})
    return pd.DataFrame(records)


def sweep_rows(strategies: Sequence[str], batch_sizes: Sequence[int]) -> list[tuple[str, int]]:
    """(strategy, size) rows: loops once, sorted strategies at every size (1: their loop). Notebook 04, section 1."""
    rows = []
    for name in strategies:
        for size in [1] if STRATEGIES[name][0] == "loop" else batch_sizes:
            row = (LOOPS[name], 1) if size == 1 and name in LOOPS else (name, size)
            if row not in rows:
                rows.append(row)
    return rows


def _joined(parts: Sequence[LabelScores]) -> LabelScores:
    """Block results as one ``LabelScores``, block after block, with their seconds, tickets and padding added up."""
    info = {key: sum(part.info[key] for part in parts) for key in ("n", "seconds", "real_tokens", "processed_tokens")}
    info["padding_fraction"] = 1 - info["real_tokens"] / info["processed_tokens"]
    return LabelScores(parts[0].labels, torch.cat([part.log_scores for part in parts]), info)


@dataclass(frozen=True)
class Sample:
    """What ``sweep`` times, and how often: the block of ``block`` sorted tickets most like its stratum of ``every``
    (``sample_blocks``), in ``repeats`` rounds. Notebook 03, section 4; notebook 04, section 1."""

    block: int
    every: int = 10
    repeats: int = 3
    # Each round block by block, every contender's block in turn, not contender after contender: over a long round
    # (all 600 tickets: benchmarks/full_plan.py) a machine's drift then falls on every contender alike.
    interleave: bool = False


def sweep(model, tokenizer, scorer, prompts, rows, sample: Sample, prefix=None, progress=True):
    """Time every (strategy, batch size) row on the same ``sample`` of ``prompts``: an untimed batch of each size first
    (out of memory there costs the row alone, said in the returned lines), then the rounds in alternating order, each
    block one ``score_batched`` call, scaled by the rule. Notebook 03, section 4; notebook 04, section 1."""
    if prefix is None and any(STRATEGIES[name][1] for name, _ in rows):
        raise ValueError("a row on the prefix cache needs prefix=PrefixCache(...)")
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    blocks = sample_blocks(lengths, sample.block, sample.every)
    found = {key: Row.plan(*key, lengths, blocks, prefix.length if prefix is not None else 0) for key in rows}
    failed = []

    def run(row: Row, items: Sequence[int]) -> LabelScores:
        chosen, cached = [prompts[i] for i in items], prefix if row.uses_prefix else None
        return score_batched(model, tokenizer, scorer, chosen, row.strategy, row.batch_size, cached, progress=False)

    for key, row in list(found.items()):
        try:
            run(row, row.blocks[0][: row.batch_size])  # the longest tickets: out of memory shows here
        except Exception as error:  # only running out of memory costs the row alone; anything else is a bug
            if not is_out_of_memory(error):
                raise
            failed.append(f"{key[0]} at {key[1]}: out of memory on {model.device.type}")
            del found[key]
            free_memory(model.device)
    keys = list(found)
    for repeat in tqdm(range(sample.repeats), desc=f"{len(keys)} rows x {sample.repeats} rounds", disable=not progress):
        order = keys if repeat % 2 == 0 else keys[::-1]
        if sample.interleave:
            parts = {key: [] for key in order}
            for k in range(len(found[order[0]].blocks) if order else 0):  # every row may have run out of memory
                for key in order:
                    parts[key].append(run(found[key], found[key].blocks[k]))
        else:
            parts = {key: [run(found[key], chunk) for chunk in found[key].blocks] for key in order}
        for key, done in parts.items():
            row = found[key]
            row.block_seconds.append([part.info["seconds"] for part in done])
            row.seconds.append(row.estimate(row.block_seconds[-1]))
            row.scores = _joined(done)
    return found, failed


@dataclass(frozen=True)
class Design:
    """What ``run_benchmark`` measures (``python -m helpers bench``'s options): each (strategy, batch size) row in each
    dtype on ``n`` article tickets with ``shots`` examples, sampled as a ``Sample``. Notebook 04, section 1."""

    strategies: Sequence[str] = tuple(STRATEGIES)
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32)
    dtypes: Sequence[str] = ("float32",)
    shots: int = 3
    n: int = POOL
    every: int = 10
    repeats: int = 3


def run_benchmark(
    model_name: str | None = None, design: Design = Design(), device=None, compile=False, progress=True, loaded=None
) -> tuple[pd.DataFrame, dict]:
    """Every row of ``design`` in every dtype, timed by ``sweep``, checked against the first dtype's loop on every
    sampled ticket; a row out of memory is left out with a line (``attrs["failed"]``). ``loaded``: a ``load_model``
    result to reuse. Returns the results (``runs/benchmark.csv``'s columns), the timed rows. Notebook 04, section 1."""
    strategies = design.strategies
    batch_sizes = design.batch_sizes
    dtypes = design.dtypes
    shots = design.shots
    unknown = [name for name in strategies if name not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"unknown strategies {unknown}: choose from {', '.join(STRATEGIES)}")
    sample = Sample(max(batch_sizes), design.every, design.repeats)
    if any(b < 1 or sample.block % b for b in batch_sizes) or sample.repeats < 1 or sample.every < 1:
        raise ValueError(f"batch sizes must each divide the largest ({list(batch_sizes)}); repeats and every >= 1")
    texts, examples = make_tickets(design.n, seed=0, style="article")["text"].tolist(), few_shot_examples(shots)
    rows = sweep_rows(strategies, batch_sizes)
    frames = []
    reference = None
    swept = {}
    for dtype in dtypes:
        if loaded is not None and loaded[2].dtype == dtype:
            model, tokenizer, info = loaded
        else:
            model, tokenizer, info = load_model(model_name, dtype=dtype, device=device, verbose=dtype == dtypes[0])
        if compile:
            model.forward = torch.compile(model.forward, dynamic=True)
        scorer = LabelScorer(tokenizer, LABELS)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
        found, failed = sweep(model, tokenizer, scorer, prompts, rows, sample, cache, progress)
        if not found:
            raise RuntimeError(f"every row ran out of memory on {model.device.type}: {'; '.join(failed)}")
        if reference is None:  # the first dtype's loop, one ticket at a time: what every row must match
            loop = found.get(("loop", 1))  # the loop row already scored every sampled ticket that way
            timed = [prompts[i] for i in next(iter(found.values())).sample]
            reference = loop.scores if loop else score_one_by_one(model, tokenizer, scorer, timed, progress=progress)
        frames.append(results_frame(found, reference, info, shots, cache.length))
        frames[-1].attrs["failed"] = [f"{line} ({dtype})" for line in failed]
        swept[dtype] = found
        free_memory(torch.device(info.device))
    results = pd.concat(frames, ignore_index=True)
    results.attrs["failed"] = [line for frame in frames for line in frame.attrs["failed"]]
    loop = results.query("strategy == 'loop' and dtype == 'float32'")
    if len(loop):
        results["speedup_vs_loop"] = results["items_per_s"] / loop["items_per_s"].iloc[0]
    return results, swept


def padding_by_strategy(tokenizer, n: int = POOL, batch_size: int = 32, shots: int = 0, seed: int = 0) -> pd.DataFrame:
    """Padding share of each way of forming batches over ``n`` article tickets (the tokenizer alone): everything padded
    to the longest, arbitrary order, sorted, a token budget of ``batch_size`` median prompts. Notebook 04, section 3."""
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
    frame.attrs.update(prompts=f"{shots}-shot" if shots else "zero-shot", batch_size=batch_size, token_budget=budget)
    return frame
