"""Presets: one setting that gives every reader of a lesson the same run, whatever their machine.

Left to themselves, lessons 01-04 size their runs to a time budget on the reader's machine (``TIME_BUDGET_S``), so
two attendees of a workshop see different ticket counts and batch sizes. The **workshop** preset fixes them: the
embedded model (no 1 GB download over a conference network), float32, and the counts below, which are those the
committed reference run uses, so its printed numbers are what an instructor tells the room to expect. Turn it on
for every notebook with ``SLM_PRESET=workshop`` in the environment (``make workshop`` does it for ``make
notebooks``; ``%env SLM_PRESET=workshop`` in an open notebook) or for one with ``PRESET = "workshop"`` in its
parameters cell. A parameter you set yourself wins over the preset.
"""

from __future__ import annotations

import os

PRESET_ENV = "SLM_PRESET"
# lesson -> the parameters the preset sets. Counts are the floors each lesson needs to show its point (01: an
# accuracy interval narrow enough to read; 03: 4 batches per strategy; 04: 5 batch sizes), which is also what the
# budget picks on a 2-core laptop-class CPU.
WORKSHOP = {
    "00": dict(MODEL="embedded"),
    "01": dict(MODEL="embedded", N_TICKETS=90, N_GENERATE=3, N_PROBES=2),
    "02": dict(MODEL="embedded", N_TICKETS=8, N_SCALING=4),
    "03": dict(MODEL="embedded", N_TICKETS=16),
    "04": dict(MODEL="embedded", N_TICKETS=12, DTYPES=["float32"]),
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
        raise ValueError(f"lesson {lesson} did not pass {', '.join(missing)} to apply_preset: the {name} preset sets it")
    chosen = dict(params)
    kept = []
    for key, value in values.items():
        if chosen[key] is None:
            chosen[key] = value
        else:
            kept.append(key)
    if verbose:
        shown = ", ".join(f"{key}={chosen[key]!r}" for key in values if key not in kept)
        print(f"{name} preset: {shown}" + (f" (yours kept: {', '.join(f'{k}={chosen[k]!r}' for k in kept)})" if kept else ""))
    return chosen
