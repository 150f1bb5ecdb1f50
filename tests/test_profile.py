"""The machine profile: measured once, cached, read correctly, and used to size work and pick dtypes."""

import json

import pytest

from helpers import profile as profiles
from helpers.sizing import PlannedRun, estimate_runs, fit_to_budget, size_to_budget
from helpers.profile import CallCost, MachineProfile, machine_profile


def synthetic(bf16: float = 400.0, fp32: float = 120.0, per_key: float = 0.0) -> MachineProfile:
    """A profile with round numbers: 10 ms per call plus 1 ms per token (plus ``per_key`` seconds per attended key),
    for single sequences up to 256 tokens and batches of 1-32 rows of 96 tokens."""
    cost = CallCost(0.01, 0.001, per_key)
    prefill = [(n, n / cost.seconds(1, n)) for n in (1, 4, 16, 64, 256)]
    batched = [(rows, rows * 96 / cost.seconds(rows, 96)) for rows in (1, 2, 4, 8, 16, 32)]
    return MachineProfile(machine="cpu: test", torch="0", model="test", dtype="float32", device="cpu", threads=2,
                          matmul_gflops={"float32": fp32, "bfloat16": bf16}, prefill=prefill, decode={1: 50.0, 32: 800.0},
                          batched=batched)


def test_the_curve_is_read_between_and_beyond_its_points():
    profile = synthetic()
    assert profile.tokens_per_s(16) == pytest.approx(16 / 0.026)
    assert profile.tokens_per_s(4) < profile.tokens_per_s(10) < profile.tokens_per_s(16)
    assert profile.tokens_per_s(4096) == pytest.approx(profile.tokens_per_s(256)), "flat past the last measured point"
    assert profile.forward_seconds(0.5) == pytest.approx(profile.forward_seconds(1)), "a call costs at least one token's call"
    assert profile.saturation_tokens == 256 and profile.peak_tokens_per_s == pytest.approx(256 / 0.266)


def test_the_cost_model_recovers_a_calls_costs_from_the_profile_and_prices_rows_apart_from_one_long_sequence():
    profile = synthetic(per_key=2e-6)
    fitted = profile.call_cost
    assert fitted.per_call == pytest.approx(0.01, rel=1e-6) and fitted.per_token == pytest.approx(0.001, rel=1e-6)
    assert fitted.per_key == pytest.approx(2e-6, rel=1e-6)
    # 32 rows of 96 tokens and one sequence of 3072: the same tokens, but the long one attends over all of them
    assert profile.call_seconds(32, 96) < profile.call_seconds(1, 32 * 96)
    # a cached prefix is attended by every row: it costs keys, not tokens
    assert profile.call_seconds(8, 50, past=200) - profile.call_seconds(8, 50) == pytest.approx(2e-6 * 8 * 50 * 200)
    flat = synthetic()
    assert flat.call_cost.per_key == 0, "no cost is negative: a term the calls do not need is left at 0"


def test_the_batched_curve_says_what_batching_can_gain_and_where_it_flattens():
    profile = synthetic()
    # 10 ms per call shared by the rows: 96 tokens cost 0.106 s alone, 32 rows 3.082 s
    assert profile.batching_gain(32) == pytest.approx(0.106 * 32 / 3.082)
    assert profile.batching_gain(1) == 1.0
    assert profile.batch_knee == min(rows for rows, rate in profile.batched if rate >= 0.9 * profile.batched[-1][1])
    assert profile.batched_tokens_per_s(64) == pytest.approx(profile.batched_tokens_per_s(32)), "flat past the last point"
    assert "batched rows of 96 tokens: 1 rows" in profile.summary() and "batched rows of 96 tokens" in profile.caption()


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
    monkeypatch.setattr(profiles, "batched_curve", lambda model: [(1, 10.0), (2, 15.0)])
    monkeypatch.setattr(profiles, "decode_step_tokens_per_s", lambda model, batch: 1.0)
    probed = []
    monkeypatch.setattr(profiles, "half_precision_finite", lambda model, dtype: probed.append(dtype) or dtype != "bfloat16")
    bars = []
    monkeypatch.setattr(profiles, "matmul_gflops", lambda device, dtype, shape, slow=None: bars.append(slow) or
                        {"float32": 100.0, "bfloat16": 80.0}[str(dtype)[6:]])
    model, _, info = embedded
    measured = machine_profile(model, info, refresh=True, verbose=False)
    assert list(measured.matmul_gflops) == ["float32", "bfloat16"], "a CPU measures float32 and bfloat16, not float16"
    assert measured.batched == [(1, 10.0), (2, 15.0)]
    assert bars == [None, 100.0 * profiles.SLOW_DTYPE_RATIO / 4], "float32 in full; the others answered early if far slower"
    assert probed == ["bfloat16"] and measured.finite == {"bfloat16": False}, "a fast half dtype is probed once"
    chosen, lines = measured.choose_dtypes(None)
    assert chosen == ["float32"] and "non-finite logits" in lines[0], "one that overflows is never chosen"
    assert measured.choose_dtypes(["float32", "bfloat16"])[0] == ["float32"], "not even when named: it would score NaN"


def test_half_precision_is_priced_with_its_arithmetic_faster_and_its_per_call_cost_as_measured():
    """Small calls on a GPU are launch-bound: about as long in any dtype, so only the arithmetic scales."""
    profile = synthetic(bf16=480.0, fp32=120.0)
    half = profile.in_dtype("bfloat16")
    assert half.call_cost.per_call == profile.call_cost.per_call
    assert half.call_cost.per_token == pytest.approx(profile.call_cost.per_token / 4)
    assert half.call_seconds(1, 1) > profile.call_seconds(1, 1) / 4, "a one-token call is mostly its fixed cost"
    assert profile.in_dtype("float32") is profile and profile.call_cost.per_token == pytest.approx(0.001)


def test_a_curve_still_climbing_at_its_last_point_says_so():
    profile = synthetic()
    assert not profile.prefill_saturated and "(not saturated at 256)" in profile.caption()
    flat = MachineProfile(machine="cpu: test", torch="0", model="test", dtype="float32", device="cpu", threads=2,
                          matmul_gflops={"float32": 1.0}, prefill=[(64, 100.0), (128, 101.0), (256, 102.0)],
                          decode={1: 1.0})
    assert flat.prefill_saturated and "not saturated" not in flat.caption()


def test_a_dtype_far_below_float32_is_answered_by_its_first_call():
    """bfloat16 without bf16 instructions takes seconds per call: one call says it is skipped anyway."""
    import torch

    quick = profiles.matmul_gflops("cpu", torch.float32, (64, 64, 64), slow=1e9)
    assert quick is not None and quick < 1e9, "below the slow bar: the first call's rate, no blocks timed"


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
    rows = [n for n, _ in first.batched]
    assert rows[0] == 1 and rows[-1] >= 32 and all(rate > 0 for _, rate in first.batched), "to 32 rows on a CPU"
    assert set(first.decode) == {1, 32} and "float32" in first.matmul_gflops
    assert machine_profile(model, info, verbose=False) is first, "the second call in a process is free"
    saved = list((tmp_path / "profiles").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["model"] == info.name
    monkeypatch.setattr(profiles, "_MEMORY", {})
    assert machine_profile(model, info, verbose=False) == first, "a new process reads the same profile from disk"
    assert machine_profile(model, info, refresh=True, verbose=False) is not first
