"""Sizing from the cost record (helpers.costs, helpers.sizing): a lesson's seconds are its recorded forward calls
priced on a profile; the count, rounds and plans follow from them, one line per decision. A synthetic profile: 10 ms
per forward call plus 1 ms per token, so the estimates are easy to reason about."""

import copy

import pytest

from helpers import costs
from helpers.lessons import COMMON, DEFAULTS
from helpers.models import ModelInfo
from helpers.rows import race_rows
from helpers.sizing import size_lesson
from tests.test_profile import synthetic

REAL = ModelInfo(name="SmolLM2-135M-Instruct (embedded)", source="test", n_params=0, dtype="float32", device="cpu",
                 threads=2)
TWIN = ModelInfo(name="twin:qwen2.5-0.5b", source="test", n_params=0, dtype="float32", device="cpu", threads=2)


@pytest.fixture(scope="module")
def tokenizer(embedded):
    return embedded[1]


def run(n, calls, repeats=1, plan=None):
    """A recorded run: cells of [rows, width, cached, in a round, count]."""
    cells = {"0": {"source": "x", "plan": False, "calls": calls}}
    if plan:
        cells["1"] = {"source": "race", "plan": True, "calls": plan}
    return {"params": {"N_TICKETS": n, "REPEATS": repeats}, "cells": cells}


def test_a_lesson_costs_a_fixed_part_a_part_per_ticket_and_its_rounds():
    profile = synthetic()  # 10 ms per call + 1 ms per token
    record = {"version": 1, "calibration_tokens": 100.0, "lessons": {"99": {
        # 2 fixed calls of 90 tokens; one call of 40 tokens per ticket; a timed round of one 10-token call per ticket
        "a": run(4, [[1, 90, 0, 0, 2], [1, 40, 0, 0, 4], [1, 10, 0, 1, 4 * 3]], repeats=3),
        "b": run(8, [[1, 90, 0, 0, 2], [1, 40, 0, 0, 8], [1, 10, 0, 1, 8 * 3]], repeats=3)}}}
    cost = costs.lesson_cost("99", profile, record=record)
    assert cost.fixed == pytest.approx(2 * 0.1) and cost.per_ticket == pytest.approx(0.05)
    assert cost.round_fixed == pytest.approx(0, abs=1e-12) and cost.round_per_ticket == pytest.approx(0.02)
    assert cost.seconds(100, rounds=2) == pytest.approx(0.2 + 100 * 0.05 + 2 * 100 * 0.02)


def test_a_plan_cell_is_priced_as_its_plan_times_the_recorded_factor():
    profile = synthetic()
    plan_calls = [[4, 50, 0, 1, 6]]  # what the plan cell ran: 6 calls, 4 rows of 50 tokens
    record = {"version": 1, "calibration_tokens": 100.0, "lessons": {"99": {"a": run(4, [[1, 10, 0, 0, 1]], plan=plan_calls)}}}
    recorded = costs.priced(plan_calls, profile)
    cost = costs.lesson_cost("99", profile, record=record, plan_price=lambda params: recorded / 2)
    assert cost.plan_factor == pytest.approx(2.0), "warm-ups and references around the plan's timed batches"
    assert cost.seconds(plan_s=10) == pytest.approx(0.02 + 20)


def test_another_tokenizer_scales_every_recorded_token_count(tokenizer):
    profile = synthetic()
    record = {"version": 1, "calibration_tokens": costs.calibration_tokens(tokenizer) / 2,
              "lessons": {"99": {"a": run(1, [[1, 100, 0, 0, 1]])}}}
    assert costs.lesson_cost("99", profile, tokenizer, record=record).fixed == pytest.approx(0.01 + 0.2)


def test_a_pass_added_to_a_notebook_differs_from_its_record_and_names_the_cell():
    recorded = costs.load_record()["lessons"]["02"]["test"]["cells"]
    assert not costs.differences("02", recorded), "a run identical to the record"
    added = copy.deepcopy(recorded)
    cell = next(iter(added))
    added[cell]["calls"] = sorted(added[cell]["calls"] + [[1, 57, 0, 0, 1]])
    changed = costs.differences("02", added)
    assert len(changed) == 1 and changed[0].startswith(f"cell {cell} (") and "forward calls over prompts" in changed[0]
    fewer_steps = copy.deepcopy(recorded)
    fewer_steps["99"] = {"source": "new cell", "plan": False, "calls": [[1, 12, 0, 0, 1]]}
    assert "makes forward calls now, unlike the record" in costs.differences("02", fewer_steps)[0]


def sized(lesson, tokenizer, info=REAL, budget=10_000, **given):
    settings = {**COMMON, **DEFAULTS[lesson], "TIME_BUDGET_S": budget, **given}
    return size_lesson(lesson, settings, {**COMMON, **DEFAULTS[lesson]}, tokenizer, synthetic(), info)


def test_lesson_01_keeps_its_accuracy_floor_and_a_twin_gives_way_to_its_minimum(tokenizer):
    values, lines = sized("01", tokenizer, budget=1)
    assert values["N_TICKETS"] == 90 and values["REPEATS"] == 2, "accuracy needs 90 tickets, whatever the budget"
    values, lines = sized("01", tokenizer, TWIN, budget=0.5)
    assert values["N_TICKETS"] == 3 and values["N_PROBES"] == 1, lines
    assert "random weights" in lines[0] and "below this lesson's floor of 6" in " ".join(lines)
    values, lines = sized("01", tokenizer)
    assert values["N_TICKETS"] == 300 and values["REPEATS"] == 3 and len(lines) == 1, lines
    values, lines = sized("01", tokenizer, budget=1, N_TICKETS=12)
    assert values["N_TICKETS"] == 12 and "12 tickets: set explicitly (estimated" in lines[0]
    _, lines = sized("01", tokenizer, budget=1, N_TICKETS=90, _preset={"MODEL", "N_TICKETS"})
    assert "90 tickets: set by the workshop preset, whatever TIME_BUDGET_S" in lines[0]


def test_lesson_02_and_03_derive_their_sizes_from_the_count_and_the_race_from_its_plan(tokenizer):
    values, lines = sized("02", tokenizer)
    assert values["N_SCALING"] == max(4, values["N_TICKETS"] // 2) and len(lines) == 1
    assert sized("02", tokenizer, budget=0.01)[0]["N_TICKETS"] == 3
    values, lines = sized("03", tokenizer)
    assert values["RACE_BATCH"] == 32 and values["BATCH_SIZE"] == min(16, values["N_TICKETS"] // 4), lines
    values, lines = sized("03", tokenizer, budget=0.01)
    assert values["RACE_BATCH"] == 4 and "batch 32 would need" in " ".join(lines), "the race gives way to smaller batches"
    assert values["ARTICLE_BATCH"] is None and values["TICKETS_PER_POINT"] == 4, lines
    values, _ = sized("03", tokenizer, budget=0.01, N_TICKETS=6, BATCH_SIZE=3, RACE_BATCH=8)
    assert (values["N_TICKETS"], values["BATCH_SIZE"], values["RACE_BATCH"]) == (6, 3, 8)
    assert race_rows(8) == {"loop": ("loop", 1), "arbitrary": ("arbitrary", 8), "sorted": ("sorted", 8),
                            "token_budget": ("token_budget", 8), "sorted, 32": ("sorted", 32)}


def test_lesson_04_buys_points_of_the_sweep_half_precision_first_then_the_costliest_points(tokenizer):
    roomy, lines = sized("04", tokenizer)
    assert roomy["DTYPES"] == ["float32", "bfloat16"] and roomy["BATCH_SIZES"] == [1, 2, 4, 8, 16, 32], lines
    assert "within the 10000 s budget" in lines[-1] and ("loop_prefix", 1) in roomy["rows"]
    tight, lines = sized("04", tokenizer, budget=1)
    assert tight["DTYPES"] == ["float32"] and "bfloat16 skipped" in lines[0]
    assert all(size <= 4 for _, size in tight["rows"]) and "left out: " in lines[-1], "the costliest points went"
    assert tight["TICKETS_PER_POINT"] == 4 and "4 tickets per point instead of 8" in lines[-1]
    named, _ = sized("04", tokenizer, budget=0.1, DTYPES=["float32", "bfloat16"], BATCH_SIZES=[1, 2])
    assert named["DTYPES"] == ["float32", "bfloat16"] and named["BATCH_SIZES"] == [1, 2], "named never give way"


def test_full_scale_runs_every_ticket_and_every_batch_and_a_twin_races_no_more_tickets_than_it_has(tokenizer):
    one, _ = sized("01", tokenizer, FULL_SCALE=True)
    assert one["N_TICKETS"] == one["N_GENERATE"] == 600
    two, _ = sized("02", tokenizer, FULL_SCALE=True)
    assert two["N_TICKETS"] == two["N_SCALING"] == 600
    three, _ = sized("03", tokenizer, budget=1, FULL_SCALE=True)
    assert three["RACE_BATCH"] == 32 and three["TICKETS_PER_POINT"] is None, "the article's batch, every batch"
    twin, _ = sized("01", tokenizer, TWIN, budget=0.5)
    assert twin["N_GENERATE"] <= twin["N_TICKETS"] == 3
