"""The plan beyond one machine (docs/scale.md), run small on one: Ray Data spreads a job's rows over WORKERS actors,
each holding one vLLM engine (the requests ``classify --engine`` sends: the package's prompts as token ids, the
labels' tokens as a tree, ``logprob_token_ids``, prefix caching), and every row's label is compared with the
package's float32; each worker first holds its engine to a golden file (``classify --save-golden``'s) on its own. On
a cluster the same script's Ray part runs with ``ray.init(address="auto")``; here two workers
share two cores, so its rate says nothing about speed, only that the rows come back whole and alike.

Run: .venv-engine/bin/python -m pip install "ray[data]"   (once: Ray in the engine's environment), then
     .venv/bin/python benchmarks/engine_ray.py [N] [WORKERS]   (default: 48 2)
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
WORKER = HERE.parent.parent / "helpers" / "engine_worker.py"


def ray_part(setup_path: str, out_path: str, workers: int) -> None:
    """In the engine's environment: the rows as a Ray dataset, ``map_batches`` over ``workers`` engine actors."""
    import ray

    spec = importlib.util.spec_from_file_location("engine_worker", WORKER)  # by path: the package's folder stays off
    worker = importlib.util.module_from_spec(spec)  # sys.path, where its modules would shadow the engine's
    spec.loader.exec_module(worker)
    setup = json.loads(Path(setup_path).read_text())
    branches = [(list(context), list(tokens)) for context, tokens in setup["branches"]]
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)

    class Scorer:
        def __init__(self):
            self.llm, self.params = worker._start(setup)
            # Each worker holds its own engine to the golden file before it scores a row (classify --save-golden)
            golden = json.loads(Path(setup["golden"]).read_text())
            if failed := worker.check_golden(self.llm, self.params, branches, golden, setup):
                raise RuntimeError(f"this worker's engine fails the golden set: {failed}")

        def __call__(self, batch):
            prompts = [list(map(int, ids)) for ids in batch["ids"]]
            answers = worker._score(self.llm, self.params, branches, prompts)
            return {
                "row": batch["row"],
                "answers": [json.dumps(answer) for answer in answers],
                "pid": [os.getpid()] * len(prompts),
            }

    rows = [{"row": i, "ids": ids} for i, ids in enumerate(setup["prompts"])]
    began = time.perf_counter()
    results = ray.data.from_items(rows).map_batches(Scorer, concurrency=workers, batch_size=8, num_cpus=1).take_all()
    seconds = time.perf_counter() - began
    found = {int(r["row"]): json.loads(r["answers"]) for r in results}
    processes = sorted({int(r["pid"]) for r in results})
    Path(out_path).write_text(
        json.dumps(
            {
                "answers": [found[i] for i in range(len(rows))],
                "rows": len(results),
                "seconds": seconds,
                "processes": len(processes),
            }
        )
    )


def main(n: int, workers: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from helpers.checks import agreement
    from helpers.data import LABELS, build_prompt, encode_prompts, few_shot_examples, make_tickets
    from helpers.engine import engine_folder, engine_python, label_branches, label_log_scores, write_golden
    from helpers.models import load_model, machine_name
    from helpers.precision import run_plan
    from helpers.prefix_cache import PrefixCache
    from helpers.scoring import LabelScorer, LabelScores

    model, tokenizer, info = load_model("embedded", dtype="float32", verbose=False)
    examples = few_shot_examples(3)
    texts = make_tickets(600, style="article")["text"][:: max(1, 600 // n)][:n]
    prompts = [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
    scorer, ids = LabelScorer(tokenizer, LABELS), encode_prompts(tokenizer, prompts)
    prefix = PrefixCache.for_prompts(model, tokenizer, labels=LABELS, examples=examples)
    reference = run_plan(model, tokenizer, scorer, prompts, dict(strategy="sorted", batch_size=16, prefix=prefix))
    branches = label_branches(scorer.token_ids)
    setup = dict(
        model=engine_folder("embedded"),
        dtype="float32",
        branches=branches,
        labels=[list(ids) for ids in scorer.token_ids],
        eager=True,
        device="cpu",
        kv_cache_bytes=1 << 30,
        prompts=ids,
    )
    with tempfile.TemporaryDirectory() as folder:
        setup_path, out_path = Path(folder) / "setup.json", Path(folder) / "out.json"
        setup["golden"] = str(Path(folder) / "golden.json")  # 8 rows' package scores: each worker checks against them
        write_golden(setup["golden"], scorer, ids, range(8), reference.log_scores[:8], "float32", {"model": "embedded"})
        setup_path.write_text(json.dumps(setup))
        env = dict(os.environ, PYTHONNOUSERSITE="1", TQDM_DISABLE="1")
        env.pop("PYTHONPATH", None)
        command = [str(engine_python()), str(HERE), "--ray", str(setup_path), str(out_path), str(workers)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)  # noqa: S603 - our own script
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
            sys.exit(f"the Ray part failed: {last}")
        result = json.loads(out_path.read_text())
    found = LabelScores(LABELS, label_log_scores(scorer.token_ids, branches, result["answers"]))
    same = agreement(reference, found)
    print(f"{info.name} · float32 · {machine_name(torch.device('cpu'))} · {n} article tickets, 3 shots")
    print(
        f"Ray Data, {workers} workers ({result['processes']} engine processes answered): {result['rows']} of {n} "
        f"rows back in {result['seconds']:.1f} s (engines' start-up included)"
    )
    print(
        f"labels: {round(same['agreement'] * n)} of {n} the package's float32, max |Δ log p| {same['max_abs_diff']:.1e}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ray"]:
        ray_part(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        args = sys.argv[1:]
        main(int(args[0]) if args else 48, int(args[1]) if len(args) > 1 else 2)
