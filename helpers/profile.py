"""The machine profile: what this device and model do per second, measured in seconds (notebook 00 onwards).

Three measurements, made once and then reused by every notebook and by ``python -m helpers bench``:

- **matmul throughput** per dtype worth trying on the device (``dtype_candidates``: float32 and bfloat16 on a
  CPU; float16, and bfloat16 from compute capability 8.0, on CUDA; float16 and bfloat16 on Apple's MPS): the "roof",
  and the reason a dtype is skipped where it runs below half of float32's speed;
- **prefill throughput**: the model's tokens/s against tokens per forward call, from 1 token up to where it
  stops growing (the saturation curve). It says whether one ticket already keeps the hardware busy;
- **one decode step** (one new token per row over a cached context) at batch 1 and at batch 32: where the
  "batch 1 is memory-bandwidth bound" argument holds (generating tokens).

Profiles are cached for the process and on disk (``cache_dir()/profiles``), keyed by machine, torch version,
model, dtype and device, so notebooks 01-04 reuse the one notebook 00 measured. Work is sized from them:
``estimate_seconds`` turns a list of forward calls into seconds, ``size_to_budget`` a time budget into a count, and
``fit_to_budget`` does the same for a lesson: its count and timed rounds, each decision in one line.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .models import ModelInfo, cache_dir, dtype_candidates, threads_text
from .timing import Stopwatch, sync

PROFILE_VERSION = 4  # 2: roof with torch.utils.benchmark at a busy size; 3: dtypes by device; 4: the roof a maximum
PREFILL_SIZES = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
DECODE_BATCHES = (1, 32)
DECODE_CONTEXT = 128  # cached tokens each decoded row attends to (about one ticket's prompt)
SLOW_DTYPE_RATIO = 0.5  # a dtype whose matmul runs below this share of float32's is skipped unless forced
ROOF_BLOCKS = 5  # timed blocks behind each roof measurement; the fastest counts
ROOF_BLOCK_S = 0.25  # seconds per block: 5 blocks make more than a second of steady matmuls
MAX_CALL_S = 1.5  # the prefill sweep stops after a call this slow: the curve is flat long before
_MEMORY: dict[str, MachineProfile] = {}


def machine_name(device: torch.device | str = "cpu") -> str:
    """What the numbers were measured on, in words: the processor (and its vector extensions) or the GPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return f"mps: Apple {platform.machine()}"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} ({torch.backends.cpu.get_cpu_capability()})"


def _time_call(call, device: torch.device, min_time_s: float = 0.2, max_repeats: int = 5) -> float:
    """Seconds per call: one warm-up (kernels are picked, memory allocated), then the best of a few runs."""
    with Stopwatch(device) as warmup:
        call()
    if warmup.seconds > MAX_CALL_S:  # too slow to repeat: the warm-up is the measurement
        return warmup.seconds
    times: list[float] = []
    while len(times) < max_repeats and (sum(times) < min_time_s or len(times) < 2):
        with Stopwatch(device) as clock:
            call()
        times.append(clock.seconds)
    return min(times)


@torch.inference_mode()
def matmul_gflops(device: torch.device | str, dtype: torch.dtype, shape: tuple[int, int, int],
                  blocks: int = ROOF_BLOCKS, block_s: float = ROOF_BLOCK_S) -> float | None:
    """Measured GFLOP/s of one (m x k) @ (k x n) matmul in ``dtype``: a roof, so a maximum. None where the dtype is
    unsupported.

    After a warm-up of about one block (clocks ramp up, kernels are picked, caches fill), ``blocks`` blocks of
    back-to-back matmuls, each at least ``block_s`` seconds, synchronised; the fastest block counts. A median of a
    cold start would sit below what the same kernel does a moment later, and a rate above the roof would follow.
    """
    device = torch.device(device)
    m, k, n = shape
    try:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        a @ b  # unsupported dtypes fail here, before timing
    except (RuntimeError, TypeError):
        return None
    sync(device)
    start, calls, elapsed = time.perf_counter(), 0, 0.0
    while elapsed < block_s:  # the warm-up, which also sizes the blocks
        a @ b
        sync(device)
        calls, elapsed = calls + 1, time.perf_counter() - start
    per_block = max(1, math.ceil(calls * block_s / elapsed))
    best = float("inf")
    for _ in range(blocks):
        with Stopwatch(device) as clock:
            for _ in range(per_block):
                a @ b
        best = min(best, clock.seconds / per_block)
    return 2 * m * k * n / best / 1e9


def roof_shape(model, device: torch.device) -> tuple[int, int, int]:
    """The model's MLP matmul (tokens x hidden @ hidden x intermediate), with enough tokens to keep the device busy.

    On a 2-core CPU 256 tokens reach ~85 % of what 2048 do; a GPU needs far larger matmuls still.
    """
    tokens = 2048 if device.type == "cpu" else 16384
    return tokens, model.config.hidden_size, model.config.intermediate_size


@torch.inference_mode()
def prefill_curve(model, sizes: Iterable[int] = PREFILL_SIZES, max_call_s: float = MAX_CALL_S) -> list[tuple[int, float]]:
    """(tokens per forward call, tokens/s) for one sequence of each size, until the throughput stops growing."""
    device = model.device
    limit = getattr(model.config, "max_position_embeddings", 4096)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    points: list[tuple[int, float]] = []
    for tokens in sizes:
        if tokens > limit:
            break
        ids = torch.randint(0, vocab, (1, tokens), generator=generator).to(device)
        seconds = _time_call(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), device)
        points.append((tokens, tokens / seconds))
        flat = len(points) >= 3 and all(points[-i][1] < 1.05 * points[-i - 1][1] for i in (1, 2))
        if seconds > max_call_s or (tokens >= 64 and flat):
            break
    return points


@torch.inference_mode()
def decode_step_tokens_per_s(model, batch: int, context: int = DECODE_CONTEXT) -> float:
    """Tokens/s of one decode step: one new token per row, attending to ``context`` cached tokens."""
    from transformers import DynamicCache

    config, device, dtype = model.config, model.device, model.dtype
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    generator = torch.Generator().manual_seed(0)
    # What the cache holds does not change the time: random keys and values of the right shape.
    layers = [tuple(torch.randn(batch, kv_heads, context, head_dim, generator=generator).to(device, dtype)
                    for _ in range(2)) for _ in range(config.num_hidden_layers)]
    cache = DynamicCache(ddp_cache_data=layers, config=config)
    ids = torch.randint(0, config.vocab_size, (batch, 1), generator=generator).to(device)
    mask = torch.ones((batch, context + 1), dtype=torch.long, device=device)
    positions = torch.full((batch, 1), context, device=device)

    def step():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
              logits_to_keep=1)
        cache.crop(-1)  # back to the context, for the next timed step

    return batch / _time_call(step, device)


@dataclass
class MachineProfile:
    """One machine + model + dtype, measured. Every result can carry ``caption()`` and ``as_dict()``."""

    machine: str
    torch: str
    model: str
    dtype: str
    device: str
    threads: int
    matmul_gflops: dict[str, float]
    prefill: list[tuple[int, float]]
    decode: dict[int, float]
    decode_context: int = DECODE_CONTEXT
    measured_s: float = 0.0
    measured_on: str = ""
    notes: list[str] = field(default_factory=list)

    # --- reading the curve ---

    def tokens_per_s(self, tokens: float) -> float:
        """Prefill tokens/s at ``tokens`` per forward call, interpolated on the measured curve (log scale)."""
        points = sorted(self.prefill)
        if tokens <= points[0][0]:
            return points[0][1] * tokens / points[0][0]  # below the smallest call: the call cost stays
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if tokens <= x1:
                t = (math.log(tokens) - math.log(x0)) / (math.log(x1) - math.log(x0))
                return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
        return points[-1][1]  # past the last point the curve is flat (or the sweep stopped on time)

    def forward_seconds(self, tokens: float) -> float:
        """Estimated seconds of one forward call processing ``tokens`` tokens (all rows together)."""
        tokens = max(tokens, 1)  # no call is cheaper than a one-token call
        return tokens / self.tokens_per_s(tokens)

    @property
    def peak_tokens_per_s(self) -> float:
        return max(rate for _, rate in self.prefill)

    @property
    def saturation_tokens(self) -> int:
        """The fewest tokens per call that reach 90 % of the peak throughput."""
        return min(tokens for tokens, rate in self.prefill if rate >= 0.9 * self.peak_tokens_per_s)

    # --- dtypes ---

    def slow_dtypes(self) -> dict[str, str]:
        """dtype -> one line saying why it is skipped by default (matmul below half of float32's)."""
        base = self.matmul_gflops.get("float32")
        slow = {}
        for name, gflops in self.matmul_gflops.items():
            if name != "float32" and base and gflops < SLOW_DTYPE_RATIO * base:
                slow[name] = (f"{name} skipped: its matmul runs at {gflops:.3g} GFLOP/s here against {base:.3g} "
                              f"for float32 (below half); ask for it explicitly to run it anyway")
        return slow

    def choose_dtypes(self, requested: Sequence[str] | None, candidates: Sequence[str] | None = None,
                      ) -> tuple[list[str], list[str]]:
        """(dtypes to run, lines to print). ``requested`` (explicit) wins; otherwise the candidates (by default
        those the profile measured: ``dtype_candidates`` of its device) minus the slow ones."""
        if requested:
            return list(dict.fromkeys(requested)), []
        candidates = list(self.matmul_gflops) if candidates is None else candidates
        slow = self.slow_dtypes()
        chosen = [d for d in candidates if d not in slow and (d == "float32" or d in self.matmul_gflops)]
        return chosen, [slow[d] for d in candidates if d in slow]

    # --- describing ---

    def caption(self) -> str:
        """One line for a figure or a table: the machine and what it measured."""
        return (f"{self.machine}, {threads_text(self.threads)} · float32 matmul {self.matmul_gflops.get('float32', 0):.0f} "
                f"GFLOP/s · prefill peak {self.peak_tokens_per_s:.0f} tokens/s, 90 % of it from ~{self.saturation_tokens} tokens per call")

    def summary(self) -> str:
        lines = [f"machine: {self.machine} · {self.device} · {threads_text(self.threads)} · torch {self.torch}",
                 f"model: {self.model} in {self.dtype} (measured in {self.measured_s:.1f} s on {self.measured_on})",
                 "matmul: " + ", ".join(f"{d} {g:.3g} GFLOP/s" for d, g in self.matmul_gflops.items()),
                 "prefill: " + ", ".join(f"{n} tok {rate:.0f}/s" for n, rate in self.prefill),
                 "decode step: " + ", ".join(f"batch {b} {rate:.0f} tok/s" for b, rate in sorted(self.decode.items()))]
        return "\n".join(lines + self.notes)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MachineProfile:
        data = dict(data)
        data["prefill"] = [tuple(point) for point in data["prefill"]]
        data["decode"] = {int(batch): rate for batch, rate in data["decode"].items()}
        return cls(**data)


def _key(info: ModelInfo, device: torch.device) -> str:
    parts = [PROFILE_VERSION, machine_name(device), torch.__version__, info.name, info.dtype, str(device),
             torch.get_num_threads()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def profile_path(info: ModelInfo, device: torch.device) -> Path:
    return cache_dir() / "profiles" / f"{_key(info, device)}.json"


def machine_profile(model, info: ModelInfo, refresh: bool = False, verbose: bool = True) -> MachineProfile:
    """This machine's profile for ``model`` (as loaded: its dtype and device), measured once and cached.

    The cache lives in this process and on disk, keyed by machine, torch version, model, dtype, device and
    threads; ``refresh=True`` measures again (after changing thread counts or power settings, say).
    """
    device = model.device
    key = _key(info, device)
    if not refresh and key in _MEMORY:
        return _MEMORY[key]
    path = profile_path(info, device)
    if not refresh and path.is_file():
        try:
            profile = MachineProfile.from_dict(json.loads(path.read_text()))
            _MEMORY[key] = profile
            if verbose:
                print(f"machine profile from {path} (measured on {profile.measured_on})")
            return profile
        except (ValueError, TypeError, KeyError):
            pass  # an unreadable or older profile: measure again
    if verbose:
        print("measuring this machine (once; cached for later notebooks) ...")
    start = time.perf_counter()
    shape = roof_shape(model, device)
    matmul = {}
    for dtype in dtype_candidates(device):
        gflops = matmul_gflops(device, dtype, shape)
        if gflops is not None:
            matmul[str(dtype).removeprefix("torch.")] = gflops
    prefill = prefill_curve(model)
    decode = {batch: decode_step_tokens_per_s(model, batch) for batch in DECODE_BATCHES}
    profile = MachineProfile(
        machine=machine_name(device), torch=torch.__version__, model=info.name, dtype=info.dtype,
        device=str(device), threads=torch.get_num_threads(), matmul_gflops=matmul, prefill=prefill, decode=decode,
        measured_s=time.perf_counter() - start, measured_on=time.strftime("%Y-%m-%d %H:%M"),
    )
    _MEMORY[key] = profile
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(profile.as_dict(), indent=1))
    temporary.replace(path)
    if verbose:
        print(f"measured in {profile.measured_s:.1f} s; saved to {path}")
    return profile


# --- sizing work by time ----------------------------------------------------------------------------------


def estimate_seconds(profile: MachineProfile, calls: Iterable[float]) -> float:
    """Estimated seconds for forward calls of the given token counts (rows x width per call)."""
    return sum(profile.forward_seconds(tokens) for tokens in calls)


def size_to_budget(
    budget_s: float,
    estimate: Callable[[int], float],
    floor: int,
    cap: int,
    explicit: int | None = None,
    what: str = "tickets",
) -> tuple[int, str]:
    """The largest count in [floor, cap] whose estimated seconds (``estimate(n)``) fit ``budget_s``; and why.

    ``estimate`` should grow with n (it is searched by doubling, then bisection). An explicit count wins.
    """
    if explicit is not None:
        n = int(explicit)
        return n, f"{n} {what}: set explicitly (estimated {estimate(n):.0f} s of model time on this machine)"
    if estimate(floor) > budget_s:
        return floor, (f"{floor} {what}: the fewest that keep the lesson visible, although they need an estimated "
                       f"{estimate(floor):.0f} s here, over the {budget_s:.0f} s budget")
    low, high = floor, floor
    while high < cap and estimate(min(cap, high * 2)) <= budget_s:
        low = high = min(cap, high * 2)
    if high < cap:
        high = min(cap, high * 2)  # estimate(high) > budget: bisect between low (fits) and high (does not)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if estimate(middle) <= budget_s else (low, middle)
    reason = (f"{low} {what}: an estimated {estimate(low):.0f} s of model time on this machine (from its measured "
              f"profile), within the {budget_s:.0f} s budget")
    return low, reason + (f" (capped at {cap})" if low == cap else "")


STRETCH = 1.5  # a lesson keeps its floor up to this many times its budget; beyond, it shrinks to fit the budget


@dataclass
class Sizing:
    """What ``fit_to_budget`` chose: the count, the timed rounds, and one line per decision (``str``: the lines)."""

    n: int
    repeats: int | None
    lines: list[str]

    def __str__(self) -> str:
        return "\n".join(self.lines)


def fit_to_budget(
    budget_s: float,
    estimate: Callable[..., float],
    floor: int,
    cap: int,
    *,
    minimum: int | None = None,
    explicit: int | None = None,
    repeats: int | None = None,
    what: str = "tickets",
) -> Sizing:
    """A lesson's count and timed rounds for its time budget, and why, in one call.

    ``estimate(n)``, or ``estimate(n, repeats)`` when ``repeats`` is given: the lesson's model seconds. An explicit
    count wins. Otherwise, where even ``floor`` is over the budget, the timed rounds drop to 2 (the fewest that give
    a spread); the count is the largest in [floor, cap] within the budget (``size_to_budget``), or the floor while
    it needs at most ``STRETCH`` times the budget. A floor beyond that (a large model, a slow machine) gives way:
    the largest count in [minimum, floor) within the budget, at least ``minimum`` (None: the floor
    never gives way, e.g. an accuracy that needs its tickets).
    """
    lines: list[str] = []
    cost = (lambda n: estimate(n, repeats)) if repeats is not None else estimate
    if explicit is None and repeats is not None and repeats > 2 and cost(floor) > budget_s:
        wanted, needed, repeats = repeats, cost(floor), 2
        lines.append(f"2 timed rounds instead of {wanted}: {floor} {what} with {wanted} need an estimated {needed:.0f} s "
                     f"here, over the {budget_s:.0f} s budget")
    if explicit is not None or cost(floor) <= STRETCH * budget_s or minimum is None or minimum >= floor:
        n, why = size_to_budget(budget_s, cost, floor=floor, cap=cap, explicit=explicit, what=what)
        return Sizing(n, repeats, [*lines, why])
    n = next((n for n in range(floor - 1, minimum - 1, -1) if cost(n) <= budget_s), minimum)
    lines.append(f"{n} {what}, below this lesson's floor of {floor}: {floor} need an estimated {cost(floor):.0f} s here, "
                 f"over {STRETCH:g}x the {budget_s:.0f} s budget (a large model or a slow machine); {n} need about "
                 f"{cost(n):.0f} s. N_TICKETS = {floor} runs every section at its intended size")
    return Sizing(n, repeats, lines)


@dataclass
class PlannedRun:
    """One pass over prompts that a notebook is about to make, for ``estimate_runs``.

    ``lengths``: each prompt's tokens (after the prefix when ``prefix_tokens`` > 0). ``continuation``: label
    tokens appended after the prompt per row, in the same forward (``continuation_tokens(scorer)``).
    ``new_tokens``: tokens generated per prompt (the generate + parse baseline), each a decode step at batch 1.
    """

    lengths: Sequence[int]
    strategy: str = "loop"
    batch_size: int = 1
    token_budget: int | None = None
    prefix_tokens: int = 0
    continuation: int = 0
    new_tokens: int = 0
    repeats: int = 1
    slowdown: float = 1.0  # e.g. float32 matmul / bfloat16 matmul, for a run in another dtype


def continuation_tokens(scorer) -> int:
    """Label tokens a scorer runs after each prompt (0 on the first-token path)."""
    return len(scorer.tail)


def estimate_runs(profile: MachineProfile, runs: Iterable[PlannedRun]) -> float:
    """Estimated seconds of model time for the planned runs: each forward call read off the prefill curve."""
    from .batching import plan_batches

    total = 0.0
    for run in runs:
        if not len(run.lengths):
            continue
        lengths = list(run.lengths)
        batches = plan_batches(lengths, run.strategy, run.batch_size, run.token_budget,
                               tokens_per_row=run.prefix_tokens + run.continuation)  # as score_batched plans them
        seconds = 0.0
        for batch in batches:
            width = max(lengths[i] for i in batch) + run.continuation
            # Cached-prefix tokens are not recomputed, but every row still attends to them: count a quarter.
            seconds += profile.forward_seconds(len(batch) * (width + run.prefix_tokens / 4))
        if run.new_tokens > 1:
            seconds += len(lengths) * (run.new_tokens - 1) / profile.decode[1]
        total += seconds * run.repeats * run.slowdown
    return total
