"""Clocks that tell the truth on every device (notebooks 01-04, the profile, the benchmark).

A GPU (CUDA or Apple's MPS) runs kernels asynchronously: a Python call returns as soon as the work is queued, so a
clock read around it measures the queueing, not the work. Every timed block therefore waits for the device before
it starts (so earlier queued work is not charged to it) and before it stops. On a CPU the waits cost nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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


def best_seconds(call: Callable[[], object], device: torch.device | str | None, repeats: int = 5) -> float:
    """The fastest of ``repeats`` synchronised runs of ``call`` after one untimed warm-up (first calls allocate
    memory and pick kernels). The minimum, because noise on a quiet machine only ever adds time."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    call()
    times = []
    for _ in range(repeats):
        with Stopwatch(device) as clock:
            call()
        times.append(clock.seconds)
    return min(times)
