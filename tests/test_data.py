import numpy as np
import pytest

from helpers.data import (
    FEW_SHOT_EXAMPLES,
    LABELS,
    VARIED_BASES,
    build_messages,
    build_prompt,
    encode_prompt,
    few_shot_examples,
    make_tickets,
    ticket_word_counts,
)


@pytest.mark.parametrize("style", ["article", "varied"])
def test_tickets_are_deterministic_for_a_seed(style):
    first, again = make_tickets(50, seed=3, style=style), make_tickets(50, seed=3, style=style)
    assert first.equals(again), "same seed must give the same tickets"
    assert not first.equals(make_tickets(50, seed=4, style=style)), "another seed must give other tickets"


@pytest.mark.parametrize("style", ["article", "varied"])
def test_word_counts_follow_the_reference_distribution(style):
    """A lognormal around 60 words (log-spread 0.9), clipped to [12, 400]: its shape, not a copy of its formula
    (notebook 00 checks the counts against the reference's draw by hand)."""
    counts = make_tickets(600, style=style)["n_words"].to_numpy()
    assert counts.dtype.kind == "i" and counts.min() == 12 and counts.max() == 400, "clipped to [12, 400]"
    logs = np.log(counts)
    assert abs(logs.mean() - np.log(60)) < 0.1 and 0.75 < logs.std() < 0.95, (logs.mean(), logs.std())
    assert 50 <= np.median(counts) <= 70, "median near the lognormal's 60 words"


@pytest.mark.parametrize("style", ["article", "varied"])
def test_labels_are_balanced_and_rotate(style):
    tickets = make_tickets(600, style=style)
    assert tickets["label"].value_counts().to_dict() == {label: 200 for label in LABELS}
    assert list(tickets["label"][:6]) == list(LABELS) * 2, "ticket i has label i mod 3"
    assert list(tickets.columns) == ["id", "text", "label", "n_words"]


def test_article_style_uses_three_base_sentences():
    tickets = make_tickets(90, style="article")
    starts = {text.split(".")[0] for text in tickets["text"]}
    assert len(starts) == 3


def test_varied_style_has_many_distinct_tickets_per_label():
    tickets = make_tickets(600, style="varied")
    for label in LABELS:
        assert len(VARIED_BASES[label]) >= 15
        texts = tickets.loc[tickets["label"] == label, "text"]
        probes = {base: " ".join(base.split()[:6]) for base in VARIED_BASES[label]}
        used = {base for base, probe in probes.items() if texts.str.contains(probe, regex=False).any()}
        assert len(used) >= 10, f"{label}: only {len(used)} base tickets used"
        assert texts.nunique() > 150, f"{label}: tickets repeat too much"


def test_few_shot_examples_never_are_test_tickets():
    texts = set(make_tickets(600, style="varied")["text"]) | set(make_tickets(600, style="article")["text"])
    assert not texts & {text for text, _ in FEW_SHOT_EXAMPLES}
    assert [label for _, label in few_shot_examples(6)] == list(LABELS) * 2


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="style"):
        make_tickets(5, style="poetry")
    with pytest.raises(ValueError, match="n >= 1"):
        make_tickets(0)
    with pytest.raises(ValueError, match="k must be"):
        few_shot_examples(99)


def test_few_shot_examples_are_earlier_chat_turns():
    messages = build_messages("My app crashes", LABELS, few_shot_examples(2))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"] == "billing" and messages[-1]["content"].startswith("Ticket: My app crashes")


def test_article_prompt_lengths_match_the_reference(embedded):
    """FACTS.md: with the embedded tokenizer, near min 50 / median 96 / max 451 tokens."""
    _, tokenizer, _ = embedded
    lengths = [len(encode_prompt(tokenizer, build_prompt(tokenizer, t))) for t in make_tickets(600)["text"]]
    assert 45 <= min(lengths) <= 60 and 90 <= np.median(lengths) <= 106 and 440 <= max(lengths) <= 475
    assert ticket_word_counts(600).max() == 400


def test_the_keyword_rules_pick_the_label_whose_words_a_ticket_mentions_most_ties_to_the_first():
    from helpers.data import KEYWORDS, keyword_label

    assert keyword_label("Please refund the duplicate charge on my invoice") == "billing"
    assert keyword_label("The app shows an error and the page will not load") == "technical"
    assert keyword_label("I cannot login: reset the password of my account") == "account"
    assert keyword_label("Hello there") == next(iter(KEYWORDS))  # no word of any label: the first listed
    assert set(KEYWORDS) == set(LABELS)


def test_the_held_out_set_is_written_apart_from_the_generator_and_balanced():
    """At least 90 hand-written tickets, 30 or more per label, of varied length, sharing no run of five words with any
    sentence the generator, its fillers or the few-shot examples use (so no fitted head has seen its wording)."""
    import re

    from helpers import data

    held = data.held_out_tickets()
    counts = held["label"].value_counts()
    assert len(held) >= 90 and set(counts.index) == set(LABELS) and counts.min() >= 30, counts
    words = held["text"].str.split().str.len()
    assert words.min() <= 8 and words.max() >= 60, "short and long tickets"
    sources = [*(s for bases in data.VARIED_BASES.values() for s in bases), *data.ARTICLE_BASES.values()]
    sources += [data.ARTICLE_FILLER, *data.VARIED_FILLERS, *(text for text, _ in data.FEW_SHOT_EXAMPLES)]

    def runs(text):
        tokens = re.findall(r"[a-z']+", text.lower())
        return {" ".join(tokens[i : i + 5]) for i in range(len(tokens) - 4)}

    generated = set().union(*map(runs, sources))
    shared = {text: runs(text) & generated for text in held["text"] if runs(text) & generated}
    assert not shared, shared
