import pytest
import torch

from helpers.attention import NAME, use_gqa_attention
from helpers.batching import score_batched
from helpers.checks import assert_agrees, float_tolerance
from helpers.data import LABELS, build_prompt
from helpers.models import load_model
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer


def test_grouped_query_models_on_cpu_read_shared_key_value_heads(embedded):
    model, _, info = embedded
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert info.attention == model.config._attn_implementation == NAME
    assert not use_gqa_attention(model), "already switched: nothing to do"


@pytest.mark.parametrize("labels", [LABELS, ["bug report", "refund request", "technical"]], ids=["labels", "tree"])
def test_it_gives_what_transformers_sdpa_gives(any_model, tickets, labels):
    """Padded batches on top of the prefix cache, and label branches under a 4D mask: both masks go through it."""
    model, tokenizer, info = any_model
    assert info.attention == NAME
    plain, _, plain_info = load_model(info.name, dtype="float32", device="cpu", attention="sdpa", verbose=False)
    assert plain_info.attention == "sdpa"
    scorer = LabelScorer(tokenizer, labels)
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"]]
    results = []
    for candidate in (plain, model):
        cache = PrefixCache.for_prompts(candidate, tokenizer, labels=labels)
        results.append(
            score_batched(candidate, tokenizer, scorer, prompts, "sorted", batch_size=4, prefix=cache, progress=False)
        )
    assert_agrees(results[0], results[1], atol=float_tolerance(results[0]))
    assert not torch.isnan(results[1].log_scores).any()


def test_bfloat16_attention_takes_the_math_kernel_where_aten_is_held_below_avx512(monkeypatch):
    """``ATEN_CPU_CAPABILITY=default`` on an AVX-512 CPU: PyTorch's bfloat16 flash kernel fails on long sequences
    there, so bfloat16 queries (also a float32 one under bfloat16 autocast) take the math kernel; float32 keeps its."""
    import contextlib

    from helpers import attention

    bf16, fp32 = torch.zeros(1, 2, 3, 4, dtype=torch.bfloat16), torch.zeros(1, 2, 3, 4)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not isinstance(attention._kernel_for(bf16), contextlib.nullcontext)
    assert isinstance(attention._kernel_for(fp32), contextlib.nullcontext)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not isinstance(attention._kernel_for(fp32), contextlib.nullcontext)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert isinstance(attention._kernel_for(bf16), contextlib.nullcontext)
