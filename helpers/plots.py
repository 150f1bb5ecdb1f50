"""Figures: titled, labelled, the model / dtype / device in the caption, saved as PNG (notebooks 01-04)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt

from .models import threads_text
from .outputs import output_dir


def caption(info, profile=None) -> str:
    """The line every figure carries: which model, dtype and device produced it (and on which machine)."""
    note = " (random weights: timing only)" if getattr(info, "timing_only", False) else ""
    machine = f" · {profile.machine}" if profile is not None else ""
    return f"{info.name}{note} · {info.dtype} · {info.device}, {threads_text(info.threads)}{machine}"


def bench_caption(frame) -> str:
    """The caption for benchmark figures: model, dtypes, device, threads, tickets."""
    first = frame.iloc[0]
    note = " (random weights: timing only)" if first["timing_only"] else ""
    dtypes = " / ".join(dict.fromkeys(frame["dtype"]))
    machine = f" · {first['machine']}" if "machine" in frame else ""
    return (f"{first['model']}{note} · {dtypes} · {first['device']}, {threads_text(first['threads'])}{machine} · "
            f"n={first['n']}, {first['shots']} shots")


def set_title(ax, text: str) -> None:
    """A computed title, wrapped to the axes' figure width so it is never cut off."""
    ax.set_title(textwrap.fill(text, width=int(ax.figure.get_figwidth() * 11)), fontsize=10)


def finish(fig, info, path: str | Path) -> Path:
    """Add the caption (a ModelInfo or a ready string), tighten the layout, save as PNG (a relative path lands in
    ``helpers.outputs.output_dir()``: runs/ at the repository root unless told otherwise, never notebooks/)."""
    text = info if isinstance(info, str) else caption(info)
    # Wrapped to the figure's width (about 17 characters per inch at this size), so no caption is cut off.
    lines = textwrap.wrap(text, width=int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=8, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04 * len(lines), 1, 1))
    path = Path(path)
    if not path.is_absolute():
        path = output_dir() / path
    fig.savefig(path, dpi=120)
    return path


def _coverage_title(curve) -> str:
    everything = curve.sort_values("coverage").iloc[-1]
    half = curve.iloc[(curve["coverage"] - 0.5).abs().argsort()].iloc[0]
    return (f"Accuracy {everything['accuracy']:.0%} on every ticket, {half['accuracy']:.0%} on the "
            f"{half['coverage']:.0%} most confident")


def plot_accuracy_coverage(curve, info, path="accuracy_vs_coverage.png", title: str | None = None, profile=None):
    """Accuracy of the tickets kept against the share kept, as the confidence threshold rises."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curve["coverage"] * 100, curve["accuracy"] * 100, marker=".")
    ax.set_xlabel("coverage: tickets classified automatically (%)")
    ax.set_ylabel("accuracy on those tickets (%)")
    set_title(ax, title or _coverage_title(curve))
    ax.set_xlim(0, 102)
    ax.grid(alpha=0.3)
    return fig, finish(fig, caption(info, profile), path)


def plot_speedup_vs_prefix(frame, info, path="prefix_speedup.png", title: str | None = None, profile=None):
    """Prefix-cache speedup against the static prefix's share of the prompt tokens."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(frame["prefix_tokens"], frame["speedup"], marker="o")
    for _, row in frame.iterrows():
        ax.annotate(f"{int(row['shots'])} shots", (row["prefix_tokens"], row["speedup"]),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.axhline(1, color="0.6", lw=1, ls="--")
    ax.set_xlabel("static prefix length (tokens)")
    ax.set_ylabel("speedup with the prefix cache (x)")
    first, last = frame.sort_values("prefix_tokens").iloc[[0, -1]].itertuples()
    set_title(ax, title or f"Prefix cache: {first.speedup:.2f}x at {first.prefix_tokens} prefix tokens, "
                          f"{last.speedup:.2f}x at {last.prefix_tokens}")
    ax.grid(alpha=0.3)
    return fig, finish(fig, caption(info, profile), path)


STRATEGY_LABELS = {
    "generate": "generate + parse",
    "loop": "loop (constrained)",
    "loop_prefix": "loop + prefix",
    "arbitrary": "arbitrary batches",
    "sorted": "sorted batches",
    "token_budget": "token budget",
    "sorted_prefix": "sorted + prefix",
}


def plot_throughput_vs_batch(frame, path="throughput_vs_batch_size.png", title: str | None = None):
    """Items/s against batch size: a line per strategy, a line style per dtype; loops as flat references."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    colors = {}
    for (dtype, strategy), rows in frame.groupby(["dtype", "strategy"], sort=False):
        style = styles[list(dict.fromkeys(frame["dtype"])).index(dtype) % len(styles)]
        color = colors.setdefault(strategy, f"C{len(colors)}")
        label = f"{STRATEGY_LABELS.get(strategy, strategy)}, {dtype}"
        if rows["batch_size"].nunique() == 1 and strategy in ("loop", "loop_prefix", "generate"):
            ax.axhline(rows["items_per_s"].iloc[0], color=color, ls=style, lw=1, label=label)
        else:
            rows = rows.sort_values("batch_size")
            ax.plot(rows["batch_size"], rows["items_per_s"], marker="o", color=color, ls=style, label=label)
    ax.set_xscale("log", base=2)
    sizes = sorted(frame["batch_size"].dropna().unique())
    ax.set_xticks(sizes, [str(int(size)) for size in sizes])
    ax.set_xlabel("batch size (rows; token budget: rows x median length)")
    ax.set_ylabel("throughput (tickets / s)")
    top = frame.sort_values("items_per_s").iloc[-1]
    set_title(ax, title or f"Throughput against batch size: best {STRATEGY_LABELS.get(top.strategy, top.strategy)}"
                          f" ({top['dtype']}, batch {int(top['batch_size'])}), {top['items_per_s']:.2f} tickets/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig, finish(fig, bench_caption(frame), path)


def plot_padding_by_strategy(padding, caption_text: str, path="padding_by_strategy.png", title: str | None = None):
    """Bar chart: padding fraction of processed tokens for each way of forming batches."""
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(padding["strategy"], padding["padding_fraction"] * 100, color=["0.6", "C3", "C2", "C1"][: len(padding)])
    ax.bar_label(bars, fmt="%.1f%%", fontsize=8)
    ax.set_ylabel("padding (% of processed tokens)")
    share = padding.set_index("strategy")["padding_fraction"]
    set_title(ax, title or f"Padding: sorted {share.get('sorted', float('nan')):.1%} of processed tokens, "
                          f"arbitrary order {share.get('arbitrary', float('nan')):.1%}")
    ax.grid(alpha=0.3, axis="y")
    return fig, finish(fig, caption_text, path)


def plot_ladder(ladder, caption_text: str, path="technique_ladder.png", title: str | None = None):
    """Horizontal bars: each step's speedup over the one-at-a-time loop."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    bars = ax.barh(ladder["step"], ladder["speedup"], color="C0")
    ax.bar_label(bars, fmt="%.2fx", fontsize=8, padding=2)
    ax.axvline(1, color="0.5", lw=1, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel("speedup over the float32 constrained loop (x)")
    top = ladder.sort_values("speedup").iloc[-1]
    set_title(ax, title or f"The technique ladder: best step '{top.step}' at {top.speedup:.2f}x the loop")
    ax.grid(alpha=0.3, axis="x")
    return fig, finish(fig, caption_text, path)


def plot_roof_fraction(frame, path="roof_fraction.png", title: str | None = None):
    """Share of the measured matmul throughput spent on useful work (``helpers.bench`` defines it: the loop's
    work beyond the cached prefix, attention over the prefix included), best batch size per strategy and dtype."""
    best = frame.dropna(subset=["roof_fraction"]).sort_values("roof_fraction").groupby(["strategy", "dtype"], sort=False).tail(1)
    labels = [f"{STRATEGY_LABELS.get(s, s)}\n{d}" for s, d in zip(best["strategy"], best["dtype"])]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(labels, best["roof_fraction"] * 100, color=["C0" if d == "float32" else "C1" for d in best["dtype"]])
    ax.bar_label(bars, fmt="%.0f%%", fontsize=8)
    ax.set_ylabel("useful FLOP/s (% of measured matmul roof)")
    top = best.sort_values("roof_fraction").iloc[-1]
    set_title(ax, title or f"Useful work: at best {top.roof_fraction:.0%} of the measured matmul roof "
                          f"({STRATEGY_LABELS.get(top['strategy'], top['strategy'])}, {top['dtype']})")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig, finish(fig, bench_caption(frame), path)


def plot_saturation(profile, marks: dict[str, int], path="prefill_saturation.png", title: str | None = None):
    """The machine profile's prefill curve (tokens/s against tokens per forward call), with marked workloads,
    and the decode step's tokens/s at batch 1 and 32 (one new token per row) for comparison."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    tokens, rates = zip(*sorted(profile.prefill))
    ax.plot(tokens, rates, marker="o", label="prefill: one sequence of n tokens per call")
    decode = sorted(profile.decode.items())
    ax.plot([b for b, _ in decode], [r for _, r in decode], marker="s", ls="--", color="C3",
            label=f"decode step: n rows x 1 new token ({profile.decode_context} cached)")
    for i, (name, n) in enumerate(marks.items()):
        rate = profile.tokens_per_s(n)
        ax.axvline(n, color=f"C{i + 1}", lw=1, ls=":")
        right = n > max(tokens) / 2  # label the right-hand marks on their left, inside the axes
        ax.annotate(f"{name}\n{n} tokens: {rate:.0f}/s ({rate / profile.peak_tokens_per_s:.0%} of peak)", (n, rate),
                    textcoords="offset points", xytext=(-5 if right else 5, -28 - 22 * i), fontsize=8,
                    color=f"C{i + 1}", ha="right" if right else "left")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per forward call (rows x tokens)")
    ax.set_ylabel("throughput (tokens / s)")
    if title is None:
        first, *rest = marks.items()
        title = f"Prefill: {first[0]} runs at {profile.tokens_per_s(first[1]) / profile.peak_tokens_per_s:.0%} of the peak"
        if rest:
            title += f", {rest[-1][0]} at {profile.tokens_per_s(rest[-1][1]) / profile.peak_tokens_per_s:.0%}"
    set_title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig, finish(fig, f"{profile.model} · {profile.dtype} · {profile.caption()}", path)
