"""A classify run stopped with SIGKILL resumes where it stopped, and its output equals an uninterrupted run's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import resume
from helpers.__main__ import main
from helpers.data import make_tickets

ROOT = Path(__file__).parent.parent
KILLER = Path(__file__).parent / "kill_after_batches.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SLM_DEVICE": "cpu"}
PROBABILITIES = ["p_billing", "p_technical", "p_account"]


def job(tmp_path, rows=40):
    source = tmp_path / "tickets.csv"
    make_tickets(rows, seed=5, style="varied")[["text"]].to_csv(source, index=False)
    return source, ["--labels", "billing,technical,account", "--model", "twin:tiny-qwen2", "--batch-size", "4",
                    "--quiet"]


def classify(args, capsys):
    code = main(["classify", *args])
    return code, capsys.readouterr().err


def same_output(one: Path, two: Path) -> None:
    a, b = pd.read_csv(one, dtype=str), pd.read_csv(two, dtype=str)
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    assert a[["text", "predicted_label"]].equals(b[["text", "predicted_label"]]), "the same rows, in order, same labels"
    assert (a[PROBABILITIES].astype(float) - b[PROBABILITIES].astype(float)).abs().max().max() < 1e-4


@pytest.mark.parametrize("launcher", ["one_process", "two_processes"])
def test_a_killed_run_resumes_and_ends_with_the_uninterrupted_output(tmp_path, capsys, launcher):
    source, options = job(tmp_path)
    whole, stopped = tmp_path / "whole.csv", tmp_path / "stopped.csv"
    code, err = classify([str(source), "--output", str(whole), *options], capsys)
    assert code == 0, err
    before = TORCHRUN + ["--master_port", "29561"] if launcher == "two_processes" else [sys.executable]
    killed = subprocess.run([*before, str(KILLER), "3", "classify", str(source), "--output", str(stopped), *options],
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert killed.returncode != 0 and not stopped.exists(), killed.stderr[-2000:]
    files = resume.progress_files(stopped)
    landed = sum(len(path.read_text().splitlines()) - 1 for path in files)
    assert files and 3 * 4 <= landed < 40, (files, landed)
    # Resumed as one process, whatever number of processes stopped.
    code, err = classify([str(source), "--output", str(stopped), *options, "--verify", "8"], capsys)
    assert code == 0, err
    assert f"resuming: {landed} of 40 rows done" in err, err
    assert f"({landed} resumed from a stopped run; the speed is this run's {40 - landed} rows)" in err, err
    assert "verified 8 random rows" in err
    same_output(whole, stopped)
    assert not resume.progress_files(stopped), "the progress files go once the output holds every row"


def test_a_torn_last_line_is_dropped_and_its_rows_scored_again(tmp_path, capsys):
    source, options = job(tmp_path, rows=12)
    whole, stopped = tmp_path / "whole.csv", tmp_path / "stopped.csv"
    assert classify([str(source), "--output", str(whole), *options], capsys)[0] == 0
    subprocess.run([sys.executable, str(KILLER), "2", "classify", str(source), "--output", str(stopped), *options],
                   env=ENV, capture_output=True, text=True, timeout=300)
    (path,) = resume.progress_files(stopped)
    text = path.read_text()
    path.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.rstrip("\n").rsplit("\n", 1)[1][:17])  # killed mid-write
    code, err = classify([str(source), "--output", str(stopped), *options], capsys)
    assert code == 0, err
    assert "resuming: 7 of 12 rows done" in err, err  # 2 batches of 4 landed, a line a row: the torn row is scored again
    same_output(whole, stopped)


@pytest.mark.parametrize("change, expected", [
    (["--labels", "billing,technical,account,refund"], "the labels changed (were billing,technical,account, now "
                                                       "billing,technical,account,refund)"),
    (["--model", "twin:tiny-llama"], "the model changed (was 'twin:tiny-qwen2', now 'twin:tiny-llama')"),
])
def test_another_job_refuses_to_resume_in_one_line_and_leaves_the_progress(tmp_path, capsys, change, expected):
    source, options = job(tmp_path, rows=12)
    stopped = tmp_path / "stopped.csv"
    subprocess.run([sys.executable, str(KILLER), "1", "classify", str(source), "--output", str(stopped), *options],
                   env=ENV, capture_output=True, text=True, timeout=300)
    (path,) = resume.progress_files(stopped)
    kept = path.read_bytes()
    changed = [*options]
    flag = changed.index(change[0])
    changed[flag + 1] = change[1]
    code, err = classify([str(source), "--output", str(stopped), *changed], capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert expected in line and "pass --overwrite to start again, or rerun with the original options" in line, line
    assert path.read_bytes() == kept, "the progress stays as it was"
    code, err = classify([str(source), "--output", str(stopped), *changed, "--overwrite"], capsys)
    assert code == 0 and "resuming" not in err, err
    assert not resume.progress_files(stopped)


def test_a_progress_line_holds_its_row_its_scores_and_whether_it_ran_in_full(tmp_path):
    expected = {"labels": ["a", "b"]}
    writer = resume.ProgressWriter(tmp_path / "out.csv", 0, expected)
    writer.append([5, 2], [[-0.1, -2.3], [-1.5, -0.25]], False)
    writer.close()
    lines = resume.progress_path(tmp_path / "out.csv", 0).read_text().splitlines()
    assert json.loads(lines[0]) == {"fingerprint": expected}
    assert json.loads(lines[2]) == {"row": 2, "scores": [-1.5, -0.25], "full": False}
    assert resume.read_progress(tmp_path / "out.csv", expected) == {5: ([-0.1, -2.3], False), 2: ([-1.5, -0.25], False)}
