"""Attention without copying keys and values per query head (grouped-query models on CPU).

SmolLM2 and Qwen2.5 share each key/value head among several query heads. On CPU, transformers' ``sdpa`` copies each
shared head once per query head (``repeat_kv``) whenever a mask is given (a padded batch, a cached prefix); PyTorch's
SDPA reads the shared heads itself (``enable_gqa=True``), and on CPU its kernel takes masks that way (on CUDA it would
fall back to a slow kernel: ``use_gqa_attention`` switches only CPU models). The agreement checks cover it."""

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, minus the per-head copies of keys and values."""
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{NAME} attention does not support position_bias or softcap: use 'sdpa'")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As in transformers: causal only without a mask (no static cache here, whose empty slots would need cropping).
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    options = dict(attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal)
    with _kernel_for(query):
        out = scaled_dot_product_attention(query, key, value, **options, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _kernel_for(query):
    """PyTorch's CPU flash kernel in bfloat16 packs its inputs with AVX-512 instructions whenever the CPU has them,
    also where ATen's kernels are held below AVX-512 (``ATEN_CPU_CAPABILITY=default``), and there fails on long
    sequences ("pack_vnni2 is only supported when avx512 is supported"), also under autocast, which casts a float32
    query to bfloat16: there the math kernel runs instead."""
    held_down = torch.backends.cpu.get_cpu_capability() == "DEFAULT"
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16  # casts it
    if query.device.type == "cpu" and (query.dtype == torch.bfloat16 or autocast) and held_down:
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


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
