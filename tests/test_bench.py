"""The full-scale workload's sample: whole batches of every plan, one scaling rule, and a sweep checked against the
loop (notebooks 03 and 04, ``python -m helpers bench``)."""

import numpy as np
import pytest

from helpers.batching import padding_report, plan_batches, score_batched
from helpers.bench import Row, run_benchmark, sample_tickets, scale_to_plan, sweep_rows
from helpers.data import LABELS, make_tickets
from helpers.scoring import LabelScorer

LENGTHS = list(np.random.default_rng(0).integers(20, 400, size=600))


@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16, 32])
def test_the_sample_is_whole_batches_of_every_plan_up_to_its_block(batch_size):
    sample = sample_tickets(LENGTHS, block=32, every=9)
    plan = plan_batches(LENGTHS, "sorted", batch_size)
    batches = {tuple(batch) for batch in plan}
    cut = [tuple(sample[start : start + batch_size]) for start in range(0, len(sample), batch_size)]
    assert all(batch in batches for batch in cut), f"a batch of {batch_size} in the sample is not one of the plan's"
    assert len(sample) == 64, "600 tickets in blocks of 32, every 9th from the 5th: blocks 4 and 13"
    # replanned as score_batched replans it, the sample gives back exactly those batches
    sampled = [LENGTHS[i] for i in sample]
    assert [tuple(sample[j] for j in batch) for batch in plan_batches(sampled, "sorted", batch_size)] == cut


def test_the_sample_reaches_both_ends_of_the_sorted_order_and_every_one_is_all_tickets():
    order = list(np.argsort(-np.asarray(LENGTHS), kind="stable"))
    sample = sample_tickets(LENGTHS, block=16, every=12)
    positions = sorted(order.index(i) for i in sample)
    assert positions[0] < 150 and positions[-1] > 450, f"the sample sits at {positions[0]}-{positions[-1]} of 600"
    assert sorted(sample_tickets(LENGTHS, block=16, every=1)) == list(range(600))
    assert len(sample_tickets(LENGTHS, block=32, every=100)) == 32, "fewer blocks than every: the middle one"
    with pytest.raises(ValueError, match="must be >= 1"):
        sample_tickets(LENGTHS, block=0, every=3)


def test_the_rule_scales_by_padded_tokens_and_is_one_for_the_full_plan():
    sample = sample_tickets(LENGTHS, block=32, every=9)
    assert scale_to_plan(LENGTHS, list(range(600)), "sorted", 8) == pytest.approx(1.0)
    loop = scale_to_plan(LENGTHS, sample, "loop", 1)
    assert loop == pytest.approx(sum(LENGTHS) / sum(LENGTHS[i] for i in sample))
    assert 5 < scale_to_plan(LENGTHS, sample, "sorted", 32) < 15, "about 600 / 64 tickets"


def test_rows_report_the_whole_plans_rate_and_their_spread():
    row = Row("sorted", 8, 600, scale=10.0, sample=list(range(60)), seconds=[2.0, 3.0, 4.0])
    assert row.items_per_s == pytest.approx(600 / 30.0)
    assert row.spread == pytest.approx((600 / 40.0, 600 / 20.0))
    assert "60 of 600 timed" in row.timed and "all 600 timed" in Row("loop", 1, 600, 1.0, list(range(600))).timed
    slower = Row("loop", 1, 600, scale=10.0, sample=[], seconds=[5.0, 6.0])
    assert row.beyond_spread(slower) and not row.beyond_spread(Row("x", 1, 600, 10.0, [], seconds=[3.5, 4.5]))
    assert not row.beyond_spread(Row("x", 1, 600, 10.0, [], seconds=[9.0])), "a single run has no spread"


def test_sweep_rows_run_the_loops_once_and_sorted_batches_at_every_size():
    assert sweep_rows(["loop", "loop_prefix", "sorted_prefix"], [1, 4, 8]) == [
        ("loop", 1),
        ("loop_prefix", 1),
        ("sorted_prefix", 4),
        ("sorted_prefix", 8),
    ]


def test_score_batched_on_the_sample_runs_the_plans_own_batches(tiny_llama):
    model, tokenizer, _ = tiny_llama
    from helpers.data import build_prompt, encode_prompts

    prompts = [build_prompt(tokenizer, text) for text in make_tickets(96, style="article")["text"]]
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    sample = sample_tickets(lengths, block=8, every=4)
    result = score_batched(
        model,
        tokenizer,
        LabelScorer(tokenizer, LABELS),
        [prompts[i] for i in sample],
        "sorted",
        batch_size=4,
        progress=False,
    )
    plan = {tuple(batch) for batch in plan_batches(lengths, "sorted", 4)}
    assert all(tuple(sample[j] for j in batch) in plan for batch in result.info["batches"])


def test_the_bench_sweep_agrees_with_the_loop_on_every_sampled_ticket(tiny_qwen, monkeypatch):
    monkeypatch.setattr("helpers.bench.load_model", lambda *args, **kwargs: tiny_qwen)
    frame = run_benchmark("twin:tiny-qwen2", shots=1, batch_sizes=[1, 4, 8], every=3, repeats=2, n=48, progress=False)
    assert list(frame["strategy"]) == ["loop", "loop_prefix", "sorted", "sorted", "sorted_prefix", "sorted_prefix"]
    assert (frame["agreement"] == 1.0).all() and (frame["max_abs_diff"] <= 1e-3).all(), frame
    assert (frame["items_per_s_min"] <= frame["items_per_s"]).all() and (
        frame["items_per_s"] <= frame["items_per_s_max"]
    ).all()
    assert (frame["sample_tickets"] == 16).all() and frame.loc[0, "speedup_vs_loop"] == 1.0
    for column in (
        "strategy",
        "batch_size",
        "dtype",
        "items_per_s",
        "items_per_s_min",
        "items_per_s_max",
        "n",
        "padding_fraction",
        "shots",
    ):
        assert column in frame, f"runs/benchmark.csv lost its {column} column"
    with pytest.raises(ValueError, match="each divide the largest"):
        run_benchmark("twin:tiny-qwen2", batch_sizes=[1, 3, 8], n=48, progress=False)


def test_lesson_03_writes_out_the_sample_and_the_scale_that_the_package_computes():
    """03's race samples the 600 tickets and scales its seconds in a few plain lines; they must pick and scale as
    04 and the CLI do (``sample_tickets``, ``scale_to_plan``)."""
    import json
    from pathlib import Path

    notebook = next((Path(__file__).parent.parent / "notebooks").glob("03_*.ipynb"))
    cells = [
        "".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"
    ]
    race = next(source for source in cells if "blocks = [order[" in source)
    rule = race[race.index("order =") : race.index("\n", race.index("scale ="))]  # from the sort to the scale
    lengths = np.random.default_rng(0).integers(20, 60, 600).tolist()  # short range: many ties in length
    for block, every in ((32, 9), (8, 75), (32, 1), (16, 18)):
        names = {"np": np, "pool_lengths": lengths, "pool_prompts": lengths, "RACE_BATCH": block, "EVERY": every}
        names.update(padding_report=padding_report, plan_batches=plan_batches)
        exec(rule, names)
        assert names["sample"] == sample_tickets(lengths, block, every), (block, every)
        assert names["scale"]["loop"] == pytest.approx(scale_to_plan(lengths, names["sample"], "loop", 1))
        assert names["scale"]["sorted"] == pytest.approx(scale_to_plan(lengths, names["sample"], "sorted", block))
