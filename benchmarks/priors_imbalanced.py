"""Which label prior suits a real queue, where one label is most of the tickets? Raw scores against the priors of
``helpers.prior`` (content-free inputs, the job's own mean, and one fitted on a labelled sample of the queue), on jobs
whose labels are 70/20/10 and 50/40/10 (and a balanced reference), both ticket styles, 0 and 6 examples: accuracy
(the share of rows right, with its 95 % Wilson interval) and balanced accuracy (the mean of the labels' recalls, with
a 95 % stratified bootstrap interval). docs/classify.md's table is this script's output.

Each (style, examples) scores one pool of tickets once, sorted batches on the prefix cache; the jobs are drawn from
it by label, without rescoring. For a mix, three jobs rotate which label gets which share (each label is the
majority once), so together they use every pool ticket exactly once: the intervals count each ticket once, and no
result leans on which label the model favours. Each job's labelled sample has the job's mix, drawn from the other two
jobs' tickets (never its own).

Run: .venv/bin/python benchmarks/priors_imbalanced.py [P] [Q]   (P tickets per job, a multiple of 10, default 80;
Q rows per labelled sample, default 30; 27 min on 2 shared cores)
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from helpers.batching import score_batched
from helpers.checks import wilson_interval
from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.prefix_cache import PrefixCache
from helpers.prior import calibrated, content_free_prior, job_prior, sample_prior
from helpers.scoring import LabelScorer

MIXES = {"70/20/10": (0.7, 0.2, 0.1), "50/40/10": (0.5, 0.4, 0.1), "balanced": (1 / 3, 1 / 3, 1 / 3)}
VARIANTS = {"raw": "raw", "cf": "content-free", "job": "job", "job10": "job of 10 rows", "one": "sample, one step"}
VARIANTS["fit"] = "sample, fitted"
SMALL_JOB = 10  # rows: each job also cut at random into jobs this small, each dividing out its own mean
BOOTSTRAP = 2000


def rotated_jobs(labels: np.ndarray, mix: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """Three jobs of the rows of ``labels``: job j takes share ``mix[(k - j) % 3]`` of label k's rows (shuffled), so
    each label is the majority once and every row lands in exactly one job."""
    rng = np.random.default_rng(seed)
    jobs = [[] for _ in LABELS]
    for k, label in enumerate(LABELS):
        rows = rng.permutation(np.flatnonzero(labels == label))
        cuts = np.cumsum([round(mix[(k - j) % 3] * len(rows)) for j in range(len(LABELS))])
        for j, part in enumerate(np.split(rows, cuts[:-1])):
            jobs[j].extend(part)
    return [np.array(sorted(job)) for job in jobs]


def labelled_sample(labels: np.ndarray, jobs: list[np.ndarray], j: int, mix, size: int, rng) -> np.ndarray:
    """``size`` rows with job ``j``'s label shares, from the other jobs' rows."""
    outside = np.setdiff1d(np.arange(len(labels)), jobs[j])
    picked = []
    for k, label in enumerate(LABELS):
        rows, wanted = outside[labels[outside] == label], round(mix[(k - j) % 3] * size)
        assert wanted <= len(rows), f"a sample of {size} needs {wanted} {label} rows outside job {j}: make P larger"
        picked.extend(rng.choice(rows, wanted, replace=False))
    return np.array(sorted(picked))


def balanced_accuracy(correct: np.ndarray, gold: np.ndarray, jobs: list[np.ndarray]) -> float:
    """The mean over jobs of the mean over labels of the label's recall in that job."""
    return float(np.mean([np.mean([correct[job][gold[job] == y].mean() for y in LABELS]) for job in jobs]))


def bootstrap_interval(correct: np.ndarray, gold: np.ndarray, jobs: list[np.ndarray], seed: int = 0):
    """95 % percentile interval of ``balanced_accuracy``, resampling rows within each (job, label) stratum (each job's
    prior held as computed: the interval counts the rows' noise, not the prior's)."""
    rng = np.random.default_rng(seed)
    strata = [job[gold[job] == y] for job in jobs for y in LABELS]
    recalls = np.stack([rng.choice(correct[rows], size=(BOOTSTRAP, len(rows))).mean(1) for rows in strata])
    values = recalls.reshape(len(jobs), len(LABELS), BOOTSTRAP).mean((0, 1))
    return tuple(np.percentile(values, [2.5, 97.5]))


def score_pool(model, tokenizer, scorer, texts, examples):
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    return score_batched(model, tokenizer, scorer, prompts, "sorted", batch_size=8, prefix=prefix, progress=False)


def main(per_job: int = 80, sample_size: int = 30) -> None:
    start = time.perf_counter()
    model, tokenizer, info = load_model("embedded", device="cpu", verbose=False)
    scorer = LabelScorer(tokenizer, LABELS)
    jobs_words = f"3 jobs of {per_job} tickets per mix, each with a labelled sample of {sample_size} rows"
    print(f"{info.short()} · {machine_name(model.device)} · {jobs_words}", flush=True)
    header = ["tickets", "examples", "mix", "metric", *VARIANTS.values()]
    print(f"| {' | '.join(header)} |\n|{'---|' * len(header)}")
    for style in ("varied", "article"):
        pool = make_tickets(3 * per_job, style=style)
        gold = pool["label"].to_numpy()
        for shots in (0, 6):
            examples = few_shot_examples(shots)
            raw = score_pool(model, tokenizer, scorer, pool["text"], examples)
            content_free = content_free_prior(model, tokenizer, scorer, examples)
            for mix_name, mix in MIXES.items():
                jobs, rng = rotated_jobs(gold, mix, seed=1), np.random.default_rng(2)
                predicted = {name: np.empty(len(gold), dtype=object) for name in VARIANTS}
                for j, job in enumerate(jobs):
                    sample = labelled_sample(gold, jobs, j, mix, sample_size, rng)
                    priors = {
                        "raw": None,
                        "cf": content_free,
                        "job": job_prior(raw[job]),
                        "one": sample_prior(raw[sample], gold[sample], steps=1),
                        "fit": sample_prior(raw[sample], gold[sample]),
                    }
                    for name, prior in priors.items():
                        predicted[name][job] = calibrated(raw[job], prior).predictions
                    for small in np.array_split(rng.permutation(job), len(job) // SMALL_JOB):
                        predicted["job10"][small] = calibrated(raw[small], job_prior(raw[small])).predictions
                correct = {name: labels == gold for name, labels in predicted.items()}
                accuracy = []
                for name in VARIANTS:
                    low, high = wilson_interval(int(correct[name].sum()), len(gold))
                    accuracy.append(f"{correct[name].mean():.0%} [{low:.0%}, {high:.0%}]")
                balanced = []
                for name in VARIANTS:
                    low, high = bootstrap_interval(correct[name], gold, jobs)
                    balanced.append(f"{balanced_accuracy(correct[name], gold, jobs):.0%} [{low:.0%}, {high:.0%}]")
                print(f"| {style} | {shots} | {mix_name} | accuracy | {' | '.join(accuracy)} |", flush=True)
                print(f"| {style} | {shots} | {mix_name} | balanced | {' | '.join(balanced)} |", flush=True)
    print(f"{(time.perf_counter() - start) / 60:.0f} minutes", flush=True)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
