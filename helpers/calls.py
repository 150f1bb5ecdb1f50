"""Recording the forward calls a notebook makes: the lessons' cost record (``helpers.costs``) is made of them.

With ``$SLM_RECORD_CALLS`` naming a file, every model ``load_model`` returns counts its forward calls (a forward
pre-hook): rows, tokens per row, tokens already cached before them, and whether the call ran inside a timed round
(``timing.compare``). After each notebook cell the counts are appended to the file as one JSON line keyed by the
cell's execution count (outside IPython, at exit). Where the variable is unset nothing is hooked; the machine
profile's own calls are never counted (``paused``).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import json
import os
from pathlib import Path

ENV = "SLM_RECORD_CALLS"
_PAUSED = contextvars.ContextVar("calls_paused", default=False)
_IN_ROUND = contextvars.ContextVar("calls_in_round", default=False)
_COUNTS: collections.Counter = collections.Counter()  # (rows, width, cached, in a round) -> calls, this cell
_FLUSHING = False


def watch(model):
    """Count ``model``'s forward calls where ``$SLM_RECORD_CALLS`` is set (else nothing); returns the model."""
    if not os.environ.get(ENV) or getattr(model, "_calls_watched", False):
        return model
    model.register_forward_pre_hook(_count, with_kwargs=True)
    model._calls_watched = True
    _flush_after_each_cell()
    return model


def _count(module, args, kwargs) -> None:
    if _PAUSED.get():
        return
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    if ids is None:
        return
    past = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5 calls it cache
    cached = int(past.get_seq_length()) if past is not None and hasattr(past, "get_seq_length") else 0
    _COUNTS[int(ids.shape[0]), int(ids.shape[1]), cached, _IN_ROUND.get()] += 1


@contextlib.contextmanager
def _set(flag: contextvars.ContextVar):
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def paused():
    """No call inside is counted: the profile's measurements, the model's load-time probe."""
    return _set(_PAUSED)


def timed_round():
    """Calls inside belong to one timed round: a lesson's cost scales them with its number of rounds."""
    return _set(_IN_ROUND)


def _flush(result=None) -> None:
    if not _COUNTS or not os.environ.get(ENV):
        return
    line = {"cell": getattr(result, "execution_count", None),
            "calls": [[*key[:3], int(key[3]), n] for key, n in sorted(_COUNTS.items())]}
    with open(os.environ[ENV], "a") as file:
        file.write(json.dumps(line) + "\n")
    _COUNTS.clear()


def _flush_after_each_cell() -> None:
    global _FLUSHING
    if _FLUSHING:
        return
    _FLUSHING = True
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        shell.events.register("post_run_cell", _flush)
    atexit.register(_flush)


def read(path: str | Path) -> dict[int | None, list[list[int]]]:
    """Execution count -> [rows, width, cached, in a round, calls] for every cell that made a forward call."""
    cells: dict[int | None, list[list[int]]] = {}
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        cells.setdefault(entry["cell"], []).extend(entry["calls"])
    return cells
