"""Attention without copying keys and values per query head (grouped-query models on CPU).

Qwen2.5 and SmolLM2 use grouped-query attention: several query heads share one key/value head
(SmolLM2-135M: 9 query heads, 3 key/value heads). On CPU, transformers' ``sdpa`` attention copies each
key/value head once per query head (``repeat_kv``) whenever a mask is given and more than one token is queried,
which is always the case for a padded batch or a cached prefix: in a batch on top of the prefix cache that is 3 copies
of every row's prefix, per
layer, per batch. PyTorch's SDPA can read the shared heads itself (``enable_gqa=True``); on CPU its kernel
takes masks that way. On CUDA a mask with ``enable_gqa`` falls back to the slow math kernel, so this is a
CPU choice: ``use_gqa_attention`` switches a model to it only there.

It is registered with transformers' own ``AttentionInterface`` (and the mask interface, so masks are built as
for ``sdpa``), and computes the same attention: the agreement checks against the loop cover it.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, minus the per-head copies of keys and values."""
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{NAME} attention does not support position_bias or softcap: use 'sdpa'")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As in transformers: the causal flag only without a mask; with more keys than queries and no mask (prefill
    # into an empty static cache) the keys past the queries are empty slots, cropped so causal aligns.
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    if is_causal and key.shape[2] > query.shape[2]:
        key, value = key[:, :, : query.shape[2]], value[:, :, : query.shape[2]]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_gqa_attention(model) -> bool:
    """Switch a grouped-query model on CPU from ``sdpa`` to ``sdpa_gqa``; True when it did."""
    config = model.config
    grouped = getattr(config, "num_key_value_heads", None) not in (None, config.num_attention_heads)
    if model.device.type != "cpu" or not grouped or config._attn_implementation != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return True
