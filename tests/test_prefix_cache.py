import pytest

from helpers.batching import score_batched
from helpers.data import LABEL_DESCRIPTIONS, LABELS, build_prompt
from helpers.prefix_cache import PrefixCache, PromptSplitError, find_prefix_text, split_is_clean
from helpers.scoring import LabelScorer, assert_agrees, score_one_by_one

from .conftest import prompts_for


def test_found_prefix_is_token_clean_for_every_ticket(embedded, tickets, few_shot):
    _, tokenizer, _ = embedded
    prefix = find_prefix_text(tokenizer, labels=LABELS, examples=few_shot)
    assert prefix.endswith("Ticket:"), "the trailing space belongs to the ticket's first word"
    for prompt in prompts_for(tokenizer, tickets["text"], few_shot):
        assert split_is_clean(tokenizer, prefix, prompt)


def test_a_split_before_a_space_is_not_token_clean(embedded, tickets):
    _, tokenizer, _ = embedded
    prompt = prompts_for(tokenizer, tickets["text"][:1])[0]
    assert not split_is_clean(tokenizer, find_prefix_text(tokenizer) + " ", prompt)


def test_cache_refuses_unclean_splits_and_foreign_prompts(embedded, tickets):
    model, tokenizer, _ = embedded
    unclean = PrefixCache(model, tokenizer, find_prefix_text(tokenizer) + " ")
    prompts = prompts_for(tokenizer, tickets["text"][:2])
    with pytest.raises(PromptSplitError, match="prompt #1 is not token-clean"):
        unclean.split(prompts[1], 1)
    cache = PrefixCache.for_prompts(model, tokenizer)
    other = build_prompt(tokenizer, tickets["text"][0], LABELS, descriptions=LABEL_DESCRIPTIONS)
    with pytest.raises(PromptSplitError, match="prompt #7 does not start with the cached prefix"):
        cache.split(other, 7)
    with pytest.raises(ValueError, match="prefix text is empty"):
        PrefixCache(model, tokenizer, "")


@pytest.mark.parametrize("examples", ["zero_shot", "few_shot"])
def test_cached_prefix_changes_no_prediction(any_model, tickets, few_shot, examples):
    model, tokenizer, _ = any_model
    shots = few_shot if examples == "few_shot" else ()
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"], shots)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=shots)
    cached = score_batched(model, tokenizer, scorer, prompts, "loop", prefix=cache, progress=False)
    assert_agrees(reference, cached, atol=1e-3)
    assert cached.info["prefix_tokens"] == cache.length
    # The working cache was cropped back after the last ticket, not left grown.
    assert cache.cache_for_batch(1).get_seq_length() == cache.length


def test_prefix_tensors_survive_any_number_of_uses(embedded, tickets):
    model, tokenizer, _ = embedded
    cache = PrefixCache.for_prompts(model, tokenizer)
    before = [k.clone() for k, _ in cache.layers]
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = prompts_for(tokenizer, tickets["text"][:8])
    score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, prefix=cache, progress=False)
    assert all((k == b).all() for (k, _), b in zip(cache.layers, before))
