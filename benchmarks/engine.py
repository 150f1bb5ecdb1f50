"""When does handing the job to an engine pay? The package's fastest verified pipeline (float32, sorted batches of
``classify``'s size on the prefix cache: every label the loop's) races vLLM (``helpers.engine``: the same prompts as
token ids, the labels' tokens as a tree, ``logprob_token_ids``, prefix caching on) on the article's tickets, 3 shots,
labels compared row by row against the package's float32. Where a half dtype is fast here (``choose_half``, as
``classify --dtype auto`` decides), the package's verified half-precision path races too. The engine's modes: eager
(``enforce_eager``, what classify runs), compiled (vLLM's default: compiled at start) and prompt_logprobs (each
prompt followed by each label, the labels' log-probs read among the prompt's: the way the engine's documentation
scores a prompt; eager); its start-up is timed apart, once each. Rounds alternate between the
contenders (``timing.compare``); the verdict is the series' rule (``Timing.verdict``: at most 1 false winner in 20).

Run (after ``make engine``): .venv/bin/python benchmarks/engine.py [MODEL] [N] [ROUNDS] [MODES]
(default: embedded 600 4 eager). On a GPU: twin:qwen2.5-0.5b, device cuda (SLM_DEVICE=cuda).
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from helpers.checks import agreement
from helpers.classify import BATCH_SIZE
from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
from helpers.engine import Engine, engine_folder
from helpers.models import load_model, machine_name
from helpers.precision import choose_half, run_plan, score_verified
from helpers.prefix_cache import PrefixCache
from helpers.profile import machine_profile
from helpers.scoring import LabelScorer, LabelScores
from helpers.timing import compare

WARM = 32  # prompts each contender scores before the rounds (a first call pays for allocation and compilation)


def main(model_name: str, n: int, rounds: int, modes: list[str]) -> None:
    device = os.environ.get("SLM_DEVICE")
    model, tokenizer, info = load_model(model_name, dtype="float32", device=device, verbose=False)
    examples = few_shot_examples(3)
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in make_tickets(n, style="article")["text"]]
    scorer, ids = LabelScorer(tokenizer, LABELS), encode_prompts(tokenizer, prompts)
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    plan = dict(strategy="sorted", batch_size=BATCH_SIZE, prefix=prefix, progress=False)
    print(f"{info.name} · float32 · {machine_name(model.device)} · {n} article tickets, 3 shots, {rounds} rounds")
    print(f"the package: sorted batches of {BATCH_SIZE} on the prefix cache; the engine: {scorer.describe()}")

    def package(chosen=prompts):
        return run_plan(model, tokenizer, scorer, chosen, plan).log_scores

    package(prompts[:WARM])
    calls, engines = {"package": package}, []
    half, why = choose_half(machine_profile(model, info, verbose=False))
    print(f"--dtype auto here: {why}")
    if half:

        def verified(chosen=prompts):
            return score_verified(model, tokenizer, scorer, chosen, half, **plan).log_scores

        verified(prompts[:WARM])
        calls[f"package, {half} verified"] = verified
    for mode in modes:
        began = time.perf_counter()
        options = dict(eager=mode != "compiled", method="prompt_logprobs" if mode == "prompt_logprobs" else None)
        engine = Engine(engine_folder(model_name), scorer, device=model.device.type, **options).ready()
        engines.append(engine)
        print(f"vllm {engine.version} ({mode}): started in {time.perf_counter() - began:.1f} s (log: {engine.log})")
        engine.log_scores(ids[:WARM])
        calls[f"vllm ({mode})"] = lambda engine=engine: engine.log_scores(ids)
    timings = compare(calls, device=model.device, repeats=rounds, warmup=0)
    reference = LabelScores(scorer.labels, timings["package"].results[0])
    for name, timing in timings.items():
        rates = sorted(n / s for s in timing.seconds)
        line = f"{name}: {n / timing.median:.2f} items/s (rounds {', '.join(f'{r:.2f}' for r in rates)})"
        if name != "package":  # the verified path's labels are float32's too: the same check
            same = agreement(reference, LabelScores(scorer.labels, timing.results[0]))
            differ = round((1 - same["agreement"]) * n)
            line += f"; labels: {n - differ} of {n} the package's float32, max |Δ log p| {same['max_abs_diff']:.1e}"
        print(line)
    ours = [name for name in calls if name.startswith("package")]
    for name in (name for name in calls if name not in ours):
        for mine in ours:
            print(timings[name].verdict(timings[mine]))
    for engine in engines:
        engine.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    torch.manual_seed(0)
    main(
        args[0] if len(args) > 0 else "embedded",
        int(args[1]) if len(args) > 1 else 600,
        int(args[2]) if len(args) > 2 else 4,
        (args[3] if len(args) > 3 else "eager").split(","),
    )
