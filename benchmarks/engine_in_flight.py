"""Does sending the engine its next chunk before the last one lands pay? ``classify --engine`` sends ``CHUNK_ROWS``
rows a request and lands each answer (its spot check, its progress file) as it returns; with ``IN_FLIGHT`` requests
sent ahead, the engine starts the next chunk while this side lands the last. One engine (vLLM, float32, eager), the
article's tickets with 3 shots, every row landed as classify lands it (a progress file, the spot check at its default
rate against the package in float32); 1 request in flight against ``IN_FLIGHT``, alternating rounds, the series'
verdict (``Timing.verdict``).

Run (after ``make engine``): .venv/bin/python benchmarks/engine_in_flight.py [N] [ROUNDS]   (default: 600 4)
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from helpers import resume
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.engine import CHUNK_ROWS, IN_FLIGHT, Engine, SpotCheck, engine_folder, run_in_chunks
from helpers.models import load_model, machine_name
from helpers.precision import rescore
from helpers.prefix_cache import PrefixCache
from helpers.scoring import LabelScorer
from helpers.timing import compare


def main(n: int, rounds: int) -> None:
    model, tokenizer, info = load_model("embedded", dtype="float32", verbose=False)
    examples = few_shot_examples(3)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(n, style="article")["text"]]
    scorer, ids = LabelScorer(tokenizer, LABELS), encode_prompts(tokenizer, prompts)
    plan = dict(strategy="sorted", batch_size=16, progress=False)
    plan["prefix"] = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    longest = max(len(row) for row in ids) + max(len(row) for row in scorer.token_ids)
    engine = Engine(engine_folder("embedded"), scorer, device=model.device.type, max_len=longest).ready()
    print(f"{engine.describe()} · {machine_name(model.device)} · {n} article tickets, 3 shots, {CHUNK_ROWS} a chunk")
    engine.log_scores(ids[:32])  # the warm-up
    folder = Path(tempfile.mkdtemp())

    def reference(rows):
        return rescore(model, tokenizer, scorer, [prompts[i] for i in rows], **plan).log_scores

    def job(in_flight):
        def run():
            writer = resume.ProgressWriter(folder / f"out{in_flight}.csv", 0, {"bench": in_flight})
            spot = SpotCheck(engine, reference)
            run_in_chunks(
                engine, ids, range(n), lambda r, s: writer.append(r, s.tolist(), False, True), spot, in_flight
            )
            writer.close()
            resume.progress_path(folder / f"out{in_flight}.csv", 0).unlink()
            return spot.checked

        return run

    calls = {"1 in flight": job(1), f"{IN_FLIGHT} in flight": job(IN_FLIGHT)}
    timings = compare(calls, device=model.device, repeats=rounds, warmup=0)
    for name, timing in timings.items():
        rates = sorted(n / s for s in timing.seconds)
        print(f"{name}: {n / timing.median:.2f} items/s (rounds {', '.join(f'{r:.2f}' for r in rates)})")
    print(timings[f"{IN_FLIGHT} in flight"].verdict(timings["1 in flight"]))
    engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 600, int(args[1]) if len(args) > 1 else 4)
