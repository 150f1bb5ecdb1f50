"""The engine's side of ``helpers.engine``: run in the engine's own environment (``make engine``: vLLM pins its own
torch and transformers), as a script, so it imports nothing of the package and nothing beyond the standard library and
the engine. No lesson builds it.

It reads JSON lines on stdin and answers each with one JSON line on the protocol stream (the process's original
stdout; the engine's own messages go to stderr):

- first ``{"model": folder, "dtype": "float32", "branches": [[context, [token, ...]], ...], ...}``, answered
  ``{"ready": {...}}`` or ``{"error": "one line"}``. A branch is a label's tokens so far (``context``) and the tokens
  that may come next (a label's next token): the labels of ``LabelScorer`` as a tree, one request per branch.
- then ``{"prompts": [[token ids], ...]}``, answered ``{"logprobs": [[[lp per token] per branch] per prompt]}``.

With ``"golden": path`` in the set-up, the engine is first held to that golden file (``check_golden``): a worker of a
cluster job checks its own engine without the package's model, and a failure is its one-line error.

Each branch is one request of the prompt's tokens plus its context, asking for the log-probabilities of its tokens
alone (``logprob_token_ids``); with prefix caching on, a ticket's second branch reuses the first's keys and values.
``"method": "prompt_logprobs"`` (for comparison: benchmarks/engine.py) instead sends each prompt followed by each
label's whole ``"labels"`` tokens and reads the labels' log-probs among the prompt's (``prompt_logprobs=0``): a
log-softmax over the vocabulary at every prompt position, and vLLM skips its prefix cache for such requests."""

import json
import os
import sys
import time

# Run as a script, its own folder comes first on the path, where the package's modules (profile, data, ...) would shadow
# the standard library's and the engine's.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]


def _protocol_stream():
    """The original stdout for the answers; everything else written to stdout (the engine logs there) goes to stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def _answer(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _settle_cpu() -> None:
    """On a CPU, vLLM binds one core per process and keeps one for itself by default: on a 2-core laptop, half the
    machine. The job gets every core this process may use (a user's own settings stand), in this one process."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def _start(setup: dict):
    if setup.get("device", "cpu") == "cpu":
        _settle_cpu()
    from vllm import LLM, SamplingParams

    # Token ids in, log-probs out: the package tokenizes, so the engine's tokenizer is never needed (a twin has none).
    options = dict(
        model=setup["model"],
        dtype=setup["dtype"],
        enable_prefix_caching=True,
        skip_tokenizer_init=True,
        seed=0,
        enforce_eager=setup.get("eager", False),
        distributed_executor_backend="uni",  # one process: no worker to start and feed
    )
    if setup.get("max_len"):  # else the model's own context length
        options["max_model_len"] = setup["max_len"]
    if setup.get("gpu_memory_utilization"):  # the package's own model shares the GPU
        options["gpu_memory_utilization"] = setup["gpu_memory_utilization"]
    if setup.get("kv_cache_bytes"):
        options["kv_cache_memory_bytes"] = setup["kv_cache_bytes"]
    llm = LLM(**options)
    if setup.get("method") == "prompt_logprobs":
        return llm, SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    # logprobs left unset: vLLM counts the requested tokens itself (a count above max_logprobs, 20, is refused)
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=tokens, detokenize=False)
        for _, tokens in setup["branches"]
    ]
    return llm, params


def _score_by_prompt(llm, params, labels, prompts):
    """Per prompt, per label, its tokens' summed log-probs read from the prompt's (method "prompt_logprobs")."""
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=ids + label) for ids in prompts for label in labels]
    outputs = llm.generate(requests, params, use_tqdm=False)
    sums = []
    for n, label in ((n, label) for n in range(len(prompts)) for label in labels):
        found = outputs[n * len(labels) + labels.index(label)].prompt_logprobs[-len(label) :]
        sums.append(sum(step[token].logprob for step, token in zip(found, label)))
    return [sums[n * len(labels) : (n + 1) * len(labels)] for n in range(len(prompts))]


def _score(llm, params, branches, prompts):
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=ids + context) for ids in prompts for context, _ in branches]
    chosen = [p for _ in prompts for p in params]
    outputs = llm.generate(requests, chosen, use_tqdm=False)
    answers = []
    for n in range(len(prompts)):
        row = []
        for b, (_, tokens) in enumerate(branches):
            found = outputs[n * len(branches) + b].outputs[0].logprobs[0]
            row.append([found[token].logprob for token in tokens])
        answers.append(row)
    return answers


def label_sums(label_ids, branches, answer, normalize=False):
    """One prompt's label log-scores from its per-branch answer, as ``helpers.engine.label_log_scores`` sums them."""
    where = {tuple(context): (b, tokens) for b, (context, tokens) in enumerate(branches)}
    sums = []
    for ids in label_ids:
        total = 0.0
        for k, token in enumerate(ids):
            b, tokens = where[tuple(ids[:k])]
            total += answer[b][tokens.index(token)]
        sums.append(total / len(ids) if normalize else total)
    return sums


def check_golden(llm, params, branches, golden: dict, setup: dict):
    """The engine (its ``setup``) against a golden file (``classify --save-golden``): None where every row has the
    package's label and log-scores within the file's tolerance (as ``helpers.checks.assert_agrees``: a NaN never
    agrees; where the file allows near ties, a label may differ where the package's top two are closer than it),
    else one line naming the first row that does not, or what does not fit."""
    if golden.get("dtype") != setup["dtype"]:
        return f"it was made for an engine in {golden.get('dtype')}, not {setup['dtype']}"
    if golden.get("label_ids") != setup.get("labels") or setup.get("method") == "prompt_logprobs":
        return "its labels' tokens are not this engine's labels (or the engine does not score by branches)"
    answers = _score(llm, params, branches, golden["prompts"])
    atol = golden["atol"]
    for row, expected, answer in zip(golden["rows"], golden["expected"], answers):
        found = label_sums(golden["label_ids"], branches, answer, golden.get("normalize", False))
        gap = max(abs(a - b) for a, b in zip(expected, found))
        want, got = expected.index(max(expected)), found.index(max(found))
        ranked = sorted(expected, reverse=True)
        tie = golden.get("near_ties") and len(ranked) > 1 and ranked[0] - ranked[1] < atol
        if not gap <= atol or (want != got and not tie):  # "not <=": a NaN fails
            labels = golden["labels"]
            return (
                f"row {row}: label {labels[got]!r} where the package's is {labels[want]!r}, log-probs up to "
                f"{gap:.2e} apart (tolerance {atol:g})"
            )
    return None


def main() -> int:
    stream = _protocol_stream()
    setup = json.loads(sys.stdin.readline())
    started = time.perf_counter()
    try:
        import vllm
    except Exception as error:  # noqa: BLE001 - a broken environment is one line, then the process ends
        _answer(stream, {"error": _first_line(error), "stage": "import"})
        return 1
    try:
        llm, params = _start(setup)
    except Exception as error:  # noqa: BLE001 - any failure to start is reported in one line, then the process ends
        _answer(stream, {"error": _first_line(error), "stage": "load"})
        return 1
    branches = [(list(context), list(tokens)) for context, tokens in setup["branches"]]
    if setup.get("golden"):  # a worker's own check at start, against the file alone (classify --save-golden)
        with open(setup["golden"], encoding="utf-8") as handle:
            golden = json.load(handle)
        if failed := check_golden(llm, params, branches, golden, setup):
            _answer(stream, {"error": f"the golden set {setup['golden']} fails: {failed}", "stage": "golden"})
            return 1
    seconds = time.perf_counter() - started
    _answer(stream, {"ready": {"engine": "vllm", "version": vllm.__version__, "seconds": seconds}})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if setup.get("method") == "prompt_logprobs":
                answer = {"label_logprobs": _score_by_prompt(llm, params, setup["labels"], request["prompts"])}
            else:
                answer = {"logprobs": _score(llm, params, branches, request["prompts"])}
            _answer(stream, answer)
        except Exception as error:  # noqa: BLE001 - the caller stops the run with this line
            _answer(stream, {"error": _first_line(error)})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
