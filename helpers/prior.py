"""The label prior (notebook 01, section 4; ``classify --prior``): what the model gives each label before it has read a
ticket, and label scores with it divided out.

A small model asked zero-shot often puts most of its probability on one label whatever the ticket says. Dividing each
row's label probabilities by the model's prior over the labels ("contextual calibration", Zhao et al. 2021; "batch
calibration", Zhou et al. 2023) subtracts one log-prob per label from every row: a shift, so the forward passes, and
every speed path's agreement with the loop, stay as they were; only which label is on top can move.

``content_free_prior`` scores inputs that say nothing ("N/A", "", a placeholder) through the job's prompt, autocast off
(three extra rows); ``job_prior`` averages the job's own probabilities (``classify`` averages a sample of its rows
spread over their lengths, scored before the others, in float32 under ``--dtype auto``, so that a float32, an auto, a
resumed and a data-parallel run divide out the same prior): both aim at balanced accuracy, the rule for a uniform
class prior.
``sample_prior`` fits a labelled sample, so a queue that is 70 % one label keeps that mix (accuracy's rule);
``save_prior``/``load_prior`` carry a prior to later jobs (a row's label then no longer depends on the rest of its
file). benchmarks/priors_imbalanced.py's table in docs/classify.md measures them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .batching import score_batched
from .data import build_prompt
from .scoring import LabelScores

PRIORS = ("none", "content-free", "job", "labelled")  # classify --prior
CONTENT_FREE = ("N/A", "", "[ticket]")  # Zhao et al.'s content-free inputs, and a placeholder


@dataclass(frozen=True)
class Prior:
    """Log-probabilities over ``labels`` (as probabilities they sum to 1) and their source. Notebook 01, section 4."""

    labels: list[str]
    log_probs: torch.Tensor
    source: str

    def __post_init__(self):
        if self.log_probs.shape != (len(self.labels),):
            raise ValueError(
                f"a prior over {len(self.labels)} labels needs as many log-probs, got {self.log_probs.shape}"
            )
        if not torch.isfinite(self.log_probs).all():
            raise ValueError(f"the prior ({self.source}) is not finite: {self.log_probs.tolist()}")

    def for_labels(self, labels: Sequence[str]) -> torch.Tensor:
        """The log-probs in the order of ``labels``; a label the prior does not cover is an error."""
        if missing := [label for label in labels if label not in self.labels]:
            raise ValueError(f"the prior ({self.source}) does not cover label(s) {missing}: it has {self.labels}")
        return self.log_probs[[self.labels.index(label) for label in labels]]

    def __str__(self) -> str:
        shares = ", ".join(f"{label} {p:.0%}" for label, p in zip(self.labels, self.log_probs.exp().tolist()))
        return f"prior ({self.source}): {shares}"


def mean_prior(scores: LabelScores, source: str) -> Prior:
    """The mean of the rows' label probabilities (raw, before any prior), as log-probs. Notebook 01, section 4."""
    if not len(scores):
        raise ValueError(f"a prior needs at least one row ({source}): there are none")
    return Prior(list(scores.labels), torch.softmax(scores.log_scores.double(), dim=-1).mean(0).log().float(), source)


def job_prior(scores: LabelScores) -> Prior:
    """The job's own mean probabilities: every row of it (computed after the last one). Notebook 01, section 4."""
    return mean_prior(scores, f"the job's {len(scores)} rows")


def content_free_prior(model, tokenizer, scorer, examples=(), descriptions=None, texts=CONTENT_FREE) -> Prior:
    """The mean probabilities the model gives ``texts``, inputs that say nothing, in the job's prompt, scored one at a
    time in the model's dtype, autocast off (float32 under ``--dtype auto``). Notebook 01, section 4 (Going deeper)."""
    prompts = [build_prompt(tokenizer, text, scorer.labels, examples, descriptions) for text in texts]
    with torch.autocast(model.device.type, enabled=False):
        scores = score_batched(model, tokenizer, scorer, prompts, "loop", progress=False)
    return mean_prior(scores, f"content-free, {len(texts)} inputs, in {str(model.dtype).removeprefix('torch.')}")


def calibrated(scores: LabelScores, prior: Prior | None) -> LabelScores:
    """``scores`` with ``prior`` divided out (``log_scores`` stay raw; ``None``: unchanged). Notebook 01, section 4."""
    shift = None if prior is None else prior.for_labels(scores.labels)
    return LabelScores(scores.labels, scores.log_scores, scores.info, prior=shift)


def sample_prior(scores: LabelScores, gold: Sequence[str], steps: int = 100) -> Prior:
    """The prior that, divided out of a labelled sample's raw scores, makes their mean probabilities its label shares
    (the maximum-likelihood shift: ``b += log mean p(b) - log share`` repeated; ``steps=1``: one step from raw). Where
    a row says little, the label most of the queue has wins, as accuracy's rule has it. No lesson builds it:
    ``classify --prior labelled``."""
    gold = list(gold)
    if len(gold) != len(scores):
        raise ValueError(f"the labelled sample has {len(scores)} scored rows but {len(gold)} labels")
    if (unknown := sorted(set(gold) - set(scores.labels))) or (unseen := [y for y in scores.labels if y not in gold]):
        wrong = f"labels {unknown} are not among {scores.labels}" if unknown else f"no row is labelled {unseen}"
        raise ValueError(f"the labelled sample does not fit the labels: {wrong} (label at least one row of each)")
    log_freq = torch.tensor([gold.count(y) / len(gold) for y in scores.labels], dtype=torch.float64).log()
    raw, shift = scores.log_scores.double(), torch.zeros(len(scores.labels), dtype=torch.float64)
    for _ in range(steps):
        step = torch.softmax(raw - shift, dim=-1).mean(0).log() - log_freq
        shift += step
        if step.abs().max() < 1e-9:
            break
    source = f"a labelled sample of {len(gold)} rows" + (", one step" if steps == 1 else "")
    return Prior(list(scores.labels), torch.log_softmax(shift, 0).float(), source)


def prior_scope(model: str, labels: Sequence[str], examples=(), prompt_format="chat", whole_answers=False) -> dict:
    """What a saved prior is valid for: what changes the raw scores it divides out (the model, the prompt's labels and
    examples, its format, whole answers), not the dtype (a score within tolerance). No lesson builds it:
    ``classify --prior-from``."""
    digest = hashlib.sha256(json.dumps([list(pair) for pair in examples]).encode()).hexdigest()[:16]
    scope = dict(model=model, labels=list(labels), examples=digest, prompt_format=prompt_format)
    return scope | {"whole_answers": whole_answers}


def save_prior(prior: Prior, path: str | Path, scope: dict) -> None:
    """``prior`` as a small JSON file, with the ``prior_scope`` it is valid for. No lesson builds it: --save-prior."""
    saved = dict(labels=prior.labels, log_probs=prior.log_probs.tolist(), source=prior.source, valid_for=scope)
    Path(path).write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")


def load_prior(path: str | Path, scope: dict) -> Prior:
    """The prior ``save_prior`` wrote, for a job of this ``prior_scope``; a missing or unreadable file, or a prior made
    for other labels, another model or prompt, is a one-line ``ValueError`` naming the file. No lesson builds it:
    ``classify --prior-from``."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        prior = Prior(saved["labels"], torch.tensor(saved["log_probs"], dtype=torch.float32), saved["source"])
        made_for = dict(saved["valid_for"])
    except FileNotFoundError:
        raise ValueError(f"{path}: no such prior file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON file ({error})") from None
    except (KeyError, TypeError, ValueError) as error:  # a key missing, a wrong type, a non-finite prior
        raise ValueError(f"{path}: not a prior file ({'no key ' * isinstance(error, KeyError)}{error})") from None
    if missing := [label for label in scope["labels"] if label not in prior.labels]:
        raise ValueError(f"{path}: the prior does not cover this job's label(s) {missing}: it has {prior.labels}")
    for key, now in scope.items():
        if made_for.get(key) != now:
            raise ValueError(f"{path}: the prior was made for {key} {made_for.get(key)!r}, not this job's {now!r}")
    return Prior(prior.labels, prior.log_probs, f"{prior.source}, from {path}")
