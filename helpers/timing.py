"""Clocks that tell the truth on every device, and one way to compare timings: warm up, alternate, repeat, and name
a winner only beyond the spread (``compare``, ``Timing.verdict``). A GPU runs kernels asynchronously, so every timed
block waits for the device before it starts and before it stops; on a CPU the waits cost nothing."""

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


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two spreads (slowest, fastest; or low, high) overlap: then no winner can be named between them. The
    one rule of the series for "within noise" (``Timing.overlaps``, ``bench.Row.beyond_spread``, the figures)."""
    return a[0] <= b[1] and b[0] <= a[1]


class Stopwatch:
    """``with Stopwatch(model.device) as clock: ...`` then ``clock.seconds``: wall time of the block, synchronised."""

    def __init__(self, device: torch.device | str | None = None):
        self.device, self.seconds, self._start = device, float("nan"), 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._start


@dataclass
class Timing:
    """Synchronised runs of one thing: ``median`` to quote, ``low``-``high`` its spread, ``results`` their returns."""

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
        """Whether these runs cannot say which is faster: their ranges overlap, or one has a single run."""
        return min(len(self.seconds), len(other.seconds)) < 2 or overlap((self.low, self.high), (other.low, other.high))

    def verdict(self, other: Timing) -> str:
        """A sentence comparing two timings, a winner named only when their runs do not overlap: the medians' ratio and
        its range (the slower's fastest run over the faster's slowest, to its slowest over the faster's fastest)."""
        fast, slow = (self, other) if self.median <= other.median else (other, self)
        ratio, pair = slow.median / fast.median, f"{self.name} and {other.name}"
        if min(len(self.seconds), len(other.seconds)) < 2:
            return f"{pair}: medians {ratio:.2f}x apart, but a single run has no spread to judge by: no winner named"
        span = f"{slow.low / fast.high:.2f}-{slow.high / fast.low:.2f}x"
        if self.overlaps(other):
            return f"{pair} are within noise of each other (medians {ratio:.2f}x apart, runs {span}: they overlap)"
        return f"{fast.name} is {ratio:.2f}x faster than {slow.name} (runs {span}: no overlap)"


def compare(calls: dict[str, Callable[[], object]], device=None, repeats=3, warmup=1) -> dict[str, Timing]:
    """Time several things the same way: each warmed up ``warmup`` times, then ``repeats`` rounds in alternating order,
    so a machine speeding up or slowing down weighs on each alike; runs synchronised with ``device``."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    if not calls:
        raise ValueError("nothing to time: give at least one call")
    for call in calls.values():
        for _ in range(warmup):
            call()
    timings, names = {name: Timing(name, []) for name in calls}, list(calls)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            with Stopwatch(device) as clock:
                result = calls[name]()
            timings[name].seconds.append(clock.seconds)
            timings[name].results.append(result)
    return timings
