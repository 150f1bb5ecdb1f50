"""How much of the machine went into useful work (notebook 04, Going deeper): each benchmark row's roof fraction and
kernel ceiling.

**Useful work** is what the one-at-a-time loop must compute for a ticket beyond the cached prefix, counted
in multiply-adds x 2, per ticket with s own tokens and c label-continuation tokens:

- every transformer weight matrix (all parameters but the embeddings) on each of the s + c tokens;
- attention: for a token that sees L earlier tokens (prefix included), q.k and p.v cost 4 x heads x head_dim
  x L per layer; the i-th own token sees prefix + i, a continuation token the row and its own branch;
- the output layer (hidden x vocabulary) at the 1 + c scored positions.

Not useful: padding, the prefix (computed once, outside the timing), softmax, norms and the rest of the
elementwise work. The roof is one matmul of the model's MLP shape at a size that keeps the device busy
(``profile.roof_shape``), the fastest of several steady blocks (a maximum, ``profile.matmul_gflops``), so
``roof_fraction`` stays below 1. Where the row's own kernels, timed alone, do more useful work per second than
that measurement, the roof is raised to their rate and the frame says so (``attrs["roof_raised"]``): a roof is
an upper bound of what was measured in the run.

**Kernel ceiling**: the roof fraction the row would reach if its forward passes were nothing but their matmuls
and attention calls, each timed alone on the row's own shapes (``kernel_seconds``). Matmuls run close to the
roof; CPU attention kernels run well below it (the softmax between the two products), and padded batches attend
over padding. ``roof_fraction / kernel_ceiling`` estimates the share of the row's time those kernels take (they
are timed apart, with warm caches); the rest is norms, rotary embeddings, activations, copies and Python, the
work ``torch.compile`` fuses.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Mapping, Sequence

import torch

from .attention import NAME as GQA_ATTENTION
from .profile import _time_call, matmul_gflops, roof_shape
from .scoring import LabelScorer, LabelScores


def non_embedding_parameters(model) -> int:
    """Parameters doing per-token matmuls: everything but the input embedding and the output layer."""
    skip = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        skip.add(id(model.get_output_embeddings().weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def useful_flops(model, lengths: Sequence[int], prefix_tokens: int, scorer: LabelScorer) -> float:
    """FLOPs the loop must spend on these tickets beyond the cached prefix (see the module docstring)."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_key = 4 * config.num_hidden_layers * heads * head_dim  # q.k and p.v, per query token and key
    weights = 2 * non_embedding_parameters(model)
    output = 2 * config.hidden_size * config.vocab_size
    tail = len(scorer.tail)
    tail_keys = int(scorer.tail_offsets.sum()) + tail  # branch token k sees k earlier branch tokens and itself
    total = 0.0
    for s in lengths:
        keys = s * prefix_tokens + s * (s + 1) / 2 + tail * (prefix_tokens + s) + tail_keys
        total += weights * (s + tail) + per_key * keys + output * (1 + tail)
    return total


def matmul_roof(model, dtype: torch.dtype) -> float:
    """Measured FLOP/s of the model's MLP matmul in ``dtype`` (the profile's measurement, for a dtype it lacks)."""
    gflops = matmul_gflops(model.device, dtype, roof_shape(model, model.device))
    return gflops * 1e9 if gflops else float("nan")


@torch.inference_mode()
def kernel_seconds(
    model, shapes: Sequence[tuple[int, int]], past_length: int = 0, scored: int = 1, masked: bool = False
) -> float:
    """Seconds the matmuls and the attention kernel alone would take for forward passes of these (rows, width) shapes.

    An estimate of the least time any implementation running these shapes on these kernels needs: per distinct
    shape, one decoder layer's linear layers and its attention call (SDPA over ``past_length`` cached keys plus the
    row's own, padding and all, with the key/value heads the model's attention gives it), each timed alone (the best of
    up to five runs, after a warm-up, so with warm caches) and counted once per layer and pass, plus the output
    layer at ``scored`` positions per row. Whatever a pipeline spends beyond this goes to norms, rotary embeddings,
    activations,
    residual adds, cache copies and Python. ``masked``: a 4D mask even for one unpadded row (tree-shaped label
    continuations). NaN for a model whose layers hold no ``nn.Linear`` (nothing to time); every layer is assumed
    to be shaped like the first.
    """

    config, device, dtype = model.config, model.device, model.dtype
    heads, kv_heads = (
        config.num_attention_heads,
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
    )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = getattr(model.get_decoder(), "layers", None)
    weights = [m.weight for m in layers[0].modules() if isinstance(m, torch.nn.Linear)] if layers else []
    if not weights:
        return float("nan")
    output = model.get_output_embeddings().weight
    # sdpa_gqa reads the shared key/value heads; transformers' sdpa copies them per query head first.
    gqa = config._attn_implementation == GQA_ATTENTION and heads != kv_heads
    total = 0.0
    for (rows, width), count in collections.Counter(shapes).items():
        tokens = rows * width
        inputs = {k: torch.randn(tokens, k, device=device, dtype=dtype) for k in {w.shape[1] for w in weights}}
        linear = _time_call(
            lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights], device, 0.05, 5
        )
        query = torch.randn(rows, heads, width, head_dim, device=device, dtype=dtype)
        keys = torch.randn(rows, kv_heads if gqa else heads, past_length + width, head_dim, device=device, dtype=dtype)
        # One unpadded row with nothing cached runs causal without a mask; anything else needs one.
        mask = (
            None
            if rows == 1 and past_length == 0 and not masked
            else torch.ones(rows, 1, width, past_length + width, dtype=torch.bool, device=device).tril(past_length)
        )
        attend = _time_call(
            lambda: torch.nn.functional.scaled_dot_product_attention(
                query, keys, keys, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
            ),
            device,
            0.05,
            5,
        )
        hidden = torch.randn(rows * scored, config.hidden_size, device=device, dtype=dtype)
        logits = _time_call(lambda: torch.nn.functional.linear(hidden, output), device, 0.05, 5)
        total += count * (config.num_hidden_layers * (linear + attend) + logits)
    return total


def _row_kernel_seconds(model, run: LabelScores, scorer: LabelScorer) -> float:
    """``kernel_seconds`` of the forward passes a ``score_batched`` run made (its ``info["forward_passes"]``)."""
    by_past = collections.defaultdict(list)
    for rows, width, past in run.info["forward_passes"]:
        by_past[past].append((rows, width))
    return sum(
        kernel_seconds(model, shapes, past, 1 + len(scorer.tail), masked=scorer.is_tree)
        for past, shapes in by_past.items()
    )


def roof_table(
    model, scorer, rows: Mapping, lengths: Sequence[int], prefix_length: int, profile
) -> tuple[dict, tuple[float, float] | None]:
    """How much of the machine each timed row used (the module docstring): per key of ``rows`` (``helpers.bench.Row``,
    timed on its sample), ``useful_gflops``, ``roof_gflops``, ``roof_fraction`` and ``kernel_ceiling``; and (the
    profile's roof, the raised one) in GFLOP/s where a row's kernels beat the profile's roof, else None.
    ``lengths``: every prompt's tokens, of which ``prefix_length`` are cached. Notebook 04, Going deeper."""
    useful = {
        key: useful_flops(model, [lengths[i] - prefix_length for i in row.sample], prefix_length, scorer)
        for key, row in rows.items()
    }
    kernels = {key: _row_kernel_seconds(model, row.scores, scorer) for key, row in rows.items()}
    dtype = str(model.dtype).removeprefix("torch.")
    measured = profile.matmul_gflops.get(dtype)
    roof = measured * 1e9 if measured else matmul_roof(model, model.dtype)
    raised = None
    fastest = max((useful[key] / kernels[key] for key in rows if kernels[key] > 0), default=0.0)
    if fastest > roof:  # the kernels beat the profile's roof: an upper bound cannot be below what was measured
        raised, roof = (roof / 1e9, fastest / 1e9), fastest
    table = {}
    for key, row in rows.items():
        per_s = useful[key] / statistics.median(row.seconds)
        table[key] = {
            "useful_gflops": per_s / 1e9,
            "roof_gflops": roof / 1e9,
            "roof_fraction": per_s / roof,
            "kernel_ceiling": useful[key] / kernels[key] / roof,
        }
    return table, raised
