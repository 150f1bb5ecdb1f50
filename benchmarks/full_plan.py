"""Do the full-scale estimates hold? Each row is estimated as notebooks 03 and 04 estimate it (whole batches drawn
from the 600-ticket plan, timed in alternating rounds, ``helpers.sweep.estimate_plans``), then the whole plan runs
once, in the same process; the script prints both and whether the full run lies inside the estimate's interval.

    python benchmarks/full_plan.py                                   # the defaults below: about 10 minutes on 2 cores
    python benchmarks/full_plan.py --rows loop:1:0,sorted:32:0 --repeats 4

A row is strategy:batch size:shots (the strategies of ``helpers.rows.STRATEGIES``). The defaults are the
article's headline (zero-shot, the loop against sorted batches of 32, notebook 03) and notebook 04's 3-shot rows
with the prefix cache, at batch 1 and at the batch size its sweep found best on a 2-core CPU (8).
"""

from __future__ import annotations

import argparse
import time

from helpers.rows import STRATEGIES, row_draw, score_draw, warm_up
from helpers.batching import score_batched
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.models import load_model
from helpers.prefix_cache import PrefixCache
from helpers.profile import machine_profile
from helpers.scoring import LabelScorer
from helpers.sweep import MIN_TICKETS, POOL, estimate_plans

DEFAULT_ROWS = "loop:1:0,sorted:32:0,loop_prefix:1:3,sorted_prefix:8:3"


def parse_rows(text: str) -> list[tuple[str, int, int]]:
    rows = []
    for part in text.split(","):
        name, size, shots = part.split(":")
        if name not in STRATEGIES:
            raise SystemExit(f"unknown strategy {name!r} in --rows: choose from {', '.join(STRATEGIES)}")
        rows.append((name, int(size), int(shots)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rows", type=parse_rows, default=parse_rows(DEFAULT_ROWS))
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds of the drawn batches (default 3: "
                        "2 before the full runs, 1 after)")
    parser.add_argument("--per-point", type=int, default=MIN_TICKETS,
                        help=f"tickets drawn per row at least (default {MIN_TICKETS})")
    args = parser.parse_args()
    model, tokenizer, info = load_model(args.model, dtype="float32")
    profile = machine_profile(model, info)
    scorer = LabelScorer(tokenizer, LABELS)
    texts = make_tickets(POOL, seed=0, style="article")["text"]
    by_shots = {}
    for shots in sorted({shots for *_, shots in args.rows}):
        examples = few_shot_examples(shots)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
        by_shots[shots] = (prompts, [len(ids) for ids in encode_prompts(tokenizer, prompts)], cache)
    draws, prefixes = {}, {}
    for name, size, shots in args.rows:
        prompts, lengths, cache = by_shots[shots]
        draws[name, size, shots] = row_draw(name, size, lengths, cache.length, len(scorer.tail), args.per_point)
        prefixes[name, size, shots] = cache if STRATEGIES[name][1] else None
    for key, draw in draws.items():
        warm_up(model, tokenizer, scorer, by_shots[key[2]][0], draw, prefixes[key])
    runs = {key: [] for key in draws}

    def round_of_draws(repeat):
        for key in list(draws) if repeat % 2 == 0 else list(draws)[::-1]:
            runs[key].append(score_draw(model, tokenizer, scorer, by_shots[key[2]][0], draws[key], prefixes[key]))

    # The rounds of the drawn batches bracket the full runs in time (all but the last before them, the last after),
    # so their spread holds the drift of the machine over the minutes the full runs take.
    started = time.perf_counter()
    for repeat in range(args.repeats - 1):
        round_of_draws(repeat)
    drawn_s = time.perf_counter() - started
    full = {}
    for key, draw in draws.items():
        name, size, shots = key
        full[key] = score_batched(model, tokenizer, scorer, by_shots[shots][0], STRATEGIES[name][0], batch_size=size,
                                  token_budget=draw.token_budget, prefix=prefixes[key], progress=False)
    round_of_draws(args.repeats - 1)
    estimates = estimate_plans(draws, runs, profile)
    print(f"{info.short()} · {profile.machine} · {args.repeats} rounds of the drawn batches, about "
          f"{drawn_s / max(1, args.repeats - 1):.0f} s each; the last after the full runs")
    print(f"{'row':<24} {'drawn':>6} {'estimate':>9} {'interval':>13} {'full run':>9} {'inside':>7} {'full run s':>10}")
    for key, draw in draws.items():
        name, size, shots = key
        estimate, (low, high) = estimates[key], estimates[key].interval
        rate = full[key].info["items_per_s"]
        print(f"{f'{name} at {size}, {shots}-shot':<24} {len(draw.tickets):>6} {estimate.items_per_s:>9.2f} "
              f"{f'{low:.2f}-{high:.2f}':>13} {rate:>9.2f} {'yes' if low <= rate <= high else 'NO':>7} "
              f"{full[key].info['seconds']:>10.0f}")


if __name__ == "__main__":
    main()
