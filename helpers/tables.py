"""The tables ``classify`` reads and writes: CSV or JSONL in, every row out once in input order, written whole or not
at all (``atomic_write``). Bad input stops with one line naming the file, row and column."""

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from .data import build_prompt, encode_prompt
from .scoring import LabelScores, check_labels

SUFFIXES = {".csv", ".jsonl", ".ndjson"}


class InputError(ValueError):
    """Bad input: the message is one line naming the file, row or column."""


def one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def rows_text(rows: Sequence[int], limit: int = 5) -> str:
    shown, more = ", ".join(str(r) for r in rows[:limit]), ", ..." if len(rows) > limit else ""
    return f"row {shown}" if len(rows) == 1 else f"rows {shown}{more} ({len(rows)} in all)"


@dataclass
class Table:
    """Input rows exactly as read: CSV values as text, JSONL values as the JSON had them (no dates parsed)."""

    path: Path
    columns: list[str]
    records: list[dict[str, Any]]
    text_column: str

    def __len__(self) -> int:
        return len(self.records)


def _read_jsonl(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    # json line by line, not pandas.read_json: that turns gappy integers into floats, rounds big ones and fills
    # missing keys with NaN. Split on newlines only: JSON strings may hold U+2028, which splitlines splits at.
    lines = path.read_text(encoding="utf-8-sig").rstrip().split("\n")  # trailing blank lines end the file
    if lines == [""]:
        raise InputError(f"{path}: the file is empty")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise InputError(f"{path}: line {number} is blank: every line must be one JSON object")
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: line {number} is not valid JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(records[-1], dict):
            raise InputError(f"{path}: line {number} is a JSON {type(records[-1]).__name__}, not an object")
    return list({key: None for record in records for key in record}), records


def read_table(path: str | Path, text_column: str = "text") -> Table:
    """Read a CSV or JSONL file and check its text column. Row numbers in errors count data rows from 1."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"{path}: unsupported format {suffix or '(no extension)'!r}: use .csv or .jsonl")
    try:
        if suffix == ".csv":
            # Every column as text (ids like 007 come back unchanged); a blank line is an empty ticket to report.
            frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], skip_blank_lines=False)
            columns, records = [str(c) for c in frame.columns], frame.to_dict("records")
        else:
            columns, records = _read_jsonl(path)
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}): save the file as UTF-8") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the file is empty") from None
    except PermissionError:
        raise InputError(f"{path}: not readable (permission denied)") from None
    except InputError:
        raise
    except (pd.errors.ParserError, ValueError) as error:
        raise InputError(f"{path}: cannot be parsed: {one_line(error)}") from None
    if text_column not in columns:
        found = ", ".join(columns) or "none"
        raise InputError(f"{path}: no column {text_column!r} (columns: {found}); choose one with --text-column")
    if not records:
        raise InputError(f"{path}: no rows")
    texts = [record.get(text_column) for record in records]
    empty = [i for i, text in enumerate(texts, start=1) if not isinstance(text, str) or not text.strip()]
    if empty:
        raise InputError(f"{path}: {rows_text(empty)}: column {text_column!r} is empty, blank or not text")
    return Table(path, columns, records, text_column)


def read_examples(path: str | Path, labels: Sequence[str], what: str = "few-shot examples") -> list[tuple[str, str]]:
    """Few-shot examples (or ``what`` else: labelled rows) from a CSV/JSONL file with ``text`` and ``label`` columns."""
    table = read_table(path, "text")
    if "label" not in table.columns:
        raise InputError(f"{path}: {what} need a 'label' column")
    unknown = [i for i, record in enumerate(table.records, start=1) if record.get("label") not in labels]
    if unknown:
        raise InputError(f"{path}: {rows_text(unknown)}: label is not one of {', '.join(labels)}")
    return [(record["text"], record["label"]) for record in table.records]


def parse_labels(labels: str | Sequence[str]) -> list[str]:
    """``"billing,technical,account"`` (or a list) -> a checked list of labels."""
    if isinstance(labels, str):
        text, labels = labels, [part.strip() for part in labels.split(",")]
        if not any(labels):
            raise InputError("the label list is empty: pass --labels a,b,c")
        if not all(labels):
            raise InputError(f"the label list {text!r} has an empty entry")
    try:
        return check_labels(labels)
    except ValueError as error:
        raise InputError(str(error)) from None


def prediction_columns(labels: Sequence[str], raw: bool = False) -> list[str]:
    """The columns the output adds; ``raw``: a prior was divided out, the raw probabilities follow (``raw_p_``)."""
    return ["predicted_label", "confidence", *(f"{p}_{label}" for p in ("p", "raw_p")[: 1 + raw] for label in labels)]


def check_columns(table: Table, labels: Sequence[str], raw: bool = False) -> None:
    clash = [c for c in prediction_columns(labels, raw) if c in table.columns]
    if clash:
        clashing = ", ".join(map(repr, clash))
        raise InputError(f"{table.path}: already has column(s) {clashing}, which the output adds: rename them first")


def check_output_path(path: str | Path, overwrite: bool, source: str | Path | None = None) -> Path:
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise InputError(f"{path}: unsupported output format {path.suffix!r}: use .csv or .jsonl")
    if source is not None and path.exists() and path.resolve() == Path(source).resolve():
        raise InputError(f"{path} is the input file: write the output elsewhere")
    if path.is_dir():
        raise InputError(f"{path} is a folder: give a file name")
    if path.exists() and not overwrite:
        raise InputError(f"{path} already exists: pass --overwrite to replace it")
    if not path.parent.is_dir():
        raise InputError(f"{path}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise InputError(f"{path}: the folder {path.parent} is not writable")
    return path


def atomic_write(path: Path, write: Callable[[TextIO], None]) -> None:
    """Write through a temporary file in the same folder, then rename it over ``path``: never a partial output."""
    hidden = dict(dir=path.parent, prefix=f".{path.name}.", suffix=".part", delete=False)  # beside it, kept to rename
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", **hidden)
    try:
        with handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():  # a temporary file is private (0600): take the replaced file's mode, else the umask's
            mode = path.stat().st_mode & 0o7777
        else:
            umask = os.umask(0)  # the only portable way to read it; set straight back
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def _csv_cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def write_results(table: Table, scores: LabelScores, path: Path) -> None:
    """Write the input rows, in input order, each followed by its prediction columns, as CSV or JSONL, atomically."""
    predicted = [  # LabelScores.to_frame's columns, probabilities to 8 decimals
        {key: value if key == "predicted_label" else round(float(value), 8) for key, value in row.items()}
        for row in scores.to_frame().to_dict("records")
    ]
    records = [{**record, **row} for record, row in zip(table.records, predicted, strict=True)]
    if path.suffix.lower() == ".csv":
        columns = [*table.columns, *prediction_columns(scores.labels, scores.prior is not None)]
        cells = [[_csv_cell(record.get(column)) for column in columns] for record in records]
        frame = pd.DataFrame(cells, columns=columns, dtype=object)
        atomic_write(path, lambda handle: frame.to_csv(handle, index=False))
    else:  # a JSONL record keeps its own keys: a key missing from an input line stays missing
        lines = [json.dumps(record, ensure_ascii=False) + "\n" for record in records]
        atomic_write(path, lambda handle: handle.writelines(lines))


def context_limit(model, tokenizer, name: str) -> int:
    """The model's context in tokens, from its config or its tokenizer (which report a huge sentinel if unknown)."""
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    if not (limits := [int(limit) for limit in limits if limit and limit < 1e9]):
        no_limit = "neither its config (max_position_embeddings) nor its tokenizer (model_max_length) gives one"
        raise InputError(f"{name}: no context length known: {no_limit}; set the tokenizer's")
    return min(limits)


def prepare_prompts(tokenizer, texts, labels, examples, max_tokens: int, truncate: bool, source="input", end_tokens=0):
    """(prompts, rows cut, the longest prompt's tokens): a prompt too long for the model is an error, or cut at the
    head with ``truncate``. Each prompt is tokenized once (twice where it is cut)."""
    label_room = max(len(encode_prompt(tokenizer, label)) for label in labels) + end_tokens
    overhead = len(encode_prompt(tokenizer, build_prompt(tokenizer, "", labels, examples)))
    budget = max_tokens - label_room - overhead
    if budget < 1:
        alone = f"the instruction and few-shot examples alone take {overhead} of the model's {max_tokens} tokens"
        raise InputError(alone)

    def needed(prompt: str) -> int:  # the prompt's tokens and room for the longest label after it
        return len(encode_prompt(tokenizer, prompt)) + label_room

    prompts, cut, longest = [], [], 0
    for row, text in enumerate(texts, start=1):
        prompt = build_prompt(tokenizer, text, labels, examples)
        tokens = needed(prompt)
        if tokens > max_tokens:
            cut.append(row)
        if tokens > max_tokens and truncate:
            # Keep the head: a ticket's start usually says what it is about. Decoding and re-encoding can shift a
            # token or two, so shrink until the prompt really fits.
            ids, keep = encode_prompt(tokenizer, text), budget
            while tokens > max_tokens and keep > 0:
                prompt = build_prompt(tokenizer, tokenizer.decode(ids[:keep]), labels, examples)
                tokens, keep = needed(prompt), keep - 8
            if tokens > max_tokens:
                raise InputError(f"{source}: row {row}: cannot be cut to fit the model's {max_tokens}-token context")
        prompts.append(prompt)
        longest = max(longest, tokens - label_room)
    if cut and not truncate:
        context = f"longer than the model's {max_tokens}-token context; pass --truncate to keep each ticket's head"
        raise InputError(f"{source}: {rows_text(cut)}: {context}")
    return prompts, cut, longest
