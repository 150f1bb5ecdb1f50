"""Each lesson's sizing, one call per notebook: how many tickets (and timed rounds) fit its time budget here.

Every pass a lesson makes is listed once, as ``PlannedRun``s over the prompt lengths the tokenizer gives, and the
machine profile turns them into seconds before any model runs (``helpers.profile.estimate_runs``);
``fit_to_budget`` picks the count. The functions mirror their notebooks' cells (a pass added to a lesson belongs in
its list here too); a pass of a few tickets that is cheap next to the rest may be left out. Each returns a ``LessonSizing``: printed, one line when all is well, one more per choice that
needs saying (fewer rounds, a floor that gave way, a dtype dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .bench import plan_rows, row_draw, sweep_batch_sizes, warm_up_rows
from .data import LABEL_DESCRIPTIONS, LABELS, build_prompt, encode_prompt, encode_prompts, few_shot_examples, make_tickets
from .prefix_cache import find_prefix_text
from .profile import STRETCH, PlannedRun, continuation_tokens, estimate_runs, fit_to_budget
from .scoring import LabelScorer
from .sweep import MIN_TICKETS, POOL


@dataclass
class LessonSizing:
    """A lesson's sizes: ``n`` tickets, ``repeats`` timed rounds, lesson-specific ``values`` (``sizing["probes"]``),
    and the ``lines`` that say why (``str``: one line when all is well)."""

    n: int
    repeats: int
    values: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def __getitem__(self, name: str):
        return self.values[name]

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _lengths(tokenizer, texts, **options) -> tuple[int, list[int]]:
    """(cached prefix tokens, whole prompt lengths) of ``build_prompt(tokenizer, text, **options)`` per text."""
    prefix = len(encode_prompt(tokenizer, find_prefix_text(tokenizer, **options)))
    return prefix, [len(ids) for ids in encode_prompts(tokenizer, [build_prompt(tokenizer, t, **options) for t in texts])]


def _fit(budget_s, estimate, floor, cap, minimum, n, repeats, derived) -> tuple[int, int, list[str]]:
    """``fit_to_budget``'s count, rounds and lines, the last line followed by ``derived(count)``: what the lesson
    derives from the count, so that all is said in one line when nothing else needs saying."""
    fit = fit_to_budget(budget_s, estimate, floor=floor, cap=cap, minimum=minimum, explicit=n, repeats=repeats)
    lines = list(fit.lines)
    lines[-1] += f"; {derived(fit.n)}"
    return fit.n, fit.repeats, lines


def lesson_01(tokenizer, profile, info, budget_s: float, n: int | None = None, repeats: int = 3,
              shot_counts=(0, 3, 6), few_shot: int = 6, batch_size: int = 8, n_generate: int | None = None,
              n_probes: int | None = None, full_scale: bool = False, seed: int = 0) -> LessonSizing:
    """Notebook 01: tickets for the accuracy sections (at least 90: an accuracy needs them; 6, or down to 3, for a
    random-weight twin, whose accuracy means nothing), a thirtieth of them (3-24) for the generate-vs-score race,
    a third of those (2-8) as probes for the checks: 1 where the floor gave way (a large model or a slow machine;
    each probe costs a dozen full forwards)."""
    pool = make_tickets(300 if not full_scale else 600, seed=seed, style="varied")["text"]
    # The prompt variants of sections 4-6, one pass each (the length-normalised scores reuse the few-shot pass).
    passes = [(shots, None) for shots in dict.fromkeys([*shot_counts, few_shot])] + [(few_shot, LABEL_DESCRIPTIONS)]
    shapes = {}  # (shots, descriptions?) -> (cached prefix tokens, whole prompt lengths)
    for shots, descriptions in [*passes, (0, None)]:
        if (shots, descriptions is not None) not in shapes:
            shapes[shots, descriptions is not None] = _lengths(
                tokenizer, pool, labels=LABELS, examples=few_shot_examples(shots), descriptions=descriptions)
    extra = continuation_tokens(LabelScorer(tokenizer, LABELS))

    def generate_count(count):
        return n_generate or int(np.clip(count // 30, 3, 24))

    floor, minimum = (90, None) if not info.timing_only else (6, 3)

    def probe_count(count):
        gave_way = n is None and count < floor  # not where N_TICKETS was set by hand
        return n_probes or (1 if gave_way else int(np.clip(generate_count(count) // 3, 2, 8)))

    def seconds(count, rounds):
        g, p = generate_count(count), probe_count(count)
        few, zero = shapes[few_shot, False][1], shapes[0, False][1]
        # Sections 1-3, one ticket at a time: generate + parse (few-shot, zero-shot, the drawing and your turn 1),
        # constrained and the shortcut, the race (its rounds: the sections before warmed it up); on the probes,
        # Check 1 (a forward per label, the loop twice: 5), Check 2 (2) and the tree-mask labels (4 slow, 1 fast).
        runs = [PlannedRun(few[:g], new_tokens=5, repeats=2 + rounds), PlannedRun(zero[:g], new_tokens=5),
                PlannedRun(few[:1], new_tokens=5, repeats=2),
                PlannedRun(few[:g], continuation=extra, repeats=2 + rounds),
                PlannedRun(few[:p], continuation=extra, repeats=12),
                # Going deeper: an extending label pair on 3 + g tickets, answer prefixes and whole answers, and
                # the slow way on the probes (4 labels)
                PlannedRun(few[:3 + g], continuation=extra + 1, repeats=2),
                PlannedRun(few[:p], continuation=extra + 1, repeats=4)]
        # Sections 4-6: per variant, the prefix once, the tickets' own tokens in sorted batches on it, the probes.
        for shots, descriptions in passes:
            prefix, whole = shapes[shots, descriptions is not None]
            runs += [PlannedRun([prefix]),
                     PlannedRun([length - prefix for length in whole[:count]], "sorted", batch_size,
                                prefix_tokens=prefix, continuation=extra),
                     PlannedRun(whole[:p], continuation=extra)]
        runs.append(PlannedRun(few[:p], continuation=extra))  # the length-normalised scores' probes
        return estimate_runs(profile, runs)

    lines = []
    if info.timing_only:
        lines.append("random weights: the 90-ticket accuracy floor is skipped (accuracy is meaningless): the floor is "
                     "6 tickets")
    count, rounds, fit = _fit(budget_s, seconds, floor, len(pool), minimum, n, repeats,
                              lambda c: f"{generate_count(c)} for the generate-vs-score race, {probe_count(c)} "
                                        f"probe{'s' if probe_count(c) > 1 else ''}")
    return LessonSizing(count, rounds, {"generate": generate_count(count), "probes": probe_count(count)}, lines + fit)


def lesson_02(tokenizer, profile, info, budget_s: float, n: int | None = None, repeats: int = 3,
              few_shot: int = 6, shot_counts=(0, 2, 6, 12), n_scaling: int | None = None,
              seed: int = 0) -> LessonSizing:
    """Notebook 02: varied tickets for the by-hand cache, the check and the race (at least 6, down to 3 where 6
    need more than 1.5x the budget), and half of them (at least 4) per point of the prefix-length sweep."""
    pool = make_tickets(600, seed=seed, style="varied")["text"]
    scorer = LabelScorer(tokenizer, LABELS)
    extra = continuation_tokens(scorer)
    shapes = {shots: _lengths(tokenizer, pool, labels=LABELS, examples=few_shot_examples(shots))
              for shots in dict.fromkeys([few_shot, *shot_counts])}

    def scaling_count(count):
        return n_scaling or min(count, max(4, count // 2))

    def seconds(count, rounds):
        prefix, whole = shapes[few_shot]
        suffix = [length - prefix for length in whole[:count]]
        runs = [PlannedRun(whole[:count], continuation=extra), PlannedRun(whole[:count]),  # reference; no-cache logits
                PlannedRun(suffix, prefix_tokens=prefix, repeats=2),  # by hand: deepcopy and crop
                PlannedRun(suffix[:2], prefix_tokens=prefix, repeats=3),  # the drawing, your turn 2, the storage
                PlannedRun(suffix, prefix_tokens=prefix, continuation=extra),  # the package
                PlannedRun(whole[:count], continuation=extra, repeats=rounds),  # the race (warm): no cache ...
                PlannedRun(suffix, prefix_tokens=prefix, continuation=extra, repeats=rounds)]  # ... and the cache
        for shots in shot_counts:
            prefix, whole = shapes[shots]
            m = scaling_count(count)
            runs += [PlannedRun(whole[:m], continuation=extra),
                     PlannedRun([length - prefix for length in whole[:m]], prefix_tokens=prefix, continuation=extra)]
        return estimate_runs(profile, runs)

    count, rounds, lines = _fit(budget_s, seconds, 6, len(pool), 3, n, repeats,
                                lambda c: f"{scaling_count(c)} per point of the scaling sweep")
    return LessonSizing(count, rounds, {"scaling": scaling_count(count)}, lines)


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


def lesson_03(tokenizer, profile, info, budget_s: float, n: int | None = None, repeats: int = 3,
              few_shot: int = 3, demo_shots: int = 6, batch_size: int | None = None, race_batch: int | None = None,
              token_budget: int | None = None, per_point: int = MIN_TICKETS, article_batch: int | None = ARTICLE_BATCH,
              seed: int = 0) -> LessonSizing:
    """Notebook 03: the race's batch size (the largest of ``RACE_BATCHES`` whose race, drawn from the 600-ticket
    plan, fits the budget beside the rest of the lesson at its floor), then article tickets for sections 2-6 (at
    least 8, so every strategy runs at least 4 batches at batch 2; down to 4 where 8 need more than 1.5x the
    budget), their batch size (a quarter of the tickets, 2-16) and token budget (batch x the median prompt)."""
    pool = make_tickets(POOL, seed=seed, style="article")["text"]
    examples = few_shot_examples(few_shot)
    pool_lengths = [len(encode_prompt(tokenizer, build_prompt(tokenizer, text))) for text in pool]
    shot_prefix, pool_shot_lengths = _lengths(tokenizer, pool, labels=LABELS, examples=examples)
    demo_prefix, pool_demo_lengths = _lengths(tokenizer, pool, labels=LABELS, examples=few_shot_examples(demo_shots))
    extra = continuation_tokens(LabelScorer(tokenizer, LABELS))

    def sizes_for(count):
        batch = batch_size or int(np.clip(count // 4, 2, 16))
        budget = token_budget or int(batch * np.median(pool_lengths[:count]))
        return batch, budget

    def race_seconds(race, rounds, article=article_batch, count=per_point):
        """The race: a warm-up batch each, then its rounds, and the loop over every drawn ticket (the reference)."""
        racing = race_rows(race, None)
        draws = {name: row_draw(*row, pool_lengths, 0, extra, count) for name, row in race_rows(race, article).items()}
        total = 0.0
        for name, draw in draws.items():  # a warm-up of about one batch; the article's size runs once
            total += sum(draw.predicted_seconds(profile, draw.numbers)) * (
                (rounds if name in racing else 1) + 1 / len(draw.numbers))
        checked = sorted({i for draw in draws.values() for i in draw.tickets})
        return total + estimate_runs(profile, [PlannedRun([pool_lengths[i] for i in checked], continuation=extra)])

    def sections_seconds(count):
        batch, budget = sizes_for(count)
        zero, shot = pool_lengths[:count], pool_shot_lengths[:count]
        demo = pool_demo_lengths[:count]
        demo_suffix = [length - demo_prefix for length in demo]
        suffix = [length - shot_prefix for length in shot]
        runs = [PlannedRun(zero, continuation=extra, repeats=2),  # the loop, and the probes
                PlannedRun(zero), PlannedRun(zero, "sorted", batch, repeats=2),  # by hand: loop; left, the helper
                PlannedRun(demo), PlannedRun(demo, "sorted", batch),  # right padding: the few-shot loop, by hand
                PlannedRun(zero, "arbitrary", batch, continuation=extra),
                PlannedRun(zero, "sorted", batch, continuation=extra),
                PlannedRun(zero, "token_budget", token_budget=budget, continuation=extra),
                # section 5's demo (few-shot loop and sorted batches on the cached prefix), section 7's drawing
                PlannedRun(demo_suffix, prefix_tokens=demo_prefix, continuation=extra),
                PlannedRun(demo_suffix, "sorted", batch, prefix_tokens=demo_prefix, continuation=extra),
                PlannedRun(shot, continuation=extra), PlannedRun(suffix, prefix_tokens=shot_prefix, continuation=extra),
                PlannedRun(suffix, "sorted", batch, prefix_tokens=shot_prefix, continuation=extra)]
        return estimate_runs(profile, runs)

    lines = []
    floor = 8
    race, article, per_race = race_batch, article_batch, per_point
    if race is None:
        fits = [b for b in RACE_BATCHES if race_seconds(b, repeats) + sections_seconds(floor) <= STRETCH * budget_s]
        race = fits[0] if fits else RACE_BATCHES[-1]
        if not fits:  # a slow machine or a large model: the article's size goes, then the tickets per contender halve
            if article is not None and article != race:
                extra_s = race_seconds(race, 2) - race_seconds(race, 2, None)
                lines.append(f"the article's comparison (sorted batches of {article}) left out: it needs an estimated "
                             f"{extra_s:.0f} s more here; ARTICLE_BATCH = {article} with RACE_BATCH = {race} runs it")
                article = None
            while per_race > 4 and race_seconds(race, 2, article, per_race) + sections_seconds(4) > budget_s:
                per_race //= 2

    def cost(count, rounds):
        return sections_seconds(count) + race_seconds(race, rounds, article, per_race)

    count, rounds, fit = _fit(budget_s, cost, floor, POOL, 4, n, repeats,
                              lambda c: "batch size {} (sections 3-6), token budget {}".format(*sizes_for(c)))
    lines += fit
    drawn = (f"the race at batch {race}: each contender's whole batches drawn from the {POOL}-ticket plan (at least "
             f"{per_race} tickets), an estimated {race_seconds(race, rounds, article, per_race):.0f} s of it")
    if race_batch is None and race != RACE_BATCHES[0]:
        drawn += f" (batch {RACE_BATCHES[0]} would need {race_seconds(RACE_BATCHES[0], rounds):.0f} s)"
    lines.append(drawn)
    batch, budget = sizes_for(count)
    return LessonSizing(count, rounds, {"batch_size": batch, "race_batch": race, "token_budget": budget,
                                        "article_batch": article, "per_point": per_race,
                                        "pool_lengths": pool_lengths}, lines)


def lesson_04(tokenizer, profile, info, budget_s: float, dtypes: list[str], per_point: int | None = MIN_TICKETS,
              repeats: int = 2, shots: int = 3, strategies=(), batch_sizes=None, others_at: int | None = 8,
              dtypes_named: bool = False, seed: int = 0) -> LessonSizing:
    """Notebook 04: the points of the sweep the budget buys. Every point times whole batches drawn from the
    600-ticket plan (at least ``per_point`` tickets, at least 2 batches; None: every batch), so its cost is set by
    the draw, not by a ticket count. Where the sweep is over the budget, half precision goes first (unless
    ``dtypes_named``), then the costliest points one by one (never a loop, nor a batch size of 4 or less), then the
    tickets per point halve (down to 4); named ``batch_sizes`` never give way. ``values["rows"]``: the (strategy,
    batch size) rows to run."""
    examples = few_shot_examples(shots)
    pool = make_tickets(POOL, seed=seed, style="article")["text"]
    prefix_tokens, lengths = _lengths(tokenizer, pool, labels=LABELS, examples=examples)
    tail = continuation_tokens(LabelScorer(tokenizer, LABELS))
    every_row = info.device != "cpu"

    def costs(rows, count, dtypes=("float32",)):
        """Per row, its draw's seconds over the repeats and its warm-up, summed over ``dtypes`` (each priced in its
        own dtype: ``in_dtype``); and the reference over every drawn ticket."""
        draws = {row: row_draw(*row, lengths, prefix_tokens, tail, count) for row in rows}
        warmed = warm_up_rows(rows, every_row=every_row)  # as run_benchmark's _timed_rows
        own = {row: sum(sum(draw.predicted_seconds(profile.in_dtype(dtype), draw.numbers)) for dtype in dtypes)
               * (repeats + (row in warmed) / len(draw.numbers)) for row, draw in draws.items()}
        checked = sorted({i for draw in draws.values() for i in draw.tickets})
        return own, estimate_runs(profile, [PlannedRun([lengths[i] for i in checked], continuation=tail)])

    def seconds(rows, run_dtypes, count):
        own, reference = costs(rows, count, run_dtypes)
        generate = estimate_runs(profile, [PlannedRun([lengths[i] for i in row_draw(
            "loop", 1, lengths, prefix_tokens, tail, count).tickets], new_tokens=5)])  # the ladder's first step
        return sum(own.values()) + reference + generate

    lines: list[str] = []
    skipped: list[str] = []  # dtypes dropped for the budget, for the notebook's summary
    dtypes = ["float32", *[d for d in dtypes if d != "float32"]]  # float32 first: its loop is every row's reference
    sizes = list(batch_sizes or sweep_batch_sizes(info.device))
    rows = plan_rows(strategies, sizes, others_at)
    if not dtypes_named and len(dtypes) > 1 and seconds(rows, dtypes, per_point) > budget_s:
        # A slow machine or a large model: keep to the budget by running float32 alone, and say so.
        dropped, dtypes = dtypes[1:], dtypes[:1]
        skipped.append(f"{', '.join(dropped)} skipped: the sweep in every dtype needs an estimated "
                       f"{seconds(rows, dropped + dtypes, per_point):.0f} s here, over the {budget_s:.0f} s budget; "
                       "raise TIME_BUDGET_S or name the dtypes in DTYPES")
        lines.append(skipped[-1])
    wanted, count = list(rows), per_point
    if batch_sizes is None:
        while seconds(rows, dtypes, count) > budget_s:
            own, _ = costs(rows, count, dtypes)
            optional = [row for row in rows if row[1] > 4]
            if optional:
                rows.remove(max(optional, key=own.get))  # the costliest point goes first
            elif count is not None and count > 4:
                count //= 2
            else:
                break
    needed = seconds(rows, dtypes, count)
    sizes = sorted({size for _, size in rows})
    drawn = "every batch of" if count is None else f"at least {count} tickets in whole batches from"
    line = (f"batch sizes {', '.join(map(str, sizes))}, each point {drawn} the {POOL}-ticket plan, {repeats} repeats; "
            f"dtypes {', '.join(dtypes)}: an estimated {needed:.0f} s of model time here")
    line += f", over the {budget_s:.0f} s budget" if needed > budget_s else f", within the {budget_s:.0f} s budget"
    left_out = [row for row in wanted if row not in rows]
    if left_out:
        line += (f" (left out: {', '.join(f'{name} at {size}' for name, size in left_out)}, which would need "
                 f"{seconds(wanted, dtypes, per_point):.0f} s in all; raise TIME_BUDGET_S for them)")
    if count != per_point:
        line += f"; {count} tickets per point instead of {per_point}"
    lines.append(line)
    if repeats < 2:
        lines.append(f"{repeats} repeat per row: no point gets a spread, so no sentence below ranks two rows "
                     "(use at least 2)")
    return LessonSizing(count or POOL, repeats, {"dtypes": dtypes, "batch_sizes": sizes, "rows": rows,
                                                 "per_point": count, "skipped": skipped}, lines)
