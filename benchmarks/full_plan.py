"""Does the sample hold? Each group of rows is timed as notebooks 03 and 04 time it (``helpers.bench.sweep``: the
block most like its stratum of every ``every``, alternating repeats, each block scaled to its stratum), then on all
600 tickets (``every=1``: nothing estimated; each round block by block, every row's block in turn, so that drift over
a long round falls on all rows alike), in the same process; the sample's repeats half before the full runs, half
after, so a machine whose speed drifts widens the sample's spread instead of biasing the ratio unseen. It prints
each row's two rates and their ratio, and each group's verdict (its first row against the others) from both, by the
series' one rule (4 rounds each, as 03 and 04 run: ``--repeats 4 --whole 4``).

    python benchmarks/full_plan.py                    # 03's race: about 40 minutes on a slow 2-core CPU
    python benchmarks/full_plan.py --rows loop:1:3:16:18,sorted_prefix:16:3:16:18 --repeats 3

Then, from the full runs alone, what the rule would have estimated had only the sample's blocks been timed, at
this ``every`` and at 3, 6 and 9: those blocks' seconds, scaled by the rule, against the whole's, in the same round;
beside it, the same with each stratum's block nearest its mean length alone, and its middle block (the two rules
before). A drifting machine cannot bias those ratios, so they test the rule itself.

A row is strategy:batch size:shots:block:every (strategies of ``helpers.bench.STRATEGIES``); rows with the same
shots, block and every form a group, timed together. The default is notebook 03's race at its default sample
(zero-shot, the loop against sorted batches of 32, blocks of 32, strata of 9).
"""

from __future__ import annotations

import argparse

from helpers.bench import POOL, STRATEGIES, Row, Sample, sample_blocks, sweep
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.models import load_model, machine_name
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer

DEFAULT_ROWS = "loop:1:0:32:9,sorted:32:0:32:9"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"strategy:batch:shots:block:every,... ({DEFAULT_ROWS})")
    parser.add_argument("--repeats", type=int, default=4, help="timed rounds of the sample (default 4, as 03 and 04)")
    parser.add_argument("--whole", type=int, default=4, help="timed rounds of all 600 tickets (default 4)")
    parser.add_argument("--model", default="embedded")
    args = parser.parse_args()
    model, tokenizer, info = load_model(args.model)
    print(info.short(), "·", machine_name(model.device), flush=True)
    texts = make_tickets(POOL, seed=0, style="article")["text"].tolist()
    scorer = LabelScorer(tokenizer, LABELS)
    groups: dict[tuple[int, int, int], list[tuple[str, int]]] = {}
    for spec in args.rows.split(","):
        name, size, shots, block, every = spec.split(":")
        groups.setdefault((int(shots), int(block), int(every)), []).append((name, int(size)))
    for (shots, block, every), keys in groups.items():
        examples = few_shot_examples(shots)
        prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
        cache = None
        if any(STRATEGIES[name][1] for name, _ in keys):
            cache = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)

        def timed(k, repeats):  # all 600 (k=1) block by block, so that drift over a long round falls on all alike
            sample = Sample(block, k, repeats, interleave=k == 1)
            return sweep(model, tokenizer, scorer, prompts, keys, sample, cache, progress=False)[0]

        sample = timed(every, args.repeats - args.repeats // 2)
        whole = timed(1, args.whole)
        for key, row in timed(every, args.repeats // 2).items():
            sample[key].seconds += row.seconds
        for key in keys:
            s, w = sample[key], whole[key]
            rounds = [", ".join(f"{row.n / t:.2f}" for t in row.seconds) for row in (s, w)]
            ratio = s.items_per_s / w.items_per_s
            print(
                f"{s.timing.name}, {shots} shots: sample {s.items_per_s:.2f} items/s ({s.timed}; repeats {rounds[0]})",
                end="",
            )
            print(f" | all {POOL} {w.items_per_s:.2f} (repeats {rounds[1]}) | sample / all = {ratio:.3f}", flush=True)
        for key in keys[1:]:  # the group's verdicts by the series' one rule (helpers.timing.judge_spreads)
            for where, rows in (("sample", sample), (f"all {POOL}", whole)):
                print(f"  {where}: {rows[key].timing.verdict(rows[keys[0]].timing)}", flush=True)
        lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
        for k in sorted({3, 6, 9, every}):
            blocks, strata = sample_blocks(lengths, block, k)
            middle = [_middle(stratum, block) for stratum in strata]  # the rule before issue 69
            nearest = [_nearest_mean(stratum, block, lengths) for stratum in strata]  # the rule before the last
            for key in keys:
                w = whole[key]
                position = {tuple(chunk): i for i, chunk in enumerate(w.blocks)}
                prefix = cache.length if w.uses_prefix else 0
                said, timed = [], len(sum(blocks, []))
                for picked in (blocks, nearest, middle):
                    rule = Row.plan(*key, lengths, (picked, strata), prefix)
                    ratios = [
                        w.estimate(seconds) / rule.estimate([seconds[position[tuple(b)]] for b in rule.blocks])
                        for seconds in w.block_seconds
                    ]
                    said.append(", ".join(f"{r:.3f}" for r in ratios))
                print(
                    f"  every {k}: {w.timing.name}, {timed} of {POOL} tickets' blocks in the whole run, "
                    f"scaled by the rule / all = {said[0]} (each whole round); the block nearest the mean length: "
                    f"{said[1]}; middle blocks: {said[2]}",
                    flush=True,
                )


def _middle(stratum: list[int], block: int) -> list[int]:
    """The middle block of a stratum (its tickets in length order), the earlier of two."""
    chunks = [stratum[start : start + block] for start in range(0, len(stratum), block)]
    return chunks[(len(chunks) - 1) // 2]


def _nearest_mean(stratum: list[int], block: int, lengths) -> list[int]:
    """The block of a stratum whose mean length is nearest the stratum's (the rule before the token-weighted one)."""
    chunks = [stratum[start : start + block] for start in range(0, len(stratum), block)]
    whole = sum(lengths[i] for i in stratum) / len(stratum)
    return min(chunks, key=lambda chunk: abs(sum(lengths[i] for i in chunk) / len(chunk) - whole))


if __name__ == "__main__":
    main()
