"""A long ``python -m helpers classify`` survives being stopped: results land as they are computed, a rerun resumes.

Every finished batch's rows are appended to a progress file beside the output and flushed, one file per process
(``.OUTPUT.progress.RANK.jsonl``), so no two processes write to one file. Its first line holds the job's
fingerprint: what decides its results (the input file's content, the text column, the labels, the model, the
dtype, the few-shot examples, the prompt format and the scoring options). Each further line is one row:
``{"row": i, "scores": [...], "full": false}`` (``full``: it ran without the prefix cache).

A rerun of the same job reads every progress file of the output, whatever number of processes wrote them, and
scores only the rows they lack. A file of another job is refused in one line that names what changed, and left as
it is. A line torn by a kill mid-write is dropped, so its row is scored again. ``--overwrite`` removes only another job's files: the same job's rows are still resumed. The output
is still written atomically at the end, from every row in input order; then the progress files are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

# What a fingerprint holds, in the order a refusal names a change, with the words it uses.
FIELDS = {"input": "the input file's content", "text_column": "the text column", "labels": "the labels",
          "model": "the model", "dtype": "the dtype", "examples": "the few-shot examples",
          "prompt_format": "the prompt format", "scoring": "the scoring options"}


class ResumeMismatch(ValueError):
    """A progress file belongs to another job; the message is one line."""


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(input_path: Path, text_column: str, labels: Sequence[str], model: str, dtype: str,
                examples: Sequence[tuple[str, str]], prompt_format: str, scoring: dict) -> dict:
    """What decides a job's results (the module docstring). Batch size, strategy, the prefix cache and the number
    of processes are left out: they change a score within the agreement tolerance, never which rows there are."""
    shown = {"input": file_digest(input_path), "text_column": text_column, "labels": list(labels), "model": model,
             "dtype": dtype, "examples": hashlib.sha256(json.dumps(list(map(list, examples))).encode()).hexdigest(),
             "prompt_format": prompt_format, "scoring": scoring}
    return json.loads(json.dumps(shown))  # as it reads back from a file (tuples become lists)


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
            if key in ("text_column", "model", "dtype", "prompt_format"):
                return f"{words} changed (was {was.get(key)!r}, now {now.get(key)!r})"
            if key == "labels":
                return f"{words} changed (were {','.join(was.get(key) or [])}, now {','.join(now[key])})"
            return f"{words} changed"
    return "its fingerprint differs"


def read_progress(output: Path, expected: dict) -> dict[int, tuple[list[float], bool]]:
    """Rows already scored for this job, from every progress file of ``output``: row -> (log-scores, full).
    Raises ``ResumeMismatch`` for a file of another job, leaving every file untouched."""
    done: dict[int, tuple[list[float], bool]] = {}
    for path in progress_files(output):
        lines = _complete_lines(path)
        if not lines:  # killed before its header landed: nothing in it
            continue
        header = json.loads(lines[0])
        if header.get("fingerprint") != expected:
            raise ResumeMismatch(
                f"{output}: its progress file {path.name} belongs to another job: "
                f"{_changed(header.get('fingerprint') or {}, expected)}; pass --overwrite to start again, or rerun "
                "with the original options to resume")
        for line in lines[1:]:
            row = json.loads(line)
            done[int(row["row"])] = (row["scores"], bool(row["full"]))
    return done


def remove_other_jobs(output: Path, expected: dict) -> None:
    """Remove the progress files of ``output`` that belong to another job (``--overwrite``)."""
    for path in progress_files(output):
        lines = _complete_lines(path)
        if lines and json.loads(lines[0]).get("fingerprint") != expected:
            path.unlink(missing_ok=True)


def remove_progress(output: Path) -> None:
    for path in progress_files(output):
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

    def append(self, rows: Sequence[int], log_scores, full: bool) -> None:
        self.handle.write("".join(json.dumps({"row": int(row), "scores": [float(v) for v in scores], "full": full})
                                  + "\n" for row, scores in zip(rows, log_scores)))
        self.handle.flush()  # in the operating system's hands: a killed process loses nothing it wrote

    def close(self) -> None:
        self.handle.close()
