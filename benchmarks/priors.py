"""Which label prior should ``classify`` use by default? Raw scores against the two priors of ``helpers.prior``
(content-free inputs, the job's own mean), on both ticket styles, with 0, 3 and 6 examples: accuracy with its 95 %
Wilson interval, the largest share one label gets (a balanced set: a third each), and McNemar's exact test of each
prior against raw on the same tickets. docs/classify.md's table is this script's output.

Run: .venv/bin/python benchmarks/priors.py [N]   (N tickets per style, default 210; ~20 min on 2 cores)
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from helpers.batching import score_batched
from helpers.checks import mcnemar_exact, wilson_interval
from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.prefix_cache import PrefixCache
from helpers.prior import calibrated, content_free_prior, job_prior
from helpers.scoring import LabelScorer


def main(n: int) -> None:
    model, tokenizer, info = load_model("embedded", device="cpu", verbose=False)
    print(f"{info.short()} · {machine_name(model.device)} · {n} tickets per style (balanced)", flush=True)
    scorer = LabelScorer(tokenizer, LABELS)
    print("| tickets | examples | raw | content-free prior | job prior | top label's share: raw / cf / job |")
    print("|---|---|---|---|---|---|")
    for style in ("varied", "article"):
        tickets = make_tickets(n, style=style)
        gold = tickets["label"].to_numpy()
        for shots in (0, 3, 6):
            examples = few_shot_examples(shots)
            prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in tickets["text"]]
            prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
            raw = score_batched(
                model, tokenizer, scorer, prompts, "sorted", batch_size=8, prefix=prefix, progress=False
            )
            priors = {"cf": content_free_prior(model, tokenizer, scorer, examples), "job": job_prior(raw)}
            variants = {"raw": raw, **{name: calibrated(raw, prior) for name, prior in priors.items()}}
            correct = {name: np.array(scores.predictions) == gold for name, scores in variants.items()}
            cells = []
            for name in variants:
                low, high = wilson_interval(int(correct[name].sum()), n)
                cell = f"{correct[name].mean():.0%} [{low:.0%}, {high:.0%}]"
                if name != "raw":
                    only_it = int((correct[name] & ~correct["raw"]).sum())
                    only_raw = int((~correct[name] & correct["raw"]).sum())
                    cell += f" (p = {mcnemar_exact(only_it, only_raw):.3f})"
                cells.append(cell)
            shares = [max(np.unique(scores.predictions, return_counts=True)[1]) / n for scores in variants.values()]
            print(f"| {style} | {shots} | {' | '.join(cells)} | {' / '.join(f'{s:.0%}' for s in shares)} |", flush=True)
            for name, prior in priors.items():
                print(f"<!-- {style} {shots}-shot {prior} -->", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 210)
