import json

import numpy as np
import pytest

from helpers.__main__ import main
from helpers.bench import non_embedding_parameters, padding_by_strategy, run_benchmark

REQUIRED = {"strategy", "batch_size", "dtype", "items_per_s", "padding_fraction", "agreement",
            "roof_fraction", "model", "device", "n"}


@pytest.fixture(scope="module")
def tiny_bench():
    return run_benchmark("twin:tiny-qwen2", n=8, shots=2, batch_sizes=[2, 4], dtypes=["float32", "bfloat16"],
                         strategies=["loop", "loop_prefix", "arbitrary", "sorted", "token_budget", "sorted_prefix"],
                         progress=False)


def test_benchmark_has_a_row_per_strategy_batch_size_and_dtype(tiny_bench):
    assert REQUIRED <= set(tiny_bench.columns)
    per_dtype = 2 + 4 * 2  # two loops at batch 1, four batched strategies at two sizes
    assert len(tiny_bench) == 2 * per_dtype
    assert set(tiny_bench["dtype"]) == {"float32", "bfloat16"}
    assert (tiny_bench["items_per_s"] > 0).all() and (tiny_bench["roof_gflops"] > 0).all()
    assert tiny_bench["timing_only"].all(), "a twin's rows must say they are timing only"
    # Speedups are relative to the float32 loop, also for the bfloat16 rows (not to each dtype's own loop).
    loop = tiny_bench.query("strategy == 'loop' and dtype == 'float32'")["items_per_s"].item()
    assert tiny_bench.attrs["loop_items_per_s"] == loop
    assert np.allclose(tiny_bench["speedup_vs_loop"], tiny_bench["items_per_s"] / loop)


def test_every_float32_row_agrees_with_the_float32_loop(tiny_bench):
    float32 = tiny_bench[tiny_bench["dtype"] == "float32"]
    assert (float32["agreement"] == 1.0).all()
    assert (float32["max_abs_diff"] <= 1e-3).all()
    # bfloat16 rows are compared with the float32 loop, not with themselves: rounding shows in every row.
    bfloat16 = tiny_bench[tiny_bench["dtype"] == "bfloat16"]
    assert (bfloat16["max_abs_diff"] > 1e-4).all(), "bfloat16 scores identical to float32: not run in bfloat16?"


def test_useful_work_excludes_embeddings(tiny_qwen):
    model, _, info = tiny_qwen
    # Tied input and output embeddings: one vocab x hidden matrix is all that is left out.
    assert non_embedding_parameters(model) == info.n_params - model.config.vocab_size * model.config.hidden_size


def test_padding_by_strategy_puts_sorted_far_below_arbitrary(embedded):
    _, tokenizer, _ = embedded
    padding = padding_by_strategy(tokenizer, n=600, batch_size=32).set_index("strategy")["padding_fraction"]
    assert padding["sorted"] <= 0.08 < 0.5 < padding["arbitrary"] < padding["global maximum"]


def test_bench_command_writes_json_records(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", "twin:tiny-qwen2", "--n", "6", "--shots", "2", "--dtypes", "float32",
                 "--batch-sizes", "2", "--strategies", "loop,sorted_prefix", "--json", str(out), "--quiet"])
    assert code == 0
    records = json.loads(out.read_text())
    assert [r["strategy"] for r in records] == ["loop", "sorted_prefix"]
    assert all(REQUIRED <= set(r) for r in records)
    assert "sorted_prefix" in capsys.readouterr().out


def test_bench_command_refuses_bad_options_in_one_line(capsys):
    assert main(["bench", "--model", "twin:tiny-qwen2", "--strategies", "warp_drive", "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: unknown strategies ['warp_drive']") and "\n" not in error
    with pytest.raises(SystemExit):
        main(["bench", "--batch-sizes", "four"])


def test_default_dtypes_skip_one_the_machine_runs_slowly(monkeypatch, capsys):
    from helpers import bench

    from .test_profile import synthetic

    monkeypatch.setattr(bench, "machine_profile", lambda model, info, verbose=True: synthetic(bf16=1.8, fp32=124.0))
    frame = run_benchmark("twin:tiny-qwen2", n=4, shots=1, batch_sizes=[2], strategies=["loop", "sorted"],
                          dtypes=None, progress=False)
    assert set(frame["dtype"]) == {"float32"}
    assert "bfloat16 skipped: its matmul runs at 1.8 GFLOP/s here against 124 for float32" in capsys.readouterr().out
    assert (frame["machine"] == "cpu: test").all() and frame["roof_gflops"].eq(124.0).all()
