"""Figures: titled, labelled, the model / dtype / device in the caption, saved as PNG (notebooks 01-04)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt


def caption(info) -> str:
    """The line every figure carries: which model, dtype and device produced it."""
    note = " (random weights: timing only)" if getattr(info, "timing_only", False) else ""
    return f"{info.name}{note} · {info.dtype} · {info.device}, {info.threads} threads"


def finish(fig, info, path: str | Path) -> Path:
    """Add the caption, tighten the layout and save next to the executed notebook."""
    fig.text(0.01, 0.005, caption(info), fontsize=8, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def plot_accuracy_coverage(curve, info, path="accuracy_vs_coverage.png"):
    """Accuracy of the tickets kept against the share kept, as the confidence threshold rises."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curve["coverage"] * 100, curve["accuracy"] * 100, marker=".")
    ax.set_xlabel("coverage: tickets classified automatically (%)")
    ax.set_ylabel("accuracy on those tickets (%)")
    ax.set_title("Route low-confidence tickets to a human")
    ax.set_xlim(0, 102)
    ax.grid(alpha=0.3)
    return fig, finish(fig, info, path)


def plot_speedup_vs_prefix(frame, info, path="prefix_speedup.png"):
    """Prefix-cache speedup against the static prefix's share of the prompt tokens."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(frame["prefix_tokens"], frame["speedup"], marker="o")
    for _, row in frame.iterrows():
        ax.annotate(f"{int(row['shots'])} shots", (row["prefix_tokens"], row["speedup"]),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.axhline(1, color="0.6", lw=1, ls="--")
    ax.set_xlabel("static prefix length (tokens)")
    ax.set_ylabel("speedup with the prefix cache (x)")
    ax.set_title("The longer the static prefix, the more the cache saves")
    ax.grid(alpha=0.3)
    return fig, finish(fig, info, path)
