"""The measurements behind the machine profile (``helpers.profile``, notebook 00): matmul roofs, the prefill and
batched-rows curves, one decode step. Each call is warmed up, then timed, synchronised with the device.
"""

from __future__ import annotations

import copy as copy_module
import math
import time
from collections.abc import Iterable

import torch

from .models import finite_logits, free_memory
from .timing import Stopwatch, sync

PREFILL_SIZES = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)


BATCH_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # rows per call of the batched curve, until it stops growing


BATCH_ROW_TOKENS = 96  # tokens per row: about a median ticket's prompt (the article's median is 94 with Qwen's tokenizer)


DECODE_BATCHES = (1, 32)


DECODE_CONTEXT = 128  # cached tokens each decoded row attends to (about one ticket's prompt)


ROOF_BLOCKS = 5  # timed blocks behind each roof measurement; the fastest counts


ROOF_BLOCK_S = 0.25  # seconds per block: 5 blocks make more than a second of steady matmuls


MAX_CALL_S = 1.5  # the prefill sweep stops after a call this slow: the curve is flat long before


def _time_call(call, device: torch.device, min_time_s: float = 0.2, max_repeats: int = 5) -> float:
    """Seconds per call: one warm-up (kernels are picked, memory allocated), then the best of a few runs."""
    with Stopwatch(device) as warmup:
        call()
    if warmup.seconds > MAX_CALL_S:  # too slow to repeat: the warm-up is the measurement
        return warmup.seconds
    times: list[float] = []
    while len(times) < max_repeats and (sum(times) < min_time_s or len(times) < 2):
        with Stopwatch(device) as clock:
            call()
        times.append(clock.seconds)
    return min(times)


@torch.inference_mode()
def matmul_gflops(device: torch.device | str, dtype: torch.dtype, shape: tuple[int, int, int],
                  blocks: int = ROOF_BLOCKS, block_s: float = ROOF_BLOCK_S, slow: float | None = None) -> float | None:
    """Measured GFLOP/s of one (m x k) @ (k x n) matmul in ``dtype``: a roof, so a maximum. None where the dtype is
    unsupported.

    After a warm-up of about one block (clocks ramp up, kernels are picked, caches fill), ``blocks`` blocks of
    back-to-back matmuls, each at least ``block_s`` seconds, synchronised; the fastest block counts. A median of a
    cold start would sit below what the same kernel does a moment later, and a rate above the roof would follow.
    ``slow``: a rate (GFLOP/s) below which the first call's is answer enough (a dtype that slow is skipped anyway;
    bfloat16 without bf16 instructions takes seconds per call).
    """
    device = torch.device(device)
    m, k, n = shape
    try:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        with Stopwatch(device) as first:
            a @ b  # unsupported dtypes fail here, before timing
    except (RuntimeError, TypeError):
        return None
    if slow is not None and 2 * m * k * n / first.seconds / 1e9 < slow:
        return 2 * m * k * n / first.seconds / 1e9
    sync(device)
    start, calls, elapsed = time.perf_counter(), 0, 0.0
    while elapsed < block_s:  # the warm-up, which also sizes the blocks
        a @ b
        sync(device)
        calls, elapsed = calls + 1, time.perf_counter() - start
    per_block = max(1, math.ceil(calls * block_s / elapsed))
    if elapsed > 4 * block_s:  # one call outlasts several blocks (bfloat16 without bf16 instructions): 2 will do
        blocks = min(blocks, 2)
    best = float("inf")
    for _ in range(blocks):
        with Stopwatch(device) as clock:
            for _ in range(per_block):
                a @ b
        best = min(best, clock.seconds / per_block)
    return 2 * m * k * n / best / 1e9


def roof_shape(model, device: torch.device) -> tuple[int, int, int]:
    """The model's MLP matmul (tokens x hidden @ hidden x intermediate), with enough tokens to keep the device busy.

    On a 2-core CPU 256 tokens reach ~85 % of what 2048 do; a GPU needs far larger matmuls still.
    """
    tokens = 2048 if device.type == "cpu" else 16384
    return tokens, model.config.hidden_size, model.config.intermediate_size


@torch.inference_mode()
def prefill_curve(model, sizes: Iterable[int] = PREFILL_SIZES, max_call_s: float = MAX_CALL_S) -> list[tuple[int, float]]:
    """(tokens per forward call, tokens/s) for one sequence of each size, until the throughput stops growing."""
    device = model.device
    limit = getattr(model.config, "max_position_embeddings", 4096)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    points: list[tuple[int, float]] = []
    for tokens in sizes:
        if tokens > limit:
            break
        ids = torch.randint(0, vocab, (1, tokens), generator=generator).to(device)
        seconds = _time_call(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), device)
        points.append((tokens, tokens / seconds))
        flat = len(points) >= 3 and all(points[-i][1] < 1.05 * points[-i - 1][1] for i in (1, 2))
        if seconds > max_call_s or (tokens >= 64 and flat):
            break
    return points


def half_precision_finite(model, dtype: str) -> bool:
    """Whether a copy of ``model`` in ``dtype`` gives finite logits (``finite_logits``): the profile records it,
    so a dtype that overflows with this model is never chosen (``choose_dtypes``)."""
    copy = copy_module.deepcopy(model).to(getattr(torch, dtype))
    try:
        return finite_logits(copy)
    finally:
        del copy
        free_memory(model.device)


@torch.inference_mode()
def batched_curve(model, rows: Iterable[int] = BATCH_ROWS, row_tokens: int = BATCH_ROW_TOKENS,
                  max_call_s: float = MAX_CALL_S) -> list[tuple[int, float]]:
    """(rows per forward call, tokens/s) for batches of ``row_tokens``-token rows, until the throughput stops growing.

    The rows carry an attention mask, as a padded batch does, so attention runs the kernel the batched paths run.
    On a CPU the curve goes to at least 32 rows (the sweep's largest size there), on a GPU to at least 256.
    """
    device = model.device
    vocab = model.config.vocab_size
    least = 32 if device.type == "cpu" else 256
    generator = torch.Generator().manual_seed(0)
    points: list[tuple[int, float]] = []
    for count in rows:
        ids = torch.randint(0, vocab, (count, row_tokens), generator=generator).to(device)
        mask = torch.ones_like(ids)
        seconds = _time_call(lambda: model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1), device)
        points.append((count, count * row_tokens / seconds))
        flat = len(points) >= 3 and all(points[-i][1] < 1.05 * points[-i - 1][1] for i in (1, 2))
        if count >= least and (flat or seconds > max_call_s):
            break
    return points


@torch.inference_mode()
def decode_step_tokens_per_s(model, batch: int, context: int = DECODE_CONTEXT) -> float:
    """Tokens/s of one decode step: one new token per row, attending to ``context`` cached tokens."""
    from transformers import DynamicCache

    config, device, dtype = model.config, model.device, model.dtype
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    generator = torch.Generator().manual_seed(0)
    # What the cache holds does not change the time: random keys and values of the right shape.
    layers = [tuple(torch.randn(batch, kv_heads, context, head_dim, generator=generator).to(device, dtype)
                    for _ in range(2)) for _ in range(config.num_hidden_layers)]
    cache = DynamicCache(ddp_cache_data=layers, config=config)
    ids = torch.randint(0, config.vocab_size, (batch, 1), generator=generator).to(device)
    mask = torch.ones((batch, context + 1), dtype=torch.long, device=device)
    positions = torch.full((batch, 1), context, device=device)

    def step():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
              logits_to_keep=1)
        cache.crop(-1)  # back to the context, for the next timed step

    return batch / _time_call(step, device)


# 5: batched rows; 6: half dtypes probed for finite logits
