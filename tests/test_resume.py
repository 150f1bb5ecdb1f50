"""A classify run stopped with SIGKILL resumes where it stopped, and its output equals an uninterrupted run's."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import classify as classify_module
from helpers import resume
from helpers.__main__ import main
from helpers.data import make_tickets
from helpers.models import load_tokenizer, twin_folder

ROOT = Path(__file__).parent.parent
KILLER = Path(__file__).parent / "kill_after_batches.py"
OWN_FOLDER = Path(__file__).parent / "own_folder_per_rank.py"
MODEL_PER_RANK = Path(__file__).parent / "model_per_rank.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]


def what_the_processes_said(stderr: str) -> str:
    """A launch's stderr before the launcher's own report, whose traceback would push the processes' words out."""
    return stderr.split("elastic/multiprocessing/api.py")[0][-3000:]


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SLM_DEVICE": "cpu"}
LABELS = ["billing", "technical", "account"]
PROBABILITIES = [f"{kind}_{label}" for kind in ("p", "raw_p") for label in LABELS]


def job(tmp_path, rows=40):
    source = tmp_path / "tickets.csv"
    make_tickets(rows, seed=5, style="varied")[["text"]].to_csv(source, index=False)
    return source, [
        "--labels",
        "billing,technical,account",
        "--model",
        "twin:tiny-qwen2",
        "--batch-size",
        "4",
        "--prior",
        "job",  # from its sample's rows, scored first: a resumed run reads them back, so the same prior
        "--quiet",
    ]


def classify(args, capsys):
    code = main(["classify", *args])
    return code, capsys.readouterr().err


def same_output(one: Path, two: Path) -> None:
    a, b = pd.read_csv(one, dtype=str), pd.read_csv(two, dtype=str)
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    assert a[["text", "predicted_label"]].equals(b[["text", "predicted_label"]]), "the same rows, in order, same labels"
    assert (a[PROBABILITIES].astype(float) - b[PROBABILITIES].astype(float)).abs().max().max() < 1e-4


def stop(source, output, options, after, launcher=(sys.executable,)):
    """Run classify in a new process and SIGKILL it once ``after`` batches have landed (kill_after_batches.py)."""
    killed = subprocess.run(
        [*launcher, str(KILLER), str(after), "classify", str(source), "--output", str(output), *options],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode != 0 and not output.exists(), killed.stderr[-2000:]
    return resume.progress_files(output)


def landed(files) -> int:
    return sum(len(path.read_text().splitlines()) - 1 for path in files)


@pytest.mark.parametrize("launcher", ["one_process", "two_processes"])
def test_a_killed_run_resumes_and_ends_with_the_uninterrupted_output(tmp_path, capsys, launcher):
    """Stopped with SIGKILL after 3 batches (under torchrun: rank 0 after 3 of its own), resumed as one process."""
    source, options = job(tmp_path)
    whole, stopped = tmp_path / "whole.csv", tmp_path / "stopped.csv"
    code, err = classify([str(source), "--output", str(whole), *options], capsys)
    assert code == 0, err
    before = (*TORCHRUN, "--master_port", "29561") if launcher == "two_processes" else (sys.executable,)
    files = stop(source, stopped, options, 3, before)
    done = landed(files)
    assert files and 3 * 4 <= done < 40, (files, done)
    if launcher == "one_process":  # killed mid-write instead: the torn last line is dropped, its row scored again
        (path,) = files
        text = path.read_text()
        path.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.rstrip("\n").rsplit("\n", 1)[1][:17])
        done -= 1
    code, err = classify([str(source), "--output", str(stopped), *options, "--verify", "8"], capsys)
    assert code == 0, err
    assert f"resuming: {done} of 40 rows done" in err, err
    assert f"({done} resumed from a stopped run; the speed is this run's {40 - done} rows)" in err, err
    assert "verified 8 random rows" in err
    same_output(whole, stopped)
    assert not resume.progress_files(stopped), "the progress files go once the output holds every row"


def test_processes_whose_output_folders_are_not_one_are_refused_before_any_row_is_scored(tmp_path):
    """Two processes, each writing to its own folder (as one path on two machines that share no disk): each would
    resume from its own progress files only. Refused at start, on every process, in one line; nothing left behind."""
    source, options = job(tmp_path, rows=8)
    launch = [*TORCHRUN, "--master_port", "29575", str(OWN_FOLDER), str(tmp_path)]
    ran = subprocess.run(
        [*launch, "classify", str(source), "--output", "out.csv", *options],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    said = what_the_processes_said(ran.stderr)
    assert ran.returncode != 0 and "the output's folder is not shared by the run's processes" in said, said
    assert "sees the marks of 1 of the run's 2 processes" in said and "every machine sees" in said, said
    for rank in (0, 1):
        assert not [path.name for path in (tmp_path / f"rank{rank}").iterdir()], "no mark, progress or output left"


def test_every_process_scores_with_the_model_rank_0_resolved(tmp_path, capsys):
    """Processes that would resolve the model to different ones (their own SLM_MODEL, as machines whose caches differ
    resolve the default): rank 0's choice is handed out, and the output is that model's, row by row."""
    source, options = job(tmp_path, rows=24)
    options[options.index("job")] = "none"  # the job's prior would score every row of so small a job on rank 0
    without_model = [option for option in options if option not in ("--model", "twin:tiny-qwen2")]
    alone = tmp_path / "alone.csv"
    code, err = classify([str(source), "--output", str(alone), *options], capsys)
    assert code == 0, err
    both = tmp_path / "both.csv"
    launch = [*TORCHRUN, "--master_port", "29577", str(MODEL_PER_RANK), "twin:tiny-qwen2,twin:tiny-llama"]
    ran = subprocess.run(
        [*launch, "classify", str(source), "--output", str(both), *without_model],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert ran.returncode == 0, what_the_processes_said(ran.stderr)
    one, two = pd.read_csv(alone), pd.read_csv(both)
    shown = [f"p_{label}" for label in LABELS]
    assert one["predicted_label"].equals(two["predicted_label"]) and len(one) == 24
    assert (one[shown] - two[shown]).abs().max().max() < 1e-4, "rank 1's rows scored by another model"


def test_two_processes_resume_from_the_progress_rank_0_read_and_handed_out(tmp_path, capsys):
    """Stopped under torchrun, resumed under torchrun: rank 0 reads the progress files and hands out which rows are
    done; the output equals the uninterrupted one's, every row exactly once."""
    source, options = job(tmp_path)
    whole, stopped = tmp_path / "whole.csv", tmp_path / "stopped.csv"
    code, err = classify([str(source), "--output", str(whole), *options], capsys)
    assert code == 0, err
    done = landed(stop(source, stopped, options, 3, (*TORCHRUN, "--master_port", "29579")))
    assert 3 * 4 <= done < 40, done
    resumed = subprocess.run(
        [*TORCHRUN, "--master_port", "29581", "-m", "helpers", "classify", str(source), "--output", str(stopped)]
        + options,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    said = what_the_processes_said(resumed.stderr)
    assert resumed.returncode == 0 and f"resuming: {done} of 40 rows done" in said, said
    same_output(whole, stopped)


def test_another_job_refuses_to_resume_in_one_line_and_leaves_the_progress(tmp_path, capsys):
    source, options = job(tmp_path, rows=12)
    stopped = tmp_path / "stopped.csv"
    (path,) = stop(source, stopped, options, 1)
    kept = path.read_bytes()
    for flag, value, expected in (
        (
            "--labels",
            "billing,technical,account,refund",
            "the labels changed (were billing,technical,account, now billing,technical,account,refund)",
        ),
        ("--model", "twin:tiny-llama", "the model changed (was 'twin:tiny-qwen2', now 'twin:tiny-llama')"),
    ):
        changed = [*options]
        changed[changed.index(flag) + 1] = value
        code, err = classify([str(source), "--output", str(stopped), *changed], capsys)
        assert code == 2
        (line,) = err.strip().splitlines()
        assert expected in line and "pass --overwrite to start again, or rerun with the original options" in line, line
        assert path.read_bytes() == kept, "the progress stays as it was"
    code, err = classify([str(source), "--output", str(stopped), *changed, "--overwrite"], capsys)
    assert code == 0 and "resuming" not in err, err
    assert not resume.progress_files(stopped)
    # The same job's progress is resumed even with --overwrite (a command that replaces an older output keeps it).
    stopped.unlink()
    path.write_bytes(kept)  # the stopped run's progress, as it was
    code, err = classify([str(source), "--output", str(stopped), *options, "--overwrite"], capsys)
    assert code == 0 and "resuming: 4 of 12 rows done" in err, err


def test_a_batch_with_nan_scores_never_lands_as_done(tmp_path, capsys, monkeypatch):
    """A half dtype that overflows on real prompts: the run stops in one line, and no NaN row waits to be resumed."""
    import helpers.batching as batching

    real, calls = batching.label_log_probs, []

    def second_batch_nan(*args, **kwargs):
        scores = real(*args, **kwargs)
        calls.append(1)
        return scores * float("nan") if len(calls) == 2 else scores

    monkeypatch.setattr(batching, "label_log_probs", second_batch_nan)
    source, options = job(tmp_path, rows=12)
    out = tmp_path / "out.csv"
    code, err = classify([str(source), "--output", str(out), *options], capsys)
    assert code == 2 and "error: NaN scores for rows" in err, err
    (path,) = resume.progress_files(out)
    assert landed([path]) == 4 and "NaN" not in path.read_text(), "only the first batch landed"


def test_a_progress_line_holds_its_row_its_scores_whether_it_ran_in_full_and_whose_scores_they_are(tmp_path):
    expected = {"labels": ["a", "b"], "resolved": "bfloat16"}
    writer = resume.ProgressWriter(tmp_path / "out.csv", 0, expected)
    writer.append([5, 2], [[-0.1, -2.3], [-1.5, -0.25]], False, False)  # the half pass's
    writer.append([2], [[-1.4, -0.3]], False, True)  # rescored in float32: the last line of a row is its own
    writer.close()
    lines = resume.progress_path(tmp_path / "out.csv", 0).read_text().splitlines()
    assert json.loads(lines[0]) == {"fingerprint": expected}
    assert json.loads(lines[2]) == {"row": 2, "scores": [-1.5, -0.25], "full": False, "exact": False}
    done = resume.read_progress(tmp_path / "out.csv", {"labels": ["a", "b"]})  # the resolution is not compared
    assert done == {5: ([-0.1, -2.3], False, False), 2: ([-1.4, -0.3], False, True)}
    assert resume.resolved(tmp_path / "out.csv") == "bfloat16"
    assert resume.recorded_bound(tmp_path / "out.csv") is None
    writer = resume.ProgressWriter(tmp_path / "out.csv", 1, expected)
    writer.bound(0.1)
    writer.bound(0.25)  # widened: the largest is the stopped run's bound
    writer.close()
    assert (
        resume.recorded_bound(tmp_path / "out.csv") == 0.25
        and len(resume.read_progress(tmp_path / "out.csv", expected)) == 2
    )
    old = resume.progress_path(tmp_path / "old.csv", 0)  # before "exact": an auto run's rows count as half-precision's
    old.write_text(
        json.dumps({"fingerprint": {"dtype": "auto"}})
        + "\n"
        + json.dumps({"row": 0, "scores": [0.0], "full": False})
        + "\n"
    )
    assert resume.read_progress(tmp_path / "old.csv", {"dtype": "auto"}) == {0: ([0.0], False, False)}


def test_restart_drops_the_stopped_runs_progress_and_starts_afresh(tmp_path, capsys):
    source, options = job(tmp_path, rows=12)
    stopped = tmp_path / "stopped.csv"
    assert landed(stop(source, stopped, options, 1)) >= 4
    code, err = classify([str(source), "--output", str(stopped), *options, "--restart"], capsys)
    assert code == 0 and "resuming" not in err, err
    assert pd.read_csv(stopped)["predicted_label"].notna().all() and not resume.progress_files(stopped)


def test_a_model_changed_in_place_is_another_job(tmp_path, capsys):
    """A local folder's weight files rewritten (here: the same bytes, written again) after a run stopped: its progress
    is refused in one line naming the weights, and kept; --restart starts afresh."""
    folder = tmp_path / "model"
    shutil.copytree(twin_folder("twin:tiny-qwen2"), folder)
    load_tokenizer("twin:tiny-qwen2").save_pretrained(folder)
    source, options = job(tmp_path, rows=12)
    options[options.index("--model") + 1] = str(folder)
    stopped = tmp_path / "stopped.csv"
    (path,) = stop(source, stopped, options, 1)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # fine-tuned in place, as far as the files can tell
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # a coarse clock, too
    code, err = classify([str(source), "--output", str(stopped), *options], capsys)
    (line,) = err.strip().splitlines()
    assert code == 2 and "the model's weights changed" in line and path.exists(), err
    code, err = classify([str(source), "--output", str(stopped), *options, "--restart"], capsys)
    assert code == 0 and "resuming" not in err, err


def test_ctrl_c_while_scoring_says_what_was_kept_and_the_rerun_resumes(tmp_path, capsys, monkeypatch):
    source, options = job(tmp_path, rows=12)
    options[options.index("--prior") + 1] = "none"
    out = tmp_path / "out.csv"
    lander = classify_module._lander

    def interrupted_after_one_batch(writer, scored, bar):
        land = lander(writer, scored, bar)

        def once(*batch):
            if scored:
                raise KeyboardInterrupt
            land(*batch)

        return once

    monkeypatch.setattr(classify_module, "_lander", interrupted_after_one_batch)
    code, err = classify([str(source), "--output", str(out), *options], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 130 and last.startswith("error: interrupted; 4 of the job's rows are kept"), err
    assert "rerun the same command to resume" in last and not out.exists(), err
    monkeypatch.setattr(classify_module, "_lander", lander)
    code, err = classify([str(source), "--output", str(out), *options], capsys)
    assert code == 0 and "resuming: 4 of 12 rows done" in err, err


AUTO = Path(__file__).parent / "auto_driver.py"


def the_float32_runs_labels(tmp_path, capsys, monkeypatch, source, options, result: Path) -> None:
    """Every row of ``result`` has the label, and the prior, that the same command gives with --dtype float32 (as
    auto_driver.py runs it: the job's prior from 8 rows)."""
    monkeypatch.setattr("helpers.classify.PRIOR_ROWS", 8)
    reference = tmp_path / "float32.csv"
    code, err = classify([str(source), "--output", str(reference), *options, "--dtype", "float32"], capsys)
    assert code == 0, err
    ran, f32 = pd.read_csv(result), pd.read_csv(reference)
    assert (ran["predicted_label"] == f32["predicted_label"]).all(), "a row left the float32 run's label"
    assert np.allclose(prior_of(ran), prior_of(f32), rtol=0, atol=1e-4), "the float32 run's prior"


def prior_of(result: pd.DataFrame) -> np.ndarray:
    """The prior a run divided out, read back from its p_ and raw_p_ columns: p = raw / prior, normalised, so log raw -
    log p is the prior's log up to a constant per row; over the labels whose probabilities are at least 0.001 on every
    row (the files keep 8 decimals), the median over the rows."""
    raw, after = result[[f"raw_p_{x}" for x in LABELS]].to_numpy(), result[[f"p_{x}" for x in LABELS]].to_numpy()
    readable = (raw >= 1e-3).all(0) & (after >= 1e-3).all(0)  # labels whose probabilities keep their digits
    assert readable.sum() >= 2, "fewer than two labels with readable probabilities"
    shift = np.log(raw[:, readable]) - np.log(after[:, readable])
    return np.median(shift - shift.mean(1, keepdims=True), axis=0)


def test_a_resumed_auto_run_keeps_the_precision_its_stopped_run_resolved(tmp_path, capsys, monkeypatch):
    """Stopped where bfloat16 was fast, resumed where it is not: the resumed run keeps bfloat16 (one precision per
    run), and with the job prior every row ends with the label and the prior a --dtype float32 run gives."""
    from tests.test_profile import synthetic

    source, options = job(tmp_path)
    options = [*options, "--dtype", "auto"]
    stopped = tmp_path / "stopped.csv"
    killed = subprocess.run(
        [sys.executable, str(AUTO), "8.0", "classify", str(source), "--output", str(stopped), *options],
        env={**ENV, "KILL_AFTER": "4"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode != 0 and "bfloat16 (its matmul runs at 8.0x float32's here)" in killed.stderr
    header = json.loads(resume.progress_files(stopped)[0].read_text().splitlines()[0])
    assert header["fingerprint"]["resolved"] == "bfloat16"
    monkeypatch.setattr("helpers.classify.machine_profile", lambda *a, **k: synthetic(bf16=2.4, fp32=120.0))
    monkeypatch.setattr("helpers.classify.PRIOR_ROWS", 8)  # as auto_driver.py ran the stopped run
    code, err = classify([str(source), "--output", str(stopped), *options], capsys)
    assert code == 0, err
    assert "--dtype auto: bfloat16, as the stopped run of this job resolved it" in err, err
    assert "bfloat16 verified in float32" in err and "Every label is the one --dtype float32 gives" in err, err
    the_float32_runs_labels(tmp_path, capsys, monkeypatch, source, options[:-2], stopped)


def test_two_processes_share_one_auto_precision_and_one_bound(tmp_path, capsys, monkeypatch):
    """Rank 1 alone would stay in float32 (its bfloat16 is slow): rank 0 resolves for both, and every row, whichever
    process scored it, ends with the label and the job prior a --dtype float32 run gives."""
    source, options = job(tmp_path)
    output = tmp_path / "two.csv"
    done = subprocess.run(
        [*TORCHRUN, "--master_port", "29571", str(AUTO), "8.0,0.02", "classify", str(source), "--output", str(output),
         *options, "--dtype", "auto"],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, what_the_processes_said(done.stderr)
    assert "matmuls only, verified" in done.stderr and "(chosen on process 0 for all 2)" in done.stderr, done.stderr
    assert "the largest of 2 (each process's and the end's)" in done.stderr and "2 process(es)" in done.stderr, (
        done.stderr
    )
    the_float32_runs_labels(tmp_path, capsys, monkeypatch, source, options, output)


def test_an_auto_run_stopped_during_the_priors_sample_scores_it_again_whole_and_gives_the_float32_runs_labels(
    tmp_path, capsys, monkeypatch
):
    """Killed after the sample's first batch (auto_driver.py: the prior from 8 rows, in batches of 4): the resumed run
    scores the rest of the sample in float32 first, and gives the float32 run's prior and labels."""
    from tests.test_profile import synthetic

    source, options = job(tmp_path)
    options = [*options, "--dtype", "auto"]
    stopped = tmp_path / "stopped.csv"
    killed = subprocess.run(
        [sys.executable, str(AUTO), "8.0", "classify", str(source), "--output", str(stopped), *options],
        env={**ENV, "KILL_AFTER": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode != 0 and len(resume.read_progress(stopped, resume_fingerprint(stopped))) == 4
    monkeypatch.setattr("helpers.classify.machine_profile", lambda *a, **k: synthetic(bf16=960.0, fp32=120.0))
    monkeypatch.setattr("helpers.classify.PRIOR_ROWS", 8)
    code, err = classify([str(source), "--output", str(stopped), *options], capsys)
    assert code == 0 and "resuming: 4 of 40 rows done" in err, err
    the_float32_runs_labels(tmp_path, capsys, monkeypatch, source, options[:-2], stopped)


def resume_fingerprint(output):
    return json.loads(resume.progress_files(output)[0].read_text().splitlines()[0])["fingerprint"]
