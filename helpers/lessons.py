"""Presets: one setting that gives every reader of a lesson the same run, whatever their machine.

Left to themselves, lessons 01-04 size their runs to a time budget on the reader's machine (``TIME_BUDGET_S``), so
two attendees of a workshop see different ticket counts and batch sizes. The **workshop** preset fixes them: the
embedded model (no 1 GB download over a conference network), float32, and the counts below, which are those the
committed reference run uses, so its printed numbers are what an instructor tells the room to expect. Turn it on
for every notebook with ``SLM_PRESET=workshop`` in the environment (``make workshop`` does it for ``make
notebooks``; ``%env SLM_PRESET=workshop`` in an open notebook) or for one with ``PRESET = "workshop"`` in its
parameters cell. A parameter you set yourself (or ``$SLM_MODEL``, for the model) wins over the preset.
"""

from __future__ import annotations

import os

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


def apply_preset(lesson: str, preset: str | None = None, verbose: bool = True, **params) -> dict:
    """``params`` (the lesson's parameters, by name) with the preset's values wherever a parameter is None.

    Returns a dict in the order given, so a lesson unpacks it: ``MODEL, N_TICKETS = apply_preset("01", PRESET,
    MODEL=MODEL, N_TICKETS=N_TICKETS).values()``. Prints one line saying what the preset set (and what you set
    instead, which wins). Every parameter the preset sets for this lesson must be passed.
    """
    name = preset_name(preset)
    if name is None:
        return dict(params)
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
    if verbose:
        shown = ", ".join(f"{key}={chosen[key]!r}" for key in values if key not in kept)
        yours = ", ".join(f"{key}: {setting}" for key, setting in kept.items())
        print(f"{name} preset: {shown}" + (f" (yours kept: {yours})" if kept else ""))
    return chosen
