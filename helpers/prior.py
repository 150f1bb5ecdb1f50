"""The label prior (notebook 01, section 4; ``classify --prior``): what the model gives each label before it has read a
ticket, and label scores with it divided out.

A small model asked zero-shot often puts most of its probability on one label whatever the ticket says. Dividing each
row's label probabilities by the model's prior over the labels ("contextual calibration", Zhao et al. 2021; "batch
calibration", Zhou et al. 2023) subtracts one log-prob per label from every row: a shift, so the forward passes, and
every speed path's agreement with the loop, stay as they were; only which label is on top can move.

Two estimates: ``content_free_prior`` scores inputs that say nothing ("N/A", "", a placeholder) through the job's own
prompt, autocast off (three extra rows); ``job_prior`` averages the job's own probabilities, after the last row (a
resumed or data-parallel run reads the same scores and gets the same prior)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batching import score_batched
from .data import build_prompt
from .scoring import LabelScores

PRIORS = ("none", "content-free", "job")  # classify --prior
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
        missing = [label for label in labels if label not in self.labels]
        if missing:
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
    return mean_prior(scores, f"content-free, {len(texts)} inputs")


def calibrated(scores: LabelScores, prior: Prior | None) -> LabelScores:
    """``scores`` with ``prior`` divided out (``log_scores`` stay raw; ``None``: unchanged). Notebook 01, section 4."""
    shift = None if prior is None else prior.for_labels(scores.labels)
    return LabelScores(scores.labels, scores.log_scores, scores.info, prior=shift)
