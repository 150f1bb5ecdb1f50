"""Constrained output: score the valid labels instead of generating text (notebook 01).

A label's score is the log-probability the model gives to the label's tokens right after the prompt:
``log p(t1 | prompt) + log p(t2 | prompt, t1) + ...``. When every label is one token, that is just
the last position's logits (the first-token shortcut, exact). Otherwise the multi-token labels' later tokens
are appended after the prompt in the same forward pass, each label a branch that sees the prompt but not the
other labels, so the prompt is processed once and there is one forward per batch.

That score says "the answer starts with this label". When one label's tokens begin another's (``account`` and
``account change``), the longer label's summed score is the shorter's plus one or more (negative) log-probs, so it
can never win. Scored
as *whole answers*, each label followed by the end-of-answer marker the chat template puts after an assistant turn
(``<|im_end|>`` for Qwen and SmolLM2), the score means "the answer is this label", and either can win. ``LabelScorer``
does that by itself when labels overlap that way (``complete=None``), always with ``complete=True``.

Every optimized path in the series (prefix cache, batching) goes through ``label_log_probs`` and is
checked against ``score_one_by_one``, the plain one-ticket-at-a-time reference.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data import answer_tokens, encode_prompt
from .timing import Stopwatch

METHODS = ("auto", "first_token", "sequence")


def check_labels(labels: Sequence[str]) -> list[str]:
    """The label list, or a one-line ``ValueError``: empty list, blank or non-text label, duplicates.

    Needs no tokenizer, so a command can refuse bad labels before it loads a model.
    """
    labels = list(labels)
    if len(labels) < 2:
        raise ValueError(f"the label list has {len(labels)} label(s): give at least two to choose between")
    for position, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"label #{position} ({label!r}) is empty: every label needs text")
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"duplicate labels: {', '.join(map(repr, duplicates))}")
    return labels


# A stand-in answer, rendered through the chat template to see what the template puts after an answer.
_SENTINEL = "Zq7Xv"


def _marker_ids(tokenizer) -> set[int]:
    """Tokens that can end an answer: the special tokens, every added token, and the end-of-sequence token."""
    ids = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def end_of_answer_text(tokenizer) -> str | None:
    """The text the tokenizer's chat template writes right after an assistant's answer, up to the first marker token
    (``"<|im_end|>"`` for Qwen and SmolLM2, ``"<|eot_id|>"`` for Llama 3, ``" </s>"`` for Llama 2); None when the
    tokenizer has no chat template or the template ends no answer with a marker token (special, added or EOS).

    Derived from the template itself (an assistant turn rendered around a stand-in answer), not hard-coded.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that cannot render an assistant turn marks no end of one either
        return None
    if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
        return None
    after = rendered.split(_SENTINEL, 1)[1]
    encoded = tokenizer(after, add_special_tokens=False, return_offsets_mapping=True)
    markers = _marker_ids(tokenizer)
    for token, (_, end) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        if token in markers:
            return after[:end]
    return None


def answer_ids(tokenizer, label: str, end_text: str) -> list[int]:
    """A label as a whole answer: the tokens of the label followed by the end-of-answer text, tokenized together as
    the template renders them (a space before the marker, as Llama 2 writes it, merges as it does there)."""
    return tokenizer(label + end_text, add_special_tokens=False)["input_ids"]


def end_of_answer_ids(tokenizer) -> list[int] | None:
    """The end-of-answer marker's tokens after a plain answer (``[<|im_end|>]`` for Qwen and SmolLM2), or None."""
    text = end_of_answer_text(tokenizer)
    if text is None:
        return None
    probe = tokenizer(_SENTINEL, add_special_tokens=False)["input_ids"]
    whole = answer_ids(tokenizer, _SENTINEL, text)
    return whole[len(probe):] if whole[: len(probe)] == probe else None


def extending_pairs(token_ids: Sequence[Sequence[int]], labels: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (shorter, longer) of labels whose tokens start with all of the shorter one's tokens (``account``,
    ``account change``): scored as answer prefixes, the longer can never beat the shorter."""
    pairs = []
    for i, short in enumerate(token_ids):
        for j, long in enumerate(token_ids):
            if i != j and len(short) < len(long) and list(long[: len(short)]) == list(short):
                pairs.append((labels[i], labels[j]))
    return pairs


class LabelScorer:
    """The label set as token sequences, and how to score them.

    ``method="auto"`` uses the first-token shortcut only when it is exact (every label one token)
    and full-sequence scoring otherwise. ``normalize=True`` divides a label's log-prob by its token
    count (length-normalised), which stops long labels from being penalised for their length.
    ``complete``: score whole answers, each label followed by the chat template's end-of-answer marker
    (``end_of_answer_ids``). None (the default) does so only when it is needed for correctness, i.e. when a
    label's tokens start another's; True always; False never (answer prefixes: the longer of two such labels
    can then never win; notebook 01 shows it). A label set that needs the marker from a template without one is
    a one-line ``ValueError`` naming the two labels.
    """

    def __init__(self, tokenizer, labels: Sequence[str], method: str = "auto", normalize: bool = False,
                 complete: bool | None = None):
        labels = check_labels(labels)
        if method not in METHODS:
            raise ValueError(f"unknown scoring method {method!r}: use one of {', '.join(METHODS)}")
        if complete not in (None, True, False):
            raise ValueError(f"complete must be None (when needed), True or False, got {complete!r}")
        self.labels = labels
        self.label_ids: list[list[int]] = []  # each label's own tokens, without any end marker
        for label in labels:
            ids = answer_tokens(tokenizer, label)  # after a plain prompt's "Category:", with its space
            if not ids:
                raise ValueError(f"label {label!r} tokenizes to nothing")
            self.label_ids.append(ids)
        seen: dict[tuple[int, ...], str] = {}
        for label, ids in zip(labels, self.label_ids):
            if tuple(ids) in seen:
                raise ValueError(f"labels {seen[tuple(ids)]!r} and {label!r} are the same tokens: no score can tell "
                                 "them apart")
            seen[tuple(ids)] = label
        self.overlaps = extending_pairs(self.label_ids, labels)
        end_text = end_of_answer_text(tokenizer) if complete is not False else None
        self.end_ids = end_of_answer_ids(tokenizer) if end_text is not None else None
        if complete is None:
            complete = bool(self.overlaps)
        if complete and not self.end_ids:
            if self.overlaps:
                short, long = self.overlaps[0]
                raise ValueError(f"label {long!r} starts with all of {short!r}'s tokens, so only whole answers can tell "
                                 "them apart, and this tokenizer's chat template marks no end of an answer: rename one")
            raise ValueError("whole answers need an end-of-answer marker, and this tokenizer's chat template has none")
        if complete and method == "first_token":
            why = (f"{self.overlaps[0][1]!r} extends {self.overlaps[0][0]!r}, so labels are scored as whole answers, "
                   if self.overlaps else "")
            raise ValueError(f"{why}whole answers are several tokens each: use method='sequence' (or 'auto')")
        self.complete = bool(complete)
        self.end_ids = self.end_ids if self.complete else []
        # What is scored per label: its tokens, and with whole answers the label and the marker tokenized together, as
        # the template renders the answer.
        self.token_ids: list[list[int]] = [answer_ids(tokenizer, label, end_text) if self.complete else ids
                                           for label, ids in zip(labels, self.label_ids)]
        self.first_ids = [ids[0] for ids in self.token_ids]
        single = all(len(ids) == 1 for ids in self.token_ids)
        if method == "auto":
            method = "first_token" if single else "sequence"
        if method == "first_token" and len(set(self.first_ids)) < len(labels):
            clash = [lab for lab, first in zip(labels, self.first_ids) if self.first_ids.count(first) > 1]
            raise ValueError(
                f"labels {', '.join(map(repr, clash))} share their first token: use method='sequence'"
            )
        self.method = method
        self.normalize = normalize
        self.lengths = torch.tensor([len(ids) for ids in self.token_ids])
        # The multi-token labels' continuations, appended after every row in the prompt's own forward pass:
        # label tokens t1..t(k-1) are inputs that predict t2..tk. Several labels form a tree (branches that all
        # attend to the row, never to each other); one label is a plain append.
        self.multi = [i for i, ids in enumerate(self.token_ids) if len(ids) > 1]
        tail, targets, label_of, offsets = [], [], [], []
        for i in self.multi if method == "sequence" else []:
            ids = self.token_ids[i]
            tail += ids[:-1]
            targets += ids[1:]
            label_of += [i] * (len(ids) - 1)
            offsets += range(len(ids) - 1)
        self.tail = tail
        self.tail_targets = torch.tensor(targets, dtype=torch.long)
        self.tail_label = torch.tensor(label_of, dtype=torch.long)
        self.tail_offsets = torch.tensor(offsets, dtype=torch.long)

    @property
    def is_tree(self) -> bool:
        """Several multi-token labels: their branches need a 4D mask so that none sees another."""
        return self.method == "sequence" and len(self.multi) > 1

    def describe(self) -> str:
        tokens = ", ".join(f"{lab}={len(ids)}" for lab, ids in zip(self.labels, self.label_ids))
        end = f", whole answers (+{len(self.end_ids)} end-of-answer token)" if self.complete else ""
        return f"method={self.method}, tokens per label: {tokens}{end}"

    def __repr__(self) -> str:
        return f"LabelScorer({self.labels}, {self.describe()})"


@dataclass
class LabelScores:
    """Per-ticket label scores, in input order, with what produced them."""

    labels: list[str]
    log_scores: torch.Tensor  # (n, n_labels): summed (or length-normalised) label log-probs, float32
    info: dict = field(default_factory=dict)

    @property
    def probabilities(self) -> torch.Tensor:
        """Softmax over the labels: the confidence is the predicted label's share."""
        return torch.softmax(self.log_scores, dim=-1)

    @property
    def predicted_index(self) -> np.ndarray:
        return self.log_scores.argmax(dim=-1).numpy()

    @property
    def predictions(self) -> list[str]:
        return [self.labels[i] for i in self.predicted_index]

    @property
    def confidence(self) -> np.ndarray:
        return self.probabilities.max(dim=-1).values.numpy()

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame({"predicted_label": self.predictions, "confidence": self.confidence})
        for j, label in enumerate(self.labels):
            frame[f"p_{label}"] = self.probabilities[:, j].numpy()
        return frame

    def __len__(self) -> int:
        return len(self.log_scores)


def pad_left(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows to one length: the last real token of every row sits at index -1."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row):] = torch.as_tensor(row)
            attention_mask[i, width - len(row):] = 1
    return input_ids, attention_mask


def batch_inputs(scorer: LabelScorer, rows: Sequence[Sequence[int]], pad_id: int, past_length: int = 0):
    """What one forward pass gets: the rows left-padded with the label tails appended (``input_ids``, ``mask``),
    and position ids that count real tokens only, from ``past_length`` (a cached prefix) on, each label branch
    restarting right after its row's last token."""
    tail = len(scorer.tail)
    input_ids, mask = pad_left([[*row, *scorer.tail] for row in rows], pad_id)
    positions = past_length + (mask.cumsum(-1) - 1).clamp(min=0)
    if tail:
        width = input_ids.shape[1]
        last = positions[:, width - tail - 1]
        positions[:, width - tail:] = last[:, None] + 1 + scorer.tail_offsets
    return input_ids, mask, positions


def visible_keys(mask: torch.Tensor, scorer: LabelScorer, past_length: int = 0) -> torch.Tensor:
    """Which keys each query may see, (rows, width, past + width) booleans: the prefix always; the row's real
    tokens causally; among the label tail, only the query's own branch. Padding is seen by nothing."""
    batch, width = mask.shape
    tail = len(scorer.tail)
    allowed = torch.ones((width, width), dtype=torch.bool).tril() & mask.bool()[:, None, :]
    if tail:
        branch = scorer.tail_label
        allowed[:, width - tail:, width - tail:] &= branch[:, None] == branch[None, :]
    return torch.cat([torch.ones((batch, width, past_length), dtype=torch.bool), allowed], dim=-1)


def _tree_mask(mask: torch.Tensor, scorer: LabelScorer, past_length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask (rows, 1, width, past + width) of ``visible_keys``, for several label branches."""
    allowed = visible_keys(mask, scorer, past_length)
    # A large negative number, not -inf: a padding row that sees nothing then stays finite (and unused). Half the
    # dtype's minimum: in float16 (min -65504) a score plus the minimum itself would round to -inf, and a row of
    # -inf is NaN after the softmax.
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min / 2)[:, None]


def _check_full_attention(model, span: int) -> None:
    """The tree mask is a full 4D mask: it replaces transformers' own, so sliding-window layers would see too far."""
    config = model.config
    window = getattr(config, "sliding_window", None)
    if window and "sliding_attention" in (getattr(config, "layer_types", None) or []) and span > window:
        raise ValueError(
            f"several multi-token labels need a 4D attention mask, and this model's sliding-window layers "
            f"({window} tokens) would see past their window in a {span}-token row: use labels of which at most one "
            "is several tokens, or shorter prompts"
        )


@torch.inference_mode()
def label_log_probs(
    model,
    scorer: LabelScorer,
    rows: Sequence[Sequence[int]],
    pad_id: int,
    prefix=None,
) -> torch.Tensor:
    """Label log-probs (n_rows, n_labels) for token rows, in one forward pass.

    ``rows`` are full prompts, or only the part after ``prefix`` (a ``PrefixCache``) when given.
    Rows are left-padded; explicit position ids keep every real token at the position it has
    unbatched, so padding changes no position (the agreement checks decide whether it changed logits).
    Multi-token labels ride along in the same pass: their tokens are appended after each row (``scorer.tail``),
    positioned right after the row's last token, and the logits of the last ``1 + len(tail)`` positions give
    every label token's log-prob. Only those few numbers per row leave the device.
    """
    device = model.device
    tail = len(scorer.tail)
    past_length = prefix.length if prefix is not None else 0
    input_ids, mask, positions = batch_inputs(scorer, rows, pad_id, past_length)
    batch, width = input_ids.shape
    if scorer.is_tree:
        _check_full_attention(model, past_length + width)
        attention = _tree_mask(mask, scorer, past_length, model.dtype)
    elif prefix is not None:
        attention = torch.cat([torch.ones((batch, past_length), dtype=mask.dtype), mask], dim=-1)
    else:
        attention = mask
    out = model(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        cache=prefix.cache_for_batch(batch) if prefix is not None else None,
        use_cache=False,
        logits_to_keep=1 + tail,  # only these positions: a (rows x length x vocab) logits tensor would be huge
    )
    logp = torch.log_softmax(out.logits.float(), dim=-1)
    # Gather the label tokens on the device: (rows x labels) numbers travel to the host, not the vocabulary.
    scores = logp[:, 0, scorer.first_ids].cpu()
    if tail:
        picked = logp[:, 1:].gather(-1, scorer.tail_targets.to(device).expand(batch, -1)[..., None])
        scores.index_add_(1, scorer.tail_label, picked[..., 0].cpu())
    if scorer.normalize:
        scores = scores / scorer.lengths
    return scores


def score_one_by_one(
    model,
    tokenizer,
    scorer: LabelScorer,
    prompts: Sequence[str],
    progress: bool = True,
    desc: str = "one at a time",
) -> LabelScores:
    """The reference: one forward per ticket, no padding, no cache reuse."""
    with Stopwatch(model.device) as clock:
        scores = [
            label_log_probs(model, scorer, [encode_prompt(tokenizer, prompt)], tokenizer.pad_token_id)
            for prompt in tqdm(prompts, desc=desc, disable=not progress, leave=False)
        ]
    seconds = clock.seconds
    info = {"strategy": "loop", "batch_size": 1, "n": len(prompts), "seconds": seconds,
            "items_per_s": len(prompts) / seconds}
    return LabelScores(scorer.labels, torch.cat(scores), info)


@torch.inference_mode()
def label_log_probs_slow(model, tokenizer, scorer: LabelScorer, prompt: str) -> torch.Tensor:
    """The slow way, for checks: one full forward per label over prompt + label, no cache, no batching, no branches.

    Returns (n_labels,) summed label log-probs (length-normalised if the scorer is). Only the label's positions go
    through the output layer (the prompt's last and the label's own, the very last one unused): the rest of a
    prompt-length x vocabulary logits tensor would be computed for nothing.
    """
    prompt_ids = encode_prompt(tokenizer, prompt)
    scores = []
    for ids in scorer.token_ids:
        full = torch.tensor([prompt_ids + ids], device=model.device)
        # The token at position p is predicted by the logits at p - 1: keep positions len(prompt) - 1 onwards.
        logits = model(input_ids=full, logits_to_keep=len(ids) + 1).logits[0, :len(ids)]
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        score = sum(logp[k, token].item() for k, token in enumerate(ids))
        scores.append(score / len(ids) if scorer.normalize else score)
    return torch.tensor(scores)


# --- the baseline: generate text, then parse it --------------------------------------------------


def parse_label(text: str, labels: Sequence[str]) -> str | None:
    """The label a generated answer names: exactly one label as a whole word, else None."""
    found = {
        label for label in labels if re.search(rf"\b{re.escape(label.lower())}\b", text.lower())
    }
    return found.pop() if len(found) == 1 else None


@torch.inference_mode()
def generate_answer(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> str:
    """Greedy free-form answer: the baseline that constrained scoring replaces."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=model.device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@torch.inference_mode()
def generation_steps(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> pd.DataFrame:
    """The forward passes behind ``generate_answer``, one row each: the tokens it processed (the prompt, then one
    token per decode step over the cache), the token it chose and that token's probability. The same greedy
    generation, with its scores kept (notebook 01 draws it)."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=model.device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id, output_logits=True,
                         return_dict_in_generate=True)
    chosen = out.sequences[0, ids.shape[1]:].tolist()
    rows = []
    # The raw logits, not the processed scores: a model's generation config may penalise repeats even when greedy.
    for step, (token, scores) in enumerate(zip(chosen, out.logits)):
        rows.append({"pass": step + 1, "input_tokens": ids.shape[1] if step == 0 else 1, "token_id": token,
                     "token": tokenizer.decode([token]),
                     "probability": torch.softmax(scores[0].float(), dim=-1)[token].item()})
    return pd.DataFrame(rows)

# --- agreement with the reference -----------------------------------------------------------------

# float32 paths differ from the reference only by summation order: ~1e-5 on log-probs in practice.
FLOAT32_ATOL = 1e-3
# Lower precision rounds every layer: batched, cached and padded paths then differ from the loop by rounding.
# Measured on the embedded model (24 few-shot tickets, sorted/arbitrary batches of 8, prefix cache, on a CPU):
# float16 up to 0.04, bfloat16 up to 0.30 on label log-probs. Each tolerance leaves a margin over that.
LOW_PRECISION_ATOL = {"float16": 0.1, "bfloat16": 0.5}


@dataclass(frozen=True)
class Tolerance:
    """How closely a path must agree with the reference in one dtype: log-probs within ``atol``; labels identical,
    or (``near_ties``, low precision only) different only where the reference's top two are within ``atol``."""

    dtype: str
    atol: float
    near_ties: bool

    def __str__(self) -> str:
        if not self.near_ties:
            return f"{self.dtype}: identical labels, log-probs within {self.atol:.0e}"
        return (f"{self.dtype} (low precision): log-probs within {self.atol:g}, labels identical except near-ties "
                f"(the reference's top two within {self.atol:g}, where rounding may order them either way)")


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    """The agreement check for results computed in ``dtype`` (a model's ``.dtype`` or its name)."""
    name = str(dtype).removeprefix("torch.")
    if name == "float32":
        return Tolerance(name, FLOAT32_ATOL, False)
    if name not in LOW_PRECISION_ATOL:
        raise ValueError(f"no agreement tolerance for dtype {name!r}: use float32, bfloat16 or float16")
    return Tolerance(name, LOW_PRECISION_ATOL[name], True)


def top2_margin(scores: LabelScores) -> torch.Tensor:
    """Per item, how far the best label's log-score is ahead of the second best (inf with one label)."""
    if scores.log_scores.shape[-1] < 2:
        return torch.full((len(scores),), float("inf"))
    top = scores.log_scores.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def agreement(reference: LabelScores, candidate: LabelScores, near_tie: float = 0.0) -> dict:
    """Fraction of identical predicted labels, the largest label log-prob difference, and near-ties.

    A differing label counts as a near-tie when the reference's top two labels are less than ``near_tie``
    apart: two runs that differ by rounding may then order them either way. ``agreement`` counts only
    identical labels; ``near_ties`` says how many of the differences were near-ties.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"cannot compare {len(reference)} reference results with {len(candidate)}")
    same = reference.predicted_index == candidate.predicted_index
    tie = (top2_margin(reference) < near_tie).numpy()
    diff = (reference.log_scores - candidate.log_scores).abs().max().item()
    return {"agreement": float(same.mean()), "max_abs_diff": diff, "n": len(reference),
            "near_ties": int((~same & tie).sum())}


def assert_agrees(
    reference: LabelScores,
    candidate: LabelScores,
    atol: float | Tolerance = FLOAT32_ATOL,
    near_ties: bool = False,
    item_names: Sequence[str] | None = None,
) -> dict:
    """Same label for every item and log-probs within ``atol``; the error names the first bad item.

    ``atol`` may be a ``Tolerance`` (``tolerance_for(model.dtype)``), which sets ``near_ties`` too.
    ``near_ties=True`` is for low-precision runs: a differing label is accepted when the reference's top
    two labels are within ``atol`` of each other (rounding can flip them), and counted in ``near_ties``.
    float32 checks keep it off: there every label must be identical. ``item_names`` name the items in the
    error (e.g. rows of a file); by default "item i", the position.
    """
    if isinstance(atol, Tolerance):
        atol, near_ties = atol.atol, atol.near_ties
    name = (lambda i: item_names[i]) if item_names is not None else (lambda i: f"item {i}")
    stats = agreement(reference, candidate, near_tie=atol if near_ties else 0.0)
    differs = reference.predicted_index != candidate.predicted_index
    if near_ties:
        differs &= ~(top2_margin(reference) < atol).numpy()
    differs = np.flatnonzero(differs)
    if len(differs):
        i = differs[0]
        raise AssertionError(
            f"{len(differs)} of {len(reference)} predictions differ; first: {name(i)} "
            f"{reference.predictions[i]!r} (reference) vs {candidate.predictions[i]!r}"
        )
    if not stats["max_abs_diff"] <= atol:  # written this way so NaN fails too
        worst = (reference.log_scores - candidate.log_scores).abs().max(-1).values.argmax().item()
        raise AssertionError(
            f"label log-probs differ by {stats['max_abs_diff']:.2e} > {atol:.0e} (worst: {name(worst)})"
        )
    return stats


def coverage_curve(confidence, correct, thresholds=None) -> pd.DataFrame:
    """Route tickets below a confidence threshold to a human: coverage and accuracy of the rest."""
    confidence, correct = np.asarray(confidence), np.asarray(correct, dtype=bool)
    if thresholds is None:
        thresholds = np.unique(np.concatenate([[0.0], confidence]))
    rows = []
    for threshold in thresholds:
        kept = confidence >= threshold
        rows.append({
            "threshold": float(threshold),
            "coverage": kept.mean(),
            "accuracy": correct[kept].mean() if kept.any() else np.nan,
            "to_human": int((~kept).sum()),
        })
    return pd.DataFrame(rows)


# --- how sure is an accuracy? ---------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion, ``successes`` out of ``n`` (95 % with the default ``z``).

    Unlike p ± z·sqrt(p(1-p)/n) it stays within [0, 1] and does not shrink to a point at 0 or n successes,
    which matters for the few dozen tickets a notebook can score. Two accuracies whose intervals overlap are
    not told apart by these tickets (a conservative reading: no overlap is clearer than a significance test).
    """
    if n <= 0 or int(n) != n:
        raise ValueError(f"cannot give an interval for n={n} items: n must be a positive whole number")
    if not 0 <= successes <= n or int(successes) != successes:
        raise ValueError(f"successes={successes} must be a whole number between 0 and n={n}")
    if z <= 0:
        raise ValueError(f"z={z} must be positive (1.96 for a 95 % interval)")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5 / (1 + z2 / n)
    # At the edges the formula gives 0 and 1 exactly, up to rounding: say so exactly.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """McNemar's exact test for two classifiers scored on the same items: the two-sided p-value that the items only
    the first got right (``only_first``) and those only the second got right (``only_second``) split as unevenly
    as this by chance. Items both got right or both got wrong say nothing about which is better, so they are not
    arguments: pass the two discordant counts. A paired test: unlike comparing two intervals, it uses the fact that
    both were scored on the same tickets.
    """
    for name, value in (("only_first", only_first), ("only_second", only_second)):
        if value < 0 or int(value) != value:
            raise ValueError(f"{name}={value} must be a whole number >= 0")
    n, k = int(only_first + only_second), int(min(only_first, only_second))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_verdict(name_a: str, correct_a, name_b: str, correct_b, alpha: float = 0.05) -> dict:
    """Two classifiers scored on the same tickets, compared by McNemar's exact test: the tickets only one of them
    got right (``only_a``, ``only_b``), the p-value, and a one-line ``verdict`` that names a winner only when
    p < ``alpha``. ``correct_a`` and ``correct_b``: per ticket, right or wrong, in the same ticket order."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{name_a} and {name_b} must be scored on the same tickets: got {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    p = mcnemar_exact(only_a, only_b)
    counts = f"{only_a} ticket(s) only {name_a} got right, {only_b} only {name_b}; McNemar's exact p = {p:.3f}"
    if p < alpha:
        better, worse = (name_a, name_b) if only_a > only_b else (name_b, name_a)
        verdict = f"{better} beat {worse} beyond chance on these {len(a)} tickets ({counts})"
    else:
        verdict = f"{name_a} and {name_b} are not distinguishable on these {len(a)} tickets ({counts})"
    return {"only_a": only_a, "only_b": only_b, "p": p, "significant": p < alpha, "verdict": verdict}

# --- which labels a tokenizer splits (notebook 01 derives its examples from the loaded tokenizer) ----------

# Plausible support-ticket label words, for examples that must hold with any tokenizer.
CANDIDATE_LABELS = (
    "billing", "payment", "bill", "bills", "refund", "refunds", "invoice", "invoices", "account", "accounts",
    "access", "login", "password", "technical", "technician", "shipping", "shipment", "delivery", "order",
    "orders", "support", "security", "subscription",
)


def _label_ids(tokenizer, words: Sequence[str]) -> list[list[int]]:
    """Each word's token ids as ``LabelScorer`` tokenizes a label; a one-line error names a bad word."""
    ids = []
    for position, word in enumerate(words):
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"candidate #{position} ({word!r}) is empty: every candidate needs text")
        ids.append(tokenizer(word, add_special_tokens=False)["input_ids"])
    return ids


def token_pieces(tokenizer, words: Sequence[str]) -> dict[str, list[str]]:
    """Each word's tokens as the tokenizer writes them, e.g. ``{"billing": ["b", "illing"]}`` for one tokenizer."""
    return {word: tokenizer.convert_ids_to_tokens(ids) for word, ids in zip(words, _label_ids(tokenizer, words))}


def first_token_clash(tokenizer, candidates: Sequence[str] = CANDIDATE_LABELS) -> tuple[str, str] | None:
    """Two candidates that start with the same token with this tokenizer (the first such pair in candidate
    order), or None when every candidate starts with a different token."""
    seen: dict[int, str] = {}
    for word, ids in zip(candidates, _label_ids(tokenizer, candidates)):
        if ids and ids[0] in seen:
            return seen[ids[0]], word
        if ids:
            seen[ids[0]] = word
    return None


def single_token_labels(tokenizer, candidates: Sequence[str] = CANDIDATE_LABELS, count: int = 3) -> list[str] | None:
    """The first ``count`` distinct candidates that are one token each with this tokenizer; None if fewer are."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    candidates = list(dict.fromkeys(candidates))
    single = [word for word, ids in zip(candidates, _label_ids(tokenizer, candidates)) if len(ids) == 1]
    return single[:count] if len(single) >= count else None


# Words that often follow a label word in real taxonomies (``account change``, ``bug report``, ``refund request``).
EXTENSIONS = (" change", " report", " request", " issue")


def extending_pair(tokenizer, bases: Sequence[str] = ("account", "bug", "refund", "billing", "login", "order"),
                   extensions: Sequence[str] = EXTENSIONS) -> tuple[str, str] | None:
    """Two labels, the second the first plus a word, whose tokens start with all of the first's tokens with this
    tokenizer (``("account", "account change")`` for most): the first such pair in the given order, or None."""
    for base in bases:
        for extension in extensions:
            longer = base + extension
            if extending_pairs(_label_ids(tokenizer, [base, longer]), [base, longer]):
                return base, longer
    return None
