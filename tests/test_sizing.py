"""Each lesson's sizing (helpers.sizing): the count and rounds for its budget, derived sizes, and one line when all
is well. A synthetic profile: 10 ms per forward call plus 1 ms per token, so the estimates are easy to reason about."""

import pytest

from helpers.models import ModelInfo
from helpers.sizing import lesson_01, lesson_02, lesson_03, lesson_04
from tests.test_profile import synthetic

REAL = ModelInfo(name="SmolLM2-135M-Instruct (embedded)", source="test", n_params=0, dtype="float32", device="cpu",
                 threads=2)
TWIN = ModelInfo(name="twin:qwen2.5-0.5b", source="test", n_params=0, dtype="float32", device="cpu", threads=2)


@pytest.fixture(scope="module")
def tokenizer(embedded):
    return embedded[1]


def test_lesson_01_keeps_its_accuracy_floor_and_a_twin_gives_way_to_its_minimum(tokenizer):
    profile = synthetic()
    real = lesson_01(tokenizer, profile, REAL, budget_s=1)
    assert real.n == 90 and real.repeats == 2, "accuracy needs 90 tickets, whatever the budget"
    assert (real["generate"], real["probes"]) == (3, 2)
    twin = lesson_01(tokenizer, profile, TWIN, budget_s=1)
    assert twin.n == 3 and "below this lesson's floor of 6" in str(twin) and "random weights" in str(twin)
    assert twin["probes"] == 1 and "1 probe" in str(twin), "below the floor, the checks run on one probe"
    roomy = lesson_01(tokenizer, profile, REAL, budget_s=10_000)
    assert roomy.n > 90 and roomy.repeats == 3 and len(roomy.lines) == 1, str(roomy)
    assert f"{roomy['generate']} for the generate-vs-score race" in str(roomy)


def test_lesson_02_and_03_derive_their_sweeps_from_the_count(tokenizer):
    profile = synthetic()
    two = lesson_02(tokenizer, profile, REAL, budget_s=10_000)
    assert two["scaling"] == max(4, two.n // 2) and len(two.lines) == 1
    assert lesson_02(tokenizer, profile, REAL, budget_s=0.1).n == 3
    three = lesson_03(tokenizer, profile, REAL, budget_s=10_000)
    assert three["batch_size"] == min(16, three.n // 4) and all(b <= three.n // 4 for b in three["batch_sizes"])
    assert len(three["pool_lengths"]) == 600 and len(three.lines) == 1, str(three)
    explicit = lesson_03(tokenizer, profile, REAL, budget_s=0.1, n=6, batch_size=3)
    assert (explicit.n, explicit["batch_size"]) == (6, 3) and "set explicitly" in str(explicit)


def test_lesson_04_drops_half_precision_then_shrinks_the_sweep_and_clamps_others_at(tokenizer):
    profile = synthetic()
    strategies = ["generate", "loop", "loop_prefix", "arbitrary", "sorted", "sorted_prefix"]
    roomy = lesson_04(tokenizer, profile, REAL, 10_000, ["float32", "bfloat16"], strategies=strategies)
    assert roomy["dtypes"] == ["float32", "bfloat16"] and roomy["batch_sizes"] == [2, 4, 8, 16, 32]
    assert len(roomy.lines) == 1 and "arbitrary at 8" in str(roomy), str(roomy)
    tight = lesson_04(tokenizer, profile, REAL, 0.1, ["float32", "bfloat16"], strategies=strategies)
    assert tight["dtypes"] == ["float32"] and tight["skipped"] and "bfloat16 skipped" in str(tight)
    assert tight.n == 4 and tight["batch_sizes"] == [2, 3, 4] and tight["others_at"] == 4
    assert "arbitrary order left out where a batch holds all 4" in str(tight) and "arbitrary at" not in str(tight)
    budget = lesson_04(tokenizer, profile, REAL, 0.1, ["float32"], strategies=[*strategies, "token_budget"])
    assert "OTHERS_AT 8 -> 4" in str(budget) and "token_budget at 4" in str(budget), "token budgets still run at 4"
    named = lesson_04(tokenizer, profile, REAL, 0.1, ["float32", "bfloat16"], strategies=strategies, dtypes_named=True,
                      batch_sizes=[2, 4], others_at=2)
    assert named["dtypes"] == ["float32", "bfloat16"] and named.n == 4, "named dtypes and sizes never give way"
