"""Presets: one setting that gives every reader of a lesson the same run, whatever their machine.

Left to themselves, lessons 01-04 size their runs to a time budget on the reader's machine (``TIME_BUDGET_S``), so
two attendees of a workshop see different ticket counts and batch sizes. The **workshop** preset fixes them: the
embedded model (no 1 GB download over a conference network), float32, and the counts below, which are those the
committed reference run uses, so its printed numbers are what an instructor tells the room to expect. Turn it on
for every notebook with ``SLM_PRESET=workshop`` in the environment (``make workshop`` does it for ``make
notebooks``; ``%env SLM_PRESET=workshop`` in an open notebook) or for one with ``OPTIONS = {"PRESET": "workshop"}``
in its parameters cell. A setting you give yourself (or ``$SLM_MODEL``, for the model) wins over the preset.

``open_lesson`` opens a lesson in one call: the preset, the environment check, the model, the tolerance, the
machine profile, the sizes for its time budget (``helpers.sizing``) and the output folder, in at most three
printed lines. Every lesson setting has its default here (``DEFAULTS``); a notebook shows the few a reader should
turn and passes any other by name (``OPTIONS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PRESET_ENV = "SLM_PRESET"
# lesson -> the parameters the preset sets: the model and the ticket counts the reference run uses (everything
# else a lesson sizes follows from its ticket count), 03's race batch and 04's sweep (tickets per point, every batch
# size of a CPU).
# 01's 90 is its accuracy floor; 02 and 03 sit above their floors (6, 8), enough for each lesson's point to show.
# The counts are fixed, not fitted to a time budget: a slow machine takes longer.
WORKSHOP = {
    "00": dict(MODEL="embedded"),
    "01": dict(MODEL="embedded", N_TICKETS=90),
    "02": dict(MODEL="embedded", N_TICKETS=8),
    "03": dict(MODEL="embedded", N_TICKETS=16, RACE_BATCH=8),
    "04": dict(MODEL="embedded", TICKETS_PER_POINT=8, BATCH_SIZES=[1, 2, 4, 8, 16, 32], DTYPES=["float32"]),
    "solutions": dict(MODEL="embedded"),  # their sizes are fixed already
}
PRESETS = {"workshop": WORKSHOP}


def preset_name(preset: str | None = None) -> str | None:
    """The preset in force: ``preset`` if given, else ``$SLM_PRESET``; None for none. An unknown name is an error."""
    name = preset if preset is not None else (os.environ.get(PRESET_ENV) or None)
    if name is not None and name not in PRESETS:
        source = "PRESET" if preset is not None else f"${PRESET_ENV}"
        raise ValueError(f"unknown preset {name!r} in {source}: choose from {', '.join(PRESETS)} (or None)")
    return name


def _preset(lesson: str, preset: str | None, params: dict) -> tuple[dict, str | None]:
    """``params`` with the preset's values wherever a parameter is None, and the line saying so (None: no preset)."""
    name = preset_name(preset)
    if name is None:
        return dict(params), None
    values = PRESETS[name].get(lesson)
    if values is None:
        raise ValueError(f"the {name} preset has no lesson {lesson!r}: choose from {', '.join(PRESETS[name])}")
    missing = [key for key in values if key not in params]
    if missing:
        raise ValueError(f"lesson {lesson} did not pass {', '.join(missing)} to apply_preset: "
                         f"the {name} preset sets it")
    chosen = dict(params)
    kept = {}  # what you set instead, shown as you set it
    for key, value in values.items():
        if chosen[key] is not None:
            kept[key] = repr(chosen[key])
        elif key == "MODEL" and os.environ.get("SLM_MODEL"):  # MODEL = None means $SLM_MODEL, which you set
            kept[key] = f"$SLM_MODEL={os.environ['SLM_MODEL']!r}"
        else:
            chosen[key] = value
    shown = ", ".join(f"{key}={chosen[key]!r}" for key in values if key not in kept)
    yours = ", ".join(f"{key}: {setting}" for key, setting in kept.items())
    return chosen, f"{name} preset: {shown}" + (f" (yours kept: {yours})" if kept else "")


def apply_preset(lesson: str, preset: str | None = None, verbose: bool = True, **params) -> dict:
    """``params`` (a notebook's parameters, by name) with the preset's values wherever a parameter is None, in the
    order given: ``MODEL = apply_preset("solutions", PRESET, MODEL=MODEL)["MODEL"]``. Prints one line saying what
    the preset set (and what you set instead, which wins). Every parameter the preset sets must be passed."""
    chosen, line = _preset(lesson, preset, params)
    if verbose and line:
        print(line)
    return chosen


# Every lesson's settings and their defaults; a notebook's parameters cell shows a few, OPTIONS names any other.
COMMON = dict(
    MODEL=None,         # None: $SLM_MODEL, else Qwen2.5-0.5B-Instruct, else the embedded model
    PRESET=None,        # None: $SLM_PRESET; "workshop": the embedded model and the reference run's sizes everywhere
    DTYPE="float32",    # float32 on every device; "float16" or "bfloat16" opt into low precision (looser checks, said)
    FULL_SCALE=False,   # True: 01-02 on the reference's 600 tickets; 03's race and 04's sweep on every batch of their plans
    OUTPUT_DIR=None,    # None: runs/ at the repository root. Figures and CSVs go there, never into notebooks/
    SEED=0,
)
DEFAULTS = {
    "01": dict(
        TIME_BUDGET_S=80,   # model time for the notebook; the ticket count follows from your machine's profile
        N_TICKETS=None,     # None: sized to the budget (at least 90; 6, or down to 3, for a random-weight twin)
        N_GENERATE=3,       # tickets of the generate-vs-score race (sections 1-2), at most N_TICKETS
        N_PROBES=None,      # None: 2 (1 where the floor gave way). Tickets checked against the slow forward and the loop
        BATCH_SIZE=8,       # rows per batch on the fast path of sections 4-6 (sorted batches on a cached prefix)
        REPEATS=3,          # timed rounds of the generate-vs-score race, alternating
        SHOT_COUNTS=[0, 3, 6],  # the prompts section 6 compares
        FEW_SHOT=6,         # examples in the prompt of sections 1-3 and of the confidence section
    ),
    "02": dict(
        TIME_BUDGET_S=40,
        N_TICKETS=None,     # None: sized to the budget (at least 6, or down to 3 where 6 are far over it)
        FEW_SHOT=6,         # examples in the main prompt
        REPEATS=3,          # timed rounds of the with/without-cache race, alternating
        SHOT_COUNTS=[0, 2, 6, 12],  # prefix lengths of the scaling sweep
        N_SCALING=None,     # None: half of N_TICKETS, at least 4. Tickets per point of the scaling sweep
    ),
    "03": dict(
        TIME_BUDGET_S=110,
        N_TICKETS=None,     # None: sized to the budget (at least 8, or down to 4). Sections 2-6
        BATCH_SIZE=None,    # None: a quarter of the tickets, 2 to 16 (sections 3-6)
        RACE_BATCH=None,    # None: 32 (the article's) where the budget allows, else 16, 8 or 4 (section 6's race)
        ARTICLE_BATCH=32,   # where the race runs smaller, sorted batches of this size run once too
        TICKETS_PER_POINT=None,  # None: helpers.sweep.MIN_TICKETS per contender, in whole batches of the 600-ticket plan
        TOKEN_BUDGET=None,  # None: BATCH_SIZE x the median prompt length (padded tokens per batch, section 6)
        FEW_SHOT=3,         # examples in the prompt of section 7 (batching + prefix cache)
        DEMO_SHOTS=6,       # examples in the failure demos of sections 3 and 5: enough that the labels vary
        REPEATS=3,          # timed rounds of the race, alternating (2 where the budget is short)
        N_PROBES=10,        # tickets re-checked one at a time, spread over the sorted order
    ),
    "04": dict(
        TIME_BUDGET_S=125,  # model time for the sweep; the batch sizes it buys follow from your machine's profile
        TICKETS_PER_POINT=None,  # None: helpers.sweep.MIN_TICKETS, in whole batches (at least 2) of the 600-ticket plan
        SHOTS=3,            # few-shot examples: the static prefix the cache saves (as in 03's section 7)
        BATCH_SIZES=None,   # None: 1 to 32 on a CPU, 1 to 256 on a GPU (the largest left out where the budget runs short)
        OTHERS_AT=8,        # arbitrary order is planned (not timed) at this batch size
        DTYPES=None,        # None: float32, plus each half-precision dtype the profile measured at least half as fast
        REPEATS=2,          # timed rounds in alternating order (at least 2 for a spread)
    ),
}


def settings_for(lesson: str, given: dict) -> tuple[dict, str | None]:
    """The lesson's settings: its defaults under ``given`` (a setting the lesson does not have is a one-line error),
    under the preset in force wherever a setting was left at None (its line is returned too)."""
    if lesson not in DEFAULTS:
        raise ValueError(f"unknown lesson {lesson!r}: choose from {', '.join(DEFAULTS)}")
    defaults = {**COMMON, **DEFAULTS[lesson]}
    unknown = [name for name in given if name not in defaults]
    if unknown:
        raise ValueError(f"lesson {lesson} has no setting {', '.join(unknown)}: its settings are {', '.join(defaults)}")
    settings = {**defaults, **given}
    chosen, line = _preset(lesson, settings["PRESET"], settings)
    return chosen, line


def papermill_parameters(declared, settings: dict) -> dict:
    """Settings as a notebook takes them: those its parameters cell declares by name, the rest in ``OPTIONS``."""
    direct = {name: value for name, value in settings.items() if name in declared}
    others = {name: value for name, value in settings.items() if name not in declared}
    return {**direct, **({"OPTIONS": others} if others else {})}


@dataclass
class Lesson:
    """An opened lesson: its model, tokenizer, ``info`` (which model, dtype, device), ``profile``, tolerance
    (``tol``), output folder (``out``), every setting (``settings``; also as attributes: ``lesson.REPEATS``) and
    what its sizing chose beyond the settings (``extras``: 04's ``rows``)."""

    name: str
    model: object
    tokenizer: object
    info: object
    profile: object
    tol: object
    out: Path
    settings: dict
    extras: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        for source in ("settings", "extras"):
            values = self.__dict__.get(source, {})
            if name in values:
                return values[name]
        raise AttributeError(f"lesson {self.__dict__.get('name')} has no setting {name!r}")

    @property
    def caption(self) -> str:
        """The line every figure carries: model, dtype, device and machine."""
        from .plots import caption

        return caption(self.info, self.profile)

    def __repr__(self) -> str:
        return "\n".join(self.lines)


def open_lesson(lesson: str, **given) -> Lesson:
    """Open lesson ``lesson`` ("01" to "04") with ``given`` settings (the rest at ``DEFAULTS``): apply the preset,
    check the environment, load the model, choose the tolerance, read (or measure) the machine profile, size the
    lesson to its time budget, create the output folder. Prints at most three lines: model · dtype · device and
    the checks' tolerance; the sizes chosen and why; anything that warns (the first time on a machine, measuring
    the profile also says so)."""
    from .agreement import tolerance_for
    from .environment import check_environment
    from .models import DEFAULT_MODEL, load_model
    from .outputs import output_dir
    from .profile import machine_profile, profile_path
    from .sizing import size_lesson

    settings, preset_line = settings_for(lesson, given)
    preset = {name for name in settings if settings[name] is not None and given.get(name) is None
              and name in PRESETS.get(preset_name(settings["PRESET"]) or "", {}).get(lesson, {})}
    warnings = [line for line in check_environment(settings["MODEL"], brief=True).splitlines()[1:]]
    out = output_dir(settings["OUTPUT_DIR"])
    model, tokenizer, info = load_model(settings["MODEL"], dtype=settings["DTYPE"], verbose=False)
    tol = tolerance_for(model.dtype)
    # silent when notebook 00 measured it already; measuring (about a minute) says so
    profile = machine_profile(model, info, verbose=not profile_path(info, model.device).is_file())
    sized, sizing_lines = size_lesson(lesson, {**settings, "_preset": preset}, {**COMMON, **DEFAULTS[lesson]}, tokenizer,
                                      profile, info)
    extras = {key: sized.pop(key) for key in list(sized) if not key.isupper()}
    settings.update(sized)
    if preset_line:
        warnings.insert(0, preset_line)
    if info.fallback_reason:
        warnings.insert(0, f"{DEFAULT_MODEL} is {info.fallback_reason}: using the embedded model instead")
    if settings["DTYPE"] not in (None, info.dtype):
        warnings.append(f"{settings['DTYPE']} gave non-finite logits here: {info.dtype} instead")
    if info.timing_only:
        warnings.append("random weights: every accuracy is meaningless; the timings and the agreement checks hold")
    lines = [f"{info.short()} · checked against the loop: {tol}", "; ".join(sizing_lines)]
    if warnings:
        lines.append("; ".join(warnings))
    opened = Lesson(lesson, model, tokenizer, info, profile, tol, out, settings, extras, lines)
    print(repr(opened))
    return opened
