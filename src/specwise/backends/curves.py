"""Cost curves: how long one forward of n tokens takes on an LM, measured on this machine.

`CostCurve` maps tokens-in-one-call to milliseconds (median of repeats after a warm-up) and is
updated from the calls actually run (`observe`); `measure_curve` calibrates one on a sequence
holding CALIBRATION_CONTEXT tokens, `measure_curves` several LMs' at once, their forwards
interleaved, with the share of the machine other processes took meanwhile (`Others`). A curve
measured while something else had the CPU is not `trusted`: it contradicts itself
(`consistent`), or the kernel counted other processes' CPU time in it (`calm`), and
`until_trusted` measures again. The backend choice (`backends.choice`),
the native build's comparison (`ik_native`), a draft model's cost (`drafters.model`) and the
controller's cost model (`specwise.costs`) all read curves from here. This module decides
nothing and keeps nothing on disk.
"""

from __future__ import annotations

import os
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
    "Others",
    "blend",
    "measure_curve",
    "measure_curves",
    "until_trusted",
]

T = TypeVar("T")
EMA = 0.1  # weight of one new observation
# `CostCurve.consistent`: a size may cost down to CONSISTENT of a smaller one's. Real curves
# dip there: mainline llama.cpp's 16-token forward measured 0.72-0.83 of its 15-token one (a
# kernel switch, every curve cached on the Zen 5 machine); the curve measured under a test
# suite's load had 0.41.
CONSISTENT, SLACK_MS = 0.6, 0.5
TRIES = 3  # untrusted calibrations before one is used uncached
# `CostCurve.calm`: the share of the machine's CPU time other processes may take while a curve
# is measured. Beside a process spinning on one of the 2 cores the kernel counted 34% of the
# machine to it, and the curve came out 1.66x / 4.87x / 2.73x for 2 / 3 / 4 tokens against
# 1.51x / 1.93x / 2.27x calm (Zen 4, BENCHMARKS "the eagle layer"). The kernel's count says so
# directly, where `consistent` sees only a load that makes a larger call cost less.
BUSY = 0.1
TICKS_S = 0.05  # CPU seconds of others ignored: the kernel counts CPU time in ticks


def blend(table: dict, key: object, value: float) -> None:
    """table[key] moves towards value by EMA (is set to it when new)."""
    old = table.get(key)
    table[key] = value if old is None else (1 - EMA) * old + EMA * value


@dataclass
class CostCurve:
    """Milliseconds of one forward call as a function of the tokens in it. `seen`: the sizes
    observed since the curve was measured or loaded (`observe`); `base`: the curve as measured
    or loaded, whose shape prices the sizes not seen."""

    ms: dict[int, float] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set, compare=False, repr=False)
    others: float = field(default=0.0, compare=False, repr=False)  # `Others.share` measuring it
    base: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.base = self.base or dict(self.ms)

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
        """Blend one observed call into the curve. A size not observed since the curve was
        measured keeps the measured shape from the nearest size observed below it (none: it
        stays as measured): it moves with the plain step (n = 1, observed every plain round)
        until a larger call is seen. A curve measured at another time (a busier or calmer machine)
        keeps its shape and the machine of now sets its level; where the calls run show the
        shape itself wrong (2 tokens dearer against 1 than measured), the larger sizes follow
        them. Otherwise a curve measured while the machine was slow would price every draft
        too high for ever: no draft would run, so no draft's cost would be seen."""
        blend(self.ms, n, ms)
        self.seen.add(n)
        anchor = None  # the largest size seen so far, going up
        for m in sorted(self.base):
            if m in self.seen:
                anchor = m
            elif anchor is not None:
                self.ms[m] = self.base[m] * self.ms[anchor] / self.base[anchor]

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

    def calm(self) -> bool:
        """Whether other processes took at most BUSY of the machine while it was measured."""
        return self.others <= BUSY

    def trusted(self) -> bool:
        """Consistent and calm: measured while nothing else had the CPU, so fit to keep."""
        return self.consistent() and self.calm()

    def relative(self) -> dict[int, float]:
        one = self.ms.get(1) or next(iter(self.ms.values()))
        return {n: v / one for n, v in sorted(self.ms.items())}


# The context a cost is measured at: a typical request's (the shipped prompts hold 60-1,100
# tokens). It matters: on the AMD EPYC Zen 3 machine mainline's one-token forward took 65 ms
# at 128 tokens and 76-78 ms at 512-1,536, ik_llama's 51-56 ms at both (BENCHMARKS.md §0).
CALIBRATION_CONTEXT = 512


def _cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has spent busy, stolen by its host included; CPU seconds
    of this process), or None where the kernel does not say (no /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


class Others:
    """Counts, from when it is made, the CPU time processes other than this one take."""

    def __init__(self) -> None:
        self.start = _cpu_seconds()
        self.t0 = time.perf_counter()

    def share(self) -> float:
        """Their CPU time since, as a share of the machine's (its cores x the time passed),
        less TICKS_S; 0.0 where the kernel does not say."""
        end = _cpu_seconds()
        if self.start is None or end is None:
            return 0.0
        others = (end[0] - self.start[0]) - (end[1] - self.start[1]) - TICKS_S
        wall = time.perf_counter() - self.t0
        return max(0.0, others) / max(wall * (os.cpu_count() or 1), 1e-9)


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
    step is the cost most compared). Each curve's `others`: the share of the machine other
    processes took while they were measured."""
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
        others = Others()
        for n in [*sizes * repeats, *[1] * plain_repeats]:
            turn = len(samples[first].get(n, ())) % 2  # who goes first alternates per size
            for name in list(lms) if turn == 0 else list(reversed(lms)):
                t = time.perf_counter()
                lms[name].forward([(Reserved.CALIBRATION, feeds[name][:n])])
                samples[name].setdefault(n, []).append((time.perf_counter() - t) * 1000.0)
                lms[name].truncate(Reserved.CALIBRATION, held[name])
        share = others.share()
    finally:
        for lm in lms.values():
            lm.release(Reserved.CALIBRATION)
    return {
        name: CostCurve({n: float(np.median(v)) for n, v in by_n.items()}, others=share)
        for name, by_n in samples.items()
    }


def until_trusted(
    measure: Callable[[], T], curves: Callable[[T], Iterable[CostCurve]]
) -> tuple[T, bool]:
    """(result, trusted): `measure()` taken again, up to TRIES times, while a curve in its
    result (`curves(result)`) is not `CostCurve.trusted`; the last result where no try was, for
    the caller to use without keeping it."""
    for attempt in range(1, TRIES + 1):
        got = measure()
        measured = list(curves(got))
        if all(c.trusted() for c in measured):
            return got, True
        then = "measuring again..." if attempt < TRIES else "using the last for this run only"
        busiest = max(c.others for c in measured)
        why = (
            f"other processes took {busiest:.0%} of the CPU meanwhile"
            if busiest > BUSY
            else "they contradict themselves (was the machine busy?)"
        )
        print(f"specwise: the costs measured cannot be kept: {why}; {then}", file=sys.stderr)
    return got, False
