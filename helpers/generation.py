"""The baseline constrained scoring replaces: generate a few tokens, then parse a label out of them (notebook 01,
section 1). Each new token is one more forward pass; an answer that names no label, or two, parses to None."""

import re
from collections.abc import Sequence

import pandas as pd
import torch

from .data import encode_prompt


def parse_label(text: str, labels: Sequence[str]) -> str | None:
    """The label a generated answer names: exactly one label as a whole word, else None. Notebook 01, section 1."""
    found = {label for label in labels if re.search(rf"\b{re.escape(label.lower())}\b", text.lower())}
    return found.pop() if len(found) == 1 else None


@torch.inference_mode()
def _greedy(model, tokenizer, prompt: str, max_new_tokens: int, **options):
    """(prompt length, ``model.generate``'s output): greedy decoding of one prompt, unpadded."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=model.device)
    options.update(attention_mask=torch.ones_like(ids), pad_token_id=tokenizer.pad_token_id, do_sample=False)
    return ids.shape[1], model.generate(ids, max_new_tokens=max_new_tokens, **options)


def generate_answer(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> str:
    """Greedy free-form answer: the baseline that constrained scoring replaces. Notebook 01, section 1."""
    length, out = _greedy(model, tokenizer, prompt, max_new_tokens)
    return tokenizer.decode(out[0, length:], skip_special_tokens=True)


@torch.inference_mode()
def generation_steps(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> pd.DataFrame:
    """The forward passes behind ``generate_answer``, a row each: the tokens it processed (the prompt, then one per
    decode step over the cache), the token it chose and its probability. Notebook 01, section 2 (the drawing)."""
    length, out = _greedy(model, tokenizer, prompt, max_new_tokens, output_logits=True, return_dict_in_generate=True)
    chosen = out.sequences[0, length:].tolist()
    steps = pd.DataFrame({"pass": range(1, len(chosen) + 1), "input_tokens": [length] + [1] * (len(chosen) - 1)})
    steps["token_id"], steps["token"] = chosen, [tokenizer.decode([token]) for token in chosen]
    # The raw logits, not the processed scores: a model's generation config may penalise repeats even when greedy.
    steps["probability"] = [torch.softmax(s[0].float(), dim=-1)[t].item() for t, s in zip(chosen, out.logits)]
    return steps
