"""Does the verified path give the float32 run's label on every row in any row order, prior included, and what does
being sure cost? The article's tickets (3 shots, prefix cache, sorted batches of 16) in ascending, descending and
shuffled token-length order, as ``classify`` runs them with the job's prior (the default): the prior's
``PRIOR_ROWS`` rows spread over the length order scored first, in float32, by both runs; then the float32 run scores
the other rows in the job's batches and the verified run scores them with ``score_verified`` in DTYPE, its near ties
read after that prior. Its labels are compared with the float32 run's row by row.

The columns: the verified run's threshold, the rows it rescored and where its time went (calibration plus rescoring as
a share of the half pass); the prior's rows' seconds; the verified run's total (with the prior's rows) over the half
pass alone, unverified, on all rows in the same batches (what being sure costs, measured whole). "before" is issue
68's starting point, timed in the same run: every row in the half pass and the job's prior averaged over the verified
scores at the end, near ties under it rescored (``settle_job_prior``), its labels against a float32 run that averages
all its rows; "prior overhead" is the run with the prior's rows over it. Each order runs the roundings asked for:
mixed (``mixed_precision``, the matrix multiplies in DTYPE, what ``classify --dtype auto`` runs) and whole
(``half_copy``: every weight and activation rounded; the copy is made once, its seconds printed). Its speeds mean
something only where DTYPE runs fast (notebook 00's profile: where ``classify --dtype auto`` picks it); its labels
hold everywhere. On a CPU without fast bfloat16, run it on a twin.

Run: .venv/bin/python benchmarks/verified_orders.py [MODEL] [DTYPE] [N] [ROUNDINGS]   (default: embedded bfloat16 600
mixed; ``mixed,whole`` runs both)
"""

import contextlib
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from helpers.batching import score_batched
from helpers.classify import PRIOR_ROWS
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.precision import calibration_rows, half_copy, mixed_precision, rescore, score_verified, settle_job_prior
from helpers.prefix_cache import PrefixCache
from helpers.prior import calibrated, job_prior, mean_prior
from helpers.scoring import LabelScorer, LabelScores

COLUMNS = (
    "order", "rounding", "labels the float32 run's", "threshold", "rescored", "calibration s", "half pass s",
    "rescoring s", "overhead", "prior's rows s", "float32 s", "verified s", "half alone s", "verified / half alone",
    "before: labels", "before: verified s", "prior overhead",
)  # fmt: skip


def before_issue_68(model, tokenizer, scorer, job, dtype, whole, plan, full):
    """The verified run as it was: every row in the half pass, the job's prior averaged over its scores at the end and
    the near ties under it rescored; its labels against a float32 run averaging all its rows. (labels same, seconds)"""
    began = time.perf_counter()
    verified = score_verified(model, tokenizer, scorer, job, dtype, whole=whole, **plan)
    exact = {*calibration_rows(tokenizer, job, 16), *verified.info["rescored"]}

    def in_float32(rows):
        return rescore(model, tokenizer, scorer, [job[i] for i in rows], **plan).log_scores

    settled = settle_job_prior(verified, exact, verified.info["threshold"], in_float32)[0]
    seconds = time.perf_counter() - began
    reference = calibrated(full, job_prior(full)).predictions
    return int((np.array(settled.predictions) == np.array(reference)).sum()), seconds


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
        f" · the job's prior from {min(PRIOR_ROWS, n)} rows · whole rounding's copy made once in {copied:.1f} s"
        " (not in its rows below)"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for whole in roundings.values():  # warm-up: each dtype's and rounding's first calls
        score_verified(model, tokenizer, scorer, prompts[:32], dtype, whole=whole, **plan)
    for name, order in orders.items():
        job = [prompts[i] for i in order]
        full = score_batched(model, tokenizer, scorer, job, **plan)
        sample = calibration_rows(tokenizer, job, PRIOR_ROWS)
        rest = [i for i in range(n) if i not in set(sample)]
        first = rescore(model, tokenizer, scorer, [job[i] for i in sample], **plan)  # as classify scores them
        prior = mean_prior(first, "the job's sample")
        float32 = full.log_scores.clone()  # the float32 run: the sample's rows from their own pass, the rest in batches
        float32[sample] = first.log_scores
        reference = np.array(calibrated(LabelScores(LABELS, float32), prior).predictions)
        for rounding, whole in roundings.items():
            verified = score_verified(model, tokenizer, scorer, [job[i] for i in rest], dtype, whole=whole,
                                      prior=prior, **plan)  # fmt: skip
            with mixed_precision(model, dtype) if whole is None else contextlib.nullcontext():  # unverified, as is
                alone = score_batched(whole or model, tokenizer, scorer, job, **own[rounding])
            auto = float32.clone()
            auto[rest] = verified.log_scores
            same = int((np.array(calibrated(LabelScores(LABELS, auto), prior).predictions) == reference).sum())
            before, before_seconds = before_issue_68(model, tokenizer, scorer, job, dtype, whole, plan, full)
            run, phases = verified.info, verified.info["phase_seconds"]
            spent = [phases.get(phase, 0.0) for phase in ("calibration", "half", "rescore")]
            total = run["seconds"] + first.info["seconds"]
            cells = [
                name, rounding, f"{same} of {n}", f"{run['threshold']:.3f}", len(run["rescored"]), f"{spent[0]:.1f}",
                f"{spent[1]:.1f}", f"{spent[2]:.1f}", f"{(spent[0] + spent[2]) / spent[1]:.1%}",
                f"{first.info['seconds']:.1f}", f"{full.info['seconds']:.1f}", f"{total:.1f}",
                f"{alone.info['seconds']:.1f}", f"{total / alone.info['seconds']:.3f}", f"{before} of {n}",
                f"{before_seconds:.1f}", f"{total / before_seconds:.3f}",
            ]  # fmt: skip
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "embedded",
        args[1] if len(args) > 1 else "bfloat16",
        int(args[2]) if len(args) > 2 else 600,
        (args[3] if len(args) > 3 else "mixed").split(","),
    )
