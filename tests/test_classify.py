"""python -m helpers classify: real files, bad input, two processes, and property tests of the batching."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.__main__ import main
from helpers.batching import STRATEGIES, score_batched
from helpers.data import LABELS, build_prompt
from helpers.scoring import LabelScorer, score_one_by_one

TINY = ["--model", "twin:tiny-qwen2", "--quiet"]
LABEL_ARGS = ["--labels", "billing,technical,account"]

# A file as a customer would export it: other column names, quotes, commas, accents, an emoji, leading zeros.
HAND_MADE = '''ticket_id,subject,body,channel
007,Double charge,"My card was charged twice for invoice 2291, please refund one of them",email
008,App crash,"L'app plante dès que j'ouvre les réglages 😡 (Android 14)",chat
009,Email change,"Please change the email address on my profile to ana@example.org",phone
010,"Quote, ""urgent""","Why is my bill higher this month? It says ""adjustment"".",email
'''


def run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err.strip()


@pytest.fixture()
def hand_made(tmp_path):
    path = tmp_path / "tickets.csv"
    path.write_text(HAND_MADE, encoding="utf-8")
    return path


def test_a_hand_made_csv_keeps_every_row_and_column_in_order(hand_made, tmp_path, capsys, embedded):
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(hand_made), *LABEL_ARGS, "--text-column", "body", "--output", str(out),
                     "--model", "embedded", "--verify", "4", "--quiet"], capsys)
    assert code == 0, err
    result = pd.read_csv(out, dtype=str)
    original = pd.read_csv(hand_made, dtype=str)
    assert list(result.columns) == [*original.columns, "predicted_label", "confidence", "p_billing", "p_technical", "p_account"]
    assert result[original.columns].equals(original), "input rows and columns must come back unchanged, in order"
    assert set(result["predicted_label"]) <= set(LABELS)
    # Each row's probabilities are the one-at-a-time reference's, in its own slot.
    model, tokenizer, _ = embedded
    reference = score_one_by_one(model, tokenizer, LabelScorer(tokenizer, LABELS),
                                 [build_prompt(tokenizer, text, LABELS) for text in original["body"]], progress=False)
    assert list(result["predicted_label"]) == reference.predictions
    assert torch.allclose(torch.tensor(result[["p_billing", "p_technical", "p_account"]].astype(float).values, dtype=torch.float32),
                          reference.probabilities, atol=1e-4)
    assert "verified 4 random rows" in err and "4 rows ->" in err and "items/s" in err


def test_jsonl_in_and_out_with_few_shot_examples(tmp_path, capsys):
    source = tmp_path / "tickets.jsonl"
    source.write_text("\n".join(json.dumps({"text": t, "n": i}) for i, t in enumerate(["refund please", "app crashes", "new email"])))
    examples = tmp_path / "examples.csv"
    examples.write_text("text,label\nI was charged twice,billing\nThe page is blank,technical\n")
    out = tmp_path / "out.jsonl"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), "--examples", str(examples),
                     "--strategy", "token_budget", "--token-budget", "500", *TINY], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["n"] for r in rows] == [0, 1, 2] and all(r["predicted_label"] in LABELS for r in rows)


BAD_INPUTS = [
    ("missing file", None, [], "no such file"),
    ("latin-1 bytes", b"text\ncaf\xe9 charged twice\n", [], "not UTF-8 text"),
    ("no text column", "body\nhello\n", [], "no column 'text' (columns: body)"),
    ("empty text", 'text\nfine\n""\n', [], "row 2: column 'text' is empty"),
    ("blank text", "text\nfine\n   \nok\n", [], "row 2: column 'text' is empty"),
    ("NaN text", None, [], "row 2: column 'text' is empty"),
    ("empty labels", "text\nhello\n", ["--labels", " "], "label list is empty"),
    ("duplicate labels", "text\nhello\n", ["--labels", "billing,billing"], "duplicate labels: 'billing'"),
    ("bad format", "text\nhello\n", [], "unsupported format '.txt'"),
]


@pytest.mark.parametrize("case,content,extra,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_one_line_error_naming_it(tmp_path, capsys, case, content, extra, message):
    suffix = ".txt" if case == "bad format" else (".jsonl" if case == "NaN text" else ".csv")
    path = tmp_path / f"input{suffix}"
    if case == "NaN text":
        path.write_text('{"text": "fine"}\n{"text": null}\n')
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    labels = extra if extra else LABEL_ARGS
    code, err = run(["classify", str(path), *labels, "--output", str(tmp_path / "out.csv"), *TINY], capsys)
    assert code == 2
    assert message in err and len(err.splitlines()) == 1, err
    if case not in ("empty labels", "duplicate labels"):
        assert path.name in err, "the error must name the file"
    assert not (tmp_path / "out.csv").exists(), "no output after an error"


def test_existing_output_is_refused_unless_overwrite(tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text("text\nmy invoice is wrong\n")
    out = tmp_path / "out.csv"
    out.write_text("keep me")
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), *TINY], capsys)
    assert code == 2 and "already exists: pass --overwrite" in err and out.read_text() == "keep me"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), "--overwrite", *TINY], capsys)
    assert code == 0 and len(pd.read_csv(out)) == 1


def test_tickets_longer_than_the_context_fail_or_are_cut_with_a_count(tmp_path, capsys):
    source = tmp_path / "in.csv"
    long_text = "please help " * 5000  # ~10k tokens, over the tiny twin's 8192
    source.write_text(f"text\nshort one\n{long_text}\nanother short one\n")
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), *TINY], capsys)
    assert code == 2 and "row 2: longer than the model's 8192-token context" in err and "--truncate" in err
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), "--truncate", *TINY], capsys)
    assert code == 0 and "cut 1 row(s)" in err
    assert len(pd.read_csv(out)) == 3, "output row count equals input row count"


def test_two_processes_match_one_process_row_by_row(hand_made, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    common = [str(hand_made), *LABEL_ARGS, "--text-column", "body", "--batch-size", "2", *TINY]
    single, double = tmp_path / "one.csv", tmp_path / "two.csv"
    subprocess.run([sys.executable, "-m", "helpers", "classify", *common, "--output", str(single)], check=True, env=env)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"]
    done = subprocess.run([*torchrun, "-m", "helpers", "classify", *common, "--output", str(double)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 process(es)" in done.stderr
    one, two = pd.read_csv(single, dtype=str), pd.read_csv(double, dtype=str)
    assert len(two) == len(one) == 4
    assert one[["ticket_id", "body", "predicted_label"]].equals(two[["ticket_id", "body", "predicted_label"]])
    probabilities = ["p_billing", "p_technical", "p_account"]
    assert (one[probabilities].astype(float) - two[probabilities].astype(float)).abs().max().max() < 1e-4


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    word_counts=st.lists(st.integers(1, 120), min_size=1, max_size=14),
    strategy=st.sampled_from(STRATEGIES),
    batch_size=st.integers(1, 9),
    budget=st.integers(1, 3000),
    use_prefix=st.booleans(),
)
def test_any_batching_gives_each_input_its_own_reference_result(tiny_qwen, word_counts, strategy, batch_size, budget, use_prefix):
    from helpers.prefix_cache import PrefixCache

    model, tokenizer, _ = tiny_qwen
    words = "refund invoice crash settings email profile login charge app slow".split()
    texts = [" ".join(words[(i + k) % len(words)] for k in range(n)) for i, n in enumerate(word_counts)]
    prompts = [build_prompt(tokenizer, text) for text in texts]
    scorer = LabelScorer(tokenizer, LABELS)
    prefix = PrefixCache.for_prompts(model, tokenizer) if use_prefix else None
    result = score_batched(model, tokenizer, scorer, prompts, strategy, batch_size, budget, prefix, progress=False)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert result.log_scores.shape == (len(prompts), len(LABELS))
    assert result.predictions == reference.predictions
    assert torch.allclose(result.log_scores, reference.log_scores, atol=1e-4)
