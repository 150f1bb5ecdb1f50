"""A fitted label head (notebook 01, section 5; ``classify --fit-head``): the labels' rows of the LM head, fitted.

The label scorer reads the LM head at the answer position: each label's first token gets the final hidden state times
that token's row of the LM head. Keep only those rows, one per label (a label of several tokens starts from its first
token's row), add a bias per label (the label prior is exactly such a shift), and you have a linear classifier on the
hidden state that, before any fitting, gives the zero-shot scorer's first-token labels. ``fit_head`` fits it to
labelled rows as a logistic regression on standardised states, held near those rows (an L2 pull towards them, its
strength chosen by cross-validation on the labelled rows), so that tens of labelled tickets move it where hundreds
would be needed from zero. A fitted head can also read the mean of the final hidden states over the ticket's own
tokens (``mean_from``: the shared prefix's length) instead of the answer position alone: the ticket's words are spread
over its positions, and on the hand-written tickets the mean reads better (docs/classify.md). Scoring with it is one
forward pass per row, on the prefix cache and in any batching, with no label tokens appended: ``LabelHead.installed``
puts it in the LM head's place and ``HeadScorer`` reads its outputs (a head is linear: the mean of its outputs is its
output on the mean)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .batching import plan_batches
from .data import encode_prompts
from .scoring import LabelScorer, check_labels, mean_over, pad_left

# The pull towards the LM head's rows, as a multiple of the data term's scale (below): the candidates cross-validation
# chooses among, strongest first (ties go to the stronger pull, the smaller change).
STRENGTHS = (1.0, 0.1, 0.01, 0.001, 0.0001)
FOLDS = 5  # cross-validation folds (at most one per labelled row)


@dataclass
class LabelHead:
    """One row and one bias per label, on the model's final hidden state at the answer position, or (``mean_from`` K)
    on its mean over the prompt's positions from K on; ``start``: the LM head's rows it was fitted from (the pull's
    centre); ``info``: how it was fitted."""

    labels: list[str]
    weight: torch.Tensor  # (labels, hidden), float32
    bias: torch.Tensor  # (labels,)
    start: torch.Tensor | None = None
    info: dict = field(default_factory=dict)
    mean_from: int | None = None

    @classmethod
    def from_lm_head(cls, model, scorer: LabelScorer) -> LabelHead:
        """The unfitted head: the LM head's rows (and bias, where it has one) for the labels' first tokens. Notebook 01,
        section 5."""
        check_plain_lm_head(model)
        lm_head = model.get_output_embeddings()
        rows = lm_head.weight[scorer.first_ids].detach().float().cpu().clone()
        bias = torch.zeros(len(scorer.labels))
        if getattr(lm_head, "bias", None) is not None:
            bias = lm_head.bias[scorer.first_ids].detach().float().cpu().clone()
        return cls(list(scorer.labels), rows, bias, rows.clone(), {"fitted_on": 0})

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        return states.float() @ self.weight.T + self.bias

    def linear(self, like: torch.nn.Module) -> torch.nn.Linear:
        """The head as a ``torch.nn.Linear`` on ``like``'s device and in its dtype (the LM head it stands in for)."""
        weight = like.weight
        layer = torch.nn.Linear(self.weight.shape[1], len(self.labels), bias=True, device=weight.device)
        with torch.no_grad():
            layer.weight.copy_(self.weight)
            layer.bias.copy_(self.bias)
        return layer.to(weight.dtype)

    @contextmanager
    def installed(self, model):
        """In this block ``model``'s outputs are this head's logits, one per label (``HeadScorer`` reads them): every
        scoring path (prefix cache, batching, mixed precision's float32 output layer) runs it unchanged."""
        check_plain_lm_head(model)
        lm_head = model.get_output_embeddings()
        model.set_output_embeddings(self.linear(lm_head))
        try:
            yield self
        finally:
            model.set_output_embeddings(lm_head)

    def digest(self) -> str:
        """A short digest of the head's numbers and what it reads (a resumed run's fingerprint)."""
        numbers = torch.cat([self.weight.flatten(), self.bias]).numpy().tobytes() + repr(self.mean_from).encode()
        return hashlib.sha256(numbers).hexdigest()[:16]

    def scorer(self) -> HeadScorer:
        """The ``LabelScorer`` that reads this head's outputs where it is installed."""
        return HeadScorer(self.labels, self.mean_from)


# Config entries of models whose forward transforms the LM head's logits (Gemma's soft cap, Granite's and Cohere's
# scales): a head in the LM head's place would be transformed too, and its fit does not know it.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_scaling", "logit_scale")


def check_plain_lm_head(model) -> None:
    """A one-line ``ValueError`` where the model transforms its logits after the LM head (``LOGIT_TRANSFORMS``)."""
    config = model.config
    if found := [name for name in LOGIT_TRANSFORMS if getattr(config, name, None) not in (None, 1, 1.0)]:
        raise ValueError(
            f"a fitted head needs a plain LM head, and this model's forward transforms its logits ({found[0]})"
        )


class HeadScorer(LabelScorer):
    """A ``LabelScorer`` for a model whose LM head is a ``LabelHead`` (``LabelHead.installed``): each label is output
    ``i``, read at the answer position or (``mean_from``) averaged over the ticket's own, no tokens appended. No lesson
    builds it: ``classify --fit-head``."""

    def __init__(self, labels: Sequence[str], mean_from: int | None = None):  # no tokenizer: the head's outputs
        self.labels, self.mean_from = check_labels(labels), mean_from
        self.label_ids = self.token_ids = [[i] for i in range(len(self.labels))]
        self.first_ids = list(range(len(self.labels)))
        self.overlaps, self.end_ids = [], []  # no tokens: nothing extends another, no end-of-answer marker
        self.complete = self.normalize = False
        self.method = "head"
        self.lengths = torch.ones(len(self.labels), dtype=torch.long)
        self.multi, self.tail = [], []
        self.tail_targets = self.tail_label = self.tail_offsets = torch.zeros(0, dtype=torch.long)

    def describe(self) -> str:
        where = "one position" if self.mean_from is None else f"the mean of positions {self.mean_from} on"
        return f"a fitted label head over {len(self.labels)} labels, {where} per row"


@torch.no_grad()  # not inference_mode: fitting takes these states into autograd
def answer_states(
    model, tokenizer, prompts: Sequence[str], batch_size: int = 16, mean_from: int | None = None
) -> torch.Tensor:
    """The final hidden state (after the last norm: what the LM head reads) at each prompt's last position, the answer
    position, or (``mean_from`` K) its mean over the positions from K on, in sorted batches: (prompts, hidden),
    float32, on the CPU. Notebook 01, section 5."""
    rows = encode_prompts(tokenizer, prompts)
    states = torch.zeros((len(rows), model.get_output_embeddings().weight.shape[1]))
    for batch in plan_batches([len(row) for row in rows], "sorted", batch_size):
        ids, mask = pad_left([rows[i] for i in batch], tokenizer.pad_token_id)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
        out = model.base_model(**{key: value.to(model.device) for key, value in inputs.items()}, use_cache=False)
        hidden = out.last_hidden_state.float()
        if mean_from is None:
            states[batch] = hidden[:, -1].cpu()
        else:
            states[batch] = mean_over(hidden, mask, positions, mean_from).cpu()
    return states


def _fit(start: LabelHead, states: torch.Tensor, targets: torch.Tensor, strength: float, steps: int) -> LabelHead:
    """Cross-entropy of the head on ``states`` plus ``strength`` times the squared distance of its rows from
    ``start``'s, that distance taken relative to the start rows' own squared size per label, minimised with L-BFGS."""
    centre = start.start if start.start is not None else start.weight
    weight, bias = start.weight.clone().requires_grad_(True), start.bias.clone().requires_grad_(True)
    scale = float(centre.pow(2).sum()) or 1.0
    optimiser = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def loss():
        optimiser.zero_grad()
        value = torch.nn.functional.cross_entropy(states @ weight.T + bias, targets)
        value = value + strength * (weight - centre).pow(2).sum() / scale * len(start.labels)
        value.backward()
        return value

    with torch.enable_grad():
        optimiser.step(loss)
    return LabelHead(start.labels, weight.detach(), bias.detach(), centre, dict(strength=strength), start.mean_from)


def cross_validated_strength(start: LabelHead, states, targets, folds: int = FOLDS, steps: int = 100) -> float:
    """The pull's strength among ``STRENGTHS`` with the best held-out accuracy over ``folds`` folds of the labelled
    rows (every row held out once), ties to the stronger pull. Notebook 01, section 5 (through ``fit_head``)."""
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))
    parts = [order[k::folds] for k in range(min(folds, len(targets)))]
    best, chosen = -1.0, STRENGTHS[0]
    for strength in STRENGTHS:
        right = 0
        for held in parts:
            kept = torch.ones(len(targets), dtype=torch.bool)
            kept[held] = False
            fitted = _fit(start, states[kept], targets[kept], strength, steps)
            right += int((fitted.logits(states[held]).argmax(-1) == targets[held]).sum())
        if right > best:
            best, chosen = right, strength
    return chosen


def fit_head(
    start: LabelHead, states: torch.Tensor, gold: Sequence[str], strength: float | None = None, mean_from=None
) -> LabelHead:
    """``start`` (``LabelHead.from_lm_head``) fitted to labelled rows: their ``answer_states`` (``mean_from``: as they
    were read) and labels. Every label needs a row; ``strength`` None: chosen by ``cross_validated_strength``. The fit
    runs on the states standardised over the labelled rows (each of the hidden state's features centred and scaled to
    its spread there, the start's rows carried along), so that the pull weighs a change to each feature by how much
    that feature varies between tickets; the head it returns reads raw states. Notebook 01, section 5."""
    gold = list(gold)
    if len(gold) != len(states):
        raise ValueError(f"{len(states)} hidden states but {len(gold)} labels: give one label per labelled row")
    if unknown := sorted(set(gold) - set(start.labels)):
        raise ValueError(f"labels {unknown} are not among the head's {start.labels}")
    if missing := [label for label in start.labels if label not in gold]:
        raise ValueError(f"no labelled row for {missing}: fitting needs at least one row of every label")
    targets = torch.tensor([start.labels.index(label) for label in gold])
    states = states.float().clone()  # a normal tensor, also where the caller made it in inference mode
    centre = states.mean(0)
    spread = states.std(0).clamp_min(1e-6)  # a feature constant over the rows: no pull is weighed by zero
    standard = _standardised(start, centre, spread)
    scaled = (states - centre) / spread
    chosen = cross_validated_strength(standard, scaled, targets) if strength is None else strength
    fitted = _raw(_fit(standard, scaled, targets, chosen, steps=200), centre, spread, start)
    accuracy = float((fitted.logits(states).argmax(-1) == targets).float().mean())
    fitted.info = dict(fitted_on=len(gold), strength=chosen, training_accuracy=accuracy)
    fitted.mean_from = mean_from
    return fitted


def _standardised(head: LabelHead, centre: torch.Tensor, spread: torch.Tensor) -> LabelHead:
    """``head`` on standardised states ``(state - centre) / spread``: the same logits for every state."""
    rows = head.start if head.start is not None else head.weight
    return LabelHead(
        head.labels, head.weight * spread, head.bias + head.weight @ centre, rows * spread, mean_from=head.mean_from
    )


def _raw(head: LabelHead, centre: torch.Tensor, spread: torch.Tensor, start: LabelHead) -> LabelHead:
    """A head fitted on standardised states, back on raw ones (``_standardised`` undone); ``start``: its centre."""
    weight = head.weight / spread
    rows = start.start if start.start is not None else start.weight
    return LabelHead(head.labels, weight, head.bias - weight @ centre, rows, head.info, head.mean_from)


def save_head(head: LabelHead, path: str | Path, scope: dict) -> None:
    """``head`` as a JSON file with what it is valid for (``helpers.prior.prior_scope``: model, labels, examples,
    prompt format). No lesson builds it: ``classify --save-head``."""
    saved = dict(
        labels=head.labels,
        weight=head.weight.tolist(),
        bias=head.bias.tolist(),
        start=head.start.tolist() if head.start is not None else None,
        info=head.info,
        mean_from=head.mean_from,
        valid_for=scope,
    )
    Path(path).write_text(json.dumps(saved) + "\n", encoding="utf-8")


def load_head(path: str | Path, scope: dict) -> LabelHead:
    """The head ``save_head`` wrote, for a job of this scope; a missing or unreadable file, or a head made for other
    labels, another model, other examples or another prompt, is a one-line ``ValueError`` naming the file. No lesson
    builds it: ``classify --head-from``."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        weight, bias = torch.tensor(saved["weight"]), torch.tensor(saved["bias"])
        reads = saved.get("mean_from")  # absent in a head that reads the answer position
        head = LabelHead(list(saved["labels"]), weight, bias, None, dict(saved.get("info") or {}), reads)
        made_for = dict(saved["valid_for"])
    except FileNotFoundError:
        raise ValueError(f"{path}: no such head file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON file ({error})") from None
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{path}: not a head file ({'no key ' * isinstance(error, KeyError)}{error})") from None
    if not (reads is None or (isinstance(reads, int) and reads >= 0)):
        raise ValueError(f"{path}: not a head file (mean_from {reads!r}: a position, or null)")
    if weight.ndim != 2 or weight.shape[0] != len(head.labels) or bias.shape != (len(head.labels),):
        raise ValueError(f"{path}: not a head file (weight {tuple(weight.shape)}, bias {tuple(bias.shape)})")
    for key, now in scope.items():
        if made_for.get(key) != now:
            raise ValueError(f"{path}: the head was fitted for {key} {made_for.get(key)!r}, not this job's {now!r}")
    return head
