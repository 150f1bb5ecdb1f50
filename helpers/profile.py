"""The machine profile: what this device and model do per second, measured in seconds (notebook 00 onwards).

Four measurements, made once and then reused by every notebook and by ``python -m helpers bench``:

- **matmul throughput** per dtype worth trying on the device (``dtype_candidates``: float32 and bfloat16 on a
  CPU; float16, and bfloat16 from compute capability 8.0, on CUDA; float16 and bfloat16 on Apple's MPS): the "roof",
  and the reason a dtype is skipped where it runs below half of float32's speed;
- **prefill throughput**: the model's tokens/s against tokens per forward call, from 1 token up to where it
  stops growing (the saturation curve). It says whether one ticket already keeps the hardware busy;
- **batched rows**: tokens/s of 1, 2, 4, ... rows of a median ticket's length in one call (``BATCH_ROW_TOKENS``),
  until it stops growing: what batching changes. A single long sequence is not the same work as a batch of
  short rows: every one of its tokens attends to all earlier ones, so attention grows with its length, while the
  rows of a batch attend only within themselves. The first curve therefore underestimates what batching short
  rows can gain; this one measures it;
- **one decode step** (one new token per row over a cached context) at batch 1 and at batch 32: where the
  "batch 1 is memory-bandwidth bound" argument holds (generating tokens).

Profiles are cached for the process and on disk (``cache_dir()/profiles``), keyed by machine, torch version,
model, dtype and device, so notebooks 01-04 reuse the one notebook 00 measured. Work is sized from them: every
measured call fits one cost model (``CallCost``: seconds per call, per token and per attended key), which prices
the calls a lesson makes (``helpers.costs``), the passes it plans (``helpers.sizing``) and every batch of a full
plan (``helpers.sweep``). The measurements themselves are ``helpers.measure``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import calls
from .measure import (BATCH_ROW_TOKENS, DECODE_BATCHES, DECODE_CONTEXT, batched_curve, decode_step_tokens_per_s,
                      half_precision_finite, matmul_gflops, prefill_curve, roof_shape)
from .models import ModelInfo, cache_dir, threads_text
from .models import dtype_candidates

PROFILE_VERSION = 6  # 2: roof with torch.utils.benchmark at a busy size; 3: dtypes by device; 4: the roof a maximum;
SLOW_DTYPE_RATIO = 0.5  # a dtype whose matmul runs below this share of float32's is skipped unless forced
_MEMORY: dict[str, MachineProfile] = {}


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """A measured rate curve read at ``x`` (log-log between points). Below its first point the call's fixed cost
    stays (the rate scales down with x); past its last point it is flat."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1] * x / points[0][0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    return points[-1][1]


@dataclass(frozen=True)
class CallCost:
    """Seconds of one forward call: ``per_call`` + ``per_token`` x the tokens computed + ``per_key`` x the (query,
    key) pairs attention scores, fitted to every call the profile timed.

    Three costs, because batching changes them differently: a call's fixed cost (Python, kernel launches, reading
    the weights) is shared by its rows; the per-token work (the matmuls) is the same however the tokens are
    grouped; attention grows with a row's length (each token attends to every earlier one and to a cached
    prefix), so one long sequence pays it and a batch of short rows does not. A row of ``width`` tokens after
    ``past`` cached ones scores width x (past + (width + 1) / 2) pairs.
    """

    per_call: float
    per_token: float
    per_key: float

    @staticmethod
    def features(rows: int, width: float, past: float = 0) -> tuple[float, float, float]:
        return 1.0, rows * width, rows * width * (past + (width + 1) / 2)

    def seconds(self, rows: int, width: float, past: float = 0) -> float:
        calls, tokens, pairs = self.features(rows, max(width, 1), past)
        return self.per_call * calls + self.per_token * tokens + self.per_key * pairs

    def scaled(self, ratio: float) -> CallCost:
        """The same calls with their arithmetic ``ratio`` times as long, their fixed cost unchanged."""
        return CallCost(self.per_call, self.per_token * ratio, self.per_key * ratio)

    @classmethod
    def fit(cls, profile: MachineProfile) -> CallCost:
        """Least relative squares over the profile's prefill calls (single sequences and batched rows), with no cost
        negative: the subset of the three terms that fits best with all of them >= 0. Decode steps are left out:
        one token per row over a cache is another regime (reading the cache), and scoring never decodes."""
        calls = [(1, tokens, 0, tokens / rate) for tokens, rate in profile.prefill]
        calls += [(rows, profile.batch_row_tokens, 0, rows * profile.batch_row_tokens / rate)
                  for rows, rate in profile.batched]
        features = np.array([cls.features(r, w, p) for r, w, p, _ in calls])
        seconds = np.array([t for *_, t in calls])
        scaled = features / seconds[:, None]  # relative errors: a 10 ms call counts as much as a 10 s one
        best, best_error = np.zeros(3), float("inf")
        for subset in ([0, 1, 2], [0, 1], [1, 2], [0, 2], [1], [0], [2]):
            coefficients = np.zeros(3)
            coefficients[subset] = np.linalg.lstsq(scaled[:, subset], np.ones(len(calls)), rcond=None)[0]
            error = float(((scaled @ coefficients - 1) ** 2).sum())
            if (coefficients >= 0).all() and error < best_error:
                best, best_error = coefficients, error
        return cls(*map(float, best))


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
    batched: list[tuple[int, float]] = field(default_factory=list)  # (rows per call, tokens/s)
    batch_row_tokens: int = BATCH_ROW_TOKENS
    decode_context: int = DECODE_CONTEXT
    measured_s: float = 0.0
    measured_on: str = ""
    notes: list[str] = field(default_factory=list)
    finite: dict[str, bool] = field(default_factory=dict)  # half dtype -> a probe forward gave finite logits

    # --- reading the curve ---

    def tokens_per_s(self, tokens: float) -> float:
        """Prefill tokens/s at ``tokens`` per forward call, interpolated on the measured curve (log scale)."""
        return _interpolate(self.prefill, tokens)

    def forward_seconds(self, tokens: float) -> float:
        """Estimated seconds of one forward call processing ``tokens`` tokens (all rows together)."""
        tokens = max(tokens, 1)  # no call is cheaper than a one-token call
        return tokens / self.tokens_per_s(tokens)

    @property
    def peak_tokens_per_s(self) -> float:
        return max(rate for _, rate in self.prefill)

    @property
    def prefill_saturated(self) -> bool:
        """Whether the single-sequence curve flattened (its last points grew under 5 %) before its largest size."""
        rates = [rate for _, rate in self.prefill]
        return len(rates) >= 3 and all(rates[-i] < 1.05 * rates[-i - 1] for i in (1, 2))

    @property
    def saturation_tokens(self) -> int:
        """The fewest tokens per call that reach 90 % of the peak throughput."""
        return min(tokens for tokens, rate in self.prefill if rate >= 0.9 * self.peak_tokens_per_s)

    # --- reading the batched curve: what batching changes ---

    def batched_tokens_per_s(self, rows: float) -> float:
        """Tokens/s of ``rows`` rows of ``batch_row_tokens`` tokens in one call, interpolated (log scale); past the
        last measured point, that point's (the curve had flattened, or the sweep stopped on time)."""
        return _interpolate(self.batched, rows)

    def batching_gain(self, rows: float) -> float:
        """How much faster ``rows`` median-length rows run per token in one call than one row alone: the gain batching
        can bring here before any padding (1.0: none)."""
        return self.batched_tokens_per_s(rows) / self.batched_tokens_per_s(1)

    @property
    def batch_knee(self) -> int:
        """The fewest rows per call that reach 90 % of the batched curve's peak: where a batch-size sweep of
        median-length rows should stop gaining."""
        peak = max(rate for _, rate in self.batched)
        return min(rows for rows, rate in self.batched if rate >= 0.9 * peak)

    @property
    def batched_flat(self) -> bool:
        """Whether the batched curve stopped growing within its measured rows (its last two points within 5 %)."""
        return len(self.batched) >= 2 and self.batched[-1][1] < 1.05 * self.batched[-2][1]

    # --- the cost of any call ---

    @functools.cached_property
    def call_cost(self) -> CallCost:
        """The cost model fitted to every call this profile timed (``CallCost.fit``)."""
        return CallCost.fit(self)

    def call_seconds(self, rows: int, width: float, past: int = 0) -> float:
        """Estimated seconds of one forward call over ``rows`` rows padded to ``width`` tokens, each attending to
        ``past`` cached tokens too (``CallCost``)."""
        return self.call_cost.seconds(rows, width, past)

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
        overflow = {d: (f"{d} skipped: a probe forward in it gave non-finite logits with this model here "
                        "(half-precision overflow); its rows would score NaN") for d, ok in self.finite.items() if not ok}
        if requested:  # named: run even a slow dtype, never one that overflows
            named = list(dict.fromkeys(requested))
            return [d for d in named if d not in overflow], [overflow[d] for d in named if d in overflow]
        candidates = list(self.matmul_gflops) if candidates is None else candidates
        skipped = {**self.slow_dtypes(), **overflow}
        chosen = [d for d in candidates if d not in skipped and (d == "float32" or d in self.matmul_gflops)]
        return chosen, [skipped[d] for d in candidates if d in skipped]

    def in_dtype(self, dtype: str) -> MachineProfile:
        """This profile pricing calls in ``dtype``: a call's arithmetic (per token, per attention pair) scaled by the
        matmul throughput of the profile's own dtype over ``dtype``'s; its fixed cost kept, since a launch-bound call (small calls on a
        GPU) takes about as long in any dtype."""
        base, other = self.matmul_gflops.get(self.dtype), self.matmul_gflops.get(dtype)
        if dtype == self.dtype or not base or not other:  # the profile's own dtype: its calls as measured
            return self
        priced = dataclasses.replace(self)
        priced.__dict__["call_cost"] = self.call_cost.scaled(base / other)  # call_cost is a cached_property
        return priced

    # --- describing ---

    def caption(self) -> str:
        """One line for a figure or a table: the machine and what it measured."""
        batched = (f" · batched rows of {self.batch_row_tokens} tokens: 90 % of their peak from {self.batch_knee} rows"
                   if self.batched else "")
        return (f"{self.machine}, {threads_text(self.threads)} · float32 matmul {self.matmul_gflops.get('float32', 0):.0f} "
                f"GFLOP/s · prefill peak {self.peak_tokens_per_s:.0f} tokens/s, 90 % of it from ~{self.saturation_tokens} "
                f"tokens per call{'' if self.prefill_saturated else f' (not saturated at {self.prefill[-1][0]})'}"
                f"{batched}")

    def summary(self) -> str:
        lines = [f"machine: {self.machine} · {self.device} · {threads_text(self.threads)} · torch {self.torch}",
                 f"model: {self.model} in {self.dtype} (measured in {self.measured_s:.1f} s on {self.measured_on})",
                 "matmul: " + ", ".join(f"{d} {g:.3g} GFLOP/s" for d, g in self.matmul_gflops.items()),
                 "prefill: " + ", ".join(f"{n} tok {rate:.0f}/s" for n, rate in self.prefill),
                 f"batched rows of {self.batch_row_tokens} tokens: "
                 + ", ".join(f"{n} rows {rate:.0f} tok/s" for n, rate in self.batched),
                 "decode step: " + ", ".join(f"batch {b} {rate:.0f} tok/s" for b, rate in sorted(self.decode.items()))]
        return "\n".join(lines + self.notes)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MachineProfile:
        data = dict(data)
        data["prefill"] = [tuple(point) for point in data["prefill"]]
        data["batched"] = [tuple(point) for point in data.get("batched", [])]
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
    with calls.paused():  # the profile's calls are not the lesson's
        return _measure(model, info, device, key, path, verbose)


def _measure(model, info: ModelInfo, device: torch.device, key: str, path: Path, verbose: bool) -> MachineProfile:
    start = time.perf_counter()
    shape = roof_shape(model, device)
    matmul = {}
    for dtype in dtype_candidates(device):  # float32 first: the others are skipped below half of it
        # On a CPU a dtype whose first call is far below that is answered by it; a GPU's first call of a dtype also
        # picks its kernels, so it times them in full.
        slow = SLOW_DTYPE_RATIO * matmul["float32"] / 4 if matmul and device.type == "cpu" else None
        gflops = matmul_gflops(device, dtype, shape, slow=slow)
        if gflops is not None:
            matmul[str(dtype).removeprefix("torch.")] = gflops
    finite = {dtype: half_precision_finite(model, dtype) for dtype in matmul
              if dtype != "float32" and matmul[dtype] >= SLOW_DTYPE_RATIO * matmul["float32"]}
    prefill = prefill_curve(model)
    batched = batched_curve(model)
    decode = {batch: decode_step_tokens_per_s(model, batch) for batch in DECODE_BATCHES}
    profile = MachineProfile(
        machine=machine_name(device), torch=torch.__version__, model=info.name, dtype=info.dtype,
        device=str(device), threads=torch.get_num_threads(), matmul_gflops=matmul, prefill=prefill, decode=decode,
        batched=batched, finite=finite,
        measured_s=time.perf_counter() - start, measured_on=time.strftime("%Y-%m-%d %H:%M"),
    )
    _MEMORY[key] = profile
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file of this process's own, renamed over the profile: two processes measuring at once both land.
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(profile.as_dict(), indent=1))
    temporary.replace(path)
    if verbose:
        print(f"measured in {profile.measured_s:.1f} s; saved to {path}")
    return profile


# --- sizing work by time ----------------------------------------------------------------------------------


