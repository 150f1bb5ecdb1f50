"""Clocks that tell the truth on every device (notebooks 01-05, the profile, the benchmark), and one way to compare
timings: warm up, alternate, repeat, and name a winner only beyond the spread (``compare``, ``Timing.verdict``).

A GPU (CUDA or Apple's MPS) runs kernels asynchronously: a Python call returns as soon as the work is queued, so a
clock read around it measures the queueing, not the work. Every timed block therefore waits for the device before
it starts (so earlier queued work is not charged to it) and before it stops. On a CPU the waits cost nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def sync(device: torch.device | str | None) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU)."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """``with Stopwatch(model.device) as clock: ...`` then ``clock.seconds``: wall time of the block, synchronised."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.seconds = float("nan")
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._start


@dataclass
class Timing:
    """Several synchronised runs of one thing: ``median`` is the figure to quote, ``low``-``high`` its spread;
    ``results``: what each timed run returned (``compare`` keeps them), in order."""

    name: str
    seconds: list[float]
    results: list = field(default_factory=list, repr=False)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def low(self) -> float:
        return min(self.seconds)

    @property
    def high(self) -> float:
        return max(self.seconds)

    def __str__(self) -> str:
        return f"{self.name}: {self.median:.3f} s (runs {self.low:.3f}-{self.high:.3f} s, {len(self.seconds)} runs)"

    def overlaps(self, other: Timing) -> bool:
        """True when these runs cannot say which is faster: their ranges overlap, or one has a single run (no spread
        to judge a difference by)."""
        if len(self.seconds) < 2 or len(other.seconds) < 2:
            return True
        return self.low <= other.high and other.low <= self.high

    def verdict(self, other: Timing, per: str = "") -> str:
        """One sentence comparing two timings, naming a winner only when their runs do not overlap. ``per``: what
        the ratio of the medians is of, for the wording (e.g. "items/s")."""
        fast, slow = (self, other) if self.median <= other.median else (other, self)
        ratio, pair = slow.median / fast.median, f"{self.name} and {other.name}"
        if min(len(self.seconds), len(other.seconds)) < 2:
            return f"{pair}: medians {ratio:.2f}x apart, but a single run has no spread to judge by: no winner named"
        if self.overlaps(other):
            runs = f"{len(self.seconds)} and {len(other.seconds)}"
            return f"{pair} are within noise of each other (medians {ratio:.2f}x apart, but their runs overlap, {runs})"
        return f"{fast.name} is {ratio:.2f}x faster than {slow.name}{f' in {per}' if per else ''} (runs do not overlap)"


def compare(
    calls: dict[str, Callable[[], object]], device: torch.device | str | None = None, repeats: int = 3, warmup: int = 1
) -> dict[str, Timing]:
    """Time several things the same way: each warmed up ``warmup`` times, then ``repeats`` rounds in alternating
    order (first to last, then last to first), so a machine that speeds up or slows down during the run weighs on
    every thing alike. Every run is synchronised with ``device``; each ``Timing`` keeps what its runs returned."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    if not calls:
        raise ValueError("nothing to time: give at least one call")
    for call in calls.values():
        for _ in range(warmup):
            call()
    timings = {name: Timing(name, []) for name in calls}
    names = list(calls)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            with Stopwatch(device) as clock:
                result = calls[name]()
            timings[name].seconds.append(clock.seconds)
            timings[name].results.append(result)
    return timings
