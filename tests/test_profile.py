"""The machine profile: measured once, cached, read correctly, and which dtypes it finds worth running."""

import json

import pytest

from helpers import profile as profiles
from helpers.profile import MachineProfile, machine_profile


def seconds(rows: int, width: int) -> float:
    """Round numbers: 10 ms per call plus 1 ms per token."""
    return 0.01 + 0.001 * rows * width


def synthetic(bf16: float = 400.0, fp32: float = 120.0) -> MachineProfile:
    """Single sequences up to 256 tokens and batches of 1-32 rows of 96 tokens, at ``seconds``' costs."""
    prefill = [(n, n / seconds(1, n)) for n in (1, 4, 16, 64, 256)]
    batched = [(rows, rows * 96 / seconds(rows, 96)) for rows in (1, 2, 4, 8, 16, 32)]
    return MachineProfile(
        machine="cpu: test",
        torch="0",
        model="test",
        dtype="float32",
        device="cpu",
        threads=2,
        matmul_gflops={"float32": fp32, "bfloat16": bf16},
        prefill=prefill,
        batched=batched,
    )


def test_the_curve_is_read_between_and_beyond_its_points():
    profile = synthetic()
    assert profile.tokens_per_s(16) == pytest.approx(16 / 0.026)
    assert profile.tokens_per_s(4) < profile.tokens_per_s(10) < profile.tokens_per_s(16)
    assert profile.tokens_per_s(4096) == pytest.approx(profile.tokens_per_s(256)), "flat past the last measured point"
    assert profile.saturation_tokens == 256 and profile.peak_tokens_per_s == pytest.approx(256 / 0.266)


def test_the_batched_curve_says_what_batching_can_gain_and_where_it_flattens():
    profile = synthetic()
    # 10 ms per call shared by the rows: one row of 96 tokens costs 0.106 s, 32 rows 3.082 s; the gain is read on
    # the batched curve alone (its first point), not against the single-sequence curve measured at other moments
    assert profile.batching_gain(32) == pytest.approx(32 / 3.082 / (1 / 0.106))
    assert profile.batching_gain(1) == 1.0
    assert profile.batch_knee == min(rows for rows, rate in profile.batched if rate >= 0.9 * profile.batched[-1][1])
    assert profile.batched_tokens_per_s(64) == pytest.approx(profile.batched_tokens_per_s(32)), (
        "flat past the last point"
    )
    assert "batched rows of 96 tokens: 1 rows" in profile.summary() and "rows of 96 tokens batched" in profile.caption()


def test_a_half_dtype_below_half_of_float32_is_not_worth_running():
    slow = synthetic(bf16=1.8, fp32=124.0)
    assert slow.fast_dtypes() == ["float32"]
    assert slow.slow_dtypes() == {
        "bfloat16": "bfloat16: its matmul runs at 1.8 GFLOP/s here against 124 for float32 "
        "(below half): not worth running"
    }
    assert synthetic(bf16=70.0, fp32=124.0).fast_dtypes() == ["float32", "bfloat16"], "0.56x is kept"
    overflowing = synthetic(bf16=400.0)
    overflowing.finite = {"bfloat16": False}
    assert overflowing.fast_dtypes() == ["float32"] and "non-finite" in overflowing.slow_dtypes()["bfloat16"]


def test_the_profile_measures_the_candidates_of_its_device(embedded, tmp_path, monkeypatch):
    monkeypatch.setenv("SLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        profiles, "prefill_curve", lambda model: [(1, 10.0), (4, 30.0)]
    )  # the matmuls are what matter here
    monkeypatch.setattr(profiles, "batched_curve", lambda model: [(1, 10.0), (2, 15.0)])
    probed = []
    monkeypatch.setattr(
        profiles, "half_precision_finite", lambda model, dtype: probed.append(dtype) or dtype != "bfloat16"
    )
    calls, speeds = [], {"float32": 100.0, "bfloat16": 80.0}
    model, _, info = embedded
    shapes = profiles.roof_shapes(model, model.device)

    def fake_matmul(device, dtype, shape, min_run_time=1.0, slow=None):
        calls.append((str(dtype)[6:], shape, slow))
        return speeds[str(dtype)[6:]] * (1.0 if shape == shapes[1] else 0.9)  # the second shape is the fastest

    monkeypatch.setattr(profiles, "matmul_gflops", fake_matmul)
    measured = machine_profile(model, info, refresh=True, verbose=False)
    assert list(measured.matmul_gflops) == ["float32", "bfloat16"], "a CPU measures float32 and bfloat16, not float16"
    assert measured.matmul_gflops == {"float32": 100.0, "bfloat16": 80.0}, "each dtype's roof: its fastest shape"
    assert measured.batched == [(1, 10.0), (2, 15.0)]
    # SmolLM2: q/o 576x576, k/v 576x192, gate/up 576x1536, down 1536x576; the output layer is not among them
    assert {shape[1:] for shape in shapes} == {(576, 576), (576, 192), (576, 1536), (1536, 576)}
    assert [call[1] for call in calls] == shapes * 2, "every weight shape in every dtype"
    bar = 100.0 * profiles.SLOW_DTYPE_RATIO / 4
    assert [call[2] for call in calls] == [None] * len(shapes) + [bar] * len(shapes), (
        "float32 in full; the others answered early if far slower"
    )
    assert probed == ["bfloat16"] and measured.finite == {"bfloat16": False}, "a fast half dtype is probed once"
    assert measured.fast_dtypes() == ["float32"], "one that overflows is never worth running"
    calls.clear()
    speeds["bfloat16"] = 1.0  # far below float32's: its first (largest) shape answers for it
    slow = machine_profile(model, info, refresh=True, verbose=False)
    assert [call[0] for call in calls] == ["float32"] * len(shapes) + ["bfloat16"]
    assert slow.matmul_gflops["bfloat16"] == pytest.approx(0.9)


def test_a_dtype_far_below_float32_is_answered_by_its_first_call(monkeypatch):
    """bfloat16 without bf16 instructions takes seconds per call: one call says it is skipped anyway."""
    import torch

    def no_timer(*args, **kwargs):
        raise AssertionError("a dtype below the slow bar must not be timed in blocks")

    monkeypatch.setattr(profiles.benchmark, "Timer", no_timer)
    quick = profiles.matmul_gflops("cpu", torch.float32, (64, 64, 64), slow=1e9)
    assert quick is not None and 0 < quick < 1e9, "below the slow bar: the first call's rate answers"


def test_a_profile_is_measured_once_then_read_from_memory_and_disk(tiny_qwen, tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(profiles, "_MEMORY", {})
    model, _, info = tiny_qwen
    first = machine_profile(model, info, verbose=False)
    sizes = [n for n, _ in first.prefill]
    assert sizes == sorted(sizes) and sizes[0] == 1 and all(rate > 0 for _, rate in first.prefill)
    rows = [n for n, _ in first.batched]
    assert rows[0] == 1 and rows[-1] >= 32 and all(rate > 0 for _, rate in first.batched), "to 32 rows on a CPU"
    assert "float32" in first.matmul_gflops

    def measuring(*_):
        raise LookupError("measured again")

    monkeypatch.setattr(profiles, "roof_shapes", measuring)  # from here on, a measurement raises
    assert machine_profile(model, info, verbose=False) is first, "the second call in a process is free"
    saved = list((tmp_path / "profiles").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["model"] == info.name
    monkeypatch.setattr(profiles, "_MEMORY", {})
    assert machine_profile(model, info, verbose=False) == first, "a new process reads the same profile from disk"
    with pytest.raises(LookupError, match="measured again"):
        machine_profile(model, info, refresh=True, verbose=False)
