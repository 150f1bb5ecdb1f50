"""The machine profile: measured once, cached, read correctly, and used to size work and pick dtypes."""

import json

import pytest

from helpers import profile as profiles
from helpers.profile import (
    MachineProfile,
    PlannedRun,
    estimate_runs,
    fit_to_budget,
    machine_profile,
    size_to_budget,
)


def synthetic(bf16: float = 400.0, fp32: float = 120.0) -> MachineProfile:
    """A profile with round numbers: 10 ms per call plus 1 ms per token up to 256 tokens, flat after."""
    prefill = [(n, n / (0.01 + 0.001 * n)) for n in (1, 4, 16, 64, 256)]
    return MachineProfile(machine="cpu: test", torch="0", model="test", dtype="float32", device="cpu", threads=2,
                          matmul_gflops={"float32": fp32, "bfloat16": bf16}, prefill=prefill, decode={1: 50.0, 32: 800.0})


def test_the_curve_is_read_between_and_beyond_its_points():
    profile = synthetic()
    assert profile.tokens_per_s(16) == pytest.approx(16 / 0.026)
    assert profile.tokens_per_s(4) < profile.tokens_per_s(10) < profile.tokens_per_s(16)
    assert profile.tokens_per_s(4096) == pytest.approx(profile.tokens_per_s(256)), "flat past the last measured point"
    assert profile.forward_seconds(0.5) == pytest.approx(profile.forward_seconds(1)), "a call costs at least one token's call"
    assert profile.saturation_tokens == 256 and profile.peak_tokens_per_s == pytest.approx(256 / 0.266)


def test_a_dtype_below_half_of_float32_is_skipped_unless_asked_for():
    slow = synthetic(bf16=1.8, fp32=124.0)
    chosen, lines = slow.choose_dtypes(None)
    assert chosen == ["float32"]
    assert lines == ["bfloat16 skipped: its matmul runs at 1.8 GFLOP/s here against 124 for float32 (below half); "
                     "ask for it explicitly to run it anyway"]
    assert slow.choose_dtypes(["float32", "bfloat16"]) == (["float32", "bfloat16"], [])
    assert synthetic(bf16=70.0, fp32=124.0).choose_dtypes(None)[0] == ["float32", "bfloat16"], "0.56x is kept"


def test_a_gpu_profile_keeps_its_fast_half_precision_dtypes():
    # A T4: the profile measured float32 and float16 only (bfloat16 is no candidate below compute capability 8.0).
    t4 = MachineProfile(machine="cuda: Tesla T4", torch="0", model="test", dtype="float32", device="cuda", threads=2,
                        matmul_gflops={"float32": 7000.0, "float16": 40000.0}, prefill=[(1, 10.0)], decode={1: 1.0})
    assert t4.choose_dtypes(None) == (["float32", "float16"], [])
    # Apple MPS where bfloat16 measured slow: float16 kept, bfloat16 dropped with its line.
    mps = MachineProfile(machine="mps: Apple arm64", torch="0", model="test", dtype="float32", device="mps", threads=8,
                         matmul_gflops={"float32": 3000.0, "float16": 5000.0, "bfloat16": 900.0}, prefill=[(1, 10.0)],
                         decode={1: 1.0})
    chosen, lines = mps.choose_dtypes(None)
    assert chosen == ["float32", "float16"] and len(lines) == 1 and lines[0].startswith("bfloat16 skipped")


def test_the_profile_measures_the_candidates_of_its_device(embedded, tmp_path, monkeypatch):
    monkeypatch.setenv("SLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profiles, "prefill_curve", lambda model: [(1, 10.0), (4, 30.0)])  # the matmuls are what matter here
    monkeypatch.setattr(profiles, "decode_step_tokens_per_s", lambda model, batch: 1.0)
    monkeypatch.setattr(profiles, "matmul_gflops", lambda device, dtype, shape: {"float32": 100.0, "bfloat16": 80.0}[str(dtype)[6:]])
    model, _, info = embedded
    measured = machine_profile(model, info, refresh=True, verbose=False)
    assert list(measured.matmul_gflops) == ["float32", "bfloat16"], "a CPU measures float32 and bfloat16, not float16"


def test_sizing_takes_the_largest_count_within_the_budget_with_floor_cap_and_override():
    cost = lambda n: 2.0 + 0.5 * n  # noqa: E731
    assert size_to_budget(30, cost, floor=4, cap=600)[0] == 56
    n, why = size_to_budget(1, cost, floor=4, cap=600)
    assert n == 4 and "the fewest that keep the lesson visible" in why and "over the 1 s budget" in why
    assert size_to_budget(10_000, cost, floor=4, cap=600)[0] == 600
    n, why = size_to_budget(1, cost, floor=4, cap=600, explicit=24)
    assert n == 24 and "set explicitly" in why


def test_a_lesson_fits_its_budget_with_fewer_rounds_then_fewer_tickets_and_says_so():
    cost = lambda n, repeats: n * repeats  # noqa: E731
    within = fit_to_budget(100, cost, floor=4, cap=600, minimum=2, repeats=3)
    assert (within.n, within.repeats) == (33, 3) and len(within.lines) == 1 and "within the 100 s budget" in str(within)
    # The floor with 3 rounds (24 s) is over the 20 s budget: 2 rounds; 16 s then fit, and the count grows to 10.
    rounds = fit_to_budget(20, cost, floor=8, cap=600, minimum=2, repeats=3)
    assert (rounds.n, rounds.repeats) == (10, 2) and "2 timed rounds instead of 3" in rounds.lines[0]
    # Within 1.5x the budget the floor is kept (and said to be over); beyond, the count gives way to fit the budget.
    kept = fit_to_budget(12, cost, floor=8, cap=600, minimum=2, repeats=2)
    assert kept.n == 8 and "over the 12 s budget" in str(kept)
    shrunk = fit_to_budget(6, cost, floor=8, cap=600, minimum=2, repeats=2)
    assert shrunk.n == 3 and "below this lesson's floor of 8" in str(shrunk) and "N_TICKETS = 8" in str(shrunk)
    assert fit_to_budget(1, cost, floor=8, cap=600, minimum=3, repeats=2).n == 3  # never below the minimum
    assert fit_to_budget(6, cost, floor=8, cap=600, repeats=2).n == 8  # no minimum: the floor never gives way
    explicit = fit_to_budget(1, cost, floor=8, cap=600, minimum=2, explicit=50, repeats=3)
    assert (explicit.n, explicit.repeats) == (50, 3) and "set explicitly" in str(explicit)
    assert fit_to_budget(1, lambda n: n, floor=8, cap=600, minimum=2).n == 2  # an estimate of the count alone


def test_estimates_charge_padding_and_per_call_costs():
    profile = synthetic()
    lengths = [4, 256, 4, 256, 16, 64, 16, 64]  # measured points: the estimate is exact there
    loop = estimate_runs(profile, [PlannedRun(lengths)])
    assert loop == pytest.approx(sum(0.01 + 0.001 * n for n in lengths))
    arbitrary = estimate_runs(profile, [PlannedRun(lengths, "arbitrary", 2)])
    ordered = estimate_runs(profile, [PlannedRun(lengths, "sorted", 2)])
    assert ordered < arbitrary, "sorted batches pad less, so they must be estimated cheaper"
    with_labels = estimate_runs(profile, [PlannedRun(lengths, continuation=1)])
    # Label continuations ride in the same call: a token more per row, never another call's fixed cost.
    assert loop < with_labels < loop + len(lengths) * 0.01 / 2
    generated = estimate_runs(profile, [PlannedRun(lengths, new_tokens=5)])
    assert generated == pytest.approx(loop + len(lengths) * 4 / 50.0)


def test_a_profile_is_measured_once_then_read_from_memory_and_disk(tiny_qwen, tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(profiles, "_MEMORY", {})
    model, _, info = tiny_qwen
    first = machine_profile(model, info, verbose=False)
    sizes = [n for n, _ in first.prefill]
    assert sizes == sorted(sizes) and sizes[0] == 1 and all(rate > 0 for _, rate in first.prefill)
    assert set(first.decode) == {1, 32} and "float32" in first.matmul_gflops
    assert machine_profile(model, info, verbose=False) is first, "the second call in a process is free"
    saved = list((tmp_path / "profiles").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["model"] == info.name
    monkeypatch.setattr(profiles, "_MEMORY", {})
    assert machine_profile(model, info, verbose=False) == first, "a new process reads the same profile from disk"
    assert machine_profile(model, info, refresh=True, verbose=False) is not first
