"""Prefix KV caching: compute the static instructions once (notebook 02).

``PrefixCache`` runs the prefix every prompt starts with (system instruction, few-shot turns, the start of the user
turn) once, keeps its keys and values in a transformers ``DynamicCache``, and from then on each ticket costs only its
own tokens. The split must be token-clean: each prompt is tokenized once, whole, and cut after the prefix's tokens;
a prompt whose tokens do not start with them is refused (``UncleanSplitError``); ``score_batched`` runs it whole."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .data import build_prompt, encode_prompt


class PromptSplitError(ValueError):
    """A prompt that does not start with the cached prefix. Notebook 02, section 4."""


class UncleanSplitError(PromptSplitError):
    """A prompt whose tokens merge across the prefix boundary: it runs in full. Notebook 02, section 2."""


def common_prefix(texts: Sequence[str]) -> str:
    """The longest string every text starts with. Notebook 02, section 1."""
    return os.path.commonprefix(list(texts))


def find_prefix_text(tokenizer, **prompt_options) -> str:
    """The static part of the templated prompt (``build_prompt``'s options): the common start of two prompts with other
    tickets, trailing spaces left to the suffix (tokenizers glue a space to the next word). Notebook 02, section 1."""
    return common_prefix([build_prompt(tokenizer, ticket, **prompt_options) for ticket in ("A", "Z")]).rstrip(" ")


def prefix_length(tokenizer, **prompt_options) -> int:
    """How many tokens of every ``build_prompt`` prompt the shared prefix holds: where a ticket's own tokens start
    (``PrefixCache.length``, without a model). No lesson builds it: ``classify --fit-head``'s ``mean_from``."""
    return len(encode_prompt(tokenizer, find_prefix_text(tokenizer, **prompt_options)))


def split_is_clean(tokenizer, prefix_text: str, prompt: str) -> bool:
    """Whether the whole prompt's tokens start with exactly the prefix's tokens and go on after them: then the rest, run
    after the cached prefix, is the plain path's input (``PrefixCache.split``'s rule). Notebook 02, section 2."""
    whole, head = encode_prompt(tokenizer, prompt), encode_prompt(tokenizer, prefix_text)
    return prompt.startswith(prefix_text) and whole[: len(head)] == head and len(whole) > len(head)


class PrefixCache:
    """The prefix's keys and values, computed once and reused for every ticket. Notebook 02, sections 3-4."""

    def __init__(self, model, tokenizer, prefix_text: str):
        if not prefix_text:
            raise ValueError("the prefix text is empty: nothing to cache")
        self.model = model
        self.tokenizer = tokenizer
        self.text = prefix_text
        self.ids = encode_prompt(tokenizer, prefix_text)
        self.length = len(self.ids)
        with torch.inference_mode():
            # Only the keys and values are wanted: one position's logits instead of prefix x vocabulary.
            out = model(input_ids=torch.tensor([self.ids], device=model.device), use_cache=True, logits_to_keep=1)
        # The prefix's own tensors, per layer. Nothing ever writes to them: every call gets a fresh cache
        # over them, and DynamicCache appends by concatenation (a new tensor), never in place.
        self.layers = [(layer.keys, layer.values) for layer in out.cache.layers]

    @classmethod
    def for_prompts(cls, model, tokenizer, **prompt_options) -> PrefixCache:
        """The cache for every prompt ``build_prompt(tokenizer, ticket, **prompt_options)`` makes."""
        return cls(model, tokenizer, find_prefix_text(tokenizer, **prompt_options))

    def split(self, prompt: str, index: int | None = None, ids: Sequence[int] | None = None) -> list[int]:
        """The prompt's tokens after the prefix (``ids``: all its tokens, if known); refuses one that doesn't fit."""
        where = f"prompt #{index}" if index is not None else "prompt"
        if not prompt.startswith(self.text):
            raise PromptSplitError(f"{where} does not start with the cached prefix: rebuild the cache")
        whole = list(ids) if ids is not None else encode_prompt(self.tokenizer, prompt)
        if whole[: self.length] != self.ids:
            raise UncleanSplitError(f"{where} is not token-clean at the prefix boundary: its tokens differ there")
        if len(whole) == self.length:
            raise PromptSplitError(f"{where} has no tokens after the prefix")
        return whole[self.length :]

    def cache_for_batch(self, batch_size: int) -> DynamicCache:
        """A fresh cache of the prefix for ``batch_size`` rows (views of its tensors): nothing is shared between calls,
        so an interrupted forward leaves nothing behind; copies as the model appends cost little (notebook 02)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        layers = self.layers
        if batch_size > 1:
            layers = [(k.expand(batch_size, -1, -1, -1), v.expand(batch_size, -1, -1, -1)) for k, v in layers]
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def __repr__(self) -> str:
        return f"PrefixCache({self.length} tokens, {self.nbytes / 2**20:.1f} MiB)"
