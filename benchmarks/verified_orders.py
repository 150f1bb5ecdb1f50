"""Does the verified path give float32's label on every row in any row order, and what does being sure cost? The
article's tickets (3 shots, prefix cache, sorted batches of 16) in ascending, descending and shuffled token-length
order: ``score_verified`` in DTYPE against float32's scores of the same rows in the same order, with its threshold,
the rows it rescored and where its time went. The overhead is calibration plus rescoring as a share of the half pass
(issue 54: at most 15 %), and the verified run's total over the half pass alone, unverified, on the same rows and
batches (what being sure costs, measured whole). Each order runs both roundings: mixed (``mixed_precision``, the
matrix multiplies in DTYPE, what ``classify --dtype auto`` runs) and whole (``half_copy``: every weight and
activation rounded; the copy is made once, its seconds printed), and the verified path's total seconds show which is
faster here with float32's labels. Its speeds mean something only where DTYPE runs fast (notebook 00's profile: where
``classify --dtype auto`` picks it); its labels hold everywhere. On a CPU without fast bfloat16, run it on a twin.

Run: .venv/bin/python benchmarks/verified_orders.py [MODEL] [DTYPE] [N] [ROUNDINGS]   (default: embedded bfloat16 600
mixed,whole; ``mixed`` alone is what classify runs, in half the time)
"""

import contextlib
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from helpers.batching import score_batched
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.precision import half_copy, mixed_precision, score_verified
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer


def main(model_name: str, dtype: str, n: int, chosen: list[str]) -> None:
    model, tokenizer, info = load_model(model_name, dtype="float32", verbose=False)
    examples = few_shot_examples(3)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(n, style="article")["text"]]
    scorer, lengths = LabelScorer(tokenizer, LABELS), [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    plan = dict(strategy="sorted", batch_size=16, prefix=prefix, progress=False)
    began = time.perf_counter()
    roundings = {"mixed": None, "whole": half_copy(model, dtype) if "whole" in chosen else None}
    roundings = {name: roundings[name] for name in chosen}
    copied = time.perf_counter() - began
    # the half pass alone, unverified, in the same batches (whole rounding on its own copy of the prefix cache)
    own = {
        name: dict(plan, prefix=PrefixCache(whole, tokenizer, prefix.text) if whole is not None else prefix)
        for name, whole in roundings.items()
    }
    orders = {
        "ascending": sorted(range(n), key=lambda i: lengths[i]),
        "descending": sorted(range(n), key=lambda i: -lengths[i]),
        "shuffled": list(np.random.default_rng(0).permutation(n)),
    }
    print(
        f"{info.short()} · {machine_name(model.device)} · {n} article tickets, 3 shots, sorted batches of 16 + prefix"
        f" · whole rounding's copy made once in {copied:.1f} s (not in its rows below)"
    )
    print(
        "| order | rounding | labels float32's | threshold | rescored | non-finite | calibration s | half pass s |"
        " rescoring s | overhead | float32 s | verified s | half alone s | verified / half alone |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for whole in roundings.values():  # warm-up: each dtype's and rounding's first calls
        score_verified(model, tokenizer, scorer, prompts[:32], dtype, whole=whole, **plan)
    for name, order in orders.items():
        job = [prompts[i] for i in order]
        full = score_batched(model, tokenizer, scorer, job, **plan)
        for rounding, whole in roundings.items():
            verified = score_verified(model, tokenizer, scorer, job, dtype, whole=whole, **plan)
            with mixed_precision(model, dtype) if whole is None else contextlib.nullcontext():  # unverified, as is
                alone = score_batched(whole or model, tokenizer, scorer, job, **own[rounding])
            same = int((np.array(verified.predictions) == np.array(full.predictions)).sum())
            run, phases = verified.info, verified.info["phase_seconds"]
            spent = [phases.get(phase, 0.0) for phase in ("calibration", "half", "rescore")]
            print(
                f"| {name} | {rounding} | {same} of {n} | {run['threshold']:.3f} | {len(run['rescored'])} | "
                f"{len(run['non_finite'])} | {spent[0]:.1f} | {spent[1]:.1f} | {spent[2]:.1f} | "
                f"{(spent[0] + spent[2]) / spent[1]:.1%} | {full.info['seconds']:.1f} | {run['seconds']:.1f} | "
                f"{alone.info['seconds']:.1f} | {run['seconds'] / alone.info['seconds']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "embedded",
        args[1] if len(args) > 1 else "bfloat16",
        int(args[2]) if len(args) > 2 else 600,
        (args[3] if len(args) > 3 else "mixed,whole").split(","),
    )
