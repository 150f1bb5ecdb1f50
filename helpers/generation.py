"""The baseline constrained scoring replaces: generate a few tokens, then parse a label out of them (notebook 01,
section 1). Each new token is one more forward pass; an answer that names no label, or two, parses to None.
"""

from __future__ import annotations

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
def generate_answer(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> str:
    """Greedy free-form answer: the baseline that constrained scoring replaces. Notebook 01, section 1."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=model.device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@torch.inference_mode()
def generation_steps(model, tokenizer, prompt: str, max_new_tokens: int = 5) -> pd.DataFrame:
    """The forward passes behind ``generate_answer``, one row each: the tokens it processed (the prompt, then one
    token per decode step over the cache), the token it chose and that token's probability. The same greedy
    generation, with its scores kept (notebook 01 draws it). Notebook 01, section 2 (the drawing)."""
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=model.device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    chosen = out.sequences[0, ids.shape[1] :].tolist()
    rows = []
    # The raw logits, not the processed scores: a model's generation config may penalise repeats even when greedy.
    for step, (token, scores) in enumerate(zip(chosen, out.logits)):
        rows.append(
            {
                "pass": step + 1,
                "input_tokens": ids.shape[1] if step == 0 else 1,
                "token_id": token,
                "token": tokenizer.decode([token]),
                "probability": torch.softmax(scores[0].float(), dim=-1)[token].item(),
            }
        )
    return pd.DataFrame(rows)
