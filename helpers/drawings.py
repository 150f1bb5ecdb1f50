"""The mechanisms drawn from a lesson's own tensors (nothing here runs a model), titles computed from them: generate
vs score (notebook 01), the KV cache (02), padded batches (03)."""

import textwrap

import matplotlib.pyplot as plt

from .batching import padding_report
from .plots import finish, set_title

SEGMENT_COLOURS = {"cached prefix": "C0", "padding": "0.85", "ticket": "C1", "label tokens": "C2"}
# Ticket tokens are orange in every figure (SEGMENT_COLOURS); neighbouring batches alternate two shades of it.
BATCH_SHADES = (SEGMENT_COLOURS["ticket"], "#fdbf6f")
# A legend under the axes: inside them it would cover the longest bar.
LEGEND_BELOW = dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)


def plot_generate_vs_score(steps, label_probs, info, path="generate_vs_score.png", answer=None, score_tokens=None):
    """Left: the forward passes of one ticket, generation's (``steps``: ``generation_steps``'s rows) above scoring's
    single pass; right: what that pass gives, every label's probability. ``answer``: the parsed text (default: the
    tokens); ``score_tokens``: the scoring pass's tokens (default: the prompt's). Notebook 01, section 2."""
    if not len(steps):
        raise ValueError("plot_generate_vs_score needs at least one generation step")
    labels, probs = list(label_probs), [float(p) for p in label_probs.values()]
    prompt = int(steps["input_tokens"].iloc[0])
    scored = int(score_tokens or prompt)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 0.45 * len(steps) + 2.4), width_ratios=(3, 2))
    rows = [f"generate, pass {k + 1}" for k in range(len(steps))] + ["score, the only pass"]
    widths = [*steps["input_tokens"], scored]
    left.barh(range(len(rows)), widths, color=["C3"] * len(steps) + ["C0"], alpha=0.8)
    gap = max(widths) * 0.02  # the notes start just right of each bar
    for k, step in enumerate(steps.itertuples()):
        note = f"{step.input_tokens} in -> {step.token!r} (p {step.probability:.2f})"
        left.text(step.input_tokens + gap, k, note, va="center", fontsize=8)
    left.text(scored + gap, len(steps), f"{scored} in -> every label", va="center", fontsize=8)
    left.set_xlim(0, max(widths) * 2.1)  # linear from zero: a one-token pass is a sliver beside the prompt's
    left.set_yticks(range(len(rows)), rows, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("tokens the forward pass processes")
    right.barh(range(len(labels)), probs, color="C0")
    for k, p in enumerate(probs):
        right.text(p, k, f" {p:.2f}", va="center", fontsize=8)
    right.set_yticks(range(len(labels)), labels, fontsize=8)
    right.invert_yaxis()
    right.set(xlim=(0, 1.15), xlabel="probability, softmax over the labels only")
    answer = "".join(steps["token"]) if answer is None else answer
    extra = f" and {scored - prompt} label token(s)" if scored != prompt else ""
    generating = f"generating took {len(steps)} forward passes and returned text to parse ({answer.strip()!r})"
    title = f"One ticket, both ways through the same {prompt} prompt tokens{extra}: {generating}; scoring took 1 and "
    title += "returned every label's probability"
    fig.suptitle(textwrap.fill(title, width=int(fig.get_figwidth() * 12)), fontsize=10)
    return fig, finish(fig, info, path)


def plot_kv_cache(snapshots, info, path="kv_cache.png"):
    """What a KV cache holds, step by step: a block per snapshot, positions across, layers up, coloured by kind, with
    its bytes. ``snapshots``: (name, ``DynamicCache``, each position's "reused", "appended", "dropped"). Notebook 02."""
    colours = {"reused": SEGMENT_COLOURS["cached prefix"], "appended": SEGMENT_COLOURS["ticket"], "dropped": "0.85"}
    names = {"reused": "prefix: computed once, reused", "appended": "this ticket's: appended"}
    names["dropped"] = "cropped away"
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(snapshots) + 1.8))
    longest = max(len(kinds) for _, _, kinds in snapshots)
    for row, (name, cache, kinds) in enumerate(snapshots):
        kinds, held = list(kinds), cache.get_seq_length()
        if held != len(kinds) - kinds.count("dropped"):
            raise ValueError(f"{name}: the cache holds {held} positions but kinds name {len(kinds)} positions")
        layers, tensors = len(cache.layers), [t for layer in cache.layers for t in (layer.keys, layer.values)]
        used = sum(t.nelement() * t.element_size() for t in tensors)
        stored = sum(t.untyped_storage().nbytes() for t in tensors)  # a crop is a view: its storage stays as it was
        start = 0
        for kind in dict.fromkeys(kinds):  # contiguous runs: the prefix, then the ticket's positions
            n = kinds.count(kind)
            ax.barh(row, n, left=start, height=0.7, color=colours[kind], edgecolor="none", label=names[kind])
            ax.text(start + n / 2, row, f"{n}", ha="center", va="center", fontsize=8)
            start += n
        for k in range(1, layers):  # a thin line between layers: each holds the same positions
            y = row - 0.35 + 0.7 * k / layers
            ax.plot([0, held], [y, y], color="white", lw=0.4)
        note = f"{held} positions x {layers} layers: {used / 2**20:.1f} MiB"
        note += f"\n(its storage still {stored / 2**20:.1f} MiB)" if stored > used else ""
        ax.text(len(kinds) + longest * 0.02, row, note, va="center", fontsize=8)
    first, depth = snapshots[0][1].layers[0].keys, len(snapshots[0][1].layers)
    kib = 2 * depth * first.shape[1] * first.shape[3] * first.element_size() / 2**10  # per position
    ax.set_yticks(range(len(snapshots)), [name for name, _, _ in snapshots], fontsize=8)
    ax.invert_yaxis()
    each = f"a key and a value per layer, {first.shape[1]} heads x {first.shape[3]} dims, {kib:.0f} KiB"
    ax.set(xlim=(0, longest * 1.45), xlabel=f"token position in the cache (each one: {each})")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), **LEGEND_BELOW)
    prefix = list(snapshots[0][2]).count("reused")
    title = f"The cache holds the {prefix}-token prefix once, {depth} layers deep; a ticket appends its positions to "
    set_title(ax, title + "every layer and a crop drops them again")
    return fig, finish(fig, info, path)


def plot_padded_batches(lengths, plans: dict, info, path="padded_batches.png"):
    """Each plan's batches in the order they run, a thin bar per ticket: its real tokens coloured, the left padding
    grey, neighbouring batches in alternating shades; a panel per plan, same scale, for a few tickets or hundreds."""
    fig, axes = plt.subplots(1, len(plans), figsize=(4.5 * len(plans), 5), sharex=True, squeeze=False)
    shares = {}
    for ax, (name, plan) in zip(axes[0], plans.items()):
        rows = []
        pads = []
        reals = []
        shades = []
        y = 0
        for k, batch in enumerate(plan):
            width = max(lengths[i] for i in batch)
            rows += range(y, y + len(batch))
            pads += [width - lengths[i] for i in batch]
            reals += [lengths[i] for i in batch]
            shades += [BATCH_SHADES[k % 2]] * len(batch)
            y += len(batch)
            y += max(1, y // 150)  # a gap between batches, visible at any number of tickets
        ax.barh(rows, pads, left=0, height=1, color="0.8", edgecolor="none")
        ax.barh(rows, reals, left=pads, height=1, color=shades, edgecolor="none")
        shares[name] = padding_report(lengths, plan).padding_fraction
        ax.set_title(f"{name}: {shares[name]:.0%} padding", fontsize=9)
        ax.set(ylim=(y, -1), yticks=[])
        ax.set_xlabel("tokens (grey: padding, on the left; orange: ticket tokens,\nbatches in alternating shades)")
    size = max(len(b) for plan in plans.values() for b in plan)
    axes[0][0].set_ylabel(f"{len(lengths)} tickets, in batches of up to {size} rows")
    (a, pa), (b, pb) = list(shares.items())[0], list(shares.items())[-1]
    title = f"{len(lengths)} tickets in batches of {size}: {a} {pa:.0%} padding, {b} {pb:.0%}"
    fig.suptitle(textwrap.fill(title, width=int(fig.get_figwidth() * 11)), fontsize=10)
    return fig, finish(fig, info, path)


def plot_prompt_split(prefix_tokens: int, ticket_tokens, label_tokens: int, info, path="prompt_split.png", names=None):
    """A bar per prompt: the cached prefix (the same for all), its ticket's tokens, the label tokens (notebook 02)."""
    ticket_tokens = [int(n) for n in ticket_tokens]
    if not ticket_tokens:
        raise ValueError("plot_prompt_split needs at least one ticket's token count")
    if prefix_tokens < 1 or min(ticket_tokens) < 1 or label_tokens < 0:
        counts = f"prefix {prefix_tokens}, tickets {ticket_tokens}, labels {label_tokens}"
        raise ValueError(f"token counts must be positive ({counts})")
    names = list(names) if names is not None else [f"ticket {i + 1}" for i in range(len(ticket_tokens))]
    share = prefix_tokens * len(ticket_tokens) / (prefix_tokens * len(ticket_tokens) + sum(ticket_tokens))
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(ticket_tokens) + 1.8))
    rows = range(len(ticket_tokens))
    ax.barh(rows, prefix_tokens, color="C0", alpha=0.55, label="cached prefix (computed once)")
    ax.barh(rows, ticket_tokens, left=prefix_tokens, color="C1", label="ticket's own tokens")
    if label_tokens:
        after = [prefix_tokens + n for n in ticket_tokens]
        ax.barh(rows, label_tokens, left=after, color="C2", label="label tokens (same forward)")
    for row, n in zip(rows, ticket_tokens):
        ax.text(prefix_tokens / 2, row, str(prefix_tokens), ha="center", va="center", fontsize=7)
        extra = f" + {label_tokens}" if label_tokens else ""
        ax.text(prefix_tokens + n + label_tokens, row, f" {n}{extra}", ha="left", va="center", fontsize=7)
    ax.set_yticks(rows, names, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlim=(0, (prefix_tokens + max(ticket_tokens) + label_tokens) * 1.12), xlabel="tokens in the forward pass")
    labels = f"; each ticket adds {label_tokens} label token{'s' if label_tokens != 1 else ''}" if label_tokens else ""
    title = f"The prefix is {prefix_tokens} tokens, {share:.0%} of these {len(ticket_tokens)} prompts' tokens"
    set_title(ax, title + labels)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(**LEGEND_BELOW)
    return fig, finish(fig, info, path)
