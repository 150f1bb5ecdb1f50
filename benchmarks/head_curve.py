"""Is the model worth speeding up once its label rows are fitted? A learning curve of the fitted label head
(``helpers.head``, ``classify --fit-head``) on the hand-written held-out set (``helpers.data.held_out_tickets``, never
fitted on), beside the keyword rules, the zero-shot label scores (raw, and with the set's own prior divided out, as
``classify``'s job prior does) and the unfitted head; with 0 and 3 few-shot examples in the prompt. Each head is fitted
on N rows drawn (DRAWS seeds) from 600 varied synthetic tickets (``make_tickets(style="varied")``, seed 11), its pull
towards the LM head's rows chosen by 5-fold cross-validation on those rows alone. Accuracy with its 95 % Wilson
interval; each draw's figure. Then the head's speed with each prompt: the held-out rows on the prefix cache in sorted
batches of 16, 4 alternating rounds (a shorter prompt is a shorter cached prefix: the same rows, less to cache).

READS: what the fitted heads read, ``mean`` (the mean final state over each ticket's own tokens, as ``classify
--fit-head`` fits) or ``answer`` (the answer position alone, as the LM head does).

Run: .venv/bin/python benchmarks/head_curve.py [MODEL] [DRAWS] [SIZES] [READS] [SHOTS]
(default: embedded 4 10,30,100,300 mean 0,3)
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from helpers.batching import score_batched
from helpers.checks import wilson_interval
from helpers.data import LABELS, build_prompt, few_shot_examples, held_out_tickets, keyword_label, make_tickets
from helpers.head import LabelHead, answer_states, fit_head
from helpers.models import load_model, machine_name
from helpers.prefix_cache import PrefixCache, prefix_length
from helpers.prior import calibrated, job_prior
from helpers.scoring import LabelScorer
from helpers.timing import compare


def accuracy(predicted, gold) -> str:
    right = int(sum(p == g for p, g in zip(predicted, gold)))
    low, high = wilson_interval(right, len(gold))
    return f"{right / len(gold):.0%} [{low:.0%}, {high:.0%}]"


def curve(model, tokenizer, shots: int, draws: int, sizes: list[int], reads: str) -> tuple[list[str], LabelHead, list]:
    """The table's lines for one prompt, the head fitted on the most rows of the first draw, and its prompts."""
    held, pool, examples = held_out_tickets(), make_tickets(600, seed=11, style="varied"), few_shot_examples(shots)
    gold, scorer = list(held["label"]), LabelScorer(tokenizer, LABELS)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in held["text"]]
    ticket = prefix_length(tokenizer, labels=LABELS, examples=examples) if reads == "mean" else None
    began = time.perf_counter()
    held_states = answer_states(model, tokenizer, prompts, mean_from=ticket)
    pool_prompts = [build_prompt(tokenizer, t, LABELS, examples) for t in pool["text"]]
    pool_states = answer_states(model, tokenizer, pool_prompts, mean_from=ticket)
    seconds = time.perf_counter() - began
    raw = score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=16, progress=False)
    start = LabelHead.from_lm_head(model, scorer)
    lines = [
        f"| {shots} | keyword rules | | {accuracy([keyword_label(t) for t in held['text']], gold)} | |",
        f"| {shots} | label scores, raw | | {accuracy(raw.predictions, gold)} | |",
        f"| {shots} | label scores, the set's prior divided out | | "
        f"{accuracy(calibrated(raw, job_prior(raw)).predictions, gold)} | |",
        f"| {shots} | head, unfitted (first tokens' rows, on the {reads}) | 0 | "
        f"{accuracy([LABELS[i] for i in start.logits(held_states).argmax(-1)], gold)} | |",
    ]
    kept = None
    for n in sizes:
        figures, shares = [], []
        for seed in range(draws):
            rows = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:n]
            head = fit_head(start, pool_states[rows], list(pool["label"].iloc[rows.numpy()]), mean_from=ticket)
            predicted = [LABELS[i] for i in head.logits(held_states).argmax(-1)]
            figures.append(f"{accuracy(predicted, gold)} (pull {head.info['strength']:g})")
            shares.append(np.mean([p == g for p, g in zip(predicted, gold)]))
            kept = head if seed == 0 else kept
        lines.append(f"| {shots} | head fitted ({reads}) | {n} | mean {np.mean(shares):.0%} | {'; '.join(figures)} |")
    print(f"shots {shots}: hidden states of {len(held) + len(pool)} prompts in {seconds:.0f} s", flush=True)
    return lines, kept, prompts


def main(model_name: str, draws: int, sizes: list[int], reads: str, shots_tried: list[int]) -> None:
    model, tokenizer, info = load_model(model_name, dtype="float32", verbose=False)
    print(f"{info.short()} · {machine_name(model.device)} · held-out: {len(held_out_tickets())} hand-written tickets")
    table, heads = ["| shots | readout | labelled rows | accuracy [95 %] | each draw |", "|---|---|---|---|---|"], {}
    for shots in shots_tried:
        lines, heads[shots], prompts = curve(model, tokenizer, shots, draws, sizes, reads)
        table += lines
        heads[shots] = (heads[shots], prompts, PrefixCache.for_prompts(model, tokenizer, labels=LABELS,
                                                                       examples=few_shot_examples(shots)))  # fmt: skip
    print("\n".join(table))

    def scoring(shots):
        head, prompts, prefix = heads[shots]

        def run():
            with head.installed(model):
                return score_batched(model, tokenizer, head.scorer(), prompts, "sorted", 16, prefix, False)

        return run

    if len(heads) < 2:
        return
    timed = compare({f"{shots}-shot": scoring(shots) for shots in heads}, model.device, repeats=4)
    n = len(heads[0][1])
    for shots, (_, _, prefix) in heads.items():
        timing = timed[f"{shots}-shot"]
        print(f"{shots}-shot head: prefix {prefix.length} tokens, {n / timing.median:.1f} items/s "
              f"({n / timing.high:.1f}-{n / timing.low:.1f})")  # fmt: skip
    names = list(timed)
    print(timed[names[0]].verdict(timed[names[1]]))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "embedded",
        int(args[1]) if len(args) > 1 else 4,
        [int(n) for n in (args[2] if len(args) > 2 else "10,30,100,300").split(",")],
        args[3] if len(args) > 3 else "mean",
        [int(n) for n in (args[4] if len(args) > 4 else "0,3").split(",")],
    )
