"""The machine profile: what this device and model do per second, measured once and cached (notebook 00; 03 reads
it): **matmul throughput** per dtype worth trying (the roof, and whether a half dtype is worth running); **prefill**
tokens/s against tokens per call for one sequence (whether one ticket keeps the hardware busy); **batched rows** of
a median ticket's length (what batching can gain: a long sequence pays attention that short rows do not). Curves a
lesson reads, not a price list: every speed a lesson reports is timed on the job itself."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .models import ModelInfo, cache_dir, dtype_candidates, finite_logits, free_memory, machine_name, threads_text
from .timing import Stopwatch

# A CUDA build of torch without a CUDA runtime warns as torch.utils.benchmark imports cpp_extension, atop every
# classify run; nothing here builds an extension, so the line is noise.
(log := logging.getLogger("torch.utils.cpp_extension")).setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402

log.setLevel(logging.NOTSET)

PROFILE_VERSION = 10  # 7: roof from torch.utils.benchmark. 8: no decode step. 9: every weight shape. 10: all threads
SLOW_DTYPE_RATIO = 0.5  # a half dtype whose matmul runs below this share of float32's is not worth running
PREFILL_SIZES = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
BATCH_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_ROW_TOKENS = 96  # about a median ticket's prompt (the article's median is 94 with Qwen's tokenizer)
MAX_CALL_S = 1.5  # a curve stops after a call this slow: it is flat long before
_MEMORY: dict[str, MachineProfile] = {}


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """A measured rate curve read at ``x``, log-log between points; flat past its ends."""
    xs, ys = zip(*sorted(points))
    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


def _time_call(call, device: torch.device, min_time_s: float = 0.2, max_repeats: int = 5) -> float:
    """Seconds per call: the best of a few synchronised runs (at least two, unless the first is too slow to repeat).
    The best discards a first run at a new size that picks kernels or grows memory: no separate warm-up needed."""
    times: list[float] = []
    while len(times) < max_repeats and (sum(times) < min_time_s or len(times) < 2):
        with Stopwatch(device) as clock:
            call()
        times.append(clock.seconds)
        if times[0] > MAX_CALL_S:  # too slow to repeat: one run is the measurement
            break
    return min(times)


@torch.inference_mode()
def matmul_gflops(device, dtype: torch.dtype, shape: tuple[int, int, int], min_run_time=1.0, slow=None) -> float | None:
    """GFLOP/s of one (m x k) @ (k x n) matmul in ``dtype``, a roof: the fastest block of ``blocked_autorange`` after a
    warm-up; None where unsupported. Below ``slow`` the first call answers (emulated bfloat16 takes seconds a call)."""
    device = torch.device(device)
    m, k, n = shape
    flops = 2 * m * k * n
    try:
        a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
        with Stopwatch(device) as first:
            a @ b  # an unsupported dtype fails here
    except (RuntimeError, TypeError):
        return None
    if slow is not None and flops / first.seconds / 1e9 < slow:
        return flops / first.seconds / 1e9
    # Timer runs on one thread unless told otherwise: the roof is every thread the model's forward uses
    timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    timer.blocked_autorange(min_run_time=min_run_time / 4)  # warm-up: clocks ramp up, kernels are picked
    measured = timer.blocked_autorange(min_run_time=min_run_time)
    return flops / min(measured.times) / 1e9  # a roof is a maximum: the fastest block


def roof_shapes(model, device: torch.device) -> list[tuple[int, int, int]]:
    """Every distinct shape of the model's weight matrices (its linear layers but the output layer) as a matmul, with
    enough tokens to keep the device busy: the roof is the fastest, since a forward runs them all."""
    tokens, head = 2048 if device.type == "cpu" else 16384, model.get_output_embeddings()
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    return sorted({(tokens, m.in_features, m.out_features) for m in linear}, key=lambda s: -s[1] * s[2])


@torch.inference_mode()
def _rate_curve(model, counts: Iterable[int], shape, masked=False, least=64) -> list[tuple[int, float]]:
    """(count, tokens/s) on random ids of ``shape(count)`` until the rate grows under 5 % twice, past ``least``."""
    points: list[tuple[int, float]] = []
    generator = torch.Generator().manual_seed(0)

    def make_inputs(count):
        rows, width = shape(count)
        ids = torch.randint(0, model.config.vocab_size, (rows, width), generator=generator).to(model.device)
        return {"input_ids": ids, **({"attention_mask": torch.ones_like(ids)} if masked else {})}, rows * width

    model(**make_inputs(1)[0], use_cache=False, logits_to_keep=1)  # warm-up, once per curve: the first call ever
    for count in counts:
        inputs, tokens = make_inputs(count)
        seconds = _time_call(lambda: model(**inputs, use_cache=False, logits_to_keep=1), model.device)
        points.append((count, tokens / seconds))
        flat = len(points) >= 3 and all(points[-i][1] < 1.05 * points[-i - 1][1] for i in (1, 2))
        if count >= least and (flat or seconds > MAX_CALL_S):
            break
    return points


def prefill_curve(model) -> list[tuple[int, float]]:
    """(tokens per forward call, tokens/s) for one sequence of each size, until the throughput stops growing."""
    limit = getattr(model.config, "max_position_embeddings", 4096)
    return _rate_curve(model, [n for n in PREFILL_SIZES if n <= limit], lambda tokens: (1, tokens))


def batched_curve(model, row_tokens: int = BATCH_ROW_TOKENS) -> list[tuple[int, float]]:
    """(rows per call, tokens/s) for masked batches of ``row_tokens``-token rows, to at least 32 rows (256 on a GPU)."""
    least = 32 if model.device.type == "cpu" else 256
    return _rate_curve(model, BATCH_ROWS, lambda rows: (rows, row_tokens), masked=True, least=least)


def half_precision_finite(model, dtype: str) -> bool:
    """Whether a copy of ``model`` in ``dtype`` gives finite logits: a dtype that overflows is never worth running."""
    half = copy.deepcopy(model).to(getattr(torch, dtype))
    try:
        return finite_logits(half)
    finally:
        del half
        free_memory(model.device)


@dataclass
class MachineProfile:
    """One machine + model + dtype, measured. Notebook 00, section 2."""

    machine: str
    torch: str
    model: str
    dtype: str
    device: str
    threads: int
    matmul_gflops: dict[str, float]  # per dtype: the fastest of the model's weight shapes (roof_shapes)
    prefill: list[tuple[int, float]]
    batched: list[tuple[int, float]] = field(default_factory=list)  # (rows per call, tokens/s)
    batch_row_tokens: int = BATCH_ROW_TOKENS
    measured_s: float = 0.0
    measured_on: str = ""
    finite: dict[str, bool] = field(default_factory=dict)  # half dtype -> a probe forward gave finite logits

    def tokens_per_s(self, tokens: float) -> float:
        """Prefill tokens/s of one sequence of ``tokens`` tokens, read on the measured curve."""
        return _interpolate(self.prefill, tokens)

    @property
    def peak_tokens_per_s(self) -> float:
        return max(rate for _, rate in self.prefill)

    @property
    def peak_tokens(self) -> int:
        return max(self.prefill, key=lambda point: point[1])[0]

    @property
    def saturation_tokens(self) -> int:
        return min(tokens for tokens, rate in self.prefill if rate >= 0.9 * self.peak_tokens_per_s)

    def batched_tokens_per_s(self, rows: float) -> float:
        """Tokens/s of ``rows`` rows of ``batch_row_tokens`` tokens in one call, read on the measured curve."""
        return _interpolate(self.batched, rows)

    def batching_gain(self, rows: float) -> float:
        """How much faster per token ``rows`` median-length rows run in one call than one, both read on the batched
        curve from one sweep (the single-sequence curve can differ from its first point by more than the gain)."""
        return self.batched_tokens_per_s(rows) / self.batched_tokens_per_s(1)

    @property
    def batch_knee(self) -> int:
        peak = max(rate for _, rate in self.batched)
        return min(rows for rows, rate in self.batched if rate >= 0.9 * peak)

    def fast_dtypes(self) -> list[str]:
        base = self.matmul_gflops["float32"]
        fast = [name for name, gflops in self.matmul_gflops.items() if gflops >= SLOW_DTYPE_RATIO * base]
        return [name for name in fast if name == "float32" or self.finite.get(name, True)]

    def slow_dtypes(self) -> dict[str, str]:
        """dtype -> one line saying why it is not worth running here."""
        base = self.matmul_gflops["float32"]
        fast = self.fast_dtypes()
        why = {}
        overflow = "a forward in it gives non-finite logits with this model (half-precision overflow)"
        slow = "its matmul runs at {:.3g} GFLOP/s here against {:.3g} for float32 (below half): not worth running"
        for name, gflops in self.matmul_gflops.items():
            if name not in fast:
                why[name] = f"{name}: " + (slow.format(gflops, base) if gflops < SLOW_DTYPE_RATIO * base else overflow)
        return why

    def caption(self) -> str:
        matmul = f"float32 matmul {self.matmul_gflops['float32']:.0f} GFLOP/s"
        # Two peaks, named apart: one long sequence's (its tokens attend to each other) and short rows' batched
        prefill = f"one sequence's prefill peak {self.peak_tokens_per_s:.0f} tokens/s at {self.peak_tokens} tokens"
        prefill += f" (90 % of it from {self.saturation_tokens})" if self.saturation_tokens < self.peak_tokens else ""
        top = max((rate for _, rate in self.batched), default=0)
        rows = f"rows of {self.batch_row_tokens} tokens batched: up to {top:.0f} tokens/s, 90 % of it from "
        where = f"{self.machine}, {threads_text(self.threads)}"
        return f"{where} · {matmul} · {prefill} · {rows}{self.batch_knee} rows"

    def summary(self) -> str:
        base = self.matmul_gflops["float32"]
        shares = {d: "" if d == "float32" else f" ({g / base:.2g}x float32)" for d, g in self.matmul_gflops.items()}
        matmul = [f"{d} {g:.3g} GFLOP/s{shares[d]}" for d, g in self.matmul_gflops.items()]
        lines = [f"machine: {self.machine} · {self.device} · {threads_text(self.threads)} · torch {self.torch}"]
        lines.append(f"model: {self.model} in {self.dtype} (measured in {self.measured_s:.1f} s on {self.measured_on})")
        lines.append("matmul: " + ", ".join(matmul))
        lines.append("prefill: " + ", ".join(f"{n} tok {rate:.0f}/s" for n, rate in self.prefill))
        rows = ", ".join(f"{n} rows {rate:.0f} tok/s" for n, rate in self.batched)
        return "\n".join([*lines, f"batched rows of {self.batch_row_tokens} tokens: {rows}"])

    @classmethod
    def from_dict(cls, data: dict) -> MachineProfile:
        data = dict(data)
        data["prefill"] = [tuple(point) for point in data["prefill"]]
        data["batched"] = [tuple(point) for point in data.get("batched", [])]
        return cls(**data)


def profile_path(info: ModelInfo, device: torch.device) -> Path:
    parts = [PROFILE_VERSION, machine_name(device), torch.__version__, info.name, info.dtype, str(device)]
    parts.append(torch.get_num_threads())
    return cache_dir() / "profiles" / f"{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]}.json"


def machine_profile(model, info: ModelInfo, refresh: bool = False, verbose: bool = True, say=print) -> MachineProfile:
    """This machine's profile for ``model``, measured once and cached (``refresh``: again); ``verbose``: ``say`` that
    it measures. Notebook 00, section 2."""
    path = profile_path(info, model.device)
    if not refresh and str(path) in _MEMORY:
        return _MEMORY[str(path)]
    if not refresh and path.is_file():
        try:
            _MEMORY[str(path)] = MachineProfile.from_dict(json.loads(path.read_text()))
            return _MEMORY[str(path)]
        except (ValueError, TypeError, KeyError):
            pass  # an unreadable or older profile: measure again
    if verbose:
        say("measuring this machine (once; cached for later notebooks) ...")
    start, device = time.perf_counter(), model.device
    shapes = roof_shapes(model, device)
    matmul: dict[str, float] = {}
    for dtype in dtype_candidates(device):  # float32 first
        # On a CPU a dtype far below half of float32's is answered by its first call, on the largest shape alone
        slow = SLOW_DTYPE_RATIO * matmul["float32"] / 4 if matmul and device.type == "cpu" else None
        rates = []
        for shape in shapes:
            rate = matmul_gflops(device, dtype, shape, min_run_time=0.25, slow=slow)
            if rate is None:  # an unsupported dtype
                break
            rates.append(rate)
            if slow is not None and rate < slow:
                break
        if rates:
            matmul[str(dtype).removeprefix("torch.")] = max(rates)
    base = matmul["float32"]
    fast = [name for name, gflops in matmul.items() if name != "float32" and gflops >= SLOW_DTYPE_RATIO * base]
    finite = {name: half_precision_finite(model, name) for name in fast}
    what = (machine_name(device), torch.__version__, info.name, info.dtype, str(device), torch.get_num_threads())
    profile = MachineProfile(*what, matmul, prefill_curve(model), batched_curve(model), finite=finite)
    profile.measured_s, profile.measured_on = time.perf_counter() - start, time.strftime("%Y-%m-%d %H:%M")
    _MEMORY[str(path)] = profile
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")  # renamed over the profile: two processes both land
    temporary.write_text(json.dumps(asdict(profile), indent=1))
    temporary.replace(path)
    if verbose:
        say(f"measured in {profile.measured_s:.1f} s; saved to {path}")
    return profile
