"""Synthetic support tickets and the classification prompt (notebook 00 onwards).

Two generators share the reference's lognormal word counts: ``style="article"`` rotates three base sentences with one
filler like the reference; ``style="varied"`` draws many base tickets and fillers, so accuracy means something."""

from collections.abc import Sequence

import numpy as np
import pandas as pd

LABELS: tuple[str, ...] = ("billing", "technical", "account")
# The no-model baseline a classifier must beat (notebooks 01 and 05): the label whose everyday words a ticket mentions
# most, ties to the first listed. Written from the labels, not tuned on the tickets.
KEYWORDS = {
    "billing": ["charge", "invoice", "refund", "payment", "price", "paid", "fee", "bill", "receipt"],
    "technical": ["app", "error", "crash", "page", "load", "fail", "sync", "bug", "freez", "slow"],
    "account": ["account", "email", "password", "user", "profile", "login", "delete", "name", "sign"],
}


def keyword_label(text: str) -> str:
    """The keyword rules' label for ``text`` (``KEYWORDS``). Notebook 01, section 4."""
    return max(KEYWORDS, key=lambda label: sum(word in text.lower() for word in KEYWORDS[label]))


SYSTEM_PROMPT = "You classify customer support tickets. Answer with exactly one of these categories: {labels}."
# Optional label descriptions for the instruction: they help a small model and lengthen the static prefix.
LABEL_DESCRIPTIONS = {
    "billing": "payments, charges, invoices, refunds, prices",
    "technical": "bugs, errors, crashes, the app or website not working",
    "account": "profile, email address, users, access, changing or deleting the account",
}
USER_TEMPLATE = "Ticket: {ticket}\nCategory:"
# A plain prompt's answers follow "Category:" after a space, as lm-evaluation-harness's target_delimiter puts them.
PLAIN_DELIMITER = " "

ARTICLE_BASES = {
    "billing": "My card was charged twice for the same invoice this month.",
    "technical": "The mobile app crashes every time I open the settings page.",
    "account": "I would like to change the email address on my profile.",
}
ARTICLE_FILLER = (
    "I have been waiting for several days now without any reply from your team, "
    "so could someone please look into this and send me an update as soon as possible?"
)
VARIED_BASES = {
    "billing": [
        "My card was charged twice for the same invoice this month.",
        "I was billed for the premium plan although I cancelled it last week.",
        "The refund you promised for my last order has not arrived.",
        "Your invoice shows a tax amount that does not match my country.",
        "Why did my monthly subscription price go up without notice?",
        "I need a corrected invoice with my company's VAT number on it.",
        "A payment of 49 euros was taken from my account that I do not recognise.",
        "My discount code was accepted but the full price was charged.",
        "Please explain the extra fee on my latest statement.",
        "I paid by bank transfer but the invoice is still marked as unpaid.",
        "The annual plan was charged at the monthly rate twelve times.",
        "I want a refund for the unused months of my yearly subscription.",
        "My credit card expired and now the renewal payment keeps failing.",
        "I was charged in dollars instead of euros and lost money on the exchange.",
        "Can you send me receipts for all payments made this year?",
        "The trial was supposed to be free but I was charged on day one.",
    ],
    "technical": [
        "The mobile app crashes every time I open the settings page.",
        "The website shows a blank white page after I click the login button.",
        "Uploading a file larger than ten megabytes fails with error 500.",
        "Notifications stopped arriving on my Android phone after the update.",
        "The desktop client freezes when I sync more than a thousand photos.",
        "Search returns no results even for items I can see in the list.",
        "The export to CSV produces a file with garbled characters.",
        "Video calls drop after about two minutes on every network I try.",
        "The API returns a timeout for every request since this morning.",
        "Dark mode makes the text on the dashboard completely unreadable.",
        "The app drains my battery in an hour even when it is closed.",
        "Two-factor codes from the authenticator are always rejected as invalid.",
        "Pages load extremely slowly and images never finish loading.",
        "The browser extension disappeared from the toolbar after the last release.",
        "Printing a report cuts off the right half of every table.",
        "The integration with my calendar creates every event twice.",
    ],
    "account": [
        "I would like to change the email address on my profile.",
        "Please delete my account and all the data you hold about me.",
        "How do I add a second user to my team workspace?",
        "I want to change the username that appears on my public profile.",
        "Can you merge my two accounts into one?",
        "I need to transfer ownership of the workspace to my colleague.",
        "Please update the phone number linked to my profile.",
        "My account was locked after a few attempts and I want it unlocked.",
        "How can I download a copy of all my personal data?",
        "I would like to rename my organisation in the account settings.",
        "Please remove my former employee from our team account.",
        "I want to switch the account language from German to English.",
        "Can I change the country listed on my profile after moving abroad?",
        "My account still shows my maiden name and I want it updated.",
        "I would like to close my child's account that is linked to mine.",
        "How do I change which email receives the account notifications?",
    ],
}
VARIED_FILLERS = [
    "I have been waiting for several days now without any reply from your team.",
    "Could someone please look into this and send me an update as soon as possible?",
    "My order number is {order} in case you need it.",
    "Hello, I hope you are having a good day.",
    "This is the third time I am writing about this.",
    "I tried again this morning and nothing has changed.",
    "I am using the latest version on a laptop at home.",
    "Thank you in advance for your help with this matter.",
    "My colleague had the same experience last month.",
    "Please let me know if you need any more details from me.",
    "I have attached a screenshot to the previous message.",
    "Kind regards and thanks for your patience.",
]

# Few-shot examples: written separately from the generators' base tickets, so no test ticket is an example.
FEW_SHOT_EXAMPLES: list[tuple[str, str]] = [
    ("I was charged for two licences but we only use one.", "billing"),
    ("The password reset email never arrives in my inbox.", "technical"),
    ("Please change the billing contact name on my profile to Anna Berg.", "account"),
    ("Where can I find the invoice for my March payment?", "billing"),
    ("The app shows an error code 42 when I try to save a draft.", "technical"),
    ("I want to add my new work email as the login for my account.", "account"),
    ("You took the payment twice after I updated my card details.", "billing"),
    ("Since the update the editor loses my changes when I switch tabs.", "technical"),
    ("How do I give my assistant access to my account?", "account"),
    ("My refund was sent to an old card that is no longer active.", "billing"),
    ("The sync between my phone and my laptop stopped working.", "technical"),
    ("Please deactivate the second profile I created by mistake.", "account"),
]


def ticket_word_counts(n: int, seed: int = 0) -> np.ndarray:
    """The reference series' target lengths: lognormal around 60 words, clipped to [12, 400]. Notebook 00, section 3."""
    return np.clip(np.random.default_rng(seed).lognormal(np.log(60), 0.9, size=n), 12, 400).astype(int)


def _article_ticket(i: int, n_words: int) -> tuple[str, str]:
    label = LABELS[i % 3]
    words = ARTICLE_BASES[label].split() + ARTICLE_FILLER.split() * n_words  # more than enough, cut to n_words
    return " ".join(words[:n_words]), label


def _varied_ticket(i: int, n_words: int, rng: np.random.Generator) -> tuple[str, str]:
    label = LABELS[i % 3]
    bases = VARIED_BASES[label]
    words = bases[rng.integers(len(bases))].split()
    # Greet first sometimes, so the label's sentence is not always the first thing the model sees.
    words = ("Hello support team,".split() if rng.random() < 0.3 else []) + words
    while len(words) < n_words:
        filler = VARIED_FILLERS[rng.integers(len(VARIED_FILLERS))]
        words += filler.format(order=f"A-{rng.integers(10000, 99999)}").split()
    return " ".join(words[:n_words]), label


def make_tickets(n: int = 600, seed: int = 0, style: str = "article") -> pd.DataFrame:
    """Deterministic synthetic tickets, columns ``id, text, label, n_words``; label ``i mod 3`` for ticket ``i`` in both
    styles, so any prefix of the set is balanced. Notebook 00, section 3."""
    if n < 1:
        raise ValueError(f"make_tickets needs n >= 1, got n={n}")
    counts = ticket_word_counts(n, seed)
    if style == "article":
        rows = [_article_ticket(i, int(c)) for i, c in enumerate(counts)]
    elif style == "varied":
        rng = np.random.default_rng([seed, 1])  # a separate stream: lengths stay identical to "article"
        rows = [_varied_ticket(i, int(c), rng) for i, c in enumerate(counts)]
    else:
        raise ValueError(f"unknown ticket style {style!r}: use 'article' or 'varied'")
    texts, labels = zip(*rows)
    frame = pd.DataFrame({"id": np.arange(n), "text": list(texts), "label": list(labels)})
    return frame.assign(n_words=frame["text"].str.split().str.len())


def held_out_tickets() -> pd.DataFrame:
    """112 support tickets written by hand in everyday support language (none from ``make_tickets``, whose sentences
    they share no five words with), 37-38 per label, 6 to 69 words, columns ``text, label``: a held-out set to
    measure accuracy on, never to fit on. Notebook 01, section 4 (and benchmarks/head_curve.py)."""
    from importlib.resources import files

    with files("helpers").joinpath("held_out_tickets.csv").open(encoding="utf-8") as handle:
        return pd.read_csv(handle, dtype=str)


def few_shot_examples(k: int) -> list[tuple[str, str]]:
    """The first ``k`` curated examples (balanced across labels for k a multiple of 3). Notebook 01, section 1."""
    if not 0 <= k <= len(FEW_SHOT_EXAMPLES):
        raise ValueError(f"k must be between 0 and {len(FEW_SHOT_EXAMPLES)}, got {k}")
    return FEW_SHOT_EXAMPLES[:k]


def system_message(labels: Sequence[str] = LABELS, descriptions: dict[str, str] | None = None) -> str:
    """The instruction, with a line per label where described (``LABEL_DESCRIPTIONS``). Notebook 00, section 4."""
    text = SYSTEM_PROMPT.format(labels=", ".join(labels))
    if descriptions:
        text += "".join(f"\n- {label}: {descriptions[label]}" for label in labels if label in descriptions)
    return text


def build_messages(ticket: str, labels: Sequence[str] = LABELS, examples=(), descriptions=None) -> list[dict[str, str]]:
    """Chat messages: the instruction, (text, label) examples as earlier turns, the ticket. Notebook 00, section 4."""
    messages = [{"role": "system", "content": system_message(labels, descriptions)}]
    for text, label in examples:
        messages.append({"role": "user", "content": USER_TEMPLATE.format(ticket=text)})
        messages.append({"role": "assistant", "content": label})
    messages.append({"role": "user", "content": USER_TEMPLATE.format(ticket=ticket)})
    return messages


def uses_chat_template(tokenizer) -> bool:
    """Whether prompts go through the tokenizer's chat template (else plain prompts). Notebook 00, section 4."""
    return bool(getattr(tokenizer, "chat_template", None))


def plain_prompt(tokenizer, ticket: str, labels: Sequence[str] = LABELS, examples=(), descriptions=None) -> str:
    """The prompt as plain text, for a tokenizer without a chat template: the instruction, each example with its label
    after "Category:", the ticket up to "Category:", after any BOS token (as in training). Notebook 00, section 4."""
    parts = [system_message(labels, descriptions)]
    parts += [USER_TEMPLATE.format(ticket=text) + PLAIN_DELIMITER + label for text, label in examples]
    parts.append(USER_TEMPLATE.format(ticket=ticket))
    return (tokenizer.bos_token or "") + "\n\n".join(parts)


def build_prompt(tokenizer, ticket: str, labels: Sequence[str] = LABELS, examples=(), descriptions=None) -> str:
    """The prompt text through the tokenizer's chat template, generation prompt included; a plain prompt where the
    tokenizer has none. ``examples``: few-shot (text, label) pairs. Notebook 00, section 4."""
    if not uses_chat_template(tokenizer):
        return plain_prompt(tokenizer, ticket, labels, examples, descriptions)
    messages = build_messages(ticket, labels, examples, descriptions)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def answer_tokens(tokenizer, label: str) -> list[int]:
    """A label's tokens as they follow the prompt: after the chat template's generation prompt, or a plain prompt's
    "Category:" and its space, split as the whole text splits (a space joins the next word). Notebook 00, section 4."""
    if uses_chat_template(tokenizer):
        return encode_prompt(tokenizer, label)
    context = encode_prompt(tokenizer, USER_TEMPLATE.format(ticket="x"))
    whole = encode_prompt(tokenizer, USER_TEMPLATE.format(ticket="x") + PLAIN_DELIMITER + label)
    if whole[: len(context)] == context and len(whole) > len(context):
        return whole[len(context) :]
    return encode_prompt(tokenizer, PLAIN_DELIMITER + label)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of a text, no special tokens added (a templated prompt holds its own). Notebook 00, section 4."""
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def encode_prompts(tokenizer, prompts) -> list[list[int]]:
    """``encode_prompt`` for many prompts in one call (a fast tokenizer uses every thread). Notebook 00, section 4."""
    return tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if len(prompts) else []
