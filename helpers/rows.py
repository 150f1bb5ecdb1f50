"""The rows of a sweep (notebook 04, section 2; notebook 03, section 6): a strategy at a batch size, its whole
batches drawn from the 600-ticket plan (``row_draw``), warmed up (``warm_up``, ``warm_up_fitting``: a row out of
device memory is left out), timed (``score_draw``) and checked against the loop (``reference_rows``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .batching import score_batched
from .models import free_memory, is_out_of_memory
from .scoring import LabelScores
from .generation import generate_answer, parse_label
from .sweep import MIN_TICKETS, STRATA, SWEEP_LOOPS, SWEEP_STRATEGIES, Draw, draw_batches
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


SWEEP_BATCH_SIZES = {"cpu": (1, 2, 4, 8, 16, 32), "gpu": (1, 2, 4, 8, 16, 32, 64, 128, 256)}


def sweep_batch_sizes(device: torch.device | str) -> tuple[int, ...]:
    """The default batch sizes of the sweep: 1 to 32 on a CPU (32 is the article's), 1 to 256 on a GPU (which
    saturates far later). Batch 1 is the loop. Notebook 04, section 2."""
    return SWEEP_BATCH_SIZES["cpu" if torch.device(device).type == "cpu" else "gpu"]


def plan_rows(strategies: Sequence[str], batch_sizes: Sequence[int], others_at: int | None = None,
              ) -> list[tuple[str, int]]:
    """(strategy, batch size) rows: loop-style strategies once at batch 1; the sweep's strategies at every batch
    size; the other batched ones at every batch size too, or only at ``others_at`` when it is given.

    A sweep's strategy at batch 1 is a loop (sorted batches of one are the loop, with the prefix cache the loop with
    it): that point is the loop's row, added where the strategies do not name it.
    Notebook 04, section 2.
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
    allocates the most), or every row where ``every_row`` (a GPU, which picks kernels per shape). Notebook 04, section 2."""
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
    Notebook 04, section 2.
    """
    strategy, cached = STRATEGIES.get(name, ("loop", False))
    budget = int(size * np.median(lengths)) if strategy == "token_budget" else None
    planned = [n - prefix_length for n in lengths] if cached else list(lengths)
    return draw_batches(planned, strategy, size, budget, past=prefix_length if cached else 0, tail=tail,
                        min_tickets=min_tickets, strata=strata)


def score_draw(model, tokenizer, scorer, prompts: Sequence[str], draw: Draw, prefix=None) -> LabelScores:
    """``score_batched`` on a draw's tickets (``prompts``: every ticket's prompt), planned as the draw was: the
    row function of the benchmark and of notebook 04's sweep. Notebook 04, section 2."""
    return score_batched(model, tokenizer, scorer, [prompts[i] for i in draw.tickets], draw.strategy,
                         batch_size=draw.batch_size or 1, token_budget=draw.token_budget, prefix=prefix, progress=False)


def generate_draw(model, tokenizer, prompts, draw: Draw, labels) -> tuple[LabelScores, list[str | None]]:
    """Generate + parse (notebook 01's baseline) on a draw's tickets, one at a time, each ticket timed: a run
    ``estimate_plan`` reads (its scores are zeros: generation scores no labels), and the parsed labels. Notebook 04, section 2."""
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
    builds its kernels for every shape a run meets). Notebook 04, section 2."""
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
    and every larger size of its strategy, said in one line; the next size down warms up instead. Notebook 04, section 2."""
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


def reference_rows(reference: LabelScores, tickets: Sequence[int], draw: Draw) -> LabelScores:
    """The rows of ``reference`` (scores of ``tickets``, in that order) for a draw's tickets, in the draw's order. Notebook 04, section 2."""
    row_of = {ticket: row for row, ticket in enumerate(tickets)}
    return LabelScores(reference.labels, reference.log_scores[[row_of[i] for i in draw.tickets]])


RACE_BATCHES = (32, 16, 8, 4)  # notebook 03's race: the largest of these its budget allows
ARTICLE_BATCH = 32  # the article's batch size


def race_rows(race_batch: int, article_batch: int | None = ARTICLE_BATCH) -> dict[str, tuple[str, int]]:
    """Notebook 03's race: contender -> (strategy, batch size), the loop and three batched strategies at
    ``race_batch``, plus sorted batches of ``article_batch`` (the article's comparison, at its size) where the race
    runs at another size (None: not)."""
    rows = {"loop": ("loop", 1), "arbitrary": ("arbitrary", race_batch), "sorted": ("sorted", race_batch),
            "token_budget": ("token_budget", race_batch)}
    if article_batch is not None and race_batch != article_batch:
        rows[f"sorted, {article_batch}"] = ("sorted", article_batch)
    return rows
