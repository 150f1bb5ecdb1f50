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
