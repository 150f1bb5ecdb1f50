"""A long ``python -m helpers classify`` survives being stopped: each process appends every finished batch's rows to
its own progress file beside the output (the job's fingerprint, then ``{"row": i, "scores": [...], "full": false,
"exact": true}`` per row, ``exact`` where the scores are float32's, not a verified half pass's); a rerun of the same
job scores only the rows missing from all of them (a line torn by a kill is dropped), another job's files are refused
in one line naming what changed. At the end they are removed."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

# What a fingerprint holds, in the order a refusal names a change, with the words it uses.
FIELDS = {
    "input": "the input file's content",
    "text_column": "the text column",
    "labels": "the labels",
    "model": "the model",
    "weights": "the model's weights",
    "dtype": "the dtype",
    "examples": "the few-shot examples",
    "prompt_format": "the prompt format",
    "scoring": "the scoring options",
}


class ResumeMismatch(ValueError):
    """A progress file belongs to another job; the message is one line."""


def fingerprint(input_path: Path, *fields) -> dict:
    """What decides a job's results: the input file's digest, then ``fields`` in ``FIELDS`` order, as read back from a
    file. Batch size, strategy, prefix cache and process count change a score within tolerance, not rows: left out."""
    digest = hashlib.sha256(Path(input_path).read_bytes()).hexdigest()  # the rows are all in memory anyway
    shown = json.loads(json.dumps(dict(zip(FIELDS, [digest, *fields], strict=True))))
    shown["examples"] = hashlib.sha256(json.dumps(shown["examples"]).encode()).hexdigest()
    return shown


def progress_path(output: Path, rank: int) -> Path:
    return output.parent / f".{output.name}.progress.{rank}.jsonl"


def progress_files(output: Path) -> list[Path]:
    return sorted(output.parent.glob(f".{output.name}.progress.*.jsonl"))


def _complete_lines(path: Path) -> list[bytes]:
    """The file's lines that end in a newline: a line torn by a kill mid-write is not one of them."""
    return path.read_bytes().split(b"\n")[:-1]


def _changed(was: dict, now: dict) -> str:
    for key, words in FIELDS.items():
        if was.get(key) != now.get(key):
            if key == "labels":
                return f"{words} changed (were {','.join(was.get(key) or [])}, now {','.join(now[key])})"
            if key in ("text_column", "model", "weights", "dtype", "prompt_format"):
                return f"{words} changed (was {was.get(key)!r}, now {now.get(key)!r})"
            return f"{words} changed"
    return "its fingerprint differs"


def _headers(output: Path):
    for path in progress_files(output):
        if lines := _complete_lines(path):  # none: killed before its header landed, nothing in it
            yield path, lines, json.loads(lines[0]).get("fingerprint") or {}


def _same_job(was: dict, now: dict) -> bool:
    return all(was.get(key) == now.get(key) for key in FIELDS)


def read_progress(output: Path, expected: dict) -> dict[int, tuple[list[float], bool, bool]]:
    """Rows already scored for this job: row -> (log-scores, full, exact); ``ResumeMismatch`` for another job's file.
    The precision a ``--dtype auto`` run resolved to (``resolved``) is not compared here: ``resolved`` reads it."""
    done = {}
    for path, lines, was in _headers(output):
        if not _same_job(was, expected):
            again = "pass --overwrite to start again, or rerun with the original options to resume"
            changed = _changed(was or {}, expected)
            raise ResumeMismatch(f"{output}: its progress file {path.name} belongs to another job: {changed}; {again}")
        for row in map(json.loads, lines[1:]):  # files from before "exact": an auto run's rows count as half's
            if "row" in row:
                done[int(row["row"])] = (row["scores"], bool(row["full"]), row.get("exact", was.get("dtype") != "auto"))
    return done


def recorded_bound(output: Path) -> float | None:
    """The largest rescoring bound the stopped run's processes noted (``ProgressWriter.bound``), or None."""
    lines = [json.loads(line) for _, lines, _ in _headers(output) for line in lines[1:]]
    return max((line["bound"] for line in lines if "bound" in line), default=None)


def resolved(output: Path) -> str | None:
    """The precision the stopped run of this job resolved ``--dtype auto`` to (its progress files'), or None."""
    found = {was["resolved"] for _, _, was in _headers(output) if "resolved" in was}
    if len(found) > 1:  # every process writes the one choice rank 0 made: two mean files of two runs mixed by hand
        raise ResumeMismatch(f"{output}: its progress files resolved --dtype auto to {sorted(found)}: pass --overwrite")
    return found.pop() if found else None


def head_path(output: Path) -> Path:
    """Where a run that fits a label head (``classify --fit-head``) keeps it until the output is written: a resumed run
    reads the head back instead of fitting it again (another batch size or thread count could fit another)."""
    return output.parent / f".{output.name}.head.json"


def remove_progress(output: Path, keep: dict | None = None) -> None:
    """Remove the progress files of ``output`` (and a fitted head kept beside them); with ``keep`` (``--overwrite``),
    only those of another job."""
    if keep is None:
        head_path(output).unlink(missing_ok=True)
    for path in progress_files(output):
        lines = _complete_lines(path)
        if keep is None or (lines and not _same_job(json.loads(lines[0]).get("fingerprint") or {}, keep)):
            path.unlink(missing_ok=True)


class ProgressWriter:
    """Appends one process's finished rows to its progress file, flushed after every batch."""

    def __init__(self, output: Path, rank: int, expected: dict):
        self.path = progress_path(output, rank)
        if self.path.exists():  # this rank's file from the stopped run: cut a torn last line, then append
            os.truncate(self.path, self.path.read_bytes().rfind(b"\n") + 1)
        if not self.path.exists() or not self.path.stat().st_size:
            self.path.write_text(json.dumps({"fingerprint": expected}) + "\n", encoding="utf-8")
        self.handle = open(self.path, "a", encoding="utf-8")

    def append(self, rows: Sequence[int], log_scores, full: bool, exact: bool) -> None:
        for row, scores in zip(rows, log_scores):
            line = {"row": int(row), "scores": [float(v) for v in scores], "full": full, "exact": exact}
            self.handle.write(json.dumps(line) + "\n")
        self.handle.flush()  # in the operating system's hands: a killed process loses nothing it wrote

    def bound(self, value: float) -> None:
        """The verified path's rescoring bound as it is set or widened: a resumed run keeps the largest."""
        self.handle.write(json.dumps({"bound": value}) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()
