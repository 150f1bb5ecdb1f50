"""Figures: each saves a PNG whose title is computed from the numbers it plots."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from helpers.drawings import plot_prompt_split
from helpers.models import ModelInfo
from helpers.plots import plot_prompt_lengths, plot_speedup_vs_prefix
from helpers.timing import NO_VERDICT

INFO = ModelInfo(name="test-model", source="synthetic", n_params=0, dtype="float32", device="cpu", threads=2)


def title_of(fig) -> str:
    """The axes title with set_title's line wrapping undone."""
    return " ".join(fig.axes[0].get_title().split())


# --- notebook 02: the prompt split ---


def test_prompt_split_saves_a_figure_whose_title_names_the_prefix_and_its_share(tmp_path):
    # 2 prompts of a 100-token prefix and 50 / 150 ticket tokens: the prefix is 200 of 400 prompt tokens.
    fig, path = plot_prompt_split(100, [50, 150], 2, INFO, path=tmp_path / "split.png")
    plt.close(fig)
    assert path == tmp_path / "split.png" and path.stat().st_size > 0, "the figure was not saved where asked"
    title = title_of(fig)
    assert "The prefix is 100 tokens, 50% of these 2 prompts' tokens" in title, title
    assert "2 label tokens" in title, f"the title should name the label tokens scored after the ticket: {title}"


def test_prompt_split_leaves_the_label_part_out_when_no_label_tokens_follow(tmp_path):
    fig, _ = plot_prompt_split(30, [10, 20, 30, 90], 0, INFO, path=tmp_path / "split.png")
    plt.close(fig)
    title = title_of(fig)
    assert "30 tokens, 44% of these 4 prompts' tokens" in title, title  # 120 / 270
    assert "label" not in title, title
    assert len(fig.axes[0].patches) == 8, "two segments (prefix, ticket) per prompt when no label tokens follow"


@pytest.mark.parametrize(
    "prefix, tickets, labels, message",
    [
        (100, [], 1, "at least one ticket"),
        (0, [10], 1, "must be positive"),
        (100, [10, 0], 1, "must be positive"),
        (100, [10], -1, "must be positive"),
    ],
)
def test_prompt_split_refuses_impossible_token_counts(tmp_path, prefix, tickets, labels, message):
    with pytest.raises(ValueError, match=message):
        plot_prompt_split(prefix, tickets, labels, INFO, path=tmp_path / "split.png")


# --- notebook 02: measured against ideal speedup ---


def speedups(**extra) -> pd.DataFrame:
    # Shares 50 % and 75 %: ideal 2x and 4x; measured 1.5x (75 % of it) and 2x (50 % of it).
    return pd.DataFrame(
        {"shots": [6, 0], "prefix_tokens": [300, 100], "prefix_share": [0.75, 0.5], "speedup": [2.0, 1.5], **extra}
    )


def test_speedup_figure_title_says_how_much_of_the_ideal_was_reached(tmp_path):
    fig, path = plot_speedup_vs_prefix(speedups(), INFO, path=tmp_path / "speedup.png")
    plt.close(fig)
    assert path.stat().st_size > 0
    title = title_of(fig)
    assert "reached 50–75% of the ideal speedup" in title, title
    assert "1.50x at 50% prefix share, 2.00x at 75%" in title, f"the ends should be in share order: {title}"


def test_speedup_figure_uses_the_given_ideal(tmp_path):
    frame = speedups(ideal_speedup=[2.5, 3.0])  # 2.0 / 2.5 = 80 %, 1.5 / 3 = 50 %
    fig, _ = plot_speedup_vs_prefix(frame, INFO, path=tmp_path / "speedup.png")
    plt.close(fig)
    assert "reached 50–80% of the ideal" in title_of(fig), title_of(fig)


def test_speedup_figure_names_a_single_fraction_when_every_point_reached_the_same(tmp_path):
    frame = pd.DataFrame({"shots": [0], "prefix_tokens": [100], "prefix_share": [0.5], "speedup": [1.8]})
    fig, _ = plot_speedup_vs_prefix(frame, INFO, path=tmp_path / "speedup.png")
    plt.close(fig)
    assert "reached 90% of the ideal speedup" in title_of(fig), title_of(fig)


# --- notebook 00: the prompt-length histogram ---


def test_saves_a_png_whose_title_names_median_max_and_padding_factor(tmp_path):
    lengths = [40, 50, 50, 60, 61, 70, 300]  # median 60, max 300; padding all to 300 processes 7 * 300 / 631
    fig, path = plot_prompt_lengths(lengths, INFO, path=tmp_path / "lengths.png")
    title = " ".join(fig.axes[0].get_title().split())
    plt.close(fig)
    assert path == tmp_path / "lengths.png" and path.stat().st_size > 0, "no PNG written"
    assert "median 60" in title and "max 300 tokens" in title, title
    assert f"{7 * 300 / 631:.1f}x" in title, title
    assert "7 tickets" in title, title


def test_marks_median_and_max_with_labelled_lines(tmp_path):
    fig, _ = plot_prompt_lengths([10, 20, 30, 40, 200], INFO, path=tmp_path / "lengths.png")
    ax = fig.axes[0]
    marked = sorted(line.get_xdata()[0] for line in ax.get_lines())
    labels = sorted(text.get_text() for text in ax.texts)
    plt.close(fig)
    assert marked == [30, 200], marked
    assert labels == ["max 200", "median 30"], labels


def test_every_prompt_falls_in_a_bar_even_the_longest(tmp_path):
    lengths = [12, 13, 90, 451]
    fig, _ = plot_prompt_lengths(lengths, INFO, path=tmp_path / "lengths.png")
    heights = [patch.get_height() for patch in fig.axes[0].patches]
    plt.close(fig)
    assert sum(heights) == len(lengths), heights


@pytest.mark.parametrize("bad", [[], [10, 0, 30], [[1, 2], [3, 4]]])
def test_bad_lengths_are_refused_with_one_line(tmp_path, bad):
    with pytest.raises(ValueError, match="plot_prompt_lengths"):
        plot_prompt_lengths(bad, INFO, path=tmp_path / "lengths.png")


def _bench_rows():
    rows = []
    for strategy, loop, rates in (
        ("sorted", "loop", [1.5, 2.0, 3.0, 4.0, 4.2, 4.3]),
        ("sorted_prefix", "loop_prefix", [2.0, 3.0, 5.0, 7.0, 8.0, 8.1]),
    ):
        for size, rate in zip([1, 2, 4, 8, 16, 32], rates):
            rows.append(
                {
                    "strategy": loop if size == 1 else strategy,
                    "batch_size": size,
                    "items_per_s": rate,
                    "items_per_s_min": rate * 0.95,
                    "items_per_s_max": rate * 1.05,
                    "tokens_per_s": 100 * rate,
                    "padding_fraction": 0.002 * size,
                    "plan_padding": 0.003 * size,
                    "predicted_items_per_s": rate,
                }
            )
    rows.append(
        {
            "strategy": "arbitrary",
            "batch_size": 8,
            "items_per_s": 1.0,
            "items_per_s_min": 0.9,
            "items_per_s_max": 1.1,
            "tokens_per_s": 60.0,
            "padding_fraction": 0.5,
            "plan_padding": 0.45,
        }
    )
    frame = pd.DataFrame(rows).assign(
        dtype="float32", model="m", timing_only=False, device="cpu", threads=2, n=600, shots=3, repeats=2
    )
    return frame.assign(prefix=frame["strategy"].str.endswith("_prefix"))


def test_throughput_figure_starts_at_zero_with_error_bars_and_names_a_winner_only_by_the_rule(tmp_path):
    from helpers.plots import plot_throughput_vs_batch

    frame = _bench_rows()
    frame["speedup_vs_loop"] = frame["items_per_s"] / 1.5
    fig, path = plot_throughput_vs_batch(frame, path=tmp_path / "t.png")
    rate, padding = fig.axes[:2]
    assert path.exists() and rate.get_ylim()[0] == 0, "a ratio is read from heights: the axis starts at zero"
    assert len(rate.containers) == 2, "one errorbar series per sorted strategy (its loop at batch 1)"
    assert "padding" in padding.get_ylabel()
    assert [t.get_text() for t in padding.get_xticklabels()] == ["1", "2", "4", "8", "16", "32"], "batch 1: the loops"
    assert "fastest median sorted + prefix at 32" in title_of(fig), title_of(fig)
    start = frame[frame["strategy"] == "loop_prefix"].iloc[0]  # the curve's own batch-1 point
    best = frame.loc[frame["items_per_s"].idxmax()]
    span = f"{best.items_per_s_min / start.items_per_s_max:.2f}-{best.items_per_s_max / start.items_per_s_min:.2f}x"
    assert f"{best.items_per_s / start.items_per_s:.2f}x its batch 1 (loop + prefix; rounds {span})" in title_of(fig)
    assert "within noise of 1 other point(s)" in title_of(fig), title_of(fig)  # 8.0 and 8.1 overlap with 5 % spreads
    apart = frame[frame["items_per_s"] != 8.0]  # 8.1 clear of 7.0 and below: apart, over 2 rounds each
    fig, _ = plot_throughput_vs_batch(apart, path=tmp_path / "u.png")
    assert NO_VERDICT in title_of(fig) and "ahead" not in title_of(fig), "2 rounds each lie apart 1 time in 3"
    fig, _ = plot_throughput_vs_batch(apart.assign(repeats=4), path=tmp_path / "u4.png")
    assert title_of(fig).endswith(", ahead by the rule"), title_of(fig)
    single = frame.assign(items_per_s_min=frame["items_per_s"], items_per_s_max=frame["items_per_s"], repeats=1)
    fig, _ = plot_throughput_vs_batch(single, path=tmp_path / "v.png")
    assert NO_VERDICT in title_of(fig) and "ahead" not in title_of(fig), title_of(fig)
    # The lesson's sweep: the plain loop without a sorted curve of its own is drawn across, and the legend names it
    lesson = frame[frame["strategy"] != "sorted"]
    fig, _ = plot_throughput_vs_batch(lesson, path=tmp_path / "w.png")
    rate = fig.axes[0]
    labels = rate.get_legend_handles_labels()[1]
    assert any(label.startswith("loop (constrained), float32: one ticket per pass, 1.50/s") for label in labels), labels
    assert any("sorted + prefix, float32 (batch 1: loop + prefix)" in label for label in labels), labels
    across = [line for line in rate.get_lines() if line.get_linestyle() == "--"]
    assert across and across[0].get_ydata()[0] == 1.5, "the plain loop, drawn across at its rate"
    plt.close("all")


# --- figure details an instructor puts on screen ---


def test_the_saturation_figure_has_one_x_axis_rows_per_call_and_says_what_batching_gains(tmp_path):
    from helpers.plots import plot_saturation
    from tests.test_profile import synthetic

    profile = synthetic()
    fig, path = plot_saturation(profile, 101, path=tmp_path / "s.png")
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[0] == "rows of 96 tokens per call", labels
    # the dashed line is what the title's ratio divides by: a ticket as long as the rows, the median named beside it
    alone = f"one 96-token row per call (the median prompt: 101): {profile.batched_tokens_per_s(1):.0f}/s"
    assert alone in labels, labels
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"][0]
    assert dashed.get_ydata()[0] * profile.batching_gain(32) == pytest.approx(profile.batched_tokens_per_s(32))
    assert ax.get_xlabel() == "rows per forward call (batch size)" and ax.get_ylim()[0] == 0
    assert f"32 rows run {profile.batching_gain(32):.2f}x the tokens/s of one" in title_of(fig)
    beyond = synthetic()
    beyond.batched = beyond.batched[:3]  # measured to 4 rows only
    fig, _ = plot_saturation(beyond, 96, path=tmp_path / "b.png")
    assert "beyond the measured rows" in title_of(fig)
    plt.close("all")


def test_padded_batches_colour_ticket_tokens_as_every_figure_does(tmp_path):
    from matplotlib.colors import to_hex

    from helpers.drawings import BATCH_SHADES, SEGMENT_COLOURS, plot_padded_batches

    lengths = [5, 9, 3, 7]
    fig, _ = plot_padded_batches(lengths, {"sorted": [[1, 3], [0, 2]]}, "caption", path=tmp_path / "p.png")
    bars = fig.axes[0].patches
    colours = {to_hex(bar.get_facecolor()) for bar in bars}
    # each row: its padding (grey, from 0) then its tokens, ending at its batch's longest
    assert [bar.get_width() for bar in bars] == [0, 2, 0, 2, 9, 7, 5, 3], [bar.get_width() for bar in bars]
    assert [bar.get_x() for bar in bars[4:]] == [0, 2, 0, 2]
    title = " ".join(fig.get_suptitle().split())
    assert title == "4 tickets in batches of 2: sorted 14% padding, sorted 14%", title
    assert to_hex(SEGMENT_COLOURS["ticket"]) == to_hex(BATCH_SHADES[0])
    assert colours == {to_hex("0.8"), *(to_hex(shade) for shade in BATCH_SHADES)}, colours
    plt.close("all")


def test_padding_by_strategy_names_its_prompts_and_batch_size_in_words(tmp_path, embedded):
    from helpers.bench import padding_by_strategy
    from helpers.plots import plot_padding_by_strategy

    padding = padding_by_strategy(embedded[1], n=40, batch_size=8)
    fig, _ = plot_padding_by_strategy(padding, "caption", path=tmp_path / "b.png")
    names = [" ".join(tick.get_text().split()) for tick in fig.axes[0].get_xticklabels()]  # wrapped over two lines
    assert "token budget" in names and "token_budget" not in names, names
    assert title_of(fig).startswith("Padding, zero-shot prompts, batches of 8:"), title_of(fig)
    plt.close("all")


def test_the_ladder_has_error_bars_and_names_a_winner_only_by_the_rule(tmp_path):
    from helpers.plots import plot_ladder

    # generate + parse is timed once: its min and max equal its median, up to rounding (here 1 ulp above it)
    ladder = pd.DataFrame(
        {
            "step": ["generate + parse", "constrained loop", "+ prefix cache"],
            "speedup": [0.3, 1.0, 1.8],
            "speedup_min": [0.30000000000000004, 0.95, 1.6],
            "speedup_max": [0.3, 1.05, 1.9],
            "repeats": [4, 4, 4],
        }
    )
    fig, _ = plot_ladder(ladder, "caption", path=tmp_path / "l.png", note="; generate + parse: one run")
    assert "caption; generate + parse: one run" in [text.get_text() for text in fig.texts], "the note joins the caption"
    assert any(type(c).__name__ == "ErrorbarContainer" for c in fig.axes[0].containers), "each step shows its spread"
    assert "slowest to fastest repeat" in fig.axes[0].get_xlabel()
    assert "best step '+ prefix cache' at 1.80x" in title_of(fig), "1.6-1.9 lies above 0.95-1.05, 4 rounds: a winner"
    fig, _ = plot_ladder(ladder.drop(columns="repeats"), "caption", path=tmp_path / "n.png")
    assert title_of(fig).endswith(f"'+ prefix cache' at 1.80x the loop, {NO_VERDICT}"), "rounds unknown: no verdict"
    close = ladder.assign(speedup_max=[0.3, 1.7, 1.9])
    fig, _ = plot_ladder(close, "caption", path=tmp_path / "m.png")
    assert "within noise of 'constrained loop'" in title_of(fig), title_of(fig)
    fig, _ = plot_ladder(ladder, "caption", path=tmp_path / "a.png", accuracy="38% [27%, 50%] of 64 tickets right")
    assert title_of(fig).endswith("The classifier: 38% [27%, 50%] of 64 tickets right"), "the ladder names its accuracy"
    plt.close("all")


def test_the_learning_curve_draws_every_draw_and_titles_the_largest_sizes_mean(tmp_path):
    from helpers.plots import plot_learning_curve

    curve = pd.DataFrame(
        [
            dict(labelled=n, draw=d, accuracy=a, accuracy_low=a - 0.1, accuracy_high=min(1, a + 0.1), n=112)
            for n, accuracies in ((10, [0.5, 0.6]), (100, [0.8, 0.9]))
            for d, a in enumerate(accuracies)
        ]
    )
    references = {"unfitted head": (0.34, 0.26, 0.43)}
    fig, _ = plot_learning_curve(curve, references, "caption", path=tmp_path / "c.png", chance=1 / 3,
                                 rules=(0.79, 0.7, 0.85))  # fmt: skip
    assert title_of(fig) == (
        "Fitted on 100 labelled tickets, the head reaches 85% (mean of its draws); keyword rules "
        "79%, on 112 held-out tickets"
    )
    errorbars = [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(errorbars) == 4, "a point with its interval per draw"
    legend = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert "keyword rules (no model): 79%" in legend and "unfitted head: 34%" in legend and "chance: 33%" in legend
    with pytest.raises(ValueError, match="accuracy_low"):
        plot_learning_curve(curve.drop(columns="accuracy_low"), references, "caption", path=tmp_path / "x.png")
    plt.close("all")


def test_the_margins_figure_puts_every_variant_side_by_side_on_one_linear_scale(tmp_path):
    """A flip needs a point above error = margin, the line drawn through the origin; every panel shares its axes, so
    two variants' margins read against each other."""
    import numpy as np

    from helpers.plots import plot_margins

    margins, errors = [0.0, 0.05, 0.25, 1.5], [0.02, 0.03, 0.48, 0.1]
    panels = [
        ("bfloat16 whole", margins, errors, [True, False, True, False], 0.3),
        ("bfloat16 mixed", [0.5, 0.8, 1.0, 2.0], [0.01, 0.02, 0.01, 0.03], [False] * 4, 0.05),
    ]
    fig, _ = plot_margins(panels, INFO, tmp_path / "m.png")
    first, second = fig.axes[:2]
    assert first.get_xscale() == second.get_xscale() == "linear"
    assert first.get_xlim() == second.get_xlim() and first.get_ylim() == second.get_ylim(), "one scale for both"
    line = next(line for line in first.get_lines() if line.get_label().startswith("error = margin"))
    x, y = line.get_data()
    assert np.allclose(x, y), "the diagonal is y = x"
    assert first.get_xlim()[0] < 0, "room left of a margin of 0, so a tie's marker shows whole"
    assert "2 of 4 flipped" in title_of(fig) and "threshold 0.30, under it 3 of 4" in title_of(fig), title_of(fig)
    with pytest.raises(ValueError, match="one margin, error and flip per ticket"):
        plot_margins([("x", [0.1], [0.1, 0.2], [False], 0.1)], INFO, tmp_path / "bad.png")
    plt.close("all")
