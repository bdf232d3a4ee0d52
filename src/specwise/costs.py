"""Measured costs: how long a forward of n tokens takes, per model, and how to keep that current.

`CostCurve` maps tokens-in-one-call to milliseconds (median of repeats after a warm-up) and
is updated from the rounds actually run. `measure_curve` calibrates one; `CostModel` holds the
target's curve, each drafter's cost per proposed token and the per-round overhead; `calibrated`
caches the target's part by model files, backend, threads and machine (one for every set of
drafters), and each drafter's cost by what it runs and the machine. A call that serves several
sequences runs as the backend's passes (`LM.passes`: sequences x tokens each); `CostModel`
prices it as the sum of its passes, a pass of one sequence by the curve and a pass of several
by what such passes were observed to cost (the curve at the pass's total tokens until then).
The numbers feed the controller and the bench; this module decides nothing.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from specwise.backends.base import LM, Reserved
from specwise.machine import machine

if TYPE_CHECKING:
    from specwise.drafters.base import Drafter

__all__ = [
    "CostCurve",
    "CostModel",
    "Pass",
    "cache_key",
    "calibrated",
    "drafter_costs",
    "measure_costs",
    "measure_curve",
    "measure_curves",
    "target_key",
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


def _blend(table: dict, key: object, value: float) -> None:
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
        _blend(self.ms, n, ms)
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


def _key(parts: Sequence[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _target_parts(target: LM) -> list[str]:
    info = target.info
    parts = [machine(), f"{info.backend}:{info.library}:{info.fingerprint}:{info.threads}"]
    return parts + (["exact"] if info.exact else [])


def target_key(target: LM) -> str:
    """Identifies a measurement of the target's calls: machine, target weights, backend and
    its library, threads, exact mode."""
    return _key(_target_parts(target))


def cache_key(target: LM, drafters: Sequence[Drafter]) -> str:
    """`target_key` and the drafters: identifies what is learnt of a set of drafters on a
    target (`controller.memory`)."""
    return _key(_target_parts(target) + sorted(d.fingerprint for d in drafters))


def drafter_costs(drafters: Sequence[Drafter]) -> dict[str, tuple[float, float]]:
    """Each drafter's (ms per proposed token, ms per context token caught up), measured now,
    by fingerprint (drafters that run one thing are measured once)."""
    out: dict[str, tuple[float, float]] = {}
    for d in drafters:
        if d.fingerprint not in out:
            out[d.fingerprint] = d.measure_cost()
    return out


def _with_drafters(
    model: CostModel, drafters: Sequence[Drafter], by_fingerprint: Mapping[str, Sequence[float]]
) -> CostModel:
    model.draft_ms_per_token = {d.name: float(by_fingerprint[d.fingerprint][0]) for d in drafters}
    model.catch_up_ms_per_token = {
        d.name: float(by_fingerprint[d.fingerprint][1]) for d in drafters
    }
    return model


def measure_costs(target: LM, drafters: Sequence[Drafter], max_tokens: int = 16) -> CostModel:
    """Calibrate now: the target's curve for 1..max_tokens tokens, each drafter's ms/token."""
    curve = measure_curve(target, sizes=range(1, max_tokens + 1))
    return _with_drafters(CostModel(curve), drafters, drafter_costs(drafters))


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


def calibrated(target: LM, drafters: Sequence[Drafter]) -> CostModel:
    """This machine's costs for the target and the drafters, from $SPECWISE_HOME/costs, where
    what is missing is measured now and cached. The target's calls are cached once for every
    set of drafters (`target_key`), so every configuration prices them alike; each drafter's
    cost by its fingerprint. A target curve that contradicts itself (`CostCurve.consistent`),
    cached or just measured, is measured again (`until_consistent`); where every try did, the
    last is used for this process only and never cached (the costs of the rounds run correct
    it as they go)."""
    from specwise.models import home, save_json

    folder = home() / "costs"
    path = folder / f"{target_key(target)}.json"
    model = CostModel.load(path)
    if model is None or not model.target.consistent():
        print(
            "specwise: measuring the target's forward costs once for this machine...",
            file=sys.stderr,
        )
        curve, consistent = until_consistent(
            lambda: measure_curve(target, sizes=range(1, 17)), lambda c: [c]
        )
        model = CostModel(curve)
        if consistent:
            model.save(path)
    drafts = folder / f"drafters-{_key([machine()])}.json"
    try:
        known = {k: v for k, v in json.loads(drafts.read_text()).items() if len(v) == 2}
    except (OSError, ValueError, AttributeError, TypeError):
        known = {}
    missing = [d for d in drafters if d.fingerprint not in known]
    if missing:
        known.update(drafter_costs(missing))
        save_json(drafts, known, indent=1)
    return _with_drafters(model, drafters, known)


Pass = tuple[int, int]  # one pass of the target inside a call: (sequences, tokens each)


@dataclass
class CostModel:
    """The costs the controller plans with: target curve, drafter ms per token, overhead, and
    the observed cost of passes over several sequences."""

    target: CostCurve
    draft_ms_per_token: dict[str, float] = field(default_factory=dict)
    overhead_ms: float = 0.5
    catch_up_ms_per_token: dict[str, float] = field(default_factory=dict)
    batched: dict[Pass, float] = field(default_factory=dict)

    def pass_ms(self, seqs: int, tokens: int) -> float:
        """One pass of `seqs` sequences with `tokens` tokens each."""
        if seqs == 1:
            return self.target(tokens)
        return self.batched.get((seqs, tokens)) or self.target(seqs * tokens)

    def call_ms(self, passes: Sequence[Pass]) -> float:
        """One target call that runs as these passes."""
        return sum(self.pass_ms(s, n) for s, n in passes)

    def observe_verify(self, passes: Sequence[Pass], ms: float) -> None:
        """Blend one observed call into the cost of its passes, shared out among them in
        proportion to what each was expected to cost."""
        predicted = [self.pass_ms(s, n) for s, n in passes]
        total = sum(predicted)
        if total <= 0:
            return
        for (s, n), p in zip(passes, predicted, strict=True):
            share = ms * p / total
            if s == 1:
                self.target.observe(n, share)
            else:
                _blend(self.batched, (s, n), share)

    def observe_draft(self, drafter: str, proposed: int, ms: float) -> None:
        if proposed > 0:
            _blend(self.draft_ms_per_token, drafter, ms / proposed)

    def observe_overhead(self, ms: float) -> None:
        self.overhead_ms = (1 - EMA) * self.overhead_ms + EMA * ms

    # -- persistence -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "target": {str(n): v for n, v in self.target.ms.items()},
            "draft_ms_per_token": self.draft_ms_per_token,
            "overhead_ms": self.overhead_ms,
            "catch_up_ms_per_token": self.catch_up_ms_per_token,
            "batched": [[s, n, ms] for (s, n), ms in sorted(self.batched.items())],
        }

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(
            target=CostCurve({int(n): float(v) for n, v in data["target"].items()}),
            draft_ms_per_token={k: float(v) for k, v in data["draft_ms_per_token"].items()},
            overhead_ms=float(data["overhead_ms"]),
            catch_up_ms_per_token={
                k: float(v) for k, v in data.get("catch_up_ms_per_token", {}).items()
            },
            batched={(int(s), int(n)): float(ms) for s, n, ms in data.get("batched", [])},
        )

    def save(self, path: Path) -> None:
        from specwise.models import save_json

        save_json(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: Path) -> CostModel | None:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
