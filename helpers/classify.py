"""Classify your own CSV or JSONL file: ``python -m helpers classify`` (real use, after notebooks 01-03).

Every input row comes out once, in input order, with ``predicted_label``, ``confidence`` and one ``p_<label>``
column per label, computed on the fastest verified path (prefix cache + length-sorted batches). Bad input
stops with one line naming the file, row and column; nothing is silently dropped. Under ``torchrun`` or
``accelerate launch`` each process scores a share and rank 0 writes the whole output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .batching import score_batched
from .data import build_prompt, encode_prompt
from .prefix_cache import PrefixCache
from .scoring import LabelScorer, LabelScores, assert_agrees, score_one_by_one

CSV_SUFFIXES = {".csv"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


class InputError(ValueError):
    """Bad input: the message is one line naming the file, row or column."""


def _rows_text(rows: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(r) for r in rows[:limit])
    return f"row {shown}" if len(rows) == 1 else f"rows {shown}{', ...' if len(rows) > limit else ''} ({len(rows)} in all)"


def read_table(path: str | Path, text_column: str = "text") -> pd.DataFrame:
    """Read a CSV or JSONL file and check its text column. Row numbers in errors count data rows from 1."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix in CSV_SUFFIXES:
            # Every column as text: ids like 007 or phone numbers must come back unchanged.
            # skip_blank_lines=False: a blank line is an empty ticket to report, not a row to drop silently.
            frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], encoding="utf-8",
                                skip_blank_lines=False)
        elif suffix in JSONL_SUFFIXES:
            frame = pd.read_json(path, lines=True, dtype=False, encoding="utf-8")
        else:
            raise InputError(f"{path}: unsupported format {suffix or '(no extension)'!r}: use .csv or .jsonl")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}): save the file as UTF-8") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the file is empty") from None
    except (pd.errors.ParserError, ValueError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"{path}: cannot be parsed: {str(error).strip().splitlines()[0]}") from None
    if text_column not in frame.columns:
        columns = ", ".join(map(str, frame.columns)) or "none"
        raise InputError(f"{path}: no column {text_column!r} (columns: {columns}); choose one with --text-column")
    if frame.empty:
        raise InputError(f"{path}: no rows")
    texts = frame[text_column]
    empty = [i + 1 for i, value in enumerate(texts) if not isinstance(value, str) or not value.strip()]
    if empty:
        raise InputError(f"{path}: {_rows_text(empty)}: column {text_column!r} is empty, blank or not text")
    return frame


def read_examples(path: str | Path, labels: Sequence[str]) -> list[tuple[str, str]]:
    """Few-shot examples from a CSV/JSONL file with ``text`` and ``label`` columns."""
    frame = read_table(path, "text")
    if "label" not in frame.columns:
        raise InputError(f"{path}: few-shot examples need a 'label' column")
    unknown = [i + 1 for i, label in enumerate(frame["label"]) if label not in labels]
    if unknown:
        raise InputError(f"{path}: {_rows_text(unknown)}: label is not one of {', '.join(labels)}")
    return list(zip(frame["text"], frame["label"]))


def parse_labels(text: str) -> list[str]:
    """``"billing,technical,account"`` -> list; the scorer validates emptiness and duplicates."""
    labels = [part.strip() for part in text.split(",")]
    if not any(labels):
        raise InputError("the label list is empty: pass --labels a,b,c")
    if any(not label for label in labels):
        raise InputError(f"the label list {text!r} has an empty entry")
    return labels


def check_output_path(path: str | Path, overwrite: bool) -> Path:
    path = Path(path)
    if path.suffix.lower() not in CSV_SUFFIXES | JSONL_SUFFIXES:
        raise InputError(f"{path}: unsupported output format {path.suffix!r}: use .csv or .jsonl")
    if path.exists() and not overwrite:
        raise InputError(f"{path} already exists: pass --overwrite to replace it")
    if not path.parent.exists():
        raise InputError(f"{path}: the folder {path.parent} does not exist")
    return path


def write_table(frame: pd.DataFrame, path: Path) -> None:
    if path.suffix.lower() in CSV_SUFFIXES:
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True, force_ascii=False)


@dataclass
class PreparedPrompts:
    prompts: list[str]
    truncated_rows: list[int]


def prepare_prompts(
    tokenizer,
    texts: Sequence[str],
    labels: Sequence[str],
    examples: Sequence[tuple[str, str]],
    max_tokens: int,
    truncate: bool,
    source: str = "input",
) -> PreparedPrompts:
    """Prompts for every text; a prompt too long for the model is an error, or cut at the head with ``truncate``."""
    label_room = max(len(tokenizer(label, add_special_tokens=False)["input_ids"]) for label in labels)
    overhead = len(encode_prompt(tokenizer, build_prompt(tokenizer, "", labels, examples)))
    budget = max_tokens - label_room - overhead
    if budget < 1:
        raise InputError(f"the instruction and few-shot examples alone take {overhead} of the model's {max_tokens} tokens")
    prompts, too_long = [], []
    for row, text in enumerate(texts, start=1):
        prompt = build_prompt(tokenizer, text, labels, examples)
        if len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens:
            too_long.append(row)
            if truncate:
                # Keep the head: the start of a ticket usually says what it is about. Decoding and
                # re-encoding can shift a token or two, so shrink until the prompt really fits.
                ids, keep = tokenizer(text, add_special_tokens=False)["input_ids"], budget
                while len(encode_prompt(tokenizer, prompt)) + label_room > max_tokens and keep > 0:
                    prompt = build_prompt(tokenizer, tokenizer.decode(ids[:keep]), labels, examples)
                    keep -= 8
        prompts.append(prompt)
    if too_long and not truncate:
        raise InputError(
            f"{source}: {_rows_text(too_long)}: longer than the model's {max_tokens}-token context; "
            "pass --truncate to keep each ticket's head"
        )
    return PreparedPrompts(prompts, too_long)


def context_length(model, tokenizer) -> int:
    """The model's context in tokens (tokenizers report a huge sentinel when they do not know)."""
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    return int(min(limit for limit in limits if limit and limit < 1e9))


def score_rows(
    model,
    tokenizer,
    scorer: LabelScorer,
    prompts: Sequence[str],
    prefix: PrefixCache | None,
    strategy: str,
    batch_size: int,
    token_budget: int | None,
    progress: bool,
) -> torch.Tensor:
    if not prompts:
        return torch.empty((0, len(scorer.labels)))
    result = score_batched(model, tokenizer, scorer, prompts, strategy, batch_size, token_budget, prefix, progress)
    return result.log_scores


def verify_sample(model, tokenizer, scorer, prompts, log_scores, k: int, seed: int = 0) -> list[int]:
    """Re-run ``k`` random rows through the one-at-a-time reference; raise on any disagreement."""
    rows = sorted(np.random.default_rng(seed).choice(len(prompts), size=min(k, len(prompts)), replace=False).tolist())
    reference = score_one_by_one(model, tokenizer, scorer, [prompts[i] for i in rows], progress=False)
    candidate = LabelScores(scorer.labels, log_scores[rows])
    try:
        assert_agrees(reference, candidate, atol=1e-3 if model.dtype == torch.float32 else 5e-2)
    except AssertionError as error:
        raise RuntimeError(f"verification failed on sampled rows {[r + 1 for r in rows]}: {error}") from None
    return rows


def result_frame(frame: pd.DataFrame, labels: Sequence[str], log_scores: torch.Tensor) -> pd.DataFrame:
    """The input rows and columns, in input order, plus the prediction columns."""
    scores = LabelScores(list(labels), log_scores).to_frame()
    clash = [c for c in scores.columns if c in frame.columns]
    if clash:
        raise InputError(f"the input already has column(s) {', '.join(clash)}: rename them first")
    out = pd.concat([frame.reset_index(drop=True), scores], axis=1)
    assert len(out) == len(frame), "every input row must come out exactly once"
    return out

