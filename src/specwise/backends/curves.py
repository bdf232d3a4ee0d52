"""Cost curves: how long one forward of n tokens takes on an LM, measured on this machine.

`CostCurve` maps tokens-in-one-call to milliseconds (median of repeats after a warm-up) and is
updated from the calls actually run (`observe`); `measure_curve` calibrates one on a sequence
holding CALIBRATION_CONTEXT tokens, `measure_curves` several LMs' at once, their forwards
interleaved; a curve that contradicts itself (`consistent`) was measured while something else
had the CPU, and `until_consistent` measures again. The backend choice (`backends.choice`),
the native build's comparison (`ik_native`), a draft model's cost (`drafters.model`) and the
controller's cost model (`specwise.costs`) all read curves from here. This module decides
nothing and keeps nothing on disk.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from specwise.backends.base import LM, Reserved

__all__ = [
    "CALIBRATION_CONTEXT",
    "EMA",
    "CostCurve",
    "blend",
    "measure_curve",
    "measure_curves",
    "until_consistent",
]

T = TypeVar("T")
EMA = 0.1  # weight of one new observation
# `CostCurve.consistent`: a size may cost down to CONSISTENT of a smaller one's. Real curves
# dip there: mainline llama.cpp's 16-token forward measured 0.72-0.83 of its 15-token one (a
# kernel switch, every curve cached on the Zen 5 machine); the curve measured under a test
# suite's load had 0.41.
CONSISTENT, SLACK_MS = 0.6, 0.5
TRIES = 3  # calibrations that contradict themselves before one is used uncached


def blend(table: dict, key: object, value: float) -> None:
    """table[key] moves towards value by EMA (is set to it when new)."""
    old = table.get(key)
    table[key] = value if old is None else (1 - EMA) * old + EMA * value


@dataclass
class CostCurve:
    """Milliseconds of one forward call as a function of the tokens in it. `seen`: the sizes
    observed since the curve was measured or loaded (`observe`)."""

    ms: dict[int, float] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set, compare=False, repr=False)

    def __call__(self, n: int) -> float:
        """Interpolated (linear) cost of n tokens; past the last measurement, in proportion to
        the tokens (a call that long is compute-bound: measured here, 4 sequences x 16 tokens
        cost 1,377 ms where the slope of the curve's last two points said 365)."""
        if n in self.ms:
            return self.ms[n]
        if not self.ms:
            raise ValueError("the cost curve has no measurements")
        xs = sorted(self.ms)
        if n < xs[0]:
            return self.ms[xs[0]]
        if n > xs[-1]:
            return self.ms[xs[-1]] * n / xs[-1]
        return float(np.interp(n, xs, [self.ms[x] for x in xs]))

    def observe(self, n: int, ms: float) -> None:
        """Blend one observed call into the curve. The sizes not observed since the curve was
        measured move with the plain step (n = 1, observed every plain round): a curve measured
        at another time (a busier or calmer machine) keeps its shape, and the machine of now
        sets its level. Otherwise a curve measured while the machine was slow would price
        every draft too high for ever: no draft would run, so no draft's cost would be seen."""
        before = self.ms.get(1)
        blend(self.ms, n, ms)
        self.seen.add(n)
        if n == 1 and before:
            scale = self.ms[1] / before
            for m in self.ms:
                if m not in self.seen:
                    self.ms[m] *= scale

    def consistent(self) -> bool:
        """Whether the curve agrees with itself: no size costs less than CONSISTENT of a
        smaller size's cost (less SLACK_MS, for timer noise on tiny models). More tokens in one
        forward cost less only a little, where a kernel changes; a curve in which they cost far
        less was measured while something else took the CPU."""
        top = 0.0
        for n in sorted(self.ms):
            if self.ms[n] < CONSISTENT * top - SLACK_MS:
                return False
            top = max(top, self.ms[n])
        return True

    def relative(self) -> dict[int, float]:
        base = self.ms.get(1) or next(iter(self.ms.values()))
        return {n: v / base for n, v in sorted(self.ms.items())}


# The context a cost is measured at: a typical request's (the shipped prompts hold 60-1,100
# tokens). It matters: on the AMD EPYC Zen 3 machine mainline's one-token forward took 65 ms
# at 128 tokens and 76-78 ms at 512-1,536, ik_llama's 51-56 ms at both (BENCHMARKS.md §0).
CALIBRATION_CONTEXT = 512


def measure_curve(
    lm: LM,
    sizes: Iterable[int] = range(1, 17),
    repeats: int = 3,
    context: int = CALIBRATION_CONTEXT,
) -> CostCurve:
    """Median time of a forward of n tokens on a sequence already holding `context` tokens."""
    return measure_curves({"lm": lm}, sizes, repeats, context)["lm"]


def measure_curves(
    lms: Mapping[str, LM],
    sizes: Iterable[int] = range(1, 17),
    repeats: int = 3,
    context: int = CALIBRATION_CONTEXT,
    plain_repeats: int = 0,
) -> dict[str, CostCurve]:
    """Each LM's `measure_curve`, their forwards interleaved: every size is measured on each LM
    in turn (who goes first alternates), so a drift of the machine's speed falls on all alike.
    plain_repeats: one-token forwards added at the end, interleaved the same way (a plain
    step is the cost most compared)."""
    sizes = list(sizes)
    rng = np.random.default_rng(0)
    held: dict[str, int] = {}  # the context each sequence holds
    feeds: dict[str, list[int]] = {}
    samples: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in lms}
    try:
        for name, lm in lms.items():
            held[name] = max(1, min(context, lm.context_length - max(sizes) - 4))
            hi = min(lm.vocab_size, 1000)
            tokens = [int(t) for t in rng.integers(10, hi, size=held[name] + max(sizes))]
            feeds[name] = tokens[held[name] :]
            lm.release(Reserved.CALIBRATION)
            lm.forward([(Reserved.CALIBRATION, tokens[: held[name]])], last_only=True)
            lm.forward([(Reserved.CALIBRATION, feeds[name][:4])])  # warm-up
            lm.truncate(Reserved.CALIBRATION, held[name])
        first = next(iter(lms))
        for n in [*sizes * repeats, *[1] * plain_repeats]:
            turn = len(samples[first].get(n, ())) % 2  # who goes first alternates per size
            for name in list(lms) if turn == 0 else list(reversed(lms)):
                t = time.perf_counter()
                lms[name].forward([(Reserved.CALIBRATION, feeds[name][:n])])
                samples[name].setdefault(n, []).append((time.perf_counter() - t) * 1000.0)
                lms[name].truncate(Reserved.CALIBRATION, held[name])
    finally:
        for lm in lms.values():
            lm.release(Reserved.CALIBRATION)
    return {
        name: CostCurve({n: float(np.median(v)) for n, v in by_n.items()})
        for name, by_n in samples.items()
    }


def until_consistent(
    measure: Callable[[], T], curves: Callable[[T], Iterable[CostCurve]]
) -> tuple[T, bool]:
    """(result, consistent): `measure()` taken again, up to TRIES times, while the curves in
    its result (`curves(result)`) contradict themselves (`CostCurve.consistent`); the last
    result where every try did, for the caller to use without keeping it."""
    for attempt in range(1, TRIES + 1):
        got = measure()
        if all(c.consistent() for c in curves(got)):
            return got, True
        then = "measuring again..." if attempt < TRIES else "using the last for this run only"
        print(
            f"specwise: the costs measured contradict themselves (was the machine busy?); {then}",
            file=sys.stderr,
        )
    return got, False
