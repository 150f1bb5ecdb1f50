"""Does the sample hold? Each row is timed as notebooks 03 and 04 time it (every k-th block of the sorted
600 tickets, alternating repeats, scaled by padded tokens: ``helpers.bench``), then on all 600 tickets, in the
same process (the sample's repeats half before the full run, half after); the script prints both numbers and their
ratio.

    python benchmarks/full_plan.py                    # the defaults below: about 19 minutes on 2 cores
    python benchmarks/full_plan.py --rows loop:1:0:32:9,sorted:32:0:32:9 --repeats 3

A row is strategy:batch size:shots:block:every (strategies of ``helpers.bench.STRATEGIES``). The defaults are notebook
03's race (zero-shot, the loop against sorted batches of 32) and notebook 04's 3-shot loop and its best size in the
reference run (sorted batches of 16 on the prefix cache), each at its lesson's default sample and repeats.
"""

from __future__ import annotations

import argparse

from helpers.batching import score_batched
from helpers.bench import POOL, STRATEGIES, Row, row_lengths, sample_tickets, scale_to_plan
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer

# strategy:batch size:shots:block:every (the lessons' defaults: 03 blocks of 32, every 9th; 04 blocks of 16, every 18th)
DEFAULT_ROWS = "loop:1:0:32:9,sorted:32:0:32:9,loop:1:3:16:18,sorted_prefix:16:3:16:18"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"strategy:batch:shots:block:every,... ({DEFAULT_ROWS})")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds of the sample (default 2, as 03 and 04)")
    parser.add_argument("--model", default="embedded")
    args = parser.parse_args()
    model, tokenizer, info = load_model(args.model)
    print(info.short(), "·", machine_name(model.device))
    texts = make_tickets(POOL, seed=0, style="article")["text"].tolist()
    scorer = LabelScorer(tokenizer, LABELS)
    for spec in args.rows.split(","):
        name, size, shots, block, every = spec.split(":")
        size, shots, block, every = int(size), int(shots), int(block), int(every)
        strategy, uses_prefix = STRATEGIES[name]
        examples = few_shot_examples(shots)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
        cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples) if uses_prefix else None
        planned = row_lengths(lengths, uses_prefix, cache.length if cache else 0)
        rows = {}
        for k in (every, 1):
            sample = sample_tickets(lengths, block, k)
            rows[k] = Row(name, size, POOL, scale_to_plan(planned, sample, strategy, size), sample)

        def run(row):
            return score_batched(
                model,
                tokenizer,
                scorer,
                [prompts[i] for i in row.sample],
                strategy,
                batch_size=size,
                prefix=cache,
                progress=False,
            ).info["seconds"]

        run(rows[every])  # warm-up
        # The sample's repeats straddle the full run (half before it, half after): a machine whose speed drifts
        # during the full run widens the sample's spread instead of biasing the ratio unseen.
        before = [run(rows[every]) for _ in range(args.repeats - args.repeats // 2)]
        rows[1].seconds = [run(rows[1])]
        rows[every].seconds = before + [run(rows[every]) for _ in range(args.repeats // 2)]
        sampled, whole = rows[every], rows[1]
        print(
            f"{name} at {size}, {shots} shots: sample {sampled.items_per_s:.2f} items/s ({sampled.timed}, every "
            f"{every}-th block of {block}; repeats before and after the full run "
            f"{', '.join(f'{sampled.n / (t * sampled.scale):.2f}' for t in sampled.seconds)}) | all {POOL} "
            f"timed once {whole.items_per_s:.2f} items/s | "
            f"sample / full = {sampled.items_per_s / whole.items_per_s:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
