"""Sizing work by time: the largest count whose estimated seconds fit a budget, each decision in one line.

``fit_to_budget`` gives a lesson its ticket count and timed rounds from an estimate (``helpers.costs`` prices a
lesson from the forward calls it really makes); ``race_seconds`` and ``sweep_seconds`` price the drawn batches of
03's race and 04's sweep (``Draw.predicted_seconds``); ``estimate_runs`` prices planned passes over prompts on the
machine profile (notebook 02's ideal saving).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .profile import MachineProfile


def size_to_budget(
    budget_s: float,
    estimate: Callable[[int], float],
    floor: int,
    cap: int,
    explicit: int | None = None,
    what: str = "tickets",
    set_by: str = "set explicitly",
) -> tuple[int, str]:
    """The largest count in [floor, cap] whose estimated seconds (``estimate(n)``) fit ``budget_s``; and why.

    ``estimate`` should grow with n (it is searched by doubling, then bisection). An explicit count wins.
    """
    if explicit is not None:
        n = int(explicit)
        return n, f"{n} {what}: {set_by} (estimated {estimate(n):.0f} s of model time on this machine)"
    if estimate(floor) > budget_s:
        return floor, (f"{floor} {what}: the fewest that keep the lesson visible, although they need an estimated "
                       f"{estimate(floor):.0f} s here, over the {budget_s:.0f} s budget")
    low, high = floor, floor
    while high < cap and estimate(min(cap, high * 2)) <= budget_s:
        low = high = min(cap, high * 2)
    if high < cap:
        high = min(cap, high * 2)  # estimate(high) > budget: bisect between low (fits) and high (does not)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if estimate(middle) <= budget_s else (low, middle)
    reason = (f"{low} {what}: an estimated {estimate(low):.0f} s of model time on this machine (from its measured "
              f"profile), within the {budget_s:.0f} s budget")
    return low, reason + (f" (capped at {cap})" if low == cap else "")


STRETCH = 1.5  # a lesson keeps its floor up to this many times its budget; beyond, it shrinks to fit the budget


@dataclass
class Sizing:
    """What ``fit_to_budget`` chose: the count, the timed rounds, and one line per decision (``str``: the lines)."""

    n: int
    repeats: int | None
    lines: list[str]

    def __str__(self) -> str:
        return "\n".join(self.lines)


def fit_to_budget(
    budget_s: float,
    estimate: Callable[..., float],
    floor: int,
    cap: int,
    *,
    minimum: int | None = None,
    explicit: int | None = None,
    repeats: int | None = None,
    what: str = "tickets",
    set_by: str = "set explicitly",
) -> Sizing:
    """A lesson's count and timed rounds for its time budget, and why, in one call.

    ``estimate(n)``, or ``estimate(n, repeats)`` when ``repeats`` is given: the lesson's model seconds. An explicit
    count wins. Otherwise, where even ``floor`` is over the budget, the timed rounds drop to 2 (the fewest that give
    a spread); the count is the largest in [floor, cap] within the budget (``size_to_budget``), or the floor while
    it needs at most ``STRETCH`` times the budget. A floor beyond that (a large model, a slow machine) gives way:
    the largest count in [minimum, floor) within the budget, at least ``minimum`` (None: the floor
    never gives way, e.g. an accuracy that needs its tickets).
    """
    lines: list[str] = []
    cost = (lambda n: estimate(n, repeats)) if repeats is not None else estimate
    if explicit is None and repeats is not None and repeats > 2 and cost(floor) > budget_s:
        wanted, needed, repeats = repeats, cost(floor), 2
        lines.append(f"2 timed rounds instead of {wanted}: {floor} {what} with {wanted} need an estimated {needed:.0f} s "
                     f"here, over the {budget_s:.0f} s budget")
    if explicit is not None or cost(floor) <= STRETCH * budget_s or minimum is None or minimum >= floor:
        n, why = size_to_budget(budget_s, cost, floor=floor, cap=cap, explicit=explicit, what=what, set_by=set_by)
        return Sizing(n, repeats, [*lines, why])
    n = next((n for n in range(floor - 1, minimum - 1, -1) if cost(n) <= budget_s), minimum)
    lines.append(f"{n} {what}, below this lesson's floor of {floor}: {floor} need an estimated {cost(floor):.0f} s here, "
                 f"over {STRETCH:g}x the {budget_s:.0f} s budget (a large model or a slow machine); {n} need about "
                 f"{cost(n):.0f} s. N_TICKETS = {floor} runs every section at its intended size")
    return Sizing(n, repeats, lines)


@dataclass
class PlannedRun:
    """One pass over prompts that a notebook is about to make, for ``estimate_runs``.

    ``lengths``: each prompt's tokens (after the prefix when ``prefix_tokens`` > 0). ``continuation``: label
    tokens appended after the prompt per row, in the same forward (``continuation_tokens(scorer)``).
    ``new_tokens``: tokens generated per prompt (the generate + parse baseline), each a decode step at batch 1.
    """

    lengths: Sequence[int]
    strategy: str = "loop"
    batch_size: int = 1
    token_budget: int | None = None
    prefix_tokens: int = 0
    continuation: int = 0
    new_tokens: int = 0
    repeats: int = 1
    slowdown: float = 1.0  # e.g. float32 matmul / bfloat16 matmul, for a run in another dtype


def continuation_tokens(scorer) -> int:
    """Label tokens a scorer runs after each prompt (0 on the first-token path)."""
    return len(scorer.tail)


def estimate_runs(profile: MachineProfile, runs: Iterable[PlannedRun]) -> float:
    """Estimated seconds of model time for the planned runs: each forward call priced by the profile's ``CallCost``."""
    from .batching import plan_batches

    total = 0.0
    for run in runs:
        if not len(run.lengths):
            continue
        lengths = list(run.lengths)
        batches = plan_batches(lengths, run.strategy, run.batch_size, run.token_budget,
                               tokens_per_row=run.prefix_tokens + run.continuation)  # as score_batched plans them
        seconds = 0.0
        for batch in batches:
            width = max(lengths[i] for i in batch) + run.continuation
            seconds += profile.call_seconds(len(batch), width, run.prefix_tokens)
        if run.new_tokens > 1:
            seconds += len(lengths) * (run.new_tokens - 1) / profile.decode[1]
        total += seconds * run.repeats * run.slowdown
    return total


# --- each lesson's sizes -----------------------------------------------------------------------------------
# What a lesson sizes comes from its settings and its cost record (helpers.costs); the plans of 03's race and 04's
# sweep are priced batch by batch from the same draws the notebooks time.

# lesson -> (floor, the least its floor gives way to (None: never), cap) of its ticket count; for random weights
FLOORS = {"01": (90, None, 300), "02": (6, 3, 600), "03": (8, 4, 600)}
TWIN_FLOORS = {"01": (6, 3, 300)}


@functools.lru_cache(maxsize=8)
def _pool(tokenizer, shots: int, seed: int = 0) -> tuple[int, tuple[int, ...], int]:
    """(cached prefix tokens, whole prompt tokens of the 600 article tickets, label tokens after each) with
    ``shots`` examples (0: no prefix is cached), the tickets of ``seed`` as the notebooks draw them."""
    from .data import LABELS, build_prompt, encode_prompt, encode_prompts, few_shot_examples, make_tickets
    from .prefix_cache import find_prefix_text
    from .scoring import LabelScorer
    from .sweep import POOL

    examples = few_shot_examples(shots)
    texts = make_tickets(POOL, seed=seed, style="article")["text"]
    lengths = tuple(map(len, encode_prompts(tokenizer, [build_prompt(tokenizer, t, LABELS, examples) for t in texts])))
    prefix = len(encode_prompt(tokenizer, find_prefix_text(tokenizer, labels=LABELS, examples=examples))) if shots else 0
    return prefix, lengths, len(LabelScorer(tokenizer, LABELS).tail)


def race_seconds(profile: MachineProfile, tokenizer, settings: dict) -> float:
    """Notebook 03's race as planned: each contender's drawn batches, priced, times its rounds (the article's size
    runs once)."""
    from .rows import race_rows, row_draw
    from .sweep import MIN_TICKETS

    _, lengths, tail = _pool(tokenizer, 0, settings.get("SEED", 0))
    per_point = None if settings.get("FULL_SCALE") else (settings.get("TICKETS_PER_POINT") or MIN_TICKETS)
    racing = race_rows(settings["RACE_BATCH"], None)
    total = 0.0
    for name, row in race_rows(settings["RACE_BATCH"], settings.get("ARTICLE_BATCH")).items():
        draw = row_draw(*row, lengths, 0, tail, per_point)
        total += sum(draw.predicted_seconds(profile, draw.numbers)) * (settings["REPEATS"] if name in racing else 1)
    return total


def sweep_seconds(profile: MachineProfile, tokenizer, settings: dict, rows=None, dtypes=None) -> dict:
    """Notebook 04's sweep as planned: row -> its drawn batches priced in every dtype, times the repeats."""
    from .rows import plan_rows, row_draw, sweep_batch_sizes
    from .sweep import MIN_TICKETS, SWEEP_STRATEGIES

    prefix, lengths, tail = _pool(tokenizer, settings["SHOTS"], settings.get("SEED", 0))
    per_point = None if settings.get("FULL_SCALE") else (settings.get("TICKETS_PER_POINT") or MIN_TICKETS)
    if rows is None:
        sizes = settings.get("BATCH_SIZES") or sweep_batch_sizes(profile.device)
        rows = plan_rows(["loop", "loop_prefix", *SWEEP_STRATEGIES], sizes, settings.get("OTHERS_AT"))
    dtypes = dtypes or settings.get("DTYPES") or ["float32"]
    from .rows import STRATEGIES

    seconds = {}
    for row in rows:
        cached = STRATEGIES[row[0]][1]
        draw = row_draw(*row, lengths, prefix if cached else 0, tail, per_point)
        seconds[row] = settings["REPEATS"] * sum(sum(draw.predicted_seconds(profile.in_dtype(d), draw.numbers))
                                                 for d in dtypes)
    return seconds


def size_lesson(lesson: str, settings: dict, defaults: dict, tokenizer, profile: MachineProfile, info,
                record: dict | None = None) -> tuple[dict, list[str]]:
    """The sizes a lesson runs at, for its ``TIME_BUDGET_S`` here: (the settings it sized, one line per decision).

    01-03 fit their ticket count and timed rounds to the budget (``fit_to_budget``: the floor, the stretch, the
    least a floor gives way to, an explicit ``N_TICKETS`` wins); 03 first picks its race's batch size, and 04 the
    points of its sweep, from their priced plans. Every estimate is the lesson's recorded calls on this profile
    (``helpers.costs.lesson_cost``)."""
    from .costs import lesson_cost

    budget, sized, lines = settings["TIME_BUDGET_S"], {}, []

    def preset_set(name):  # a value the preset chose, not the reader
        return name in settings.get("_preset", ())

    plan = {"03": race_seconds, "04": lambda p, t, s: sum(sweep_seconds(p, t, s).values())}.get(lesson)
    cost = lesson_cost(lesson, profile, tokenizer, record=record, seed=settings.get("SEED", 0),
                       plan_price=(lambda params: plan(profile, tokenizer, {**defaults, **params})) if plan else None)
    if lesson == "04":
        return _size_sweep(settings, tokenizer, profile, cost)
    floor, minimum, cap = (TWIN_FLOORS.get(lesson) if info.timing_only else None) or FLOORS[lesson]
    if info.timing_only and lesson in TWIN_FLOORS:
        lines.append(f"random weights: the {FLOORS[lesson][0]}-ticket accuracy floor is skipped (accuracy is "
                     f"meaningless): the floor is {floor} tickets")
    explicit, full = settings["N_TICKETS"], settings.get("FULL_SCALE")
    if full and lesson in ("01", "02"):  # the reference series' 600 tickets everywhere
        explicit = 600
    race = settings.get("RACE_BATCH")
    if lesson == "03":
        race_settings = dict(settings)
        if full:  # the race at the article's batch size on every batch of each plan; the sections still sized
            race = race or 32
            race_settings["TICKETS_PER_POINT"] = None
        else:
            race, lines = _size_race(settings, tokenizer, profile, cost, floor, race_settings, lines)
        sized.update(RACE_BATCH=race, ARTICLE_BATCH=race_settings["ARTICLE_BATCH"],
                     TICKETS_PER_POINT=race_settings["TICKETS_PER_POINT"])
        race_s = functools.lru_cache(lambda rounds: cost.plan_factor * race_seconds(
            profile, tokenizer, {**race_settings, "RACE_BATCH": race, "REPEATS": rounds}))
    else:
        race_s = lambda rounds: 0.0  # noqa: E731
    set_by = ("set by the workshop preset, whatever TIME_BUDGET_S" if explicit is not None and preset_set("N_TICKETS")
              else "set explicitly")
    fit = fit_to_budget(budget, lambda n, rounds: cost.seconds(n, rounds) + race_s(rounds), floor=floor, cap=cap,
                        minimum=minimum, explicit=explicit, repeats=settings["REPEATS"], set_by=set_by)
    n, gave_way = fit.n, explicit is None and fit.n < floor
    sized.update(N_TICKETS=n, REPEATS=fit.repeats)
    derived = ""
    if lesson == "01":
        sized["N_GENERATE"] = n if full else min(settings["N_GENERATE"], n)
        sized["N_PROBES"] = settings["N_PROBES"] or (1 if gave_way else 2)
        derived = f"{sized['N_GENERATE']} tickets for the generate-vs-score race, {sized['N_PROBES']} probe(s)"
    elif lesson == "02":
        sized["N_SCALING"] = settings["N_SCALING"] or (n if full else min(n, max(4, n // 2)))
        derived = f"{sized['N_SCALING']} per point of the scaling sweep"
    elif lesson == "03":
        batch = settings["BATCH_SIZE"] or int(min(16, max(2, n // 4)))
        lengths = sorted(_pool(tokenizer, 0, settings["SEED"])[1][:n])
        sized.update(BATCH_SIZE=batch, TOKEN_BUDGET=settings["TOKEN_BUDGET"] or int(batch * lengths[len(lengths) // 2]))
        derived = f"batch size {batch} (sections 3-6), token budget {sized['TOKEN_BUDGET']}"
    lines += fit.lines
    lines[-1] += f"; {derived}"
    return sized, lines


def _size_race(settings, tokenizer, profile, cost, floor, race_settings, lines):
    """03's race batch: the largest of ``RACE_BATCHES`` whose race fits the budget beside the rest of the lesson at
    its floor; on a slow machine the article's size goes, then the tickets per contender halve (to 4)."""
    from .rows import RACE_BATCHES
    from .sweep import MIN_TICKETS

    budget, rounds = settings["TIME_BUDGET_S"], settings["REPEATS"]
    race_settings["TICKETS_PER_POINT"] = settings["TICKETS_PER_POINT"] or MIN_TICKETS

    def race(batch, **changes):
        return cost.plan_factor * race_seconds(profile, tokenizer, {**race_settings, "RACE_BATCH": batch, **changes})

    chosen = settings["RACE_BATCH"]
    if chosen is None:
        fits = [b for b in RACE_BATCHES if race(b) + cost.seconds(floor, rounds) <= STRETCH * budget]
        chosen = fits[0] if fits else RACE_BATCHES[-1]
        if not fits:  # a slow machine or a large model
            article = race_settings["ARTICLE_BATCH"]
            if article is not None and article != chosen:
                extra = race(chosen) - race(chosen, ARTICLE_BATCH=None)
                lines.append(f"the article's comparison (sorted batches of {article}) left out: it needs an estimated "
                             f"{extra:.0f} s more here; OPTIONS = {{\"RACE_BATCH\": {chosen}, \"ARTICLE_BATCH\": {article}}} runs it")
                race_settings["ARTICLE_BATCH"] = None
            while race_settings["TICKETS_PER_POINT"] > 4 and race(chosen) + cost.seconds(4, 2) > budget:
                race_settings["TICKETS_PER_POINT"] //= 2
        line = (f"the race at batch {chosen}: each contender's whole batches drawn from the 600-ticket plan (at least "
                f"{race_settings['TICKETS_PER_POINT']} tickets), an estimated {race(chosen):.0f} s of it")
        if chosen != RACE_BATCHES[0]:
            line += f" (batch {RACE_BATCHES[0]} would need {race(RACE_BATCHES[0]):.0f} s)"
        lines.append(line)
    return chosen, lines


def _size_sweep(settings, tokenizer, profile, cost) -> tuple[dict, list[str]]:
    """04's points: where the sweep is over the budget, half precision goes first (unless ``DTYPES`` names them),
    then the costliest points one by one (never a loop, nor a batch size of 4 or less), then the tickets per point
    halve (down to 4); named ``BATCH_SIZES`` never give way."""
    from .rows import plan_rows, sweep_batch_sizes
    from .sweep import MIN_TICKETS, POOL, SWEEP_STRATEGIES

    budget, lines, skipped = settings["TIME_BUDGET_S"], [], []
    dtypes, dropped_slow = profile.choose_dtypes(settings["DTYPES"])
    skipped += dropped_slow
    lines += dropped_slow
    dtypes = ["float32", *[d for d in dtypes if d != "float32"]]  # float32 first: its loop is every row's reference
    sizes = list(settings["BATCH_SIZES"] or sweep_batch_sizes(profile.device))
    rows = plan_rows(["loop", "loop_prefix", *SWEEP_STRATEGIES], sizes, settings["OTHERS_AT"])
    count = None if settings.get("FULL_SCALE") else (settings["TICKETS_PER_POINT"] or MIN_TICKETS)
    wanted = list(rows)

    def own(rows, dtypes, count):
        per_row = sweep_seconds(profile, tokenizer, {**settings, "TICKETS_PER_POINT": count}, rows, dtypes)
        return {row: cost.plan_factor * s for row, s in per_row.items()}

    def seconds(rows, dtypes, count):
        return sum(own(rows, dtypes, count).values()) + cost.seconds()

    if settings["DTYPES"] is None and len(dtypes) > 1 and seconds(rows, dtypes, count) > budget:
        dropped, dtypes = dtypes[1:], dtypes[:1]
        skipped.append(f"{', '.join(dropped)} skipped: the sweep in every dtype needs an estimated "
                       f"{seconds(rows, dropped + dtypes, count):.0f} s here, over the {budget:.0f} s budget; "
                       "raise TIME_BUDGET_S or name them: OPTIONS = {\"DTYPES\": [...]}")
        lines.append(skipped[-1])
    per_point = count
    if settings["BATCH_SIZES"] is None:
        while seconds(rows, dtypes, count) > budget:
            optional = [row for row in rows if row[1] > 4]
            if optional:
                costs = own(rows, dtypes, count)
                rows.remove(max(optional, key=costs.get))  # the costliest point goes first
            elif count is not None and count > 4:
                count //= 2
            else:
                break
    needed = seconds(rows, dtypes, count)
    sizes = sorted({size for _, size in rows})
    drawn = "every batch of" if count is None else f"at least {count} tickets in whole batches from"
    line = (f"batch sizes {', '.join(map(str, sizes))}, each point {drawn} the {POOL}-ticket plan, "
            f"{settings['REPEATS']} repeats; dtypes {', '.join(dtypes)}: an estimated {needed:.0f} s of model time here")
    line += f", over the {budget:.0f} s budget" if needed > budget else f", within the {budget:.0f} s budget"
    if needed > budget and settings["BATCH_SIZES"] is not None:
        line += (" (batch sizes fixed by the workshop preset: nothing left out)" if "BATCH_SIZES" in settings.get("_preset", ())
                 else " (BATCH_SIZES named: nothing left out)")
    left_out = [row for row in wanted if row not in rows]
    if left_out:
        line += (f" (left out: {', '.join(f'{name} at {size}' for name, size in left_out)}, which would need "
                 f"{seconds(wanted, dtypes, per_point):.0f} s in all; raise TIME_BUDGET_S for them)")
    if count != per_point:
        line += f"; {count} tickets per point instead of {per_point}"
    lines.append(line)
    if settings["REPEATS"] < 2:
        lines.append(f"{settings['REPEATS']} repeat per row: no point gets a spread, so no sentence below ranks two "
                     "rows (use at least 2)")
    return {"DTYPES": dtypes, "BATCH_SIZES": sizes, "TICKETS_PER_POINT": count, "rows": rows, "skipped": skipped}, lines
