"""What a lesson costs: the forward calls its notebook really makes, recorded once, priced on this machine's profile.

A lesson sizes itself before any model runs, so it needs its own model time in advance. Rather than a second,
hand-kept list of each lesson's passes, the notebooks' calls are recorded (``helpers.calls``, a forward hook) and
committed in ``costs.json``: runs of each lesson on the embedded model (``CONFIGS``):

- ``test``: the test suite's small run. The suite records it again on every run and fails with "regenerate the
  cost record" when a notebook's calls change (a pass added, removed or reshaped);
- ``a`` and ``b``: the lesson's defaults at two ticket counts (04, which sizes no ticket count, has ``a`` only). Priced on a profile, they give the lesson's seconds
  as a fixed part plus a part per ticket (``LessonCost``); calls inside timed rounds (``timing.compare``) scale with
  the rounds.

A cell tagged ``plan`` (03's race, 04's sweep) times whole batches drawn from a plan whose size the lesson chooses at
run time. Its recorded seconds over the plan's price at run ``a`` (``helpers.sizing`` prices plans) are a factor,
for the warm-ups and reference loops around the timed batches, that multiplies the plan's price at the reader's size.

Another model's tokenizer makes other prompt lengths: every recorded token count is scaled by the ratio of the two
tokenizers' lengths of the same prompts (``calibration_tokens``). A reader who reshapes a lesson's prompts
(``FEW_SHOT``, ``SHOT_COUNTS``) gets the record's estimate, scaled by tokens only.

Regenerate after changing a notebook: ``python -m helpers costs`` (about 10 minutes on 2 CPU cores).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import calls
from .profile import MachineProfile, _interpolate

RECORD_PATH = Path(__file__).with_name("costs.json")
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RECORD_VERSION = 1
PLAN_TAG = "plan"
# The runs recorded per lesson, all on the embedded model in float32: "test" is the suite's (small prompts, few
# rounds), "a" and "b" the lesson's defaults at two ticket counts (everything the lesson would size, named).
CONFIGS = {
    "01": {"test": dict(N_TICKETS=4, SHOT_COUNTS=[0, 3], FEW_SHOT=3, REPEATS=1, N_GENERATE=2),
           "a": dict(N_TICKETS=8), "b": dict(N_TICKETS=16)},  # whole batches of 8 (BATCH_SIZE): a slope per full batch
    "02": {"test": dict(N_TICKETS=3, SHOT_COUNTS=[0, 3], FEW_SHOT=3, REPEATS=1),
           "a": dict(N_TICKETS=6), "b": dict(N_TICKETS=12)},
    "03": {"test": dict(N_TICKETS=4, N_PROBES=2, RACE_BATCH=2, ARTICLE_BATCH=None, TICKETS_PER_POINT=4,
                        DEMO_SHOTS=3, REPEATS=2, FEW_SHOT=1),
           # a: the race at 16 with the article's 32, as a 2-core CPU runs it (the plan factor comes from a); b: the
           # sections at twice the tickets (its race, unused, kept small)
           "a": dict(N_TICKETS=8, RACE_BATCH=16), "b": dict(N_TICKETS=16, RACE_BATCH=2, ARTICLE_BATCH=None)},
    "04": {"test": dict(DTYPES=["float32"], TICKETS_PER_POINT=4, BATCH_SIZES=[1, 2], OTHERS_AT=2, SHOTS=1, REPEATS=2),
           "a": dict(DTYPES=["float32"], BATCH_SIZES=[1, 2, 4])},
}
COMMON = dict(MODEL="embedded", TIME_BUDGET_S=5, FULL_SCALE=False)
TICKET_STYLES = {"01": "varied", "02": "varied", "03": "article", "04": "article"}  # the tickets each lesson sizes


def notebook_path(lesson: str) -> Path:
    found = sorted(NOTEBOOKS.glob(f"{lesson}_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no notebook for lesson {lesson} in {NOTEBOOKS}")
    return found[0]


def calibration_tokens(tokenizer) -> float:
    """Mean tokens of 32 varied tickets' 3-shot prompts: how long this tokenizer makes the lessons' prompts."""
    from .data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets

    examples = few_shot_examples(3)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(32, seed=0, style="varied")["text"]]
    return sum(map(len, encode_prompts(tokenizer, prompts))) / len(prompts)


@functools.lru_cache(maxsize=1)
def load_record(path: Path = RECORD_PATH) -> dict:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no cost record at {path}: regenerate it with python -m helpers costs")
    record = json.loads(Path(path).read_text())
    if record.get("version") != RECORD_VERSION:
        raise ValueError(f"{path} is a version {record.get('version')} cost record, not {RECORD_VERSION}: "
                         "regenerate it with python -m helpers costs")
    return record


# --- pricing ------------------------------------------------------------------------------------------------


def call_seconds(profile: MachineProfile, rows: int, width: float, cached: float) -> float:
    """One forward call's seconds: a decode step (one new token per row over a cache) at the profile's decode rate,
    any other call by its cost model."""
    if round(width) <= 1 and cached > 0:
        return rows / _interpolate(sorted(profile.decode.items()), rows)
    return profile.call_seconds(rows, width, cached)


def priced(entries, profile: MachineProfile, ratio: float = 1.0, in_round: bool | None = None) -> float:
    """Seconds of recorded calls ``[rows, width, cached, in_round, count]``, token counts scaled by ``ratio``;
    ``in_round``: only the calls inside (True) or outside (False) timed rounds."""
    return sum(count * call_seconds(profile, rows, max(1.0, width * ratio) if width > 1 else width, cached * ratio)
               for rows, width, cached, timed, count in entries if in_round is None or bool(timed) == in_round)


@functools.lru_cache(maxsize=8)
def ticket_tokens(tokenizer, style: str, seed: int = 0) -> tuple[int, ...]:
    """Cumulative tokens of a lesson's tickets (``[k]``: of the first k of 600), with ``tokenizer``."""
    from .data import make_tickets

    total, out = 0, [0]
    for text in make_tickets(600, seed=seed, style=style)["text"]:
        total += len(tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(total)
    return tuple(out)


@dataclass(frozen=True)
class LessonCost:
    """A lesson's recorded work on one profile: ``seconds(n, rounds, plan_s)`` = outside rounds (fixed + per unit)
    + rounds x one round (fixed + per unit) + ``plan_factor`` x the plan's priced seconds.

    A unit is one token of the lesson's first n tickets (``units[n]``), where the tokenizer is known: tickets are
    12 to 400 words, so the recorded runs' few extra tickets say how much a token costs, not a ticket. Without
    ``units``, a unit is one ticket."""

    lesson: str
    fixed: float
    per_ticket: float
    round_fixed: float
    round_per_ticket: float
    plan_factor: float
    units: tuple[int, ...] | None = None

    def amount(self, n: int) -> float:
        return float(self.units[min(n, len(self.units) - 1)]) if self.units is not None else float(n)

    def seconds(self, n: int = 0, rounds: int = 1, plan_s: float = 0.0) -> float:
        u = self.amount(n)
        outside = self.fixed + self.per_ticket * u
        return max(0.0, outside) + rounds * max(0.0, self.round_fixed + self.round_per_ticket * u) + self.plan_factor * plan_s


def _run_parts(run: dict, profile: MachineProfile, ratio: float) -> tuple[float, float, float]:
    """(seconds outside timed rounds, seconds of one round, seconds of the plan cells) of one recorded run."""
    ordinary = [entry for cell in run["cells"].values() if not cell["plan"] for entry in cell["calls"]]
    planned = [entry for cell in run["cells"].values() if cell["plan"] for entry in cell["calls"]]
    rounds = max(1, int(run["params"].get("REPEATS") or 1))
    return (priced(ordinary, profile, ratio, in_round=False), priced(ordinary, profile, ratio, in_round=True) / rounds,
            priced(planned, profile, ratio))


def lesson_cost(lesson: str, profile: MachineProfile, tokenizer=None,
                plan_price: Callable[[dict], float] | None = None, record: dict | None = None,
                seed: int = 0) -> LessonCost:
    """The lesson's ``LessonCost`` on ``profile``: its recorded runs ``a`` and ``b`` priced, token counts scaled to
    ``tokenizer``'s prompts (None: the recording tokenizer's). ``plan_price(params)``: the seconds the lesson's plan
    costs with those settings (``helpers.sizing``), for the factor of its plan cells (run ``a``'s settings)."""
    if record is None and os.environ.get(calls.ENV) and not RECORD_PATH.is_file():
        record = {"lessons": {}}  # recording the first record: nothing to price yet
    record = record or load_record()
    if lesson not in record["lessons"]:
        if os.environ.get(calls.ENV):  # recording this lesson anew: its old calls may not exist yet
            return LessonCost(lesson, 0.0, 0.0, 0.0, 0.0, 0.0)
        raise ValueError(f"the cost record has no lesson {lesson}: regenerate it with python -m helpers costs")
    runs = record["lessons"][lesson]
    ratio = calibration_tokens(tokenizer) / record["calibration_tokens"] if tokenizer is not None else 1.0
    a = runs["a"]
    units = ticket_tokens(tokenizer, TICKET_STYLES.get(lesson, "varied"), seed) if tokenizer is not None else None
    cost = LessonCost(lesson, 0.0, 0.0, 0.0, 0.0, 0.0, units)
    outside_a, round_a, plan_a = _run_parts(a, profile, ratio)
    slope = round_slope = 0.0
    n_a = a["params"].get("N_TICKETS") or 0
    if "b" in runs and runs["b"]["params"]["N_TICKETS"] != n_a:
        outside_b, round_b, _ = _run_parts(runs["b"], profile, ratio)
        span = cost.amount(runs["b"]["params"]["N_TICKETS"]) - cost.amount(n_a)
        slope, round_slope = (outside_b - outside_a) / span, (round_b - round_a) / span
    factor = 0.0
    if plan_a > 0:
        planned = plan_price(a["params"]) if plan_price is not None else 0.0
        factor = plan_a / planned if planned > 0 else 0.0
    u_a = cost.amount(n_a)
    return LessonCost(lesson, outside_a - slope * u_a, slope, round_a - round_slope * u_a, round_slope, factor, units)


# --- recording ----------------------------------------------------------------------------------------------


def settings_for(lesson: str, run: str) -> dict:
    """The settings a recorded run executes the lesson with (``COMMON`` under the run's ``CONFIGS``)."""
    return {**COMMON, **CONFIGS[lesson][run]}


def cells_of(executed: dict, recorded: dict) -> dict[str, dict]:
    """The recorded calls (``calls.read``) by the source notebook's code-cell index, with each cell's first line and
    whether it is a plan cell. Papermill's injected parameters cell is not the notebook's and is skipped."""
    cells, index = {}, -1
    for cell in executed["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "injected-parameters" in tags:
            continue
        index += 1
        entries = recorded.get(cell.get("execution_count"))
        if entries:
            source = "".join(cell["source"]).strip().splitlines()
            cells[str(index)] = {"source": source[0][:80] if source else "", "plan": PLAN_TAG in tags,
                                 "calls": sorted(entries)}
    return cells


def run_recorded(lesson: str, run: str, workdir: Path, progress: bool = False) -> dict:
    """Execute the lesson with the run's settings, its calls recorded: {"params", "cells"}."""
    import papermill

    from .lessons import papermill_parameters

    notebook = notebook_path(lesson)
    settings = {**settings_for(lesson, run), "OUTPUT_DIR": str(workdir / "out")}
    log = workdir / f"{lesson}-{run}.calls.jsonl"
    log.unlink(missing_ok=True)
    previous = os.environ.get(calls.ENV)
    os.environ[calls.ENV] = str(log)
    try:
        executed = papermill.execute_notebook(
            str(notebook), str(workdir / notebook.name), cwd=str(workdir), kernel_name="python3",
            parameters=papermill_parameters(papermill.inspect_notebook(str(notebook)), settings), progress_bar=progress)
    finally:
        if previous is None:
            os.environ.pop(calls.ENV, None)
        else:
            os.environ[calls.ENV] = previous
    from .lessons import COMMON as LESSON_COMMON, DEFAULTS

    used = {**LESSON_COMMON, **DEFAULTS[lesson], **settings_for(lesson, run)}  # every setting, REPEATS included
    used.pop("OUTPUT_DIR", None)
    return {"params": used, "cells": cells_of(executed, calls.read(log) if log.exists() else {})}


def regenerate(lessons=None, path: Path = RECORD_PATH, progress: bool = True) -> Path:
    """Record every lesson's runs (``CONFIGS``) and write the record; lessons not named keep their recorded runs."""
    from .models import load_tokenizer

    old = json.loads(path.read_text()) if path.is_file() else {}
    lessons = list(lessons or CONFIGS)
    kept = old.get("lessons", {}) if old.get("version") == RECORD_VERSION else {}
    record = {"version": RECORD_VERSION, "model": "embedded", "dtype": "float32",
              "calibration_tokens": calibration_tokens(load_tokenizer("embedded")), "lessons": dict(kept)}
    with tempfile.TemporaryDirectory() as tmp:
        for lesson in lessons:
            runs = {}
            for run in CONFIGS[lesson]:
                print(f"recording lesson {lesson}, run {run}: {CONFIGS[lesson][run]}", flush=True)
                runs[run] = run_recorded(lesson, run, Path(tmp), progress)
            record["lessons"][lesson] = runs
            record["lessons"] = dict(sorted(record["lessons"].items()))
            path.write_text(json.dumps(record, indent=1) + "\n")  # after each lesson: a failure keeps the others
    load_record.cache_clear()
    return path


def differences(lesson: str, cells: dict[str, dict], run: str = "test", record: dict | None = None) -> list[str]:
    """How ``cells`` (``cells_of`` a run just made) differ from the recorded run, one line per cell; empty where
    they agree. Prefill calls must match exactly; decode steps (whose count follows the model's answers) within
    a fifth, at least 2."""
    recorded = (record or load_record())["lessons"].get(lesson, {}).get(run)
    if recorded is None:
        return [f"lesson {lesson} has no recorded {run!r} run"]

    def split(entries):
        decode = sum(count for rows, width, cached, _, count in entries if width <= 1 and cached > 0)
        return sorted(e for e in entries if not (e[1] <= 1 and e[2] > 0)), decode

    lines = []
    for key in sorted({*cells, *recorded["cells"]}, key=int):
        now, then = cells.get(key), recorded["cells"].get(key)
        name = f"cell {key} ({(now or then)['source']!r})"
        if now is None or then is None:
            lines.append(f"{name} {'makes no forward call now, but did in the record' if now is None else 'makes forward calls now, unlike the record'}")
            continue
        (prefill_now, decode_now), (prefill_then, decode_then) = split(now["calls"]), split(then["calls"])
        if prefill_now != prefill_then:
            count_now, count_then = sum(e[-1] for e in prefill_now), sum(e[-1] for e in prefill_then)
            lines.append(f"{name}: {count_now} forward calls over prompts, {count_then} recorded (or other shapes)")
        elif abs(decode_now - decode_then) > max(2, decode_then / 5):
            lines.append(f"{name}: {decode_now} decode steps, {decode_then} recorded")
    return lines
