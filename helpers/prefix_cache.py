"""Prefix KV caching: compute the static instructions once (notebook 02).

Every prompt starts with the same text (system instruction, few-shot turns, the start of the user
turn). ``PrefixCache`` runs that prefix through the model once, keeps its keys and values in a
transformers ``DynamicCache``, and from then on each ticket costs only its own tokens.

The split must be token-clean: prefix tokens + suffix tokens must equal the whole prompt's tokens,
or the model would see a different input than the plain path. ``PrefixCache.split`` refuses any
prompt where that does not hold.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .data import build_prompt, encode_prompt


class PromptSplitError(ValueError):
    """A prompt that does not start with the cached prefix, or whose split is not token-clean."""


def common_prefix(texts: Sequence[str]) -> str:
    """The longest string every text starts with."""
    return os.path.commonprefix(list(texts))


def find_prefix_text(tokenizer, **prompt_options) -> str:
    """The static part of the templated prompt: everything before the ticket's first character.

    ``prompt_options`` are ``build_prompt``'s (labels, examples, descriptions). Two prompts with
    different tickets are rendered; their common start is the static part. Trailing
    whitespace is left to the suffix, because tokenizers glue a space to the next word (" The").
    """
    rendered = [build_prompt(tokenizer, ticket, **prompt_options) for ticket in ("A", "Z")]
    return common_prefix(rendered).rstrip(" ")


def split_is_clean(tokenizer, prefix_text: str, prompt: str) -> bool:
    """True when tokenizing the two parts separately gives exactly the whole prompt's tokens."""
    whole = encode_prompt(tokenizer, prompt)
    parts = encode_prompt(tokenizer, prefix_text) + encode_prompt(tokenizer, prompt[len(prefix_text):])
    return prompt.startswith(prefix_text) and parts == whole


class PrefixCache:
    """The prefix's keys and values, computed once, reused for every ticket (batched or not)."""

    def __init__(self, model, tokenizer, prefix_text: str):
        if not prefix_text:
            raise ValueError("the prefix text is empty: nothing to cache")
        self.model = model
        self.tokenizer = tokenizer
        self.text = prefix_text
        self.ids = encode_prompt(tokenizer, prefix_text)
        self.length = len(self.ids)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([self.ids], device=model.device), use_cache=True)
        self.working = out.cache
        # The prefix's own tensors: DynamicCache appends by concatenation, so they never change.
        self.layers = [(layer.keys, layer.values) for layer in out.cache.layers]

    @classmethod
    def for_prompts(cls, model, tokenizer, **prompt_options) -> PrefixCache:
        """The cache for every prompt ``build_prompt(tokenizer, ticket, **prompt_options)`` makes."""
        return cls(model, tokenizer, find_prefix_text(tokenizer, **prompt_options))

    def split(self, prompt: str, index: int | None = None) -> list[int]:
        """The prompt's own tokens after the prefix; refuses a prompt the cache does not fit."""
        where = f"prompt #{index}" if index is not None else "prompt"
        if not prompt.startswith(self.text):
            raise PromptSplitError(f"{where} does not start with the cached prefix: rebuild the cache")
        whole = encode_prompt(self.tokenizer, prompt)
        suffix = encode_prompt(self.tokenizer, prompt[len(self.text):])
        if whole[: self.length] != self.ids or whole[self.length:] != suffix:
            raise PromptSplitError(
                f"{where} is not token-clean at the prefix boundary: prefix + suffix tokens differ "
                "from the whole prompt's tokens"
            )
        if not suffix:
            raise PromptSplitError(f"{where} has no tokens after the prefix")
        return suffix

    def cache_for_batch(self, batch_size: int) -> DynamicCache:
        """A cache holding the prefix for ``batch_size`` rows, ready for their suffixes.

        Batch 1 reuses one working cache, cropped back to the prefix after the last ticket: cropping
        keeps a view of the first tokens, so no copy of the prefix is made per ticket. Larger batches
        get a fresh cache over ``expand``ed views of the batch-1 tensors (no per-row copy until the
        model appends the rows' own keys, which copies each row's prefix once per batch).
        """
        if batch_size == 1:
            extra = self.working.get_seq_length() - self.length
            if extra:
                self.working.crop(-extra)  # a negative count removes that many tokens from the end
            return self.working
        return DynamicCache(
            ddp_cache_data=[
                (k.expand(batch_size, -1, -1, -1), v.expand(batch_size, -1, -1, -1)) for k, v in self.layers
            ],
            config=self.model.config,
        )

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def __repr__(self) -> str:
        return f"PrefixCache({self.length} tokens, {self.nbytes / 2**20:.1f} MiB)"
