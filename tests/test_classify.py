"""python -m helpers classify: real files, bad input, two processes, and property tests of the batching."""

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import models
from helpers.__main__ import main
from helpers.batching import STRATEGIES, Batching, score_batched
from helpers.checks import float_tolerance
from helpers.data import LABELS, build_prompt
from helpers.prior import calibrated, content_free_prior
from helpers.scoring import LabelScorer, score_one_by_one
from helpers.tables import prediction_columns
from tests.test_resume import TORCHRUN, what_the_processes_said

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
    code, err = run(
        [
            "classify",
            str(hand_made),
            *LABEL_ARGS,
            "--text-column",
            "body",
            "--output",
            str(out),
            "--model",
            "embedded",
            "--verify",
            "4",
            "--quiet",
        ],
        capsys,
    )
    assert code == 0, err
    result = pd.read_csv(out, dtype=str)
    original = pd.read_csv(hand_made, dtype=str)
    assert list(result.columns) == [
        *original.columns,
        "predicted_label",
        "confidence",
        *(f"p_{label}" for label in LABELS),
        *(f"raw_p_{label}" for label in LABELS),  # a label prior was divided out: the raw probabilities follow
    ]
    assert result[original.columns].equals(original), "input rows and columns must come back unchanged, in order"
    assert set(result["predicted_label"]) <= set(LABELS)
    # Each row's probabilities are the one-at-a-time reference's, in its own slot, raw and with the default prior of a
    # job of 4 rows: the content-free one (the job's own mean needs more rows).
    model, tokenizer, _ = embedded
    reference = score_one_by_one(
        model,
        tokenizer,
        LabelScorer(tokenizer, LABELS),
        [build_prompt(tokenizer, text, LABELS) for text in original["body"]],
        progress=False,
    )
    prior = content_free_prior(model, tokenizer, LabelScorer(tokenizer, LABELS))
    assert list(result["predicted_label"]) == calibrated(reference, prior).predictions
    for columns, expected in (("p", calibrated(reference, prior)), ("raw_p", reference)):
        shares = result[[f"{columns}_{label}" for label in LABELS]].astype(float).values
        tolerance = float_tolerance(expected)  # a probability moves no more than its log-prob
        assert torch.allclose(torch.tensor(shares, dtype=torch.float32), expected.probabilities, 0, tolerance), columns
    assert "verified 4 random rows" in err and "4 rows ->" in err and "items/s" in err
    shares = ", ".join(f"{label} {p:.0%}" for label, p in zip(LABELS, prior.log_probs.exp().tolist()))
    assert f"prior (content-free, 3 inputs, in float32): {shares}" in err, err


def test_jsonl_in_and_out_with_few_shot_examples(tmp_path, capsys):
    source = tmp_path / "tickets.jsonl"
    source.write_text(
        "\n".join(json.dumps({"text": t, "n": i}) for i, t in enumerate(["refund please", "app crashes", "new email"]))
    )
    examples = tmp_path / "examples.csv"
    examples.write_text("text,label\nI was charged twice,billing\nThe page is blank,technical\n")
    out = tmp_path / "out.jsonl"
    code, err = run(
        [
            "classify",
            str(source),
            *LABEL_ARGS,
            "--output",
            str(out),
            "--examples",
            str(examples),
            "--strategy",
            "token_budget",
            "--token-budget",
            "500",
            *TINY,
        ],
        capsys,
    )
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


def test_tickets_longer_than_the_context_fail_or_are_cut_with_a_count(tmp_path, capsys, monkeypatch):
    # the twin with a 512-token context: a cut ticket then fills 512 positions, not 8192 (20 s of attention here)
    monkeypatch.setitem(
        models.TWINS, "twin:tiny-qwen2", {**models.TWINS["twin:tiny-qwen2"], "max_position_embeddings": 512}
    )
    source = tmp_path / "in.csv"
    long_text = "please help " * 400  # ~800 tokens
    source.write_text(f"text\nshort one\n{long_text}\nanother short one\n")
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), *TINY], capsys)
    assert code == 2 and "row 2: longer than the model's 512-token context" in err and "--truncate" in err
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), "--truncate", *TINY], capsys)
    assert code == 0 and "cut 1 row(s)" in err
    assert len(pd.read_csv(out)) == 3, "output row count equals input row count"


@pytest.mark.parametrize("n_rows", [5, 1], ids=["5_rows", "1_row"])
def test_two_processes_match_one_process_row_by_row(tmp_path, n_rows, capsys):
    """Uneven shares (3 + 2 rows; 1 + 0 rows) come back as one output equal to the single-process one."""
    source = tmp_path / "tickets.csv"
    source.write_text(HAND_MADE + '011,Login,"I cannot log in since the update",chat\n', encoding="utf-8")
    frame = pd.read_csv(source, dtype=str).head(n_rows)
    frame.to_csv(source, index=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    common = [str(source), *LABEL_ARGS, "--text-column", "body", "--batch-size", "2", "--prior", "job", *TINY]
    single, double = tmp_path / "one.csv", tmp_path / "two.csv"
    code, err = run(["classify", *common, "--output", str(single)], capsys)  # the single process: this one
    assert code == 0, err
    done = subprocess.run(
        [
            *TORCHRUN,
            "--master_port",
            str(29533 + n_rows),
            "-m",
            "helpers",
            "classify",
            *common,
            "--output",
            str(double),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, what_the_processes_said(done.stderr)
    assert "2 process(es)" in done.stderr
    one, two = pd.read_csv(single, dtype=str), pd.read_csv(double, dtype=str)
    assert len(two) == len(one) == n_rows
    assert one[["ticket_id", "body", "predicted_label"]].equals(two[["ticket_id", "body", "predicted_label"]])
    probabilities = [f"{kind}_{label}" for kind in ("p", "raw_p") for label in LABELS]
    assert (one[probabilities].astype(float) - two[probabilities].astype(float)).abs().max().max() < 1e-4


def test_a_failure_on_one_process_stops_every_process_with_its_message(hand_made, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    out = tmp_path / "out.csv"
    driver = Path(__file__).parent / "fail_on_one_rank.py"
    done = subprocess.run(
        [
            *TORCHRUN,
            "--master_port",
            "29541",
            str(driver),
            "1",
            "classify",
            str(hand_made),
            *LABEL_ARGS,
            "--text-column",
            "body",
            "--output",
            str(out),
            *TINY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode != 0
    # Both processes end with the failing process's message: rank 1 its own, rank 0 relayed.
    assert done.stderr.count("injected failure on rank 1") >= 2, done.stderr[-3000:]
    assert "error: process 1 of 2: injected failure on rank 1" in done.stderr, done.stderr[-3000:]
    assert not out.exists()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    word_counts=st.lists(st.integers(1, 120), min_size=1, max_size=14),
    strategy=st.sampled_from(STRATEGIES),
    batch_size=st.integers(1, 9),
    budget=st.integers(1, 3000),
    use_prefix=st.booleans(),
)
def test_any_batching_gives_each_input_its_own_reference_result(
    tiny_qwen, word_counts, strategy, batch_size, budget, use_prefix
):
    from helpers.prefix_cache import PrefixCache

    model, tokenizer, _ = tiny_qwen
    words = "refund invoice crash settings email profile login charge app slow".split()
    texts = [" ".join(words[(i + k) % len(words)] for k in range(n)) for i, n in enumerate(word_counts)]
    prompts = [build_prompt(tokenizer, text) for text in texts]
    scorer = LabelScorer(tokenizer, LABELS)
    prefix = PrefixCache.for_prompts(model, tokenizer) if use_prefix else None
    result = score_batched(
        model, tokenizer, scorer, prompts, Batching(strategy, batch_size, budget), prefix=prefix, progress=False
    )
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    assert result.log_scores.shape == (len(prompts), len(LABELS))
    assert result.predictions == reference.predictions
    assert torch.allclose(result.log_scores, reference.log_scores, rtol=0, atol=float_tolerance(reference))


# --- reliability: the issue's own command, checks before loading, faithful and atomic output ----------------


def test_the_multi_word_label_command_gives_a_prediction_per_row(tmp_path, capsys, embedded):
    """Several multi-token labels on the prefix path used to widen the shared cache and crash the second row."""
    source = tmp_path / "t.csv"
    source.write_text('text\n"I was charged twice"\n"The app crashes on upload"\n"Change my email"\n')
    labels = ["refund request", "bug report", "account change"]
    model, tokenizer, _ = embedded
    reference = score_one_by_one(
        model,
        tokenizer,
        LabelScorer(tokenizer, labels),
        [build_prompt(tokenizer, t, labels) for t in pd.read_csv(source)["text"]],
        progress=False,
    )
    for strategy in ("loop", "sorted"):
        out = tmp_path / f"{strategy}.csv"
        code, err = run(
            [
                "classify",
                str(source),
                "--labels",
                ",".join(labels),
                "--output",
                str(out),
                "--strategy",
                strategy,
                "--model",
                "embedded",
                "--prior",
                "none",
                "--quiet",
            ],
            capsys,
        )
        assert code == 0, err
        result = pd.read_csv(out)
        assert list(result["predicted_label"]) == reference.predictions, strategy
        probabilities = torch.tensor(result[[f"p_{label}" for label in labels]].values, dtype=torch.float32)
        assert torch.allclose(probabilities, reference.probabilities, rtol=0, atol=float_tolerance(reference))


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if the model is loaded: every case below must be refused before that."""
    from helpers import models

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_model", refuse)


PRE_LOAD_CASES = [
    ("duplicate labels", dict(labels="billing,account,billing"), "duplicate labels: 'billing'"),
    ("blank label", dict(labels="billing,,account"), "has an empty entry"),
    ("one label", dict(labels="billing"), "the label list has 1 label(s)"),
    ("missing input", dict(input="missing.csv"), "missing.csv: no such file"),
    ("no text column", dict(text_column="body"), "no column 'body' (columns: text)"),
    ("output exists", dict(output="exists.csv"), "exists.csv already exists: pass --overwrite"),
    ("output folder missing", dict(output="nowhere/out.csv"), "the folder"),
    ("output is the input", dict(output="in.csv", overwrite=True), "is the input file"),
    ("output format", dict(output="out.xlsx"), "unsupported output format '.xlsx'"),
    ("column clash", dict(input="clash.csv"), "clash.csv: already has column(s) 'confidence'"),
    ("raw column clash", dict(input="raw.csv"), "raw.csv: already has column(s) 'raw_p_billing'"),
    ("bad prior", dict(prior="uniform"), "unknown prior 'uniform': use one of none, content-free, job"),
    ("bad examples", dict(examples="examples.csv"), "label is not one of"),
    ("bad batch size", dict(batch_size=0), "--batch-size must be >= 1"),
    ("bad strategy", dict(strategy="random"), "unknown strategy 'random'"),
    *(
        [("unavailable device", dict(device="cuda"), "device 'cuda' asked for, but torch sees no CUDA GPU")]
        if not torch.cuda.is_available()
        else []
    ),
]


@pytest.mark.parametrize("case,options,message", PRE_LOAD_CASES, ids=[c[0] for c in PRE_LOAD_CASES])
def test_every_check_runs_before_the_model_loads(tmp_path, no_model, case, options, message):
    from helpers.classify import classify_file
    from helpers.tables import InputError

    (tmp_path / "in.csv").write_text("text\nmy invoice is wrong\n")
    (tmp_path / "clash.csv").write_text("text,confidence\nmy invoice is wrong,high\n")
    (tmp_path / "raw.csv").write_text("text,raw_p_billing\nmy invoice is wrong,0.5\n")
    (tmp_path / "exists.csv").write_text("keep me")
    (tmp_path / "examples.csv").write_text("text,label\nI was charged twice,refunds\n")
    arguments = {"input": "in.csv", "labels": "billing,technical,account", "output": "out.csv", **options}
    for key in ("input", "output", "examples"):
        if key in arguments:
            arguments[key] = tmp_path / arguments[key]
    with pytest.raises(InputError, match=re.escape(message)) as error:
        classify_file(
            arguments.pop("input"),
            arguments.pop("labels"),
            arguments.pop("output"),
            examples_path=arguments.pop("examples", None),
            **arguments,
        )
    assert "\n" not in str(error.value)
    assert (tmp_path / "exists.csv").read_text() == "keep me"


def test_the_device_is_chosen_on_the_command_line_and_recorded(hand_made, tmp_path, capsys):
    out = tmp_path / "out.csv"
    code, err = run(
        [
            "classify",
            str(hand_made),
            *LABEL_ARGS,
            "--text-column",
            "body",
            "--output",
            str(out),
            *TINY,
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert code == 0, err
    assert "· cpu ·" in err, err
    if not torch.cuda.is_available():
        code, err = run(
            [
                "classify",
                str(hand_made),
                *LABEL_ARGS,
                "--text-column",
                "body",
                "--output",
                str(tmp_path / "x.csv"),
                *TINY,
                "--device",
                "cuda",
            ],
            capsys,
        )
        assert code == 2 and err.count("\n") == 0 and "no CUDA GPU" in err, err


DATE_LIKE = [
    {
        "id": "007",
        "created_at": "2024-01-05T10:00:00Z",
        "timestamp": 1704448800,
        "updated": "2024-01-05",
        "text": "I was charged twice\u2028(pasted)",
        "big": 12345678901234567890,
        "meta": {"channel": "email"},
        "score": 0.1,
    },
    {
        "id": "008",
        "created_at": "05/01/2024",
        "timestamp": "1704448800",
        "text": "The app crashes",
        "vip": True,
        "note": None,
    },
]


def test_jsonl_values_come_back_exactly_as_written(tmp_path, capsys):
    """No date parsing (created_at, timestamp), no float-ification of gappy integers, missing keys stay missing."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in DATE_LIKE))
    out = tmp_path / "out.jsonl"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), *TINY], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").split("\n")  # not splitlines: it would split at U+2028 too
    assert lines.pop() == "" and len(lines) == len(DATE_LIKE)
    for record, line in zip(DATE_LIKE, lines):
        written = json.loads(line)
        assert {k: written[k] for k in record} == record and written["predicted_label"] in LABELS
        assert set(written) == set(record) | set(prediction_columns(LABELS, raw=True))  # a prior (content-free here)
        for key, value in record.items():  # the very text of each value (non-ASCII written as itself)
            assert f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}" in line, (key, line)


def test_csv_values_come_back_exactly_as_written(tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text(
        "id,created_at,timestamp,amount,text\n007,2024-01-05 10:00,1704448800,1e3,refund please\n"
        "008,05/01/2024,,0010.50,app crashes\n"
    )
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), *TINY], capsys)
    assert code == 0, err
    written = out.read_text().splitlines()
    original = source.read_text().splitlines()
    assert len(written) == len(original), "one output line per input line"
    for before, after in zip(original, written):
        assert after.startswith(before + ","), (before, after)


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"text": "fine"}\n{"text": "oops"\n', "line 2 is not valid JSON"),
        ('{"text": "fine"}\n["not", "an", "object"]\n', "line 2 is a JSON list, not an object"),
        ('{"text": "fine"}\n\n{"text": "after a gap"}\n', "line 2 is blank"),
    ],
    ids=["bad_json", "not_an_object", "blank_line"],
)
def test_bad_jsonl_lines_are_named(tmp_path, no_model, content, message):
    from helpers.tables import InputError, read_table

    path = tmp_path / "in.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=re.escape(message)):
        read_table(path)
    path.write_text('{"text": "fine"}\n{"text": "also fine"}\n\n\n')
    assert len(read_table(path)) == 2, "blank lines at the end of a file are not rows"


def test_a_write_stopped_midway_leaves_no_partial_output_and_the_old_file_untouched(tmp_path):
    from helpers.tables import atomic_write

    target = tmp_path / "out.csv"
    target.write_text("keep me")

    def half_then_interrupted(handle):
        handle.write("text,predicted_label\n" * 1000)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_interrupted)
    assert target.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"], "the temporary file must be removed"
    target.chmod(0o640)
    atomic_write(target, lambda handle: handle.write("new"))
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640, "a replaced file keeps its mode (the temporary one was 0600)"


def test_a_classify_run_failing_while_writing_keeps_the_existing_output(tmp_path, capsys, monkeypatch):
    import helpers.tables as tables

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["refund please", "app crashes", "new email"]))
    out = tmp_path / "out.jsonl"
    out.write_text("keep me")
    written = []

    def dumps_then_fail(value, **kwargs):
        written.append(value)
        if len(written) == 2:
            raise OSError("No space left on device")
        return json.dumps(value, **kwargs)

    failing_json = SimpleNamespace(dumps=dumps_then_fail, loads=json.loads, JSONDecodeError=json.JSONDecodeError)
    monkeypatch.setattr(tables, "json", failing_json)
    code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(out), "--overwrite", *TINY], capsys)
    assert code == 2 and "No space left on device" in err
    # The rows scored so far wait in the progress file, for a rerun to resume from (helpers.resume).
    assert out.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == [
        ".out.jsonl.progress.0.jsonl",
        "in.jsonl",
        "out.jsonl",
    ]


def test_verify_in_bfloat16_uses_a_tolerance_and_counts_near_ties(hand_made, tmp_path, capsys):
    out = tmp_path / "out.csv"
    code, err = run(
        [
            "classify",
            str(hand_made),
            *LABEL_ARGS,
            "--text-column",
            "body",
            "--output",
            str(out),
            "--dtype",
            "bfloat16",
            "--verify",
            "4",
            *TINY,
        ],
        capsys,
    )
    assert code == 0, err
    assert re.search(
        r"verified 4 random rows .*: all agree \(\d+ near-tie\(s\) within 0.75 counted as agreement", err
    ), err
    assert re.search(r"bfloat16, unverified: \d+ of 4 rows have their top two labels within 0.75, near ties", err), err


@pytest.mark.parametrize("prior", ["none", "content-free", "job", "labelled", "file"])
@pytest.mark.parametrize("bfloat16_speed", [8.0, 0.02], ids=["fast", "slow"])
def test_dtype_auto_gives_the_float32_runs_labels_and_prior_where_half_precision_is_fast_and_elsewhere(
    tmp_path, monkeypatch, bfloat16_speed, prior
):
    """The same command with --dtype float32 and --dtype auto: the same prior to the last bit (the job's from 8 rows
    scored in float32 before the others, the content-free one in float32, a file's) and the same label on every row;
    a labelled sample's prior is fitted to every row's scores, so auto runs it in float32."""
    from helpers import classify, precision
    from tests.test_profile import synthetic

    # the machine profile as notebook 00 would measure it on a CPU with (or without) fast bfloat16
    profile = synthetic(bf16=120.0 * bfloat16_speed, fp32=120.0)
    monkeypatch.setattr(classify, "machine_profile", lambda model, info, **options: profile)
    monkeypatch.setattr(precision, "CALIBRATION", 6)
    monkeypatch.setattr(classify, "PRIOR_ROWS", 8)  # of 24: the half pass scores the other 16
    source = tmp_path / "tickets.jsonl"
    texts = [f"{word} problem number {i}" for i, word in enumerate(["refund", "crash", "login", "invoice"] * 6)]
    source.write_text("\n".join(json.dumps({"text": text, "label": LABELS[i % 3]}) for i, text in enumerate(texts)))
    options = dict(model_name="twin:tiny-qwen2", batch_size=4, progress=False, prior=prior)
    if prior == "file":  # a prior fitted to a labelled sample and saved, then read by both runs
        saved = tmp_path / "prior.json"
        classify.classify_file(
            source, LABELS, tmp_path / "sample.jsonl", **dict(options, prior="labelled"), save_prior=saved
        )
        options = dict(options, prior=None, prior_from=saved)
    results, said = {}, {"float32": [], "auto": []}
    for dtype in ("float32", "auto"):
        results[dtype] = classify.classify_file(
            source, LABELS, tmp_path / f"{dtype}.jsonl", dtype=dtype, say=said[dtype].append, **options,
            verify=8 if dtype == "auto" else 0,  # under auto: float32's labels exactly, under the run's prior
        )  # fmt: skip
    err, labels = "\n".join(said["auto"]), {dtype: result.predictions for dtype, result in results.items()}
    assert "verified 8 random rows against the one-at-a-time reference: all agree\n" in err + "\n", err
    assert (results["auto"].prior is None) == (prior == "none")
    if prior != "none":
        assert torch.equal(results["auto"].prior.log_probs, results["float32"].prior.log_probs), "the same prior"
    assert labels["auto"] == labels["float32"], "auto changed a label"
    if prior == "labelled":
        assert "--dtype auto: float32 (--prior labelled is fitted to every row's scores" in err, err
        assert "rescored" not in err
    elif bfloat16_speed > 1:
        assert "--dtype auto: bfloat16 (its matmul runs at 8.0x float32's here), matmuls only, verified" in err, err
        head = re.search(r"^--dtype auto: (\d+) of 24 rows rescored in float32: .* closer than ([\d.e-]+),", err, re.M)
        assert head and int(head[1]) == len(results["auto"].rescored), err
        proven = re.search(r"^--dtype auto, the bound: .* Every label is the one --dtype float32 gives, (.*), provided "
                           r"rounding moved no row's gap by more than ([\d.e-]+)$", err, re.M)  # fmt: skip
        assert proven and proven[2] == head[2], err
        same = f"under the same prior ({results['auto'].prior.source})" if prior != "none" else "with no prior"
        assert proven[1] == same, err
        if prior == "job":
            assert "8 of the job's 24 rows spread over its lengths, in float32" in proven[1], err
        assert "bfloat16 verified in float32" in err
        assert re.search(r"--dtype auto, where the time went: calibration [\d.]+ s, half [\d.]+ s, rescore", err), err
    else:
        assert "--dtype auto: float32 (half precision is not 1.5x faster here: matmul bfloat16 0.02x)" in err, err
        assert "rescored" not in err


def test_collapsed_predictions_end_with_a_warning(tmp_path):
    from helpers.classify import collapse_warning

    labels = ["billing", "technical", "account"]
    warning = collapse_warning(["billing"] * 9 + ["account"], labels)
    assert warning == (
        "warning: 9 of 10 rows (90%) got 'billing' (billing 9, technical 0, account 1): the model may "
        "not be telling the labels apart; give it a few labelled examples with --examples FILE "
        "(columns text, label); or divide out its label prior with --prior job"
    )
    assert collapse_warning(["billing"] * 8 + ["account"] * 2, labels) is None
    assert collapse_warning(["billing"] * 9, labels) is None, "too few rows to call it a collapse"
    given = collapse_warning(["billing"] * 10, labels, examples=3)
    assert "--examples FILE" not in given and "its 3 example(s) were not enough" in given, given
    divided = collapse_warning(["billing"] * 10, labels, prior="job")
    assert "even with its label prior divided out" in divided and "--prior" not in divided, divided


def test_the_embedded_model_zero_shot_collapses_raw_and_the_default_prior_lifts_it(tmp_path, capsys):
    """30 varied tickets, the 10 shortest of each label among 300 (the model's forwards are the suite's costliest),
    zero-shot: raw (the raw_p_ columns), nearly every one gets one label and the warning would say so; with the job's
    prior divided out (the default from 30 rows), under the warning's share (on 210 full-length such tickets,
    benchmarks/priors.py: at most 60 %), no warning."""
    from helpers.classify import COLLAPSE_SHARE, collapse_warning
    from helpers.data import make_tickets

    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    pool = make_tickets(300, seed=3, style="varied")
    pool["words"] = pool["text"].str.split().str.len()
    pool.sort_values("words", kind="stable").groupby("label").head(10).sort_index()[["text"]].to_csv(
        source, index=False
    )
    options = ["--output", str(out), "--model", "embedded", "--batch-size", "8", "--quiet"]
    code, err = run(["classify", str(source), *LABEL_ARGS, *options], capsys)
    assert code == 0, err
    result = pd.read_csv(out)
    raw = result[[f"raw_p_{label}" for label in LABELS]].to_numpy().argmax(1)
    raw_labels = [LABELS[i] for i in raw]
    assert "--prior job" in collapse_warning(raw_labels, LABELS), "raw, the embedded model collapses zero-shot"
    shares = result["predicted_label"].value_counts(normalize=True)
    assert shares.max() < COLLAPSE_SHARE and len(shares) == len(LABELS), shares
    assert "warning:" not in err and "prior (the job's 30 rows, in float32): billing" in err, err


def test_rows_that_are_not_token_clean_run_in_full_and_are_counted(tmp_path, monkeypatch, embedded):
    from helpers import classify
    from helpers.prefix_cache import PrefixCache, find_prefix_text

    def prefix_ending_in_the(model, tokenizer, **options):
        return PrefixCache(model, tokenizer, find_prefix_text(tokenizer, **options) + " The")

    monkeypatch.setattr(PrefixCache, "for_prompts", staticmethod(prefix_ending_in_the))
    source = tmp_path / "in.csv"
    texts = ["The app crashes when I upload a photo", "Theory aside, my bill is wrong", "The email is old"]
    pd.DataFrame({"text": texts}).to_csv(source, index=False)
    said = []
    result = classify.classify_file(
        source, LABELS, tmp_path / "out.csv", model_name="embedded", prior="none", progress=False, say=said.append
    )
    assert result.full_prompt_rows == [2]
    assert "prefix cache: 1 row(s) not token-clean at the prefix boundary ran in full (row 2)" in said[-1]
    model, tokenizer, _ = embedded
    reference = score_one_by_one(
        model,
        tokenizer,
        LabelScorer(tokenizer, LABELS),
        [build_prompt(tokenizer, t, LABELS) for t in texts],
        progress=False,
    )
    assert result.predictions == reference.predictions


def test_verify_on_a_verified_half_precision_run_takes_no_label_flip_within_the_tolerance(tiny_qwen, tickets):
    """``--dtype auto`` promises float32's labels: its ``--verify`` compares them exactly (under the run's prior), where
    a half dtype asked for by name accepts a flip between two labels closer than its tolerance."""
    from helpers.checks import verify_sample

    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    prompts = [build_prompt(tokenizer, text, LABELS) for text in tickets["text"][:4]]
    reference = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False).log_scores
    flipped = reference.clone()
    top = reference[0].argsort(descending=True)
    flipped[0, top[0]], flipped[0, top[1]] = reference[0, top[1]], reference[0, top[0]]  # row 1's top two swapped
    assert (reference[0, top[0]] - reference[0, top[1]]).abs() < 0.75, "a near tie in bfloat16's tolerance"
    named = verify_sample(model, tokenizer, scorer, prompts, flipped, 4, dtype="bfloat16")
    assert named["near_ties"] == 1 and not named["exact"]
    with pytest.raises(RuntimeError, match="verification failed on sampled rows .*row 1"):
        verify_sample(model, tokenizer, scorer, prompts, flipped, 4, dtype="bfloat16", shift=0.0)
    shift = torch.zeros(len(LABELS))
    shift[top[0]] = 5.0  # a prior that puts another label first in every row, the reference's as the run's
    assert verify_sample(model, tokenizer, scorer, prompts, reference, 4, dtype="bfloat16", shift=shift)["exact"]


def test_a_model_whose_config_and_tokenizer_give_no_context_length_stops_in_one_line(tmp_path, tiny_qwen, monkeypatch):
    from helpers.classify import Job, Options, _passes
    from helpers.tables import InputError

    model, tokenizer, _ = tiny_qwen
    source = tmp_path / "in.csv"
    source.write_text("text\nmy invoice is wrong\n")
    job = Job.read(source, LABELS, tmp_path / "out.csv", Options())
    monkeypatch.setattr(model, "config", SimpleNamespace())  # a config without max_position_embeddings
    monkeypatch.setattr(tokenizer, "model_max_length", int(1e30))  # what a tokenizer says when it does not know
    with pytest.raises(InputError, match=r"no context length known: neither its config .* nor its tokenizer") as caught:
        _passes(model, tokenizer, LabelScorer(tokenizer, LABELS), job, Options(), None)
    assert "\n" not in str(caught.value)


def test_a_prior_fitted_on_a_labelled_sample_is_saved_and_divides_later_jobs_row_by_row(tmp_path, capsys, tiny_qwen):
    """--prior labelled fits the prior to a labelled sample of the queue (helpers.prior.sample_prior) and --save-prior
    keeps it; --prior-from divides it out of a later job, so a row's label no longer depends on the rest of its file
    (the job's prior would move with it); a prior made for another model is refused in one line."""
    from helpers.data import make_tickets
    from helpers.prior import sample_prior

    tickets = make_tickets(30, seed=11, style="varied")
    sample, saved = tmp_path / "sample.csv", tmp_path / "prior.json"
    mix = tickets.head(12).assign(label=["billing"] * 8 + ["technical"] * 3 + ["account"])  # a queue's 8/3/1 mix
    mix[["text", "label"]].to_csv(sample, index=False)
    out = tmp_path / "sample_out.csv"
    code, err = run(["classify", str(sample), *LABEL_ARGS, "--output", str(out), "--prior", "labelled",
                     "--save-prior", str(saved), *TINY], capsys)  # fmt: skip
    assert code == 0 and f"prior saved to {saved}" in err and "a labelled sample of 12 rows" in err, err
    model, tokenizer, _ = tiny_qwen
    scorer = LabelScorer(tokenizer, LABELS)
    raw = score_one_by_one(model, tokenizer, scorer, [build_prompt(tokenizer, t, LABELS) for t in mix["text"]])
    expected = calibrated(raw, sample_prior(raw, list(mix["label"]))).predictions
    assert list(pd.read_csv(out)["predicted_label"]) == expected
    small, large = tmp_path / "small.csv", tmp_path / "large.csv"
    tickets.head(10)[["text"]].to_csv(small, index=False)
    tickets[["text"]].to_csv(large, index=False)
    labels = {}
    for source in (small, large):
        result = tmp_path / f"{source.stem}_out.csv"
        code, err = run(["classify", str(source), *LABEL_ARGS, "--output", str(result), "--prior-from", str(saved),
                         *TINY], capsys)  # fmt: skip
        assert code == 0 and f"from {saved}" in err, err
        labels[source.stem] = list(pd.read_csv(result)["predicted_label"])
    assert labels["small"] == labels["large"][:10], "the same rows, the same labels, whatever else the file holds"
    for extra, message in (
        (["--prior-from", str(tmp_path / "none.json")], "none.json: no such prior file"),
        (["--prior-from", str(saved), "--model", "twin:tiny-llama"], "the prior was made for model 'twin:tiny-qwen2'"),
        (["--prior-from", str(saved), "--prior", "job"], f"--prior-from {saved} and --prior job: give one of them"),
        (["--save-prior", str(saved), "--prior", "none"], "--save-prior with --prior none: there is no prior to save"),
        (["--prior", "labelled"], "(10 in all): --prior labelled needs a 'label' column holding one of billing"),
    ):
        code, err = run(["classify", str(small), *LABEL_ARGS, "--output", str(tmp_path / "x.csv"), *TINY, *extra],
                        capsys)  # fmt: skip
        assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_a_near_tie_that_a_half_precision_prior_would_flip_keeps_the_float32_runs_label(tmp_path, monkeypatch):
    """Rounding that leans one way (here every half-precision pass adds 0.05 to one label's logit) moves a prior
    averaged over half-precision scores, as --dtype auto's job prior was until issue 68: on these 90 rows that flipped
    near ties against the float32 run (1 to 3 rows, at 48 to 120 rows). The job's prior now comes from its sample's
    float32 scores in both runs: every label is the float32 run's, the leaning rows rescored under their bound."""
    from helpers import classify, precision
    from helpers.data import make_tickets
    from helpers.prior import job_prior
    from tests.test_profile import synthetic

    monkeypatch.setattr(classify, "machine_profile", lambda model, info, **options: synthetic(bf16=960.0, fp32=120.0))
    monkeypatch.setattr(precision, "CALIBRATION", 6)
    monkeypatch.setattr(classify, "PRIOR_ROWS", 8)
    model, tokenizer, _ = models.load_model("twin:tiny-qwen2", dtype="float32", verbose=False)
    scorer, real = LabelScorer(tokenizer, LABELS), precision.mixed_precision

    @contextlib.contextmanager
    def leaning_precision(model, dtype):
        def lean(module, inputs, logits):  # an error of one sign in every row: technical's scores up
            logits[..., scorer.first_ids[LABELS.index("technical")]] += 0.05

        hook = model.get_output_embeddings().register_forward_hook(lean)
        try:
            with real(model, dtype):
                yield
        finally:
            hook.remove()

    monkeypatch.setattr(precision, "mixed_precision", leaning_precision)
    source = tmp_path / "tickets.csv"
    make_tickets(90, seed=5, style="varied")[["text"]].to_csv(source, index=False)
    options = dict(model_name="twin:tiny-qwen2", batch_size=4, progress=False, prior="job")
    float32 = classify.classify_file(source, LABELS, tmp_path / "float32.csv", dtype="float32", **options)
    auto = classify.classify_file(source, LABELS, tmp_path / "auto.csv", dtype="auto", **options)
    assert auto.rescored, "the lean set a bound: near ties were rescored"
    assert auto.predictions == float32.predictions, "auto changed a label"
    assert torch.equal(auto.prior.log_probs, float32.prior.log_probs), "the same prior"
    # the job is one where it matters: every row's prior averaged over half-precision scores flips a label
    prompts = [build_prompt(tokenizer, text, LABELS) for text in pd.read_csv(source)["text"]]
    raw = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, progress=False)
    with leaning_precision(model, "bfloat16"):
        half = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=4, progress=False)
    assert calibrated(raw, job_prior(half)).predictions != calibrated(raw, job_prior(raw)).predictions


def test_a_job_no_larger_than_the_priors_sample_runs_auto_in_float32_and_says_why(tmp_path, monkeypatch):
    """The job's prior scores its sample in float32 first: a job of at most that many rows leaves none to half
    precision, so auto resolves to float32 before measuring anything."""
    from helpers import classify

    def unmeasured(*args, **kwargs):
        raise AssertionError("the machine profile was read for a job that cannot use half precision")

    monkeypatch.setattr(classify, "machine_profile", unmeasured)
    monkeypatch.setattr(classify, "PRIOR_ROWS", 32)
    source = tmp_path / "tickets.csv"
    pd.DataFrame({"text": [f"refund problem number {i}" for i in range(24)]}).to_csv(source, index=False)
    options = dict(model_name="twin:tiny-qwen2", batch_size=4, progress=False)
    said = []
    auto = classify.classify_file(source, LABELS, tmp_path / "auto.csv", dtype="auto", say=said.append, **options)
    float32 = classify.classify_file(source, LABELS, tmp_path / "float32.csv", dtype="float32", **options)
    assert any("--dtype auto: float32 (the job's prior scores up to 32 rows in float32" in line for line in said), said
    assert auto.dtype == "float32" and auto.predictions == float32.predictions
    assert torch.equal(auto.prior.log_probs, float32.prior.log_probs)
