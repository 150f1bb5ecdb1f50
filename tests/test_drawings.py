"""The mechanism drawings (helpers.drawings): each is drawn from the tensors it is given, and its title says what
they hold; the notebooks build those tensors from a real model."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from helpers.data import build_prompt, encode_prompt
from helpers.drawings import plot_generate_vs_score, plot_kv_cache
from helpers.generation import generate_answer, generation_steps
from helpers.scoring import LabelScorer, batch_inputs, visible_keys


def suptitle(fig) -> str:
    return " ".join(fig._suptitle.get_text().split())


def test_generation_steps_are_the_passes_generate_answer_makes(tiny_qwen):
    model, tokenizer, _ = tiny_qwen
    prompt = build_prompt(tokenizer, "My invoice is wrong")
    steps = generation_steps(model, tokenizer, prompt, max_new_tokens=4)
    assert tokenizer.decode(steps["token_id"].tolist(), skip_special_tokens=True) == generate_answer(
        model, tokenizer, prompt, max_new_tokens=4
    )
    # The prompt once, then one token per decode step; greedy: every chosen token was the most likely one.
    assert steps["input_tokens"].tolist() == [len(encode_prompt(tokenizer, prompt))] + [1] * (len(steps) - 1)
    assert ((steps["probability"] > 0) & (steps["probability"] <= 1)).all() and 1 <= len(steps) <= 4


def test_generate_vs_score_counts_generations_passes_against_one(tmp_path):
    steps = pd.DataFrame(
        {
            "pass": [1, 2],
            "input_tokens": [120, 1],
            "token_id": [5, 6],
            "token": ["b", "illing"],
            "probability": [0.6, 0.9],
        }
    )
    fig, path = plot_generate_vs_score(
        steps, {"billing": 0.7, "technical": 0.2, "account": 0.1}, "caption", path=tmp_path / "g.png"
    )
    plt.close(fig)
    assert path.stat().st_size > 0
    title = suptitle(fig)
    assert (
        "'billing' took 2 forward passes" in title and "takes 1 and gives 3 probabilities (top: billing, 70%)" in title
    )
    with pytest.raises(ValueError, match="at least one generation step"):
        plot_generate_vs_score(steps.iloc[:0], {"a": 1.0}, "caption", path=tmp_path / "e.png")


def test_tree_mask_hides_label_branches_from_each_other(tiny_qwen, tmp_path):
    _, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, ["billing", "refund request", "password reset"])
    assert scorer.is_tree, "two labels of several words: a tree"
    row = encode_prompt(tokenizer, build_prompt(tokenizer, "Please refund me", scorer.labels))
    _, mask, _ = batch_inputs(scorer, [row], pad_id=0)
    seen = visible_keys(mask, scorer)[0]
    n, branch = len(row), scorer.tail_label
    tail = seen[n:, n:]
    assert torch.equal(tail, tail & (branch[:, None] == branch[None, :])), "a branch sees another branch"
    assert seen[n:, :n].all(), "every label token sees the whole prompt"


def test_kv_cache_drawing_counts_what_is_reused_and_appended(tmp_path):
    prefix = np.random.default_rng(0).normal(size=(6, 4))
    after = np.vstack([prefix, np.ones((3, 4))])
    snapshots = [
        ("the prefix", prefix, ["reused"] * 6),
        ("+ ticket", after, ["reused"] * 6 + ["appended"] * 3),
        ("crop", np.vstack([prefix, np.full((3, 4), np.nan)]), ["reused"] * 6 + ["dropped"] * 3),
    ]
    fig, path = plot_kv_cache(snapshots, "caption", path=tmp_path / "kv.png")
    plt.close(fig)
    assert path.stat().st_size > 0 and "the 6-token prefix" in suptitle(fig)
    assert "6 reused, 3 appended" in fig.axes[1].get_title().replace("\n", " ")
    with pytest.raises(ValueError, match="positions but"):
        plot_kv_cache([("bad", prefix, ["reused"])], "caption", path=tmp_path / "bad.png")
