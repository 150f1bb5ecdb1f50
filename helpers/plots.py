"""Figures: titled, labelled, the model / dtype / device in the caption, saved as PNG (notebooks 01-04)."""

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from .batching import global_padding_factor
from .models import machine_name, threads_text
from .outputs import output_dir
from .timing import NO_VERDICT, judge_spreads, overlap

NOTE = {"textcoords": "offset points"}  # an annotation's offset from its point, in points
# fmt: off
STRATEGY_LABELS = {"generate": "generate + parse", "loop": "loop (constrained)", "loop_prefix": "loop + prefix",
                   "arbitrary": "arbitrary batches", "sorted": "sorted batches", "token_budget": "token budget",
                   "sorted_prefix": "sorted + prefix"}
# fmt: on


def judged(rows, column: str, best) -> list[str]:
    """The one rule (``timing.judge_spreads``) between ``best`` and each of ``rows``: their spreads of repeats
    (``column``_min to _max) over their ``repeats`` (one where the column is missing: no verdict)."""

    def spread(row):  # (its spread of repeats, their number): judge_spreads' arguments for one row
        return (row[f"{column}_min"], row[f"{column}_max"]), int(row.get("repeats", 1))

    return [judge_spreads(*spread(best), *spread(row)) for _, row in rows.iterrows()]


def caption(info) -> str:
    """The line every figure carries: which model, dtype and device produced it, on which machine."""
    note = " (random weights: timing only)" if getattr(info, "timing_only", False) else ""
    where = f"{info.device}, {threads_text(info.threads)} · {machine_name(info.device)}"
    return f"{info.name}{note} · {info.dtype} · {where}"


def bench_caption(frame) -> str:
    first = frame.iloc[0]
    note = " (random weights: timing only)" if first["timing_only"] else ""
    dtypes, machine = " / ".join(dict.fromkeys(frame["dtype"])), f" · {first['machine']}" if "machine" in frame else ""
    timed = first.get("sample_tickets", first["n"])
    tickets = f"{first['n']} tickets" if timed == first["n"] else f"{timed} of {first['n']} tickets timed, scaled"
    where = f"{first['device']}, {threads_text(first['threads'])}{machine}"
    return f"{first['model']}{note} · {dtypes} · {where} · {tickets}, {first['shots']} shots"


def set_title(ax, text: str, width: float | None = None) -> None:
    """A computed title, wrapped to the figure's width (or ``width`` inches: the axes' own, beside a legend)."""
    inches = width if width is not None else ax.figure.get_figwidth()
    ax.set_title(textwrap.fill(text, width=int(inches * 11)), fontsize=10)


def finish(fig, info, path: str | Path, note: str = "") -> Path:
    """Add the caption (a ModelInfo, a benchmark's results frame or a ready string; ``note`` after it), tighten the
    layout, save as PNG (a relative path in ``helpers.outputs.output_dir()``: runs/, never notebooks/)."""
    text = (info if isinstance(info, str) else bench_caption(info) if hasattr(info, "iloc") else caption(info)) + note
    lines = textwrap.wrap(text, width=int(fig.get_figwidth() * 17))  # 17 characters an inch: no caption is cut off
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=8, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04 * len(lines), 1, 1))
    path = Path(path) if Path(path).is_absolute() else output_dir() / path
    fig.savefig(path, dpi=120)
    return path


def plot_speedup_vs_prefix(frame, info, path="prefix_speedup.png"):
    """Measured prefix-cache speedup against the prefix's share of the prompt tokens (bars: ``speedup_low`` to
    ``speedup_high``, the range of its rounds), beside the ideal 1 / (1 - share). Notebook 02, section 5."""
    frame = frame.sort_values("prefix_share")
    share = frame["prefix_share"].to_numpy()
    # The ideal: every prefix token saved, nothing else changed.
    ideal = frame["ideal_speedup"] if "ideal_speedup" in frame else 1 / (1 - frame["prefix_share"])
    reached = frame["speedup"] / ideal
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    curve = np.linspace(0, min(0.97, share.max() + 0.05), 100)
    ax.plot(curve * 100, 1 / (1 - curve), color="0.6", lw=1, label="ideal: 1 / (1 - prefix share)")
    ax.plot(share * 100, ideal, "o", color="0.6", mfc="white")
    spread = None
    if {"speedup_low", "speedup_high"} <= set(frame.columns):
        spread = [frame["speedup"] - frame["speedup_low"], frame["speedup_high"] - frame["speedup"]]
    label = "measured in this run" + (" (bars: the range of its rounds)" if spread is not None else "")
    ax.errorbar(share * 100, frame["speedup"], yerr=spread, marker="o", color="C0", capsize=3, label=label)
    for row, fraction in zip(frame.itertuples(), reached):
        note = f"{int(row.shots)} shots, {int(row.prefix_tokens)} tok\n{fraction:.0%} of ideal"
        # below and right of the point: the measured line climbs away from there, the ideal runs above it
        ax.annotate(note, (row.prefix_share * 100, row.speedup), **NOTE, xytext=(6, -4), fontsize=7, va="top")
    ax.axhline(1, color="0.6", lw=1, ls=":")
    ax.set(xlabel="static prefix's share of the prompt tokens (%)", xlim=(0, 100))  # room for the last point's label
    ax.set_ylabel("speedup with the prefix cache (x)")
    ax.set_ylim(0, max(ideal.max(), frame.get("speedup_high", frame["speedup"]).max()) * 1.15)
    low, high = reached.min(), reached.max()
    span = f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low * 100:.0f}–{high:.0%}"
    ends = [frame.iloc[k] for k in (0, -1)]
    ends = [f"{r.speedup:.2f}x" + (f" ({r.speedup_low:.2f}-{r.speedup_high:.2f})" if spread else "") for r in ends]
    title = f"The cache reached {span} of the ideal speedup: {ends[0]} at {share[0]:.0%} prefix share, "
    set_title(ax, title + f"{ends[1]} at {share[-1]:.0%}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig, finish(fig, caption(info), path)


def plot_throughput_vs_batch(frame, path="throughput_vs_batch_size.png"):
    """Two panels against batch size, each point all 600 tickets (``helpers.bench``): tickets/s (bars: slowest to
    fastest repeat), and padding, the timed sample's (filled) beside the plan's (hollow). A line per sorted strategy and
    dtype from its loop at batch 1; a loop with no sorted curve runs across, dashed. Notebook 04."""
    fig, (rate_ax, pad_ax) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    dtypes, sizes = list(dict.fromkeys(frame["dtype"])), sorted(frame["batch_size"].dropna().unique())
    start_of = {}  # (dtype, prefix) -> the curve's batch-1 row: what the title's ratio divides by
    drawn = frame[frame["strategy"].str.startswith(("loop", "sorted"))]  # a curve: a loop and its sorted batches
    for k, ((dtype, prefix), points) in enumerate(drawn.groupby(["dtype", "prefix"], sort=False)):
        points = points.sort_values("batch_size")
        style = ["-", "--", ":"][dtypes.index(dtype) % 3]
        color = f"C{k}"
        start_of[dtype, prefix] = loop = points.iloc[0]
        loop_name = STRATEGY_LABELS.get(loop.strategy, loop.strategy)
        if len(points) == 1 and loop.strategy.startswith("loop"):  # a loop alone: one ticket per pass, drawn across
            label = f"{loop_name}, {dtype}: one ticket per pass, {loop.items_per_s:.2f}/s"
            rate_ax.axhline(loop.items_per_s, color=color, ls="--", lw=1, label=label)
            continue
        error = [points["items_per_s"] - points["items_per_s_min"], points["items_per_s_max"] - points["items_per_s"]]
        line = dict(marker="o", ms=4, color=color, ls=style)
        name = STRATEGY_LABELS.get(points.iloc[-1].strategy, points.iloc[-1].strategy)
        label = f"{name}, {dtype} (batch 1: {loop_name})"
        rate_ax.errorbar(points["batch_size"], points["items_per_s"], yerr=error, capsize=3, **line, label=label)
        pad_ax.plot(points["batch_size"], 100 * points["padding_fraction"], **line)
        plan = {**line, "ms": 7, "mfc": "none", "ls": "none"}  # the whole plan's: hollow markers
        pad_ax.plot(points["batch_size"], 100 * points["plan_padding"], **plan)
    pad_ax.set_xscale("log", base=2)
    pad_ax.set_xticks(sizes, [str(int(size)) for size in sizes])
    pad_ax.set_xlabel("batch size (rows per forward pass; at 1, one ticket per pass: each curve's loop)")
    rate_ax.set(ylabel="tickets / s, all 600\n(bars: slowest to fastest repeat)", ylim=(0, None))
    pad_ax.set_ylabel("padding (%)")
    filled, hollow = Line2D([], [], marker="o", color="0.3", ms=4), Line2D([], [], marker="o", color="0.3", ls="none")
    hollow.set(mfc="none", ms=7)
    beside = dict(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # legends right of the axes
    pad_ax.legend([filled, hollow], ["the timed sample's", "the whole plan's"], **beside)
    best = frame.sort_values("items_per_s").iloc[-1]
    name = STRATEGY_LABELS.get(best.strategy, best.strategy)
    outcomes = judged(frame.drop(index=best.name), "items_per_s", best)
    close, apart = outcomes.count("within noise"), NO_VERDICT if NO_VERDICT in outcomes else "ahead by the rule"
    verdict = f", within noise of {close} other point(s)" if close else f", {apart}"
    start = start_of[best["dtype"], best["prefix"]]  # the batch-1 point of the best point's own curve
    title = f"Tickets/s against batch size: fastest median {name} at {best.batch_size}, "
    start_name = STRATEGY_LABELS.get(start.strategy, start.strategy)
    span = f"{best.items_per_s_min / start.items_per_s_max:.2f}-{best.items_per_s_max / start.items_per_s_min:.2f}x"
    title += f"{best.items_per_s / start.items_per_s:.2f}x its batch 1 ({start_name}; rounds {span}){verdict}"
    set_title(rate_ax, title, width=6.3)
    for ax in (rate_ax, pad_ax):
        ax.grid(alpha=0.3)
    rate_ax.legend(**beside)
    return fig, finish(fig, bench_caption(frame), path)


def plot_padding_by_strategy(padding, info, path="padding_by_strategy.png"):
    """Bars: padding share of processed tokens per way of forming batches (``bench.padding_by_strategy``'s frame)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [STRATEGY_LABELS.get(name, name).replace(" ", "\n", 1) for name in padding["strategy"]]  # no overlap
    bars = ax.bar(names, padding["padding_fraction"] * 100, color=["0.6", "C3", "C2", "C1"][: len(padding)])
    ax.bar_label(bars, fmt="%.1f%%", fontsize=8)
    ax.set_ylabel("padding (% of processed tokens)")
    share = padding.set_index("strategy")["padding_fraction"]
    setting = padding.attrs
    nan = float("nan")
    known = {"prompts", "batch_size"} <= setting.keys()
    where = f", {setting['prompts']} prompts, batches of {setting['batch_size']}" if known else ""
    sorted_, arbitrary = share.get("sorted", nan), share.get("arbitrary", nan)
    set_title(ax, f"Padding{where}: sorted {sorted_:.1%} of processed tokens, arbitrary order {arbitrary:.1%}")
    ax.grid(alpha=0.3, axis="y")
    return fig, finish(fig, info, path)


def plot_ladder(ladder, info, path="technique_ladder.png", note: str = "", accuracy: str = ""):
    """Bars: each step's speedup over the one-at-a-time loop, from its slowest to fastest repeat (``speedup_min``,
    ``speedup_max``) over its ``repeats``; ``note`` goes in the caption (a step timed otherwise), ``accuracy`` (the
    classifier every step runs, ``checks.accuracy_beside_rules``) in the title. Notebook 04, section 4."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    below, above = ladder["speedup"] - ladder["speedup_min"], ladder["speedup_max"] - ladder["speedup"]
    spread = [below.clip(lower=0), above.clip(lower=0)]  # a step with one repeat: min = max, up to rounding
    bars = ax.barh(ladder["step"], ladder["speedup"], color="C0", xerr=spread, ecolor="0.3", capsize=3)
    ax.bar_label(bars, labels=[f"{x:.2f}x" for x in ladder["speedup"]], fontsize=8, padding=8)
    ax.axvline(1, color="0.5", lw=1, ls="--")
    ax.set_xlim(0, max(1.0, ladder["speedup_max"].max()) * 1.2)  # room for the labels
    ax.invert_yaxis()
    ax.set_xlabel("speedup over the float32 constrained loop (x; bars: slowest to fastest repeat)")
    ranked = ladder.sort_values("speedup", ascending=False)
    top, outcomes = ranked.iloc[0], judged(ranked.iloc[1:], "speedup", ranked.iloc[0])
    close = ", ".join(f"'{step}'" for step, said in zip(ranked["step"][1:], outcomes) if said == "within noise")
    said = f", within noise of {close}" if close else f", {NO_VERDICT}" if NO_VERDICT in outcomes else ""  # the rule
    lead = f"fastest median '{top.step}'" if said else f"best step '{top.step}'"
    classifier = f". The classifier: {accuracy}" if accuracy else ""
    set_title(ax, f"The technique ladder: {lead} at {top.speedup:.2f}x the loop{said}{classifier}")
    ax.grid(alpha=0.3, axis="x")
    return fig, finish(fig, info, path, note)


def plot_saturation(profile, median: int, rows: int = 32, path="prefill_saturation.png"):
    """What batching can gain here: the profile's prefill tokens/s by rows per call (``profile.batch_row_tokens`` each)
    against one row per call (dashed; ``median``, the median prompt, beside it). ``rows``: the title's."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    (counts, batched), width = zip(*sorted(profile.batched)), profile.batch_row_tokens
    ax.plot(counts, batched, marker="D", color="C2", label=f"rows of {width} tokens per call")
    for count, rate in zip(counts, batched):
        ax.annotate(f"{rate:.0f}", (count, rate), **NOTE, fontsize=7, color="C2", xytext=(0, 6), ha="center")
    alone = profile.batched_tokens_per_s(1)  # the curve's own first point: the title's ratio is against this line
    about = f" (the median prompt: {median})" if median != width else ""
    ax.axhline(alone, color="C1", lw=1, ls="--", label=f"one {width}-token row per call{about}: {alone:.0f}/s")
    knee = profile.batch_knee
    knee_text = f"90 % of the batched peak from {knee} row{'s' if knee > 1 else ''}"
    ax.axvline(knee, color="0.5", lw=1, ls=":", label=knee_text)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set(ylim=(0, max(*batched, alone) * 1.15), xlabel="rows per forward call (batch size)")
    ax.set_ylabel("prefill throughput (tokens / s)")
    beyond = " (beyond the measured rows: flat)" if rows > counts[-1] else ""
    title = f"Prefill tokens/s by rows per call: {rows} rows run {profile.batching_gain(rows):.2f}x the tokens/s of "
    set_title(ax, title + f"one {width}-token row{beyond}, {knee_text}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig, finish(fig, f"{profile.model} · {profile.dtype} · {profile.caption()}", path)


def plot_accuracy_intervals(variants, info, path="accuracy_intervals.png", baseline=None, chance=None, rules=None):
    """Accuracy per prompt variant (``variant``, ``accuracy``, ``accuracy_low``, ``accuracy_high``, ``n``), its 95 %
    Wilson interval; ``baseline``'s shaded, ``chance`` dotted, ``rules`` (a no-model baseline) grey. Notebook 01."""
    missing = [name for name in ("variant", "accuracy", "accuracy_low", "accuracy_high", "n") if name not in variants]
    if missing:
        raise ValueError(f"the variants table lacks column(s) {', '.join(missing)}")
    rows, extra = variants.reset_index(drop=True), rules is not None
    fig, ax = plt.subplots(figsize=(7, 0.5 * (len(rows) + extra) + 2))
    errors = [100 * (rows["accuracy"] - rows["accuracy_low"]), 100 * (rows["accuracy_high"] - rows["accuracy"])]
    ax.errorbar(100 * rows["accuracy"], range(len(rows)), xerr=errors, fmt="o", capsize=4, color="C0")
    points, names = [(row["accuracy"], i, "C0") for i, row in rows.iterrows()], list(rows["variant"])
    if extra:
        accuracy, low, high = rules
        spread = [[100 * (accuracy - low)], [100 * (high - accuracy)]]
        ax.errorbar([100 * accuracy], [len(rows)], xerr=spread, fmt="s", capsize=4, color="0.45")
        points.append((accuracy, len(rows), "0.45"))
        names.append("keyword rules (no model)")
    for accuracy, i, color in points:
        ax.annotate(f"{accuracy:.0%}", (100 * accuracy, i), **NOTE, xytext=(0, 7), ha="center", fontsize=8, color=color)
    ax.set_yticks(range(len(names)), names)
    # ylim: top row first, with room for its label above it
    ax.set(ylim=(len(names) - 0.5, -0.7), xlim=(0, 100), xlabel="accuracy (%), with its 95 % Wilson interval")
    best, n = rows.sort_values("accuracy", ascending=False).iloc[0], int(rows["n"].max())
    interval = f"[{best['accuracy_low']:.0%}-{best['accuracy_high']:.0%}]"
    text = f"Accuracy on {n} tickets: best {best['variant']} at {best['accuracy']:.0%} {interval}"
    if baseline is not None:
        base = rows[rows["variant"] == baseline]
        if base.empty:
            raise ValueError(f"baseline variant {baseline!r} is not in the table")
        base = base.iloc[0]
        band = (100 * base["accuracy_low"], 100 * base["accuracy_high"])
        ax.axvspan(*band, color="0.9", zorder=0, label=f"{baseline}: 95 % interval")
        if best["variant"] == baseline:
            text += f"; no variant beat {baseline}"
        else:
            spans = [(row["accuracy_low"], row["accuracy_high"]) for row in (best, base)]
            text += f", {'overlapping' if overlap(*spans) else 'clear of'} the {baseline} interval"
    if chance is not None:
        ax.axvline(100 * chance, color="C3", ls=":", lw=1.2, label=f"chance: {chance:.0%}")
        text += f"; chance {chance:.0%}"
    if extra:
        text += f"; keyword rules {rules[0]:.0%} [{rules[1]:.0%}-{rules[2]:.0%}]"
    if baseline is not None or chance is not None:  # below the axes: inside them it would cover a row
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    set_title(ax, text)
    ax.grid(alpha=0.3, axis="x")
    return fig, finish(fig, caption(info), path)


def plot_prompt_lengths(lengths, info, path="prompt_lengths.png"):
    """Histogram of prompt lengths, median and maximum marked, counts on a log axis: long prompts show (notebook 00)."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or not np.issubdtype(lengths.dtype, np.number):
        raise ValueError(f"plot_prompt_lengths needs a non-empty list of numbers, got {lengths.dtype} {lengths.shape}")
    if (empty := np.flatnonzero(lengths < 1)).size:
        raise ValueError(f"plot_prompt_lengths: lengths[{empty[0]}] = {lengths[empty[0]]}, but a prompt has a token")
    median, longest = int(np.median(lengths)), int(lengths.max())
    factor = global_padding_factor(lengths.tolist())
    fig, ax = plt.subplots(figsize=(7, 4))
    # About 60 whole-token bins from 0 up to the longest: fine enough for the bulk, and single prompts in the tail show.
    width = max(1, int(np.ceil(longest / 60)))
    counts, _, _ = ax.hist(lengths, bins=np.arange(0, longest + width, width), color="C0", alpha=0.8)
    ax.set_yscale("log")
    ax.set_ylim(0.7, counts.max() * 2.5)  # a bar of one prompt stays visible; room above the bars for the labels
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    box = {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
    for value, name, color, style, side in ((median, "median", "C1", "--", 1), (longest, "max", "C3", ":", -1)):
        ax.axvline(value, color=color, ls=style, lw=1.5)
        where = dict(xycoords=("data", "axes fraction"), xytext=(4 * side, -14), ha="left" if side > 0 else "right")
        ax.annotate(f"{name} {value}", (value, 1), **NOTE, **where, fontsize=9, color=color, bbox=box)
    ax.set(xlim=(0, longest * 1.03), xlabel="prompt length (tokens)", ylabel="prompts (log scale)")
    title = f"Prompt lengths of {lengths.size} tickets: median {median}, max {longest} tokens; padding all to the "
    set_title(ax, title + f"longest would process {factor:.1f}x the real tokens")
    ax.grid(alpha=0.3, axis="y")
    return fig, finish(fig, caption(info), path)


def plot_margins(panels, info, path="precision_margins.png"):
    """Where the flipped labels sit (notebook 05, section 2), a panel per variant: each ticket's top-two margin in its
    dtype against how far rounding moved its margins, flips marked, the verified path's threshold (tickets left of it
    are rescored) and error = margin (flips sit above). ``panels``: (variant, margins, errors, flipped, threshold)."""
    if not panels:
        raise ValueError("plot_margins needs at least one variant")
    data = []
    for variant, margins, errors, flipped, threshold in panels:
        margins = np.asarray(margins)
        errors = np.asarray(errors)
        flipped = np.asarray(flipped, dtype=bool)
        if not (len(margins) == len(errors) == len(flipped)) or not len(margins):
            got = f"{len(margins)}, {len(errors)}, {len(flipped)}"
            raise ValueError(f"{variant}: one margin, error and flip per ticket, got {got}")
        data.append((variant, margins, errors, flipped, threshold))
    right = max(max(m.max(), t) for _, m, _, _, t in data) * 1.1
    top = max(max(e.max(), 1e-3) for _, _, e, _, _ in data) * 1.15
    fig, axes = plt.subplots(1, len(data), figsize=(4.8 * len(data) + 1.5, 4), sharex=True, sharey=True, squeeze=False)
    for ax, (variant, margins, errors, flipped, threshold) in zip(axes[0], data):
        ax.scatter(margins[~flipped], errors[~flipped], s=14, color="0.55", label="same label as float32")
        ax.scatter(margins[flipped], errors[flipped], s=40, color="C3", marker="x", label="label flipped")
        ax.axvline(threshold, color="C0", ls="--", lw=1, label="threshold: rescored left of it")
        ax.plot([0, right], [0, right], color="0.3", ls=":", lw=1, label="error = margin: a flip sits above it")
        # a little room left of 0: a tie's marker shows whole
        ax.set(xlim=(-right * 0.02, right), ylim=(0, top), xlabel="top-two margin (log-prob)")
        rescored = int((margins < threshold).sum())
        worst = f", the largest margin flipped {margins[flipped].max():.2f}" if flipped.any() else ""
        title = f"{variant}: {int(flipped.sum())} of {len(margins)} flipped{worst}; threshold {threshold:.2f}, under it"
        set_title(ax, f"{title} {rescored} of {len(margins)}", width=4.8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("margin error: largest change in\na difference of two labels' scores")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig, finish(fig, caption(info), path)


def plot_learning_curve(curve, references, info, path="learning_curve.png", chance=None, rules=None):
    """The fitted head's accuracy against its labelled rows: a dot per draw (``curve``: rows
    ``labelled``, ``draw``, ``accuracy``, ``accuracy_low``, ``accuracy_high``) with its 95 % interval, each size's mean
    joined; ``references`` (name -> accuracy, low, high: readouts fitted on nothing) as dashed lines with their
    intervals shaded; ``rules`` (the keyword rules) grey, ``chance`` dotted. Notebook 01, section 5."""
    missing = [name for name in ("labelled", "draw", "accuracy", "accuracy_low", "accuracy_high") if name not in curve]
    if missing or curve.empty:
        raise ValueError(f"the learning curve lacks rows or column(s) {', '.join(missing)}")
    sizes = sorted(curve["labelled"].unique())
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    named = {**references, **({"keyword rules (no model)": rules} if rules is not None else {})}
    colors = iter(["C1", "C2", "C4", "C5", "C6", "C8"])  # not C0 (the head) nor C3 (chance)
    for name, (accuracy, low, high) in named.items():
        color = "0.45" if name.startswith("keyword") else next(colors)
        ax.axhspan(100 * low, 100 * high, color=color, alpha=0.08, zorder=0)
        ax.axhline(100 * accuracy, color=color, ls="--", lw=1.2, label=f"{name}: {accuracy:.0%}")
    draws = curve.groupby("labelled")["draw"].transform("count")
    for row, count in zip(curve.itertuples(), draws):
        x = row.labelled * 10 ** (0.12 * (row.draw / max(1, count - 1) - 0.5) if count > 1 else 0)  # side by side
        ax.errorbar(
            [x],
            [100 * row.accuracy],
            yerr=[[100 * (row.accuracy - row.accuracy_low)], [100 * (row.accuracy_high - row.accuracy)]],
            fmt="o",
            ms=4,
            capsize=3,
            color="C0",
            alpha=0.8,
        )
    means = curve.groupby("labelled")["accuracy"].mean()
    ax.plot(means.index, 100 * means.values, color="C0", lw=1.5, label="fitted head: each draw, and their mean")
    if chance is not None:
        ax.axhline(100 * chance, color="C3", ls=":", lw=1.2, label=f"chance: {chance:.0%}")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(
        xlabel="labelled tickets the head was fitted on (log scale)",
        ylabel="accuracy (%), 95 % Wilson interval",
        ylim=(0, 100),
    )
    largest = means.loc[sizes[-1]]
    text = f"Fitted on {sizes[-1]} labelled tickets, the head reaches {largest:.0%} (mean of its draws)"
    if rules is not None:
        text += f"; keyword rules {rules[0]:.0%}"
    text += f", on {int(curve['n'].iloc[0])} held-out tickets" if "n" in curve else ""
    set_title(ax, text, width=4.2)  # the axes' width: the legend takes the rest
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.grid(alpha=0.3)
    return fig, finish(fig, info, path)
