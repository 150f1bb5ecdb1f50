"""Length-bucketed batching, alone or on top of the prefix cache (notebook 03).

A padded batch costs (rows x its longest row) tokens. Sorting by token length puts similar lengths together, so each
batch pads only to its own maximum; a token budget caps (rows x longest row) instead of rows, so the long tail never
blows memory. Results always return to their input slots."""

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from .data import encode_prompts
from .prefix_cache import UncleanSplitError
from .scoring import LabelScorer, LabelScores, label_log_probs
from .timing import sync

STRATEGIES = ("loop", "arbitrary", "sorted", "token_budget")


class NonFiniteScores(RuntimeError):
    """A forward gave NaN label scores: a broken mask, or a half dtype overflowing. Notebook 03, section 2."""


@dataclass
class PaddingReport:
    """Real and processed (padded) tokens of some batches, and the share that was padding. Notebook 03, section 3."""

    real_tokens: int
    processed_tokens: int
    n_batches: int

    @property
    def padding_fraction(self) -> float:
        return (self.processed_tokens - self.real_tokens) / self.processed_tokens if self.processed_tokens else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "padding_fraction": self.padding_fraction}


def plan_batches(
    lengths: Sequence[int], strategy="sorted", batch_size=16, token_budget=None, tokens_per_row=0
) -> list[list[int]]:
    """Indices of the items in each batch, in the order the batches run. ``loop``: one item per batch, input order;
    ``arbitrary``: ``batch_size`` per batch, input order; ``sorted``: longest first (out of memory shows in the first
    batch), ``batch_size`` per batch; ``token_budget``: longest first, as many rows as keep rows x (``tokens_per_row``,
    e.g. a cached prefix, + the longest row) within ``token_budget``, an item over it alone. Notebook 03, section 3."""
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
        if tokens_per_row < 0:
            raise ValueError(f"tokens_per_row must be >= 0, got {tokens_per_row}")
    elif batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if strategy == "arbitrary":
        return [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    if strategy == "sorted":
        return [order[start : start + batch_size] for start in range(0, n, batch_size)]
    batches: list[list[int]] = []
    for index in order:  # longest first, so a batch's first row sets its padded width
        if batches and (len(batches[-1]) + 1) * (tokens_per_row + lengths[batches[-1][0]]) <= token_budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def padding_report(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> PaddingReport:
    """Real vs processed (padded) tokens of these batches (a plan, or some of its batches). Notebook 03, section 4."""
    processed = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return PaddingReport(int(sum(lengths[i] for batch in batches for i in batch)), int(processed), len(batches))


def global_padding_factor(lengths: Sequence[int]) -> float:
    """Processed / real tokens when everything is padded to the longest item. Notebook 00, section 3."""
    return len(lengths) * max(lengths) / sum(lengths)


@dataclass(frozen=True)
class Batching:
    """``score_batched``'s batches in full: ``plan_batches``' strategy and sizes; ``first``: items whose batches run
    before the others (the verified path's calibration sample, in the job's own batches); ``on_batch(items, log_scores,
    full)``: called as each batch finishes; ``unclean``: a prompt not token-clean at the prefix runs in full ("full",
    in ``.info["full_prompt_items"]``) or stops the run ("raise"), as one not starting with it does. Notebook 03."""

    strategy: str = "sorted"
    batch_size: int = 16
    token_budget: int | None = None
    first: Collection[int] = ()
    on_batch: Callable | None = None
    unclean: str = "full"


def score_batched(
    model,
    tokenizer,
    scorer: LabelScorer,
    prompts: Sequence[str],
    strategy: str | Batching = "sorted",
    batch_size: int | None = None,
    prefix=None,
    progress: bool = True,
) -> LabelScores:
    """Label scores for every prompt, in input order, timing and padding in ``.info``. ``strategy``: a ``plan_batches``
    strategy with ``batch_size`` rows per batch (default 16), or a ``Batching`` (a token budget, an order, a call per
    batch). With ``prefix`` (a ``PrefixCache``) only each prompt's tokens after it run. Notebook 03, section 2."""
    how = strategy if isinstance(strategy, Batching) else Batching(strategy)
    if batch_size is not None and how is strategy:
        raise ValueError("a Batching holds its own batch_size: give it there")
    how = how if batch_size is None else replace(how, batch_size=batch_size)
    if len(prompts) == 0:
        raise ValueError("no prompts to score")
    if how.unclean not in ("full", "raise"):
        raise ValueError(f"unclean must be 'full' or 'raise', got {how.unclean!r}")
    sync(model.device)  # earlier queued GPU work is not this run's
    start = time.perf_counter()
    cached, full = {}, {}  # item -> its tokens after the prefix, or (run in full) all its tokens
    # Every prompt is tokenized once, in one call; the prefix split cuts the ids, never the text.
    for i, (prompt, ids) in enumerate(zip(prompts, encode_prompts(tokenizer, prompts))):
        try:
            if prefix is not None:
                cached[i] = prefix.split(prompt, i, ids=ids)
                continue
        except UncleanSplitError:
            if how.unclean == "raise":
                raise
        full[i] = ids
    tokenized = time.perf_counter()
    # Two groups, each planned on its own: rows after the cached prefix, and rows run in full.
    groups = [(list(group), list(group.values()), cache) for group, cache in ((cached, prefix), (full, None)) if group]
    scores = torch.full((len(prompts), len(scorer.labels)), float("nan"))
    # every batch's input positions as it ran, and its seconds (its scores' copy to the host waits for the device)
    ran = []
    batch_seconds = []
    planned = []  # (input positions, their rows, cache, shape) in running order
    for items, rows, cache in groups:
        lengths, past = [len(row) for row in rows], cache.length if cache is not None else 0
        # Besides its own tokens, every row holds the label continuations and (when cached) the prefix.
        batches = plan_batches(lengths, how.strategy, how.batch_size, how.token_budget, len(scorer.tail) + past)
        # shapes: (rows, padded width: the longest row plus the label tokens appended to every row, cached prefix)
        shapes = [(len(batch), max(lengths[i] for i in batch) + len(scorer.tail), past) for batch in batches]
        planned += [([items[j] for j in b], [rows[j] for j in b], cache, shape) for b, shape in zip(batches, shapes)]
    planned.sort(key=lambda batch, first=set(how.first): first.isdisjoint(batch[0]))  # stable: else the plan's order
    passes = [shape for *_, shape in planned]  # every forward pass's shape, in the order they run
    with tqdm(total=len(prompts), desc=how.strategy, disable=not progress, leave=False) as bar:
        for slots, rows, cache, _ in planned:
            began = time.perf_counter()
            scores[slots] = label_log_probs(model, scorer, rows, tokenizer.pad_token_id, cache)
            batch_seconds.append(time.perf_counter() - began)
            ran.append(slots)
            if how.on_batch is not None:
                how.on_batch(slots, scores[slots], cache is None and prefix is not None)
            bar.update(len(slots))
    sync(model.device)
    seconds = time.perf_counter() - start
    if torch.isnan(scores).any():
        bad = torch.isnan(scores).any(-1).nonzero().flatten().tolist()
        raise NonFiniteScores(f"NaN scores for items {bad[:10]}: check the attention mask and dtype")
    info = {
        "strategy": how.strategy,
        "batch_size": 1 if how.strategy == "loop" else (None if how.strategy == "token_budget" else how.batch_size),
        "token_budget": how.token_budget if how.strategy == "token_budget" else None,
        "prefix_tokens": prefix.length if prefix is not None else 0,
        "full_prompt_items": sorted(full) if prefix is not None else [],
        "n": len(prompts),
        "seconds": seconds,
        "tokenize_seconds": tokenized - start,  # part of "seconds": the rest is the forward passes
        "forward_passes": passes,
        "batches": ran,
        "batch_seconds": batch_seconds,
        "items_per_s": len(prompts) / seconds,
        # every batch's real and padded tokens, of each row's tokens after the prefix where it ran on the cache
        **padding_report({i: len(ids) for i, ids in (cached | full).items()}, ran).as_dict(),
    }
    return LabelScores(scorer.labels, scores, info)
