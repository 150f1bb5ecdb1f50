"""Clocks that tell the truth on every device, and one way to compare timings: warm up, alternate, repeat, and name a
winner only by the series' one rule (``judge_spreads``). A GPU runs kernels asynchronously, so every timed block waits
for the device before it starts and before it stops; on a CPU the waits cost nothing."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def sync(device: torch.device | str | None) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU)."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals (low, high; or slowest, fastest) overlap."""
    return a[0] <= b[1] and b[0] <= a[1]


def false_winner_rate(n: int, m: int) -> float:
    """How often ``n`` rounds of one contender lie wholly apart from ``m`` of an equal one (every order of the rounds
    equally likely): 2 n! m! / (n + m)!. 2 rounds each: 1 time in 3; 3: 1 in 10; 4: 1 in 35; 5: 1 in 126."""
    return min(1.0, 2 / math.comb(n + m, n))


FALSE_WINNERS = 0.05  # the bar: a rule may name a winner between equal contenders at most 1 time in 20
ROUNDS_NEEDED = next(k for k in range(1, 99) if false_winner_rate(k, k) <= FALSE_WINNERS)  # 4
NO_VERDICT = f"no verdict at this size: {ROUNDS_NEEDED} rounds each would be needed"


def judge_spreads(a: tuple[float, float], n: int, b: tuple[float, float], m: int) -> str:
    """The series' one rule on two spreads (any measure) over ``n`` and ``m`` rounds: "winner" where they lie apart
    and ``false_winner_rate`` is at most ``FALSE_WINNERS``, ``NO_VERDICT`` where apart over fewer, or "within noise"."""
    if overlap(a, b):
        return "within noise"
    return "winner" if false_winner_rate(n, m) <= FALSE_WINNERS else NO_VERDICT


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

    def judge(self, other: Timing) -> str:
        """The rule (``judge_spreads``) on these runs and ``other``'s: "winner", ``NO_VERDICT`` or "within noise"."""
        return judge_spreads((self.low, self.high), len(self.seconds), (other.low, other.high), len(other.seconds))

    def beats(self, other: Timing) -> bool:
        """Whether the rule names these runs faster than ``other``'s."""
        return self.median < other.median and self.judge(other) == "winner"

    def verdict(self, other: Timing) -> str:
        """A sentence comparing two timings by the rule (``judge``): the medians' ratio and its range (the slower's
        fastest run over the faster's slowest, to its slowest over the faster's fastest), over how many rounds."""
        fast, slow = (self, other) if self.median <= other.median else (other, self)
        ratio = slow.median / fast.median
        n, m = len(fast.seconds), len(slow.seconds)
        span, pair = f"{slow.low / fast.high:.2f}-{slow.high / fast.low:.2f}x", f"{self.name} and {other.name}"
        rounds = f"{n} and {m} rounds" if n != m else f"{n} round{'s' * (n > 1)} each"
        if self.judge(other) == "winner":
            return f"{fast.name} is {ratio:.2f}x faster than {slow.name} (runs {span}: apart over {rounds})"
        if self.judge(other) == NO_VERDICT:
            return f"{pair}: medians {ratio:.2f}x apart (runs {span} over {rounds}); {NO_VERDICT}"
        return f"{pair} are within noise of each other (medians {ratio:.2f}x apart, runs {span}: they overlap)"


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
