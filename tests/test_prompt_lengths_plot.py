"""Notebook 00's figure: the prompt-length histogram (helpers.plots.plot_prompt_lengths)."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from helpers.plots import plot_prompt_lengths

INFO = SimpleNamespace(name="a model", dtype="float32", device="cpu", threads=2)


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
