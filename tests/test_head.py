"""A fitted label head (helpers.head; classify --fit-head, --save-head, --head-from): it starts as the zero-shot
first-token scorer, fits labelled rows, scores alike on every path, and a head that does not fit a job is refused in one
line before the model loads."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from helpers import classify, models, resume
from helpers.__main__ import main
from helpers.batching import Batching, score_batched
from helpers.checks import float_tolerance
from helpers.data import LABELS, encode_prompt, make_tickets
from helpers.head import STRENGTHS, HeadScorer, LabelHead, answer_states, fit_head, load_head, save_head
from helpers.prefix_cache import PrefixCache, prefix_length
from helpers.prior import prior_scope
from helpers.scoring import LabelScorer, score_one_by_one
from tests.conftest import prompts_for
from tests.test_resume import ENV, KILLER, TORCHRUN, what_the_processes_said

TINY = ["--model", "twin:tiny-qwen2", "--quiet"]
LABEL_ARGS = ["--labels", ",".join(LABELS)]


def test_the_unfitted_head_is_the_first_token_scorer_over_the_labels(tiny_llama, tickets):
    """Before fitting, the head's log-probs are the labels' first-token log-probs renormalised over the labels."""
    model, tokenizer, _ = tiny_llama
    prompts = prompts_for(tokenizer, tickets["text"][:6])
    first = score_batched(
        model, tokenizer, LabelScorer(tokenizer, LABELS, method="first_token"), prompts, "loop", progress=False
    )
    head = LabelHead.from_lm_head(model, LabelScorer(tokenizer, LABELS))
    with head.installed(model):
        scores = score_batched(model, tokenizer, HeadScorer(LABELS), prompts, "loop", progress=False)
    expected = torch.log_softmax(first.log_scores, dim=-1)
    assert torch.allclose(scores.log_scores, expected, rtol=0, atol=float_tolerance(first)), "the renormalised scores"
    assert scores.predictions == first.predictions
    assert model.get_output_embeddings().weight.shape[0] > len(LABELS), "the LM head is put back"


@pytest.mark.parametrize("reads", ["answer", "mean"])
@pytest.mark.parametrize("how", ["sorted", "arbitrary", "token_budget"])
def test_a_head_gives_each_row_the_one_at_a_time_result_on_every_path(tiny_qwen, tickets, few_shot, how, reads):
    model, tokenizer, _ = tiny_qwen
    prompts = prompts_for(tokenizer, tickets["text"][:10], few_shot)
    start = LabelHead.from_lm_head(model, LabelScorer(tokenizer, LABELS))
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=few_shot)
    mean_from = prefix.length if reads == "mean" else None
    weight, bias = start.weight + 0.01 * torch.randn(start.weight.shape), torch.tensor([0.2, -0.1, 0.0])
    head = LabelHead(LABELS, weight, bias, mean_from=mean_from)
    with head.installed(model):
        reference = score_one_by_one(model, tokenizer, head.scorer(), prompts, progress=False)
        batching = Batching(how, 3, 600 if how == "token_budget" else None)
        batched = score_batched(model, tokenizer, head.scorer(), prompts, batching, prefix=prefix, progress=False)
    assert batched.predictions == reference.predictions
    assert torch.allclose(batched.log_scores, reference.log_scores, rtol=0, atol=float_tolerance(reference))


def test_a_head_on_the_mean_reads_the_mean_final_state_over_the_tickets_own_tokens(tiny_qwen, tickets, few_shot):
    """The mean state, by hand from one prompt's full forward, is ``answer_states``'s; the installed head's scores are
    the head applied to it (a linear head: the mean of its outputs is its output on the mean)."""
    model, tokenizer, _ = tiny_qwen
    prompts = prompts_for(tokenizer, tickets["text"][:4], few_shot)
    ticket = prefix_length(tokenizer, labels=LABELS, examples=few_shot)
    states = answer_states(model, tokenizer, prompts, batch_size=3, mean_from=ticket)
    for prompt, state in zip(prompts, states):
        ids = torch.tensor([encode_prompt(tokenizer, prompt)])
        with torch.no_grad():
            by_hand = model.base_model(input_ids=ids).last_hidden_state[0, ticket:].mean(0)
        assert torch.allclose(state, by_hand, atol=1e-5)
    assert not torch.allclose(states, answer_states(model, tokenizer, prompts), atol=1e-3), "not the answer position"
    start = LabelHead.from_lm_head(model, LabelScorer(tokenizer, LABELS))
    head = LabelHead(LABELS, start.weight, torch.tensor([0.3, 0.0, -0.2]), mean_from=ticket)
    with head.installed(model):
        scores = score_batched(model, tokenizer, head.scorer(), prompts, "sorted", batch_size=3, progress=False)
    expected = torch.log_softmax(head.logits(states), dim=-1)
    assert torch.allclose(scores.log_scores, expected, atol=1e-4)


def test_the_answer_state_is_what_the_lm_head_reads(tiny_qwen, tickets):
    model, tokenizer, _ = tiny_qwen
    prompts = prompts_for(tokenizer, tickets["text"][:5])
    states = answer_states(model, tokenizer, prompts, batch_size=2)
    scorer = LabelScorer(tokenizer, LABELS, method="first_token")
    logits = states @ model.get_output_embeddings().weight[scorer.first_ids].detach().float().T
    first = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    assert torch.allclose(torch.log_softmax(logits, -1), torch.log_softmax(first.log_scores, -1), atol=1e-4)


def test_fitting_learns_what_a_linear_rule_tells_apart_and_stays_near_its_start_where_told():
    """Three clusters the start cannot tell apart: fitted, the head gets its rows right; a strong pull keeps it near."""
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=generator) * 3
    targets = torch.arange(60) % 3
    states = centres[targets] + torch.randn(60, 16, generator=generator)
    start = LabelHead(LABELS, torch.zeros(3, 16) + 0.01, torch.zeros(3), torch.zeros(3, 16) + 0.01)
    gold = [LABELS[i] for i in targets]
    fitted = fit_head(start, states, gold)
    assert fitted.info["fitted_on"] == 60 and fitted.info["strength"] in STRENGTHS
    assert fitted.info["training_accuracy"] == 1.0
    held = centres[torch.arange(30) % 3] + torch.randn(30, 16, generator=generator)
    assert (fitted.logits(held).argmax(-1) == torch.arange(30) % 3).float().mean() > 0.9
    near, far = fit_head(start, states, gold, strength=100.0), fit_head(start, states, gold, strength=1e-6)
    assert (near.weight - start.weight).norm() < (far.weight - start.weight).norm()


def test_the_fit_reads_each_feature_in_units_of_its_spread_over_the_labelled_rows():
    """Rescale one feature of the states (and the start's weights on it, so the start's logits stay the same): the
    fitted head's logits stay the same too, as they do only when the fit runs on standardised states."""
    generator = torch.Generator().manual_seed(1)
    targets = torch.arange(45) % 3
    states = torch.randn(3, 8, generator=generator)[targets] + torch.randn(45, 8, generator=generator)
    rows = torch.randn(3, 8, generator=generator) * 0.1
    gold = [LABELS[i] for i in targets]
    factor = torch.ones(8)
    factor[2] = 1000.0
    plain = fit_head(LabelHead(LABELS, rows, torch.zeros(3), rows), states, gold, strength=0.1)
    scaled_rows = rows / factor
    scaled = fit_head(LabelHead(LABELS, scaled_rows, torch.zeros(3), scaled_rows), states * factor, gold, strength=0.1)
    assert torch.allclose(plain.logits(states), scaled.logits(states * factor), atol=1e-3)


@pytest.mark.parametrize(
    "gold,message",
    [
        (["billing"] * 6, "no labelled row for ['technical', 'account']"),
        (["billing", "technical", "account", "refund", "billing", "account"], "labels ['refund'] are not among"),
        (["billing", "technical", "account"], "6 hidden states but 3 labels"),
    ],
)
def test_fitting_on_rows_that_do_not_fit_the_labels_is_a_one_line_error(gold, message):
    start = LabelHead(LABELS, torch.zeros(3, 4), torch.zeros(3))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        fit_head(start, torch.zeros(6, 4), gold)


def write(path, frame):
    frame.to_csv(path, index=False)
    return path


def labelled_and_jobs(tmp_path):
    pool = make_tickets(90, seed=5, style="varied")
    labelled = write(tmp_path / "labelled.csv", pool.iloc[:30][["text", "label"]])
    first = write(tmp_path / "first.csv", pool.iloc[30:60][["text"]])
    second = write(tmp_path / "second.csv", pool.iloc[60:][["text"]])
    return labelled, first, second


def run(args, capsys):
    code = main(["classify", *args])
    return code, capsys.readouterr().err


def test_a_saved_head_gives_a_later_job_the_labels_the_fitted_run_gives(tmp_path, capsys):
    labelled, first, second = labelled_and_jobs(tmp_path)
    head_file = tmp_path / "head.json"
    fit = ["--fit-head", str(labelled), "--batch-size", "4", *TINY]
    code, err = run([str(first), *LABEL_ARGS, "--output", str(tmp_path / "a.csv"), *fit, "--save-head", str(head_file)],
                    capsys)  # fmt: skip
    assert code == 0, err
    assert "fitted on 30 rows of" in err and f"head saved to {head_file}" in err, err
    assert "prior (" not in err, "a head's bias is its prior: no other is divided out by default"
    code, err = run([str(second), *LABEL_ARGS, "--output", str(tmp_path / "fitted.csv"), *fit], capsys)
    assert code == 0, err
    code, err = run([str(second), *LABEL_ARGS, "--output", str(tmp_path / "saved.csv"), "--head-from",
                     str(head_file), "--batch-size", "4", *TINY], capsys)  # fmt: skip
    assert code == 0, err
    assert "a label head fitted" not in err, "a saved head is read, not fitted again"
    fitted, saved = pd.read_csv(tmp_path / "fitted.csv"), pd.read_csv(tmp_path / "saved.csv")
    assert list(fitted["predicted_label"]) == list(saved["predicted_label"])
    assert (fitted["confidence"] - saved["confidence"]).abs().max() < 1e-5
    head = load_head(head_file, json.loads(head_file.read_text())["valid_for"])
    assert head.labels == list(LABELS) and head.weight.shape[0] == 3 and head.info["fitted_on"] == 30
    tokenizer = models.load_model("twin:tiny-qwen2", verbose=False)[1]
    assert head.mean_from == prefix_length(tokenizer, labels=LABELS), "it reads the mean over each row's own tokens"


def same_output(one, two) -> None:
    a, b = pd.read_csv(one), pd.read_csv(two)
    assert list(a.columns) == list(b.columns) and list(a["predicted_label"]) == list(b["predicted_label"])
    shares = [f"p_{label}" for label in LABELS]
    assert (a[shares] - b[shares]).abs().max().max() < 1e-4


def head_cases(tmp_path):
    """(options, message) pairs: each head file or option a job cannot use."""
    labelled, _, _ = labelled_and_jobs(tmp_path)
    scope = prior_scope("twin:tiny-qwen2", LABELS)  # this job's, but for the one field each file changes
    head = LabelHead(list(LABELS), torch.zeros(3, 8), torch.zeros(3))
    files = {}
    for name, changed in [("model", {"model": "embedded"}), ("labels", {"labels": ["billing", "refund", "account"]}),
                          ("examples", {"examples": "0123"}), ("prompt", {"prompt_format": "plain"})]:  # fmt: skip
        save_head(head, tmp_path / f"{name}.json", {**scope, **changed})
        files[name] = str(tmp_path / f"{name}.json")
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "prior.json").write_text(json.dumps({"labels": list(LABELS), "log_probs": [0, 0, 0]}))
    return [
        (["--head-from", files["model"]], "the head was fitted for model 'embedded', not this job's 'twin:tiny-qwen2'"),
        (["--head-from", files["labels"]], "the head was fitted for labels"),
        (["--head-from", files["examples"]], "the head was fitted for examples"),
        (["--head-from", files["prompt"]], "the head was fitted for prompt_format 'plain'"),
        (["--head-from", str(tmp_path / "none.json")], "none.json: no such head file"),
        (["--head-from", str(tmp_path / "junk.json")], "junk.json: not a readable JSON file"),
        (["--head-from", str(tmp_path / "prior.json")], "prior.json: not a head file (no key 'weight')"),
        (["--fit-head", str(labelled), "--head-from", files["model"]], "give one of them"),
        (["--save-head", str(tmp_path / "h.json")], "saves the head this run fits: give --fit-head"),
        (["--fit-head", str(labelled), "--engine", "vllm"], "--engine vllm: a fitted head reads the model's hidden"),
        (["--fit-head", str(tmp_path / "first.csv")], "labelled rows need a 'label' column"),
        (["--fit-head", str(labelled), "--save-prior", str(tmp_path / "p.json")], "a fitted head divides out none"),
    ]


def test_a_head_a_job_cannot_use_is_refused_in_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the head was checked")

    monkeypatch.setattr(models, "load_model", refuse)
    for options, message in head_cases(tmp_path):
        code, err = run([str(tmp_path / "second.csv"), *LABEL_ARGS, "--output", str(tmp_path / "out.csv"), *options,
                         *TINY], capsys)  # fmt: skip
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and message in lines[0], (options, err)
        assert not (tmp_path / "out.csv").exists()


def test_a_head_with_dtype_auto_gives_the_float32_runs_labels(tmp_path, monkeypatch):
    from helpers import precision
    from tests.test_profile import synthetic

    monkeypatch.setattr(classify, "machine_profile", lambda model, info, **options: synthetic(bf16=960.0, fp32=120.0))
    monkeypatch.setattr(precision, "CALIBRATION", 6)
    labelled, first, _ = labelled_and_jobs(tmp_path)
    options = dict(model_name="twin:tiny-qwen2", batch_size=4, progress=False, fit_head=labelled)
    said = []
    float32 = classify.classify_file(first, LABELS, tmp_path / "float32.csv", dtype="float32", **options)
    auto = classify.classify_file(first, LABELS, tmp_path / "auto.csv", dtype="auto", say=said.append, **options)
    assert auto.dtype == "bfloat16 verified in float32", auto.dtype
    assert any("Every label is the one --dtype float32 gives, with no prior" in line for line in said), said
    assert auto.predictions == float32.predictions


def test_a_head_run_resumes_and_runs_on_two_processes_with_the_same_output(tmp_path, capsys):
    labelled, first, _ = labelled_and_jobs(tmp_path)
    options = [*LABEL_ARGS, "--fit-head", str(labelled), "--batch-size", "4", *TINY]
    code, err = run([str(first), "--output", str(tmp_path / "whole.csv"), *options], capsys)
    assert code == 0, err
    stopped = tmp_path / "stopped.csv"
    killed = subprocess.run([sys.executable, str(KILLER), "3", "classify", str(first), "--output", str(stopped),
                             *options], env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode != 0 and not stopped.exists(), killed.stderr[-2000:]
    assert resume.head_path(stopped).exists(), "the fitted head is kept beside the progress files"
    code, err = run([str(first), "--output", str(stopped), *options], capsys)
    assert code == 0 and "resuming: 12 of 30 rows done" in err, err
    assert "the head the stopped run fitted on 30 rows, read back" in err, err
    assert not resume.head_path(stopped).exists(), "removed with the progress files once the output is written"
    same_output(tmp_path / "whole.csv", stopped)
    two = tmp_path / "two.csv"
    done = subprocess.run([*TORCHRUN, "--master_port", "29573", "-m", "helpers", "classify", str(first), "--output",
                           str(two), *options], env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, what_the_processes_said(done.stderr)
    same_output(tmp_path / "whole.csv", two)
