"""Length-bucketed batching, alone or on top of the prefix cache (notebook 03).

A padded batch costs (rows x its longest row) tokens. Sorting by token length puts similar lengths
together, so each batch pads only to its own maximum; a token budget caps (rows x longest row)
instead of rows, so the long tail never blows memory. Results always return to their input slots.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from .data import encode_prompt
from .scoring import LabelScorer, LabelScores, label_log_probs

STRATEGIES = ("loop", "arbitrary", "sorted", "token_budget")


@dataclass
class PaddingReport:
    real_tokens: int
    processed_tokens: int
    n_batches: int

    @property
    def padding_tokens(self) -> int:
        return self.processed_tokens - self.real_tokens

    @property
    def padding_fraction(self) -> float:
        """Padding tokens / processed tokens."""
        return self.padding_tokens / self.processed_tokens if self.processed_tokens else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "padding_fraction": self.padding_fraction}


def plan_batches(
    lengths: Sequence[int],
    strategy: str = "sorted",
    batch_size: int = 16,
    token_budget: int | None = None,
) -> list[list[int]]:
    """Indices of the items in each batch, in the order the batches run.

    ``loop``: one item per batch, input order. ``arbitrary``: ``batch_size`` items per batch, input
    order. ``sorted``: longest first (an out-of-memory error shows up in the first batch, not the last),
    ``batch_size`` per batch. ``token_budget``: longest first, as many rows as keep rows x longest row
    within ``token_budget``; a single item over the budget runs alone.
    """
    n = len(lengths)
    if n == 0:
        raise ValueError("nothing to batch: the list of items is empty")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown batching strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if strategy == "loop":
        return [[i] for i in range(n)]
    if strategy == "token_budget":
        if token_budget is None or token_budget < 1:
            raise ValueError(f"strategy 'token_budget' needs token_budget >= 1, got {token_budget}")
    elif batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if strategy == "arbitrary":
        return [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    if strategy == "sorted":
        return [order[start:start + batch_size] for start in range(0, n, batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Longest first, so the batch's first row sets its padded width.
        width = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1) * width > token_budget:
            batches.append(current)
            current = []
        current.append(index)
    batches.append(current)
    return batches


def padding_report(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> PaddingReport:
    """Real vs processed (padded) tokens for a batch plan."""
    processed = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return PaddingReport(int(sum(lengths)), int(processed), len(batches))


def global_padding_factor(lengths: Sequence[int]) -> float:
    """Processed / real tokens when everything is padded to the longest item."""
    return len(lengths) * max(lengths) / sum(lengths)


def score_batched(
    model,
    tokenizer,
    scorer: LabelScorer,
    prompts: Sequence[str],
    strategy: str = "sorted",
    batch_size: int = 16,
    token_budget: int | None = None,
    prefix=None,
    progress: bool = True,
) -> LabelScores:
    """Label scores for every prompt, in input order, plus timing and padding accounting in ``.info``.

    With ``prefix`` (a ``PrefixCache``) only each prompt's tokens after the prefix are run; the
    prefix is shared by every row of every batch.
    """
    if len(prompts) == 0:
        raise ValueError("no prompts to score")
    start = time.perf_counter()
    if prefix is not None:
        rows = [prefix.split(prompt, i) for i, prompt in enumerate(prompts)]
    else:
        rows = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    lengths = [len(row) for row in rows]
    batches = plan_batches(lengths, strategy, batch_size, token_budget)
    scores = torch.full((len(rows), len(scorer.labels)), float("nan"))
    with tqdm(total=len(rows), desc=strategy, disable=not progress, leave=False) as bar:
        for batch in batches:
            # Scores go back to their input slots: batches run in sorted order.
            scores[batch] = label_log_probs(
                model, scorer, [rows[i] for i in batch], tokenizer.pad_token_id, prefix=prefix
            )
            bar.update(len(batch))
    seconds = time.perf_counter() - start
    if torch.isnan(scores).any():
        bad = torch.isnan(scores).any(-1).nonzero().flatten().tolist()
        raise RuntimeError(f"NaN scores for items {bad[:10]}: check the attention mask and dtype")
    info = {
        "strategy": strategy,
        "batch_size": 1 if strategy == "loop" else (None if strategy == "token_budget" else batch_size),
        "token_budget": token_budget if strategy == "token_budget" else None,
        "prefix_tokens": prefix.length if prefix is not None else 0,
        "n": len(rows),
        "seconds": seconds,
        "items_per_s": len(rows) / seconds,
        **padding_report(lengths, batches).as_dict(),
    }
    return LabelScores(scorer.labels, scores, info)
