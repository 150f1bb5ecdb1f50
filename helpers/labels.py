"""Which labels a tokenizer splits, and where two share a first token (notebook 01, section 3 and Going deeper): the
lesson derives its examples from the loaded tokenizer, so they hold for whichever model you run.
"""

from __future__ import annotations

from collections.abc import Sequence

from .scoring import extending_pairs

# Plausible support-ticket label words, for examples that must hold with any tokenizer.
CANDIDATE_LABELS = (
    "billing",
    "payment",
    "bill",
    "bills",
    "refund",
    "refunds",
    "invoice",
    "invoices",
    "account",
    "accounts",
    "access",
    "login",
    "password",
    "technical",
    "technician",
    "shipping",
    "shipment",
    "delivery",
    "order",
    "orders",
    "support",
    "security",
    "subscription",
)


def _label_ids(tokenizer, words: Sequence[str]) -> list[list[int]]:
    """Each word's token ids as ``LabelScorer`` tokenizes a label; a one-line error names a bad word."""
    ids = []
    for position, word in enumerate(words):
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"candidate #{position} ({word!r}) is empty: every candidate needs text")
        ids.append(tokenizer(word, add_special_tokens=False)["input_ids"])
    return ids


def token_pieces(tokenizer, words: Sequence[str]) -> dict[str, list[str]]:
    """Each word's tokens as the tokenizer writes them, e.g. ``{"billing": ["b", "illing"]}`` for one tokenizer.
    Notebook 01, section 3."""
    return {word: tokenizer.convert_ids_to_tokens(ids) for word, ids in zip(words, _label_ids(tokenizer, words))}


def first_token_clash(tokenizer, candidates: Sequence[str] = CANDIDATE_LABELS) -> tuple[str, str] | None:
    """Two candidates that start with the same token with this tokenizer (the first such pair in candidate
    order), or None when every candidate starts with a different token. Notebook 01, section 3."""
    seen: dict[int, str] = {}
    for word, ids in zip(candidates, _label_ids(tokenizer, candidates)):
        if ids and ids[0] in seen:
            return seen[ids[0]], word
        if ids:
            seen[ids[0]] = word
    return None


def single_token_labels(tokenizer, candidates: Sequence[str] = CANDIDATE_LABELS, count: int = 3) -> list[str] | None:
    """The first ``count`` distinct candidates that are one token each with this tokenizer; None if fewer are.
    Notebook 01, section 3."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    candidates = list(dict.fromkeys(candidates))
    single = [word for word, ids in zip(candidates, _label_ids(tokenizer, candidates)) if len(ids) == 1]
    return single[:count] if len(single) >= count else None


# Words that often follow a label word in real taxonomies (``account change``, ``bug report``, ``refund request``).
EXTENSIONS = (" change", " report", " request", " issue")


def extending_pair(
    tokenizer,
    bases: Sequence[str] = ("account", "bug", "refund", "billing", "login", "order"),
    extensions: Sequence[str] = EXTENSIONS,
) -> tuple[str, str] | None:
    """Two labels, the second the first plus a word, whose tokens start with all of the first's tokens with this
    tokenizer (``("account", "account change")`` for most): the first such pair in the given order, or None.
    Notebook 01, Going deeper."""
    for base in bases:
        for extension in extensions:
            longer = base + extension
            if extending_pairs(_label_ids(tokenizer, [base, longer]), [base, longer]):
                return base, longer
    return None
