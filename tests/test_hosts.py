"""Where readers really run the package: without the notebook tools, on half precision that overflows, out of
device memory, and on a model whose tokenizer has no chat template."""

import copy
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from helpers import models
from helpers.__main__ import main
from helpers.batching import Batching, score_batched
from helpers.checks import assert_agrees
from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets, uses_chat_template
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, score_one_by_one


def test_the_commands_run_without_the_notebook_tools(tmp_path):
    """A GPU box with only the package installed: check, classify and bench work without nbformat or papermill."""
    source = tmp_path / "in.csv"
    make_tickets(6, seed=1, style="varied")[["text"]].to_csv(source, index=False)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["nbformat"] = None  # unimportable, as where it is not installed
        sys.modules["papermill"] = None
        from helpers.__main__ import main
        codes = [main(["check"]),
                 main(["classify", {str(source)!r}, "--labels", "billing,technical,account", "--output",
                       {str(tmp_path / "out.csv")!r}, "--model", "twin:tiny-qwen2", "--quiet"]),
                 main(["bench", "--model", "twin:tiny-qwen2", "--every", "30",
                 "--shots", "1", "--dtypes", "float32",
                       "--batch-sizes", "2", "--strategies", "loop,sorted", "--repeats", "2", "--quiet"])]
        print("CODES", codes)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    codes = eval(done.stdout.split("CODES", 1)[1])
    assert codes[0] in (0, 1) and codes[1:] == [0, 0], (codes, done.stderr[-2000:])
    assert len(pd.read_csv(tmp_path / "out.csv")) == 6


# --- half precision that overflows --------------------------------------------------------------------------


def test_a_probe_forward_finds_non_finite_logits(tiny_qwen):
    model, _, _ = tiny_qwen
    assert models.finite_logits(model)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("inf"))
    assert not models.finite_logits(broken)


def test_a_default_half_dtype_that_overflows_falls_back_to_float32_and_a_named_one_refuses(
    tiny_qwen, monkeypatch, capsys
):
    model, _, _ = tiny_qwen
    half = copy.deepcopy(model).to(torch.float16)
    monkeypatch.setattr(models, "finite_logits", lambda model: False)
    settled, dtype = models.settle_dtype(half, torch.float16, None, "twin:tiny-qwen2")
    assert dtype == torch.float32 and settled.dtype == torch.float32
    assert (
        "float16 gave non-finite logits in a probe forward (half-precision overflow): using float32"
        in capsys.readouterr().out
    )
    with pytest.raises(models.HalfPrecisionError, match="non-finite logits in float16 .*use float32"):
        models.settle_dtype(copy.deepcopy(model).to(torch.float16), torch.float16, "float16", "twin:tiny-qwen2")
    monkeypatch.setattr(models, "finite_logits", lambda model: True)
    assert models.settle_dtype(half, torch.float16, None, "x")[1] == torch.float16, "a finite one is kept"


@pytest.fixture(scope="module")
def base_model(tiny_llama):
    """A twin whose tokenizer has no chat template, as a base model's (or a classifier saved without one)."""
    model, tokenizer, info = tiny_llama
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return model, plain, info


def test_without_a_chat_template_prompts_are_plain_text_and_labels_follow_category(base_model):
    _, tokenizer, _ = base_model
    assert not uses_chat_template(tokenizer)
    prompt = build_prompt(tokenizer, "My card was charged twice.", LABELS, few_shot_examples(2))
    assert prompt.endswith("Ticket: My card was charged twice.\nCategory:") and "assistant" not in prompt
    assert prompt.startswith(tokenizer.bos_token + "You classify"), "the model's BOS token, then the instruction"
    assert "Category: billing\n\n" in prompt or "Category: technical\n\n" in prompt, prompt
    scorer = LabelScorer(tokenizer, LABELS)
    for label, ids in zip(LABELS, scorer.label_ids):
        assert tokenizer.decode(ids) == " " + label, "the label as the whole text splits it, after the space"


def test_plain_prompts_batch_and_cache_with_the_loops_results(base_model):
    model, tokenizer, _ = base_model
    examples = few_shot_examples(3)
    prompts = [
        build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(10, seed=4, style="varied")["text"]
    ]
    scorer = LabelScorer(tokenizer, LABELS)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    for strategy, cache in (("sorted", prefix), ("arbitrary", None), ("token_budget", prefix)):
        result = score_batched(
            model, tokenizer, scorer, prompts, Batching(strategy, 4, 400), prefix=cache, progress=False
        )
        assert_agrees(reference, result)  # identical labels, log-probs within 1e-3 (float32)


def test_classify_on_a_model_without_a_chat_template_says_so_and_verifies(base_model, tmp_path, monkeypatch, capsys):
    model, tokenizer, info = base_model
    monkeypatch.setattr(models, "load_tokenizer", lambda name=None: tokenizer)
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: (model, tokenizer, info))
    source = tmp_path / "in.csv"
    make_tickets(12, seed=2, style="varied")[["text"]].to_csv(source, index=False)
    code = main(
        [
            "classify",
            str(source),
            "--labels",
            "billing,technical,account",
            "--output",
            str(tmp_path / "o.csv"),
            "--verify",
            "12",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "its tokenizer has no chat template (a base model?): plain prompts" in err, err
    assert "verified 12 random rows against the one-at-a-time reference: all agree" in err, err
