import pytest
import torch

from helpers.batching import Batching, score_batched
from helpers.checks import assert_agrees, float_tolerance
from helpers.data import LABEL_DESCRIPTIONS, LABELS, build_prompt
from helpers.prefix_cache import PrefixCache, PromptSplitError, UncleanSplitError, find_prefix_text, split_is_clean
from helpers.scoring import LabelScorer, score_one_by_one

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
    assert_agrees(reference, cached, atol=float_tolerance(reference))
    assert cached.info["prefix_tokens"] == cache.length


def test_every_call_gets_its_own_cache_holding_the_prefix_alone(tiny_llama):
    model, tokenizer, _ = tiny_llama
    cache = PrefixCache.for_prompts(model, tokenizer)
    first = cache.cache_for_batch(1)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]), cache=first, use_cache=True, logits_to_keep=1)
    second = cache.cache_for_batch(1)
    assert second is not first, "a shared cache would carry one ticket's tokens (or a failure) into the next"
    assert first.get_seq_length() == cache.length + 3 and second.get_seq_length() == cache.length
    wide = cache.cache_for_batch(3)
    assert wide.layers[0].keys.shape[0] == 3 and wide.get_seq_length() == cache.length


@pytest.mark.parametrize("fail_on_call", [1, 2], ids=["first_ticket", "second_ticket"])
def test_an_interrupted_forward_changes_no_later_result(tiny_llama, tickets, fail_on_call):
    """Ctrl-C (or out of memory) halfway through the layers must not leave a longer or wider cache behind."""
    model, tokenizer, _ = tiny_llama
    labels = ["bug report", "refund request", "billing question about refunds"]  # a tree of label continuations
    scorer = LabelScorer(tokenizer, labels)
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"][:4]]
    cache = PrefixCache.for_prompts(model, tokenizer, labels=labels)
    before = score_batched(model, tokenizer, scorer, prompts, "loop", prefix=cache, progress=False)
    calls = []

    def interrupt(module, args, output):
        calls.append(1)
        if len(calls) == fail_on_call:
            raise KeyboardInterrupt

    layers = model.model.layers
    handle = layers[len(layers) // 2].register_forward_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            score_batched(model, tokenizer, scorer, prompts, "loop", prefix=cache, progress=False)
    finally:
        handle.remove()
    after = score_batched(model, tokenizer, scorer, prompts, "loop", prefix=cache, progress=False)
    # The same calls on the same cache run the same kernels in the same order: equal bit for bit.
    assert torch.equal(before.log_scores, after.log_scores), "the interrupted call changed later results"


def test_a_prompt_that_is_not_token_clean_runs_with_its_full_prompt(any_model):
    model, tokenizer, _ = any_model
    # A prefix ending in " The" fits "The app ..." but not "Theory ...", where " Theory" is one token.
    texts = [
        "The app crashes when I upload a photo",
        "Theory aside, my bill is wrong",
        "The email on my profile is old",
    ]
    prompts = [build_prompt(tokenizer, text) for text in texts]
    cache = PrefixCache(model, tokenizer, find_prefix_text(tokenizer) + " The")
    assert [split_is_clean(tokenizer, cache.text, p) for p in prompts] == [True, False, True]
    scorer = LabelScorer(tokenizer, LABELS)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    for strategy in ("loop", "sorted"):
        result = score_batched(model, tokenizer, scorer, prompts, strategy, batch_size=2, prefix=cache, progress=False)
        assert result.info["full_prompt_items"] == [1]
        assert_agrees(reference, result, atol=float_tolerance(reference))
    with pytest.raises(UncleanSplitError, match="prompt #1 is not token-clean"):
        score_batched(
            model, tokenizer, scorer, prompts, Batching("loop", unclean="raise"), prefix=cache, progress=False
        )


def test_prefix_tensors_survive_any_number_of_uses(tiny_llama, tickets):
    model, tokenizer, _ = tiny_llama
    labels = ["bug report", "refund request", "technical"]
    cache = PrefixCache.for_prompts(model, tokenizer, labels=labels)
    before = [(k.clone(), v.clone()) for k, v in cache.layers]
    scorer = LabelScorer(tokenizer, labels)
    prompts = [build_prompt(tokenizer, text, labels) for text in tickets["text"][:8]]
    for strategy, batch_size in (("loop", 1), ("sorted", 4)):
        score_batched(model, tokenizer, scorer, prompts, strategy, batch_size=batch_size, prefix=cache, progress=False)
    assert all(torch.equal(k, bk) and torch.equal(v, bv) for (k, v), (bk, bv) in zip(cache.layers, before))


def test_every_prompt_is_tokenized_once_in_one_call(tiny_llama, tickets):
    """The split cuts the whole prompt's ids; tokenizing prefix and suffix text again is not needed."""
    model, tokenizer, _ = tiny_llama
    cache = PrefixCache.for_prompts(model, tokenizer)
    prompts = [build_prompt(tokenizer, text) for text in tickets["text"][:6]]
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text, **kwargs):
            calls.append(len(text) if isinstance(text, list) else 1)
            return tokenizer(text, **kwargs)

    scorer = LabelScorer(tokenizer, LABELS)
    result = score_batched(model, Counting(), scorer, prompts, "sorted", batch_size=3, prefix=cache, progress=False)
    assert calls == [len(prompts)], "one tokenizer call holding every prompt"
    assert 0 < result.info["tokenize_seconds"] < result.info["seconds"]
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert_agrees(reference, result, atol=float_tolerance(reference))
