"""Constrained output: score the valid labels instead of generating text (notebook 01).

A label's score is the log-probability of its tokens right after the prompt, ``log p(t1 | prompt) + log p(t2 | prompt,
t1) + ...``: with single-token labels, the last position's logits (the exact first-token shortcut); otherwise the later
label tokens are appended in the same forward pass, each label a branch that sees the prompt but not the other labels.
That says "the answer starts with this label": where one label's tokens begin another's (``account``, ``account
change``) the longer can never win, so ``LabelScorer`` then scores *whole answers*, each label followed by the
end-of-answer marker. Every fast path goes through ``label_log_probs``, checked against ``score_one_by_one``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data import answer_tokens, encode_prompt, uses_chat_template
from .timing import Stopwatch

METHODS = ("auto", "first_token", "sequence")
_SENTINEL = "Zq7Xv"  # a stand-in answer, rendered through the chat template to see what it puts after an answer


def check_labels(labels: Sequence[str]) -> list[str]:
    """The label list, or a one-line ``ValueError`` (fewer than two, blank or non-text, duplicates); needs no tokenizer,
    so a command refuses bad labels before it loads a model. Notebook 01, section 2."""
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


def end_of_answer_text(tokenizer) -> str | None:
    """What the chat template writes right after an assistant's answer, up to its first marker token (``<|im_end|>`` for
    Qwen and SmolLM2, ``<|eot_id|>`` for Llama 3), read around a stand-in answer; or None. Notebook 01, Going deeper."""
    if not uses_chat_template(tokenizer):
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
    markers = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    markers.add(tokenizer.eos_token_id)  # None where it has none: no token's id
    for token, (_, end) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        if token in markers:
            return after[:end]
    return None


def end_of_answer_ids(tokenizer) -> list[int] | None:
    """The end-of-answer marker's tokens after answers (Qwen's ``[<|im_end|>]``), or None. Notebook 01, Going deeper."""
    text = end_of_answer_text(tokenizer)
    if text is None:
        return None
    probe, whole = encode_prompt(tokenizer, _SENTINEL), encode_prompt(tokenizer, _SENTINEL + text)
    return whole[len(probe) :] if whole[: len(probe)] == probe else None


def extending_pairs(token_ids: Sequence[Sequence[int]], labels: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (shorter, longer) of labels whose tokens start with all of the shorter one's. Notebook 01, Going deeper."""
    pairs = []
    for i, short in enumerate(token_ids):
        for j, long in enumerate(token_ids):
            if i != j and len(short) < len(long) and list(long[: len(short)]) == list(short):
                pairs.append((labels[i], labels[j]))
    return pairs


class LabelScorer:
    """The label set as token sequences, and how to score them: ``method="auto"``, the first-token shortcut where exact
    (one token each), else full sequences; ``normalize``: per token; ``complete``: whole answers (each label then the
    end-of-answer marker), by default only where a label's tokens start another's. Notebook 01, section 2."""

    def __init__(self, tokenizer, labels: Sequence[str], method="auto", normalize=False, complete: bool | None = None):
        labels = check_labels(labels)
        if method not in METHODS:
            raise ValueError(f"unknown scoring method {method!r}: use one of {', '.join(METHODS)}")
        if complete not in (None, True, False):
            raise ValueError(f"complete must be None (when needed), True or False, got {complete!r}")
        # Each label's own tokens, without any end marker (after a plain prompt's "Category:", with its space).
        self.labels, self.label_ids = labels, [answer_tokens(tokenizer, label) for label in labels]
        if [] in self.label_ids:
            raise ValueError(f"label {labels[self.label_ids.index([])]!r} tokenizes to nothing")
        for j, ids in enumerate(self.label_ids):
            if ids in self.label_ids[:j]:
                pair = f"{labels[self.label_ids.index(ids)]!r} and {labels[j]!r}"
                raise ValueError(f"labels {pair} are the same tokens: no score can tell them apart")
        self.overlaps = extending_pairs(self.label_ids, labels)
        end_text = end_of_answer_text(tokenizer) if complete is not False else None
        self.end_ids = end_of_answer_ids(tokenizer) if end_text is not None else None
        complete = bool(self.overlaps) if complete is None else complete
        if complete and not self.end_ids:
            if self.overlaps:
                short, long = self.overlaps[0]
                why = f"label {long!r} starts with all of {short!r}'s tokens, so only whole answers can tell them apart"
                raise ValueError(f"{why}, and this tokenizer's chat template marks no end of an answer: rename one")
            raise ValueError("whole answers need an end-of-answer marker, and this tokenizer's chat template has none")
        if complete and method == "first_token":
            pair = self.overlaps[0] if self.overlaps else None
            why = f"{pair[1]!r} extends {pair[0]!r}, so labels are scored as whole answers, " if pair else ""
            raise ValueError(f"{why}whole answers are several tokens each: use method='sequence' (or 'auto')")
        self.complete = bool(complete)
        self.end_ids = self.end_ids if self.complete else []
        # What is scored per label: its tokens; with whole answers the label and the marker tokenized together, as the
        # template renders the answer (a space before the marker, as Llama 2 writes it, merges as it does there).
        self.token_ids = self.label_ids
        if self.complete:
            self.token_ids = [encode_prompt(tokenizer, label + end_text) for label in labels]
        self.first_ids = [ids[0] for ids in self.token_ids]
        if method == "auto":
            method = "first_token" if all(len(ids) == 1 for ids in self.token_ids) else "sequence"
        if method == "first_token" and len(set(self.first_ids)) < len(labels):
            clash = [lab for lab, first in zip(labels, self.first_ids) if self.first_ids.count(first) > 1]
            raise ValueError(f"labels {', '.join(map(repr, clash))} share their first token: use method='sequence'")
        self.method, self.normalize = method, normalize
        self.lengths = torch.tensor([len(ids) for ids in self.token_ids])
        # Multi-token labels' continuations, appended to every row in its own forward: tokens t1..t(k-1) predict t2..tk;
        # several labels form a tree of branches that see the row, never each other.
        self.multi = [i for i, ids in enumerate(self.token_ids) if len(ids) > 1]
        branches = [(i, self.token_ids[i]) for i in self.multi] if method == "sequence" else []
        self.tail = [token for _, ids in branches for token in ids[:-1]]
        self.tail_targets = torch.tensor([token for _, ids in branches for token in ids[1:]], dtype=torch.long)
        self.tail_label = torch.tensor([i for i, ids in branches for _ in ids[1:]], dtype=torch.long)
        self.tail_offsets = torch.tensor([k for _, ids in branches for k in range(len(ids) - 1)], dtype=torch.long)

    @property
    def is_tree(self) -> bool:
        """Several multi-token labels: their branches need a 4D mask so that none sees another."""
        return self.method == "sequence" and len(self.multi) > 1

    def batch_inputs(self, rows: Sequence[Sequence[int]], pad_id: int, past_length: int = 0):
        """One forward pass's inputs: the rows left-padded with the label tails appended (``input_ids``, ``mask``), and
        position ids counting real tokens only, from ``past_length`` (a cached prefix) on. Notebook 03, section 5."""
        input_ids, mask = pad_left([[*row, *self.tail] for row in rows], pad_id)
        positions = past_length + (mask.cumsum(-1) - 1).clamp(min=0)
        if tail := len(self.tail):  # each label branch restarts right after its row's last token
            positions[:, -tail:] = positions[:, -tail - 1, None] + 1 + self.tail_offsets
        return input_ids, mask, positions

    def visible_keys(self, mask: torch.Tensor, past_length: int = 0) -> torch.Tensor:
        """Which keys each query may see, (rows, width, past + width) booleans: the prefix always; the row's real tokens
        causally; among the label tail, only the query's own branch; padding, nothing. Notebook 03, section 5."""
        batch, width = mask.shape
        allowed = torch.ones((width, width), dtype=torch.bool).tril() & mask.bool()[:, None, :]
        if tail := len(self.tail):
            allowed[:, -tail:, -tail:] &= self.tail_label[:, None] == self.tail_label[None, :]
        return torch.cat([torch.ones((batch, width, past_length), dtype=torch.bool), allowed], dim=-1)

    def describe(self) -> str:
        tokens = ", ".join(f"{lab}={len(ids)}" for lab, ids in zip(self.labels, self.label_ids))
        end = f", whole answers (+{len(self.end_ids)} end-of-answer token)" if self.complete else ""
        return f"method={self.method}, tokens per label: {tokens}{end}"

    def __repr__(self) -> str:
        return f"LabelScorer({self.labels}, {self.describe()})"


@dataclass
class LabelScores:
    """Per-ticket label scores, in input order, with what produced them. Notebook 01, section 2. With a ``prior``
    (``helpers.prior``), predictions, probabilities, confidence and margins read the calibrated scores."""

    labels: list[str]
    log_scores: torch.Tensor  # (n, n_labels): summed (or length-normalised) label log-probs, float32
    info: dict = field(default_factory=dict)
    prior: torch.Tensor | None = None  # (n_labels,) log-probs divided out of every row: helpers.prior.calibrated

    @property
    def calibrated(self) -> torch.Tensor:
        return self.log_scores if self.prior is None else self.log_scores - self.prior

    @property
    def raw(self) -> LabelScores:
        """These scores without the prior: what every agreement check compares."""
        return LabelScores(self.labels, self.log_scores, self.info)

    @property
    def probabilities(self) -> torch.Tensor:
        return torch.softmax(self.calibrated, dim=-1)

    @property
    def predicted_index(self) -> np.ndarray:
        return self.calibrated.argmax(dim=-1).numpy()

    @property
    def predictions(self) -> list[str]:
        return [self.labels[i] for i in self.predicted_index]

    @property
    def confidence(self) -> np.ndarray:
        return self.probabilities.max(dim=-1).values.numpy()

    @property
    def margins(self) -> torch.Tensor:
        """Per row, the top label's lead on the next; where small, rounding may swap them. Notebook 05, section 2."""
        top = self.calibrated.topk(2, dim=-1).values
        return top[:, 0] - top[:, 1]

    def to_frame(self) -> pd.DataFrame:
        """Prediction, confidence and ``p_<label>`` columns; with a prior, the raw probabilities too (``raw_p_``)."""
        frame = pd.DataFrame({"predicted_label": self.predictions, "confidence": self.confidence})
        shares = {"p": self.probabilities.numpy(), "raw_p": torch.softmax(self.log_scores, dim=-1).numpy()}
        for kind in ("p", "raw_p") if self.prior is not None else ("p",):
            for j, label in enumerate(self.labels):
                frame[f"{kind}_{label}"] = shares[kind][:, j]
        return frame

    def __len__(self) -> int:
        return len(self.log_scores)

    def __getitem__(self, rows) -> LabelScores:
        """Some rows' scores, in the order given: ``scores[:2]`` or ``scores[[4, 0]]``; one row is ``scores[[i]]``."""
        if isinstance(rows, (int, np.integer)):
            raise TypeError(f"index LabelScores with a slice or a list of rows (scores[[{rows}]]), not one number")
        index = rows if isinstance(rows, slice) else torch.as_tensor(np.asarray(rows), dtype=torch.long)
        return LabelScores(self.labels, self.log_scores[index], prior=self.prior)


def pad_left(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows to one length: the last real token of every row sits at index -1. Notebook 03, section 2."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row) :] = torch.as_tensor(row)
            attention_mask[i, width - len(row) :] = 1
    return input_ids, attention_mask


def mean_over(values: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, start: int) -> torch.Tensor:
    """The mean of ``values`` (rows, width, size) over each row's real tokens at positions ``start`` on (a fitted
    head's ``mean_from``: the ticket's own tokens, after the shared prefix). No lesson builds it: ``answer_states`` and
    ``label_log_probs`` under a head that reads the mean (notebook 01, section 5, calls the first)."""
    kept = (mask.bool() & (positions >= start)).to(values.device)[..., None]
    return (values * kept).sum(1) / kept.sum(1)


def _tree_mask(mask: torch.Tensor, scorer: LabelScorer, past_length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask (rows, 1, width, past + width) of ``LabelScorer.visible_keys``, for several label branches."""
    allowed = scorer.visible_keys(mask, past_length)
    # A large negative number, not -inf: a padding row that sees nothing stays finite. Half the dtype's minimum: in
    # float16 (min -65504) a score plus the minimum would round to -inf, and a row of -inf is NaN after the softmax.
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min / 2)[:, None]


def _check_full_attention(model, span: int) -> None:
    """The tree mask is a full 4D mask: it replaces transformers' own, so sliding-window layers would see too far."""
    window = getattr(model.config, "sliding_window", None)
    if window and "sliding_attention" in (getattr(model.config, "layer_types", None) or []) and span > window:
        why = f"this model's sliding-window layers ({window} tokens) would see past them in a {span}-token row"
        raise ValueError(f"several multi-token labels need a 4D mask, and {why}: use at most one such label")


@torch.inference_mode()
def label_log_probs(model, scorer: LabelScorer, rows: Sequence[Sequence[int]], pad_id, prefix=None) -> torch.Tensor:
    """Label log-probs (rows x labels) for token rows (prompts, or their tokens after ``prefix``) in one forward pass,
    multi-token labels appended (``scorer.tail``): only those numbers leave the device. Notebook 01, section 3."""
    device = model.device
    tail = len(scorer.tail)
    past_length = prefix.length if prefix is not None else 0
    ids, mask, positions = scorer.batch_inputs(rows, pad_id, past_length)
    batch, width = ids.shape
    if scorer.is_tree:
        _check_full_attention(model, past_length + width)
        attention = _tree_mask(mask, scorer, past_length, model.dtype)
    else:  # the cached prefix, if any, is seen by every row
        attention = torch.cat([torch.ones((batch, past_length), dtype=mask.dtype), mask], dim=-1)
    inputs = dict(input_ids=ids.to(device), attention_mask=attention.to(device), position_ids=positions.to(device))
    cache = prefix.cache_for_batch(batch) if prefix is not None else None
    if (mean_from := getattr(scorer, "mean_from", None)) is not None:  # a head reading the mean: a few labels wide
        logits = model(**inputs, cache=cache, use_cache=False, logits_to_keep=0).logits.float()
        return torch.log_softmax(mean_over(logits, mask, positions, mean_from), dim=-1).cpu()
    # only the last 1 + tail positions: a (rows x length x vocabulary) logits tensor would be huge
    out = model(**inputs, cache=cache, use_cache=False, logits_to_keep=1 + tail)
    logp = torch.log_softmax(out.logits.float(), dim=-1)
    scores = logp[:, 0, scorer.first_ids].cpu()
    if tail:
        picked = logp[:, 1:].gather(-1, scorer.tail_targets.to(device).expand(batch, -1)[..., None])
        scores.index_add_(1, scorer.tail_label, picked[..., 0].cpu())
    if scorer.normalize:
        scores = scores / scorer.lengths
    return scores


def score_one_by_one(model, tokenizer, scorer, prompts, progress=True, desc="one at a time") -> LabelScores:
    """The reference: one forward per ticket, no padding, no cache reuse. Notebook 01, section 2."""
    with Stopwatch(model.device) as clock:
        scores = [
            label_log_probs(model, scorer, [encode_prompt(tokenizer, prompt)], tokenizer.pad_token_id)
            for prompt in tqdm(prompts, desc=desc, disable=not progress, leave=False)
        ]
    seconds = clock.seconds
    info = dict(strategy="loop", batch_size=1, n=len(prompts), seconds=seconds, items_per_s=len(prompts) / seconds)
    return LabelScores(scorer.labels, torch.cat(scores), info)


@torch.inference_mode()
def score_the_slow_way(model, tokenizer, scorer: LabelScorer, prompts: Sequence[str]) -> LabelScores:
    """The slow way, for checks: one full forward per label over prompt + label, no cache, batching or branches;
    summed label log-probs (normalised where the scorer is), one row per prompt. Notebook 01, section 3."""
    rows = []
    for prompt in prompts:
        prompt_ids, scores = encode_prompt(tokenizer, prompt), []
        for ids in scorer.token_ids:
            full = torch.tensor([prompt_ids + ids], device=model.device)
            # The token at position p is predicted by the logits at p - 1: keep positions len(prompt) - 1 onwards.
            logits = model(input_ids=full, logits_to_keep=len(ids) + 1).logits[0, : len(ids)]
            logp = torch.log_softmax(logits.float(), dim=-1).cpu()
            score = sum(logp[k, token].item() for k, token in enumerate(ids))
            scores.append(score / len(ids) if scorer.normalize else score)
        rows.append(scores)
    return LabelScores(scorer.labels, torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(scorer.labels)))
