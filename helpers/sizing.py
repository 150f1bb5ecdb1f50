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

from .bench import STRATEGIES as ROW_KINDS
from .bench import SWEEP_FLOOR, SWEEP_STRATEGIES, plan_rows, sweep_batch_sizes, warm_up_rows
from .data import LABEL_DESCRIPTIONS, LABELS, build_prompt, encode_prompt, encode_prompts, few_shot_examples, make_tickets
from .prefix_cache import find_prefix_text
from .profile import PlannedRun, continuation_tokens, estimate_runs, fit_to_budget
from .scoring import LabelScorer


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
              shot_counts=(0, 3, 6), few_shot: int = 6, batch_size: int = 4, n_generate: int | None = None,
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


def lesson_03(tokenizer, profile, info, budget_s: float, n: int | None = None, repeats: int = 3,
              few_shot: int = 3, demo_shots: int = 6, batch_size: int | None = None, batch_sizes=None,
              token_budget: int | None = None, seed: int = 0) -> LessonSizing:
    """Notebook 03: article tickets (at least 8, so every strategy runs at least 4 batches at batch 2; down to 4
    where 8 need more than 1.5x the budget); the batch size (a quarter of the tickets, 2-16), the sweep of section
    7 (those of 4, 8, 16, 32 that leave at least 4 batches) and the token budget (batch x the median prompt)."""
    pool = make_tickets(600, seed=seed, style="article")["text"]
    examples = few_shot_examples(few_shot)
    pool_lengths = [len(encode_prompt(tokenizer, build_prompt(tokenizer, text))) for text in pool]
    shot_prefix, pool_shot_lengths = _lengths(tokenizer, pool, labels=LABELS, examples=examples)
    demo_prefix, pool_demo_lengths = _lengths(tokenizer, pool, labels=LABELS, examples=few_shot_examples(demo_shots))
    extra = continuation_tokens(LabelScorer(tokenizer, LABELS))

    def sizes_for(count):
        batch = batch_size or int(np.clip(count // 4, 2, 16))
        sweep = list(batch_sizes or ([b for b in (4, 8, 16, 32) if b <= count // 4] or [batch]))
        budget = token_budget or int(batch * np.median(pool_lengths[:count]))
        return batch, sweep, budget

    def seconds(count, rounds):
        batch, sweep, budget = sizes_for(count)
        zero, shot = pool_lengths[:count], pool_shot_lengths[:count]
        suffix = [length - shot_prefix for length in shot]
        demo = pool_demo_lengths[:count]
        demo_suffix = [length - demo_prefix for length in demo]
        runs = [PlannedRun(zero, continuation=extra, repeats=2),  # the loop, and the probes
                PlannedRun(zero), PlannedRun(zero, "sorted", batch, repeats=2),  # by hand: loop; left, the helper
                PlannedRun(demo), PlannedRun(demo, "sorted", batch),  # right padding: the few-shot loop, by hand
                PlannedRun(zero, "arbitrary", batch, continuation=extra),
                PlannedRun(zero, "sorted", batch, continuation=extra),
                PlannedRun(zero, "token_budget", token_budget=budget, continuation=extra),
                # the race: the rounds of the loop and the three batched strategies (warm: they ran above)
                PlannedRun(zero, continuation=extra, repeats=rounds),
                PlannedRun(zero, "arbitrary", batch, continuation=extra, repeats=rounds),
                PlannedRun(zero, "sorted", batch, continuation=extra, repeats=rounds),
                PlannedRun(zero, "token_budget", token_budget=budget, continuation=extra, repeats=rounds),
                # section 5's demo (few-shot loop and sorted batches on the cached prefix), section 7's references
                PlannedRun(demo_suffix, prefix_tokens=demo_prefix, continuation=extra),
                PlannedRun(demo_suffix, "sorted", batch, prefix_tokens=demo_prefix, continuation=extra),
                PlannedRun(shot, continuation=extra), PlannedRun(suffix, prefix_tokens=shot_prefix, continuation=extra)]
        for size in sweep:
            runs += [PlannedRun(shot, "arbitrary", size, continuation=extra),
                     PlannedRun(shot, "sorted", size, continuation=extra),
                     PlannedRun(suffix, "sorted", size, prefix_tokens=shot_prefix, continuation=extra)]
        return estimate_runs(profile, runs)

    count, rounds, lines = _fit(budget_s, seconds, 8, len(pool), 4, n, repeats, lambda c: (
        "batch size {} (sections 3-6), sweep {} (section 7), token budget {}".format(*sizes_for(c))))
    batch, sweep, budget = sizes_for(count)
    return LessonSizing(count, rounds, {"batch_size": batch, "batch_sizes": sweep, "token_budget": budget,
                                        "pool_lengths": pool_lengths}, lines)


def lesson_04(tokenizer, profile, info, budget_s: float, dtypes: list[str], n: int | None = None, repeats: int = 2,
              shots: int = 3, strategies=(), batch_sizes=None, others_at: int | None = 8, dtypes_named: bool = False,
              seed: int = 0) -> LessonSizing:
    """Notebook 04: article tickets for the benchmark (at least 8, for 5 batch sizes of the sweep, or the largest
    size asked for; where 8 need more than 1.5x the budget, as many as fit it: 6 or 7 still sweep 5 sizes, down to
    4 tickets at sizes 2-4), its batch sizes, the dtypes (half precision is dropped before the curve is, unless
    ``dtypes_named``) and ``others_at`` clamped to the tickets (arbitrary order left out where one batch holds them
    all: ``plan_rows``)."""
    examples = few_shot_examples(shots)
    pool = make_tickets(600, seed=seed, style="article")["text"]
    prefix_tokens, pool_lengths = _lengths(tokenizer, pool, labels=LABELS, examples=examples)
    extra = continuation_tokens(LabelScorer(tokenizer, LABELS))
    base = profile.matmul_gflops["float32"]

    def sizes_for(count):
        return list(batch_sizes or sweep_batch_sizes(info.device, count))

    def seconds(count, rounds, run_dtypes=None):
        rows = plan_rows(strategies, sizes_for(count), others_at, count)  # (strategy, batch size), as run_benchmark
        lengths = pool_lengths[:count]
        suffix = [length - prefix_tokens for length in lengths]
        budget_per_row = int(np.median(lengths))
        longest = sorted(lengths)[::-1]
        total = 0.0
        for dtype in run_dtypes or dtypes:
            slowdown = base / profile.matmul_gflops.get(dtype, base)
            runs = []
            if dtype == "float32" and ("loop", 1) not in rows:  # the reference every row is checked against
                runs.append(PlannedRun(lengths, continuation=extra, repeats=rounds))
            warmed = warm_up_rows(rows, every_row=info.device != "cpu")  # as run_benchmark's _timed_rows
            for name, size in rows:
                if name == "generate":
                    runs += [PlannedRun(lengths, new_tokens=5)] if dtype == "float32" else []
                    continue
                strategy, cached = ROW_KINDS[name]
                row_budget = size * budget_per_row if strategy == "token_budget" else None
                rows_of = suffix if cached else lengths
                runs.append(PlannedRun(rows_of, strategy, size, row_budget, prefix_tokens=prefix_tokens if cached else 0,
                                       continuation=extra, repeats=rounds, slowdown=slowdown))
                if (name, size) in warmed:  # the warm-up: one batch of the longest prompts
                    warm = [length - (prefix_tokens if cached else 0) for length in longest[:min(size, 8)]]
                    runs.append(PlannedRun(warm, strategy, size, row_budget,
                                           prefix_tokens=prefix_tokens if cached else 0, continuation=extra,
                                           slowdown=slowdown))
            total += estimate_runs(profile, runs)
        return total

    lines: list[str] = []
    skipped: list[str] = []  # dtypes dropped for the budget, for the notebook's summary
    floor = max([*batch_sizes, others_at or 1]) if batch_sizes else max(SWEEP_FLOOR, others_at or 1)
    if not dtypes_named and n is None and len(dtypes) > 1:
        every_dtype = seconds(floor, repeats)
        if every_dtype > budget_s:
            # A slow machine or a large model: keep to the budget by running float32 alone, and say so.
            dropped, dtypes = dtypes[1:], dtypes[:1]
            skipped.append(f"{', '.join(dropped)} skipped: {floor} tickets in every dtype need an estimated "
                           f"{every_dtype:.0f} s here, over the {budget_s:.0f} s budget; raise TIME_BUDGET_S or name "
                           "the dtypes in DTYPES")
            lines.append(skipped[-1])
    others = [name for name in strategies
              if name in ROW_KINDS and name not in SWEEP_STRATEGIES and ROW_KINDS[name][0] != "loop"]

    def plan_line(count):
        line = f"dtypes {', '.join(dtypes)}; {', '.join(SWEEP_STRATEGIES)} at batch sizes {sizes_for(count)}"
        rows = plan_rows(strategies, sizes_for(count), others_at, count)
        for name in others:
            at = [str(size) for size in sorted({min(size, count) for row, size in rows if row == name})]  # clamped
            if at:
                line += f"; {name} at {', '.join(at)}"
        return line

    count, rounds, fit = _fit(budget_s, lambda c, r: seconds(c, r, dtypes), floor, len(pool),
                              None if batch_sizes else 4, n, repeats, plan_line)
    lines += fit
    sizes = sizes_for(count)
    run_others = [name for name in others if name in dict(plan_rows(strategies, sizes, others_at, count))]
    if "arbitrary" in others and "arbitrary" not in run_others:
        lines.append(f"arbitrary order left out where a batch holds all {count} tickets: the same work as sorted's "
                     "one batch")
    if others_at is not None and others_at > count:
        if run_others:
            lines.append(f"OTHERS_AT {others_at} -> {count}: a batch cannot hold more than the {count} tickets")
        others_at = count
    if rounds < 2:
        lines.append(f"{rounds} repeat per row: no point gets a spread, so no sentence below ranks two rows "
                     "(use at least 2)")
    return LessonSizing(count, rounds, {"dtypes": dtypes, "batch_sizes": sizes, "others_at": others_at,
                                        "skipped": skipped}, lines)
