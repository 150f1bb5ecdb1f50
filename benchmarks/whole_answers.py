"""Whole answers (each label + the end-of-answer marker) vs answer prefixes on the course's labels: accuracy, label
agreement, McNemar's exact test and speed, zero-shot and 6-shot, on both ticket styles: the README's table behind
``LabelScorer``'s default (``complete=None``: whole answers only where a label extends another).

Run: .venv/bin/python benchmarks/whole_answers.py [N]   (N tickets per style, default 120; ~16 min on 2 cores)
"""

import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from helpers.batching import score_batched
from helpers.checks import assert_agrees, mcnemar_exact, wilson_interval
from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets
from helpers.models import load_model
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer, LabelScores, score_one_by_one
from helpers.timing import Timing

REPEATS = 3  # timed runs per variant, alternating which goes first (4 each would let the rule name a winner)


def main(n: int) -> None:
    model, tokenizer, info = load_model("embedded", device="cpu", verbose=False)
    print(info.short(), torch.backends.cpu.get_cpu_capability(), flush=True)
    scorers = {complete: LabelScorer(tokenizer, LABELS, complete=complete) for complete in (False, True)}
    for style in ("varied", "article"):
        tickets = make_tickets(n, style=style)
        gold = tickets["label"].to_numpy()
        for shots in (0, 6):
            examples = few_shot_examples(shots)
            prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in tickets["text"]]
            prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)

            def run(complete):
                return score_batched(
                    model, tokenizer, scorers[complete], prompts, "sorted", batch_size=8, prefix=prefix, progress=False
                )

            results, seconds = {}, {False: [], True: []}
            for complete in (False, True):  # the warm-up run, checked against the loop on 12 tickets
                results[complete] = run(complete)
                reference = score_one_by_one(model, tokenizer, scorers[complete], prompts[:12], progress=False)
                assert_agrees(reference, LabelScores(LABELS, results[complete].log_scores[:12]))
            for repeat in range(REPEATS):
                for complete in (False, True) if repeat % 2 == 0 else (True, False):
                    start = time.perf_counter()
                    run(complete)
                    seconds[complete].append(time.perf_counter() - start)
            predicted = {complete: np.array(results[complete].predictions) for complete in (False, True)}
            correct = {complete: predicted[complete] == gold for complete in (False, True)}
            only_prefix = int((correct[False] & ~correct[True]).sum())
            only_whole = int((~correct[False] & correct[True]).sum())
            for complete, name in ((False, "prefixes"), (True, "whole")):
                low, high = wilson_interval(int(correct[complete].sum()), n)
                counts = {label: int((predicted[complete] == label).sum()) for label in LABELS}
                print(
                    f"{style:7s} {shots}-shot {name:8s}: accuracy {correct[complete].mean():.3f} "
                    f"[{low:.2f}, {high:.2f}], "
                    f"{n / statistics.median(seconds[complete]):.1f} items/s (runs {min(seconds[complete]):.2f}-"
                    f"{max(seconds[complete]):.2f} s) {counts}"
                )
            print(
                f"    same label {np.mean(predicted[False] == predicted[True]):.3f}; discordant {only_prefix} vs "
                f"{only_whole}, McNemar exact p={mcnemar_exact(only_prefix, only_whole):.3f}; "
                f"{Timing('whole', seconds[True]).verdict(Timing('prefixes', seconds[False]))}",  # the series' rule
                flush=True,
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 120)
