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
    assert two["scaling"] == max(4, two.n // 2) and len(two.lines) == 2 - 1
    assert lesson_02(tokenizer, profile, REAL, budget_s=0.1).n == 3
    three = lesson_03(tokenizer, profile, REAL, budget_s=10_000)
    assert three["batch_size"] == min(16, three.n // 4) and three["race_batch"] == 32, "a roomy budget races at 32"
    assert len(three["pool_lengths"]) == 600 and "the race at batch 32" in str(three), str(three)
    explicit = lesson_03(tokenizer, profile, REAL, budget_s=0.1, n=6, batch_size=3, race_batch=8)
    assert (explicit.n, explicit["batch_size"], explicit["race_batch"]) == (6, 3, 8) and "set explicitly" in str(explicit)
    tight = lesson_03(tokenizer, profile, REAL, budget_s=0.1)
    assert tight["race_batch"] == 4 and "batch 32 would need" in str(tight), "the race gives way to smaller batches"


def test_lesson_03s_race_draws_every_strategy_and_the_articles_size_where_it_races_smaller():
    from helpers.sizing import race_rows

    assert race_rows(8) == {"loop": ("loop", 1), "arbitrary": ("arbitrary", 8), "sorted": ("sorted", 8),
                            "token_budget": ("token_budget", 8), "sorted, 32": ("sorted", 32)}
    assert "sorted, 32" not in race_rows(32) and "sorted, 32" not in race_rows(8, None)


STRATEGIES = ["loop", "loop_prefix", "arbitrary", "sorted", "sorted_prefix"]


def test_lesson_04_buys_points_of_the_sweep_half_precision_first_then_the_costliest_points(tokenizer):
    profile = synthetic()
    roomy = lesson_04(tokenizer, profile, REAL, 10_000, ["float32", "bfloat16"], strategies=STRATEGIES)
    assert roomy["dtypes"] == ["float32", "bfloat16"] and roomy["batch_sizes"] == [1, 2, 4, 8, 16, 32]
    assert len(roomy.lines) == 1 and "within the 10000 s budget" in str(roomy), str(roomy)
    assert ("arbitrary", 8) in roomy["rows"] and ("loop_prefix", 1) in roomy["rows"]
    tight = lesson_04(tokenizer, profile, REAL, 1, ["float32", "bfloat16"], strategies=STRATEGIES)
    assert tight["dtypes"] == ["float32"] and tight["skipped"] and "bfloat16 skipped" in str(tight)
    assert all(size <= 4 for _, size in tight["rows"]) and "left out: " in str(tight), "the costliest points went"
    assert {("loop", 1), ("loop_prefix", 1), ("sorted", 2), ("sorted_prefix", 4)} <= set(tight["rows"])
    assert tight["per_point"] == 4 and "4 tickets per point instead of 8" in str(tight), str(tight)
    # between the two: some points bought, the costliest left out first
    middle = lesson_04(tokenizer, profile, REAL, 40, ["float32"], strategies=STRATEGIES)
    kept = set(middle["rows"])
    assert ("sorted", 32) not in kept or ("sorted_prefix", 32) in kept, "rows without the cache cost more per point"
    named = lesson_04(tokenizer, profile, REAL, 0.1, ["float32", "bfloat16"], strategies=STRATEGIES, dtypes_named=True,
                      batch_sizes=[1, 2])
    assert named["dtypes"] == ["float32", "bfloat16"] and named["batch_sizes"] == [1, 2, 8], "named never give way"
    assert lesson_04(tokenizer, profile, REAL, 10, ["bfloat16"], strategies=STRATEGIES)["dtypes"][0] == "float32", \
        "float32 always runs first: its loop is the reference"
