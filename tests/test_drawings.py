"""The mechanism drawings (helpers.drawings): each is drawn from the tensors it is given, and its title says what
they hold; the notebooks build those tensors from a real model."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from helpers.data import build_prompt, encode_prompt
from helpers.drawings import plot_generate_vs_score, plot_kv_cache
from helpers.generation import generate_answer, generation_steps
from helpers.scoring import LabelScorer


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
    assert "took 2 forward passes and returned text to parse ('billing')" in title and "scoring took 1" in title
    left = fig.axes[0]
    assert left.get_xscale() == "linear" and left.get_xlim()[0] == 0, "bar lengths read as token counts"
    assert [bar.get_width() for bar in left.patches] == [120, 1, 120]
    with pytest.raises(ValueError, match="at least one generation step"):
        plot_generate_vs_score(steps.iloc[:0], {"a": 1.0}, "caption", path=tmp_path / "e.png")


def test_tree_mask_hides_label_branches_from_each_other(tiny_qwen, tmp_path):
    _, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, ["billing", "refund request", "password reset"])
    assert scorer.is_tree, "two labels of several words: a tree"
    row = encode_prompt(tokenizer, build_prompt(tokenizer, "Please refund me", scorer.labels))
    _, mask, _ = scorer.batch_inputs([row], pad_id=0)
    seen = scorer.visible_keys(mask)[0]
    n, branch = len(row), scorer.tail_label
    tail = seen[n:, n:]
    assert torch.equal(tail, tail & (branch[:, None] == branch[None, :])), "a branch sees another branch"
    assert seen[n:, :n].all(), "every label token sees the whole prompt"


def test_kv_cache_drawing_shows_positions_layers_and_bytes_from_the_cache_itself(tmp_path):
    from transformers import DynamicCache

    def cache(positions, layers=3, heads=2, dims=4096):
        held = DynamicCache()
        for layer in range(layers):
            held.update(torch.ones(1, heads, positions, dims), torch.ones(1, heads, positions, dims), layer)
        return held

    cropped = cache(9)
    cropped.crop(-3)  # a view of the first 6 positions: the storage still holds 9
    snapshots = [
        ("the prefix", cache(6), ["reused"] * 6),
        ("+ ticket", cache(9), ["reused"] * 6 + ["appended"] * 3),
        ("crop", cropped, ["reused"] * 6 + ["dropped"] * 3),
    ]
    fig, path = plot_kv_cache(snapshots, "caption", path=tmp_path / "kv.png")
    plt.close(fig)
    ax = fig.axes[0]
    title = ax.get_title().replace("\n", " ")
    assert path.stat().st_size > 0 and "the 6-token prefix once, 3 layers deep" in title, title
    texts = [text.get_text() for text in ax.texts]
    per_position = 2 * 3 * 2 * 4096 * 4  # keys and values x layers x heads x dims x 4 bytes
    assert f"9 positions x 3 layers: {9 * per_position / 2**20:.1f} MiB" in texts, texts
    mib = per_position / 2**20
    crop = f"6 positions x 3 layers: {6 * mib:.1f} MiB\n(its storage still {9 * mib:.1f} MiB)"
    assert crop in texts and sum("storage" in text for text in texts) == 1, texts
    assert "2 heads x 4096 dims" in ax.get_xlabel(), ax.get_xlabel()
    with pytest.raises(ValueError, match="holds 6 positions but kinds name 5"):
        plot_kv_cache([("bad", cache(6), ["reused"] * 5)], "caption", path=tmp_path / "bad.png")
