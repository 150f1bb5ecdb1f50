"""Labels as whole answers (issue 22): a label that extends another (``account`` / ``account change``) can win.

Scored as answer prefixes, the longer label's log-prob is the shorter's plus one more (negative) term, so it never
wins; scored with the chat template's end-of-answer marker after every label, it can. The marker comes from the
template; a template without one refuses such a label set in one line. Every batched and cached path agrees with
the one-at-a-time reference on these sets in test_label_sets.py.
"""

import re

import pandas as pd
import pytest

from helpers.checks import mcnemar_exact
from helpers.data import build_prompt
from helpers.scoring import LabelScorer, end_of_answer_ids, end_of_answer_text, extending_pairs, score_one_by_one

EXTENDING = ["account", "account change", "billing"]
# The tickets of the issue: three ask to change something on the account.
CHANGE_TICKETS = [
    "Please change the email address on my account",
    "I want to change my account password and username",
    "I was charged twice",
    "How do I change my account settings?",
]
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture()
def fresh_tokenizer():
    """A tokenizer of its own (the tests change its template), the embedded model's."""
    from helpers.models import load_tokenizer

    return load_tokenizer("embedded")


def test_the_end_marker_is_what_the_template_puts_after_an_answer(fresh_tokenizer):
    tokenizer = fresh_tokenizer
    assert end_of_answer_ids(tokenizer) == tokenizer.convert_tokens_to_ids(["<|im_end|>"])
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor %}"
    assert end_of_answer_ids(tokenizer) == tokenizer.convert_tokens_to_ids(["<|endoftext|>"])
    # Llama 2 writes a space before its marker: scored together with the label, as the template renders it.
    tokenizer.chat_template = "{% for m in messages %} {{ m['content'] }} <|endoftext|>{% endfor %}"
    assert end_of_answer_text(tokenizer) == " <|endoftext|>"
    scorer = LabelScorer(tokenizer, EXTENDING)
    assert scorer.token_ids[1] == tokenizer("account change <|endoftext|>", add_special_tokens=False)["input_ids"]
    tokenizer.chat_template = PLAIN_TEMPLATE  # a newline after the answer is no marker: answers may hold newlines
    assert end_of_answer_ids(tokenizer) is None
    tokenizer.chat_template = None
    assert end_of_answer_ids(tokenizer) is None


def test_whole_answers_are_chosen_when_a_label_extends_another_and_on_request(embedded):
    _, tokenizer, _ = embedded
    end = end_of_answer_ids(tokenizer)
    needed = LabelScorer(tokenizer, EXTENDING)
    assert needed.complete and needed.overlaps == [("account", "account change")]
    assert all(ids == label + end for ids, label in zip(needed.token_ids, needed.label_ids))
    assert needed.method == "sequence" and needed.is_tree
    plain = LabelScorer(tokenizer, ["billing", "technical", "account"])
    assert not plain.complete and plain.token_ids == plain.label_ids and plain.overlaps == []
    asked = LabelScorer(tokenizer, ["billing", "technical", "account"], complete=True)
    assert asked.complete and all(ids[-len(end) :] == end for ids in asked.token_ids)
    assert "whole answers" in asked.describe()
    with pytest.raises(ValueError, match="use method='sequence'"):
        LabelScorer(tokenizer, EXTENDING, method="first_token")
    with pytest.raises(ValueError, match="complete must be"):
        LabelScorer(tokenizer, EXTENDING, complete="yes")


def test_as_answer_prefixes_the_longer_label_never_wins_and_as_whole_answers_it_can(embedded, tickets):
    model, tokenizer, _ = embedded
    texts = [*CHANGE_TICKETS, *tickets["text"][:3]]
    prompts = [build_prompt(tokenizer, text, EXTENDING) for text in texts]
    prefixes = score_one_by_one(
        model, tokenizer, LabelScorer(tokenizer, EXTENDING, complete=False), prompts, progress=False
    )
    # log p("account change") = log p("account") + log p(" change" | ...): never above, on any ticket.
    assert (prefixes.log_scores[:, 1] < prefixes.log_scores[:, 0]).all()
    assert "account change" not in prefixes.predictions
    whole = score_one_by_one(model, tokenizer, LabelScorer(tokenizer, EXTENDING), prompts, progress=False)
    assert "account change" in whole.predictions[: len(CHANGE_TICKETS)], whole.log_scores[: len(CHANGE_TICKETS)]
    # The single-token label's whole-answer score is its prefix score plus log p(end | label): lower, finite.
    assert (whole.log_scores[:, 0] <= prefixes.log_scores[:, 0]).all() and whole.log_scores.isfinite().all()


def test_a_template_without_an_end_marker_refuses_labels_only_it_could_tell_apart(fresh_tokenizer):
    tokenizer = fresh_tokenizer
    tokenizer.chat_template = PLAIN_TEMPLATE
    with pytest.raises(
        ValueError, match=re.escape("label 'account change' starts with all of 'account''s tokens")
    ) as error:
        LabelScorer(tokenizer, EXTENDING)
    assert "\n" not in str(error.value) and "marks no end of an answer" in str(error.value)
    with pytest.raises(ValueError, match="whole answers need an end-of-answer marker"):
        LabelScorer(tokenizer, ["billing", "technical"], complete=True)
    assert not LabelScorer(tokenizer, EXTENDING, complete=False).complete, "answer prefixes stay possible on request"
    assert not LabelScorer(tokenizer, ["billing", "technical"]).complete


def test_labels_with_the_same_tokens_are_refused():
    class Lowercase:  # a tokenizer that cannot tell case apart, and has no chat template
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text.lower()]}

    with pytest.raises(ValueError, match="labels 'Account' and 'account' are the same tokens"):
        LabelScorer(Lowercase(), ["Account", "account"])


def test_extending_pairs_and_the_lessons_pair_with_the_embedded_tokenizer(embedded):
    _, tokenizer, _ = embedded
    assert extending_pairs([[1], [1, 2], [1, 2, 3], [2]], list("abcd")) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert extending_pairs([[1, 2], [1, 3]], ["a", "b"]) == []
    # Notebook 01's Going deeper relies on this pair extending with the tokenizer it runs.
    assert LabelScorer(tokenizer, ["account", "account change", "billing"]).overlaps == [("account", "account change")]
    assert LabelScorer(tokenizer, ["technical", "technically"], complete=False).overlaps == []  # no whole-token prefix


def test_mcnemar_exact_is_the_two_sided_binomial_test_of_the_discordant_items():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 2**5)
    assert mcnemar_exact(10, 3) == mcnemar_exact(3, 10) == pytest.approx(2 * (1 + 13 + 78 + 286) / 2**13)
    assert mcnemar_exact(7, 7) == 1.0
    with pytest.raises(ValueError, match="only_first=-1"):
        mcnemar_exact(-1, 2)


def test_the_issue_command_can_return_the_longer_label(tmp_path, capsys):
    from helpers.__main__ import main

    source, out = tmp_path / "ac.csv", tmp_path / "ac.out.csv"
    source.write_text("text\n" + "\n".join(CHANGE_TICKETS) + "\n")
    code = main(
        [
            "classify",
            str(source),
            "--labels",
            ",".join(EXTENDING),
            "--output",
            str(out),
            "--model",
            "embedded",
            "--verify",
            "4",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "scoring whole answers" in err and "verified 4 random rows" in err
    assert "account change" in set(pd.read_csv(out)["predicted_label"])


def test_classify_refuses_such_labels_before_the_model_loads(tmp_path, monkeypatch, fresh_tokenizer):
    from helpers import models
    from helpers.classify import classify_file
    from helpers.tables import InputError

    fresh_tokenizer.chat_template = PLAIN_TEMPLATE
    monkeypatch.setattr(models, "load_tokenizer", lambda name=None: fresh_tokenizer)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    (tmp_path / "in.csv").write_text("text\nchange my email\n")
    with pytest.raises(InputError, match=re.escape("--labels: label 'account change' starts with all of")) as error:
        classify_file(tmp_path / "in.csv", "account,account change,billing", tmp_path / "out.csv")
    assert "\n" not in str(error.value) and not (tmp_path / "out.csv").exists()


def test_a_whole_answer_is_the_templates_own_rendering_of_that_answer(embedded):
    """What is scored (prompt, then label + marker) is exactly how the chat template writes that answer."""
    from helpers.data import build_messages, encode_prompt

    _, tokenizer, _ = embedded
    scorer = LabelScorer(tokenizer, EXTENDING)
    prompt = encode_prompt(tokenizer, build_prompt(tokenizer, CHANGE_TICKETS[0], EXTENDING))
    for label, ids in zip(EXTENDING, scorer.token_ids):
        messages = [*build_messages(CHANGE_TICKETS[0], EXTENDING), {"role": "assistant", "content": label}]
        rendered = encode_prompt(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False))
        assert rendered[: len(prompt) + len(ids)] == prompt + ids, label
