"""The GPU tier: the same checks on the machine's accelerator (CUDA or Apple MPS), skipped where there is none.

Run it alone with ``.venv/bin/python -m pytest -m gpu``. Every other test runs on the CPU (conftest sets
``SLM_DEVICE=cpu``), so this is where lessons, the benchmark and classify meet a GPU: the lessons at their quick scale
in
float32 and in the device's fast dtype, every batching path against the one-at-a-time loop on the device, the
benchmark on two strategies, and classify with ``--device``.
"""

import pandas as pd
import papermill
import pytest
import torch

from helpers.__main__ import main
from helpers.batching import Batching, score_batched
from helpers.bench import Design, run_benchmark
from helpers.checks import FLOAT32_ATOL, assert_agrees, tolerance_for
from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets
from helpers.models import load_model, pick_dtype
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, score_one_by_one

from .test_notebooks import NOTEBOOKS, SOLUTIONS, run_small

ACCELERATOR = (
    "cuda"
    if torch.cuda.is_available()
    else "mps"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    else None
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ACCELERATOR is None, reason="no GPU here (CUDA or Apple MPS)")]
# The device's fast dtype: bfloat16 on CUDA from compute capability 8.0, float16 below it and on MPS.
FAST = str(pick_dtype(None, torch.device(ACCELERATOR))).removeprefix("torch.") if ACCELERATOR == "cuda" else "float16"


@pytest.fixture(scope="module")
def on_gpu():
    return load_model("embedded", dtype="float32", device=ACCELERATOR, verbose=False)


@pytest.mark.parametrize("dtype", ["float32", FAST])
@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_the_notebooks_run_on_the_gpu(notebook, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("SLM_DEVICE", ACCELERATOR)
    declared = papermill.inspect_notebook(str(notebook))
    known = set(declared)
    if dtype != "float32" and "DTYPE" not in known and "DTYPES" not in known:
        pytest.skip(f"{notebook.name} has no dtype parameter")
    extra = {"DTYPE": dtype} if "DTYPE" in known else {"DTYPES": sorted({"float32", dtype})}
    executed = run_small(notebook, declared, tmp_path, extra=extra)
    printed = "".join(
        "".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", [])
    )
    assert f"· {ACCELERATOR}" in printed or ACCELERATOR in printed, (
        f"{notebook.name} did not say it ran on {ACCELERATOR}"
    )


@pytest.mark.parametrize(
    "strategy, batch_size, use_prefix",
    [
        ("loop", 1, True),
        ("arbitrary", 4, False),
        ("sorted", 4, False),
        ("sorted", 4, True),
        ("token_budget", None, True),
    ],
)
def test_every_path_agrees_with_the_loop_on_the_gpu(on_gpu, strategy, batch_size, use_prefix):
    model, tokenizer, _ = on_gpu
    examples = few_shot_examples(3)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(12, style="varied")["text"]]
    scorer = LabelScorer(tokenizer, LABELS)
    reference = score_one_by_one(model, tokenizer, scorer, prompts, progress=False)
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples) if use_prefix else None
    result = score_batched(
        model,
        tokenizer,
        scorer,
        prompts,
        Batching(strategy, batch_size or 4, 400 if strategy == "token_budget" else None),
        prefix=prefix,
        progress=False,
    )
    assert_agrees(reference, result, tolerance_for(model.dtype))


def test_the_benchmark_runs_two_strategies_on_the_gpu():
    design = Design(["loop", "sorted_prefix"], [4], ["float32", FAST], shots=2, repeats=1, every=40)
    frame, _ = run_benchmark("embedded", design, device=ACCELERATOR, progress=False)
    assert set(frame["device"].str.split(":").str[0]) == {ACCELERATOR}
    float32 = frame[frame["dtype"] == "float32"]
    assert (float32["agreement"] == 1.0).all() and (float32["max_abs_diff"] <= FLOAT32_ATOL).all(), float32
    fast = frame[frame["dtype"] == FAST]
    assert len(fast) and (fast["max_abs_diff"] <= tolerance_for(FAST).atol).all(), fast
    assert (frame["items_per_s"] > 0).all()


def test_classify_runs_on_the_gpu(tmp_path, capsys):
    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    pd.DataFrame({"text": make_tickets(12, style="varied")["text"]}).to_csv(source, index=False)
    code = main(
        [
            "classify",
            str(source),
            "--labels",
            "billing,technical,account",
            "--output",
            str(out),
            "--model",
            "embedded",
            "--device",
            ACCELERATOR,
            "--verify",
            "4",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"· {ACCELERATOR}" in err and "verified 4 random rows" in err, err
    assert len(pd.read_csv(out)) == 12
