"""Measured costs: what the controller plans with, per target and drafters, and how to keep
that current.

`CostModel` holds the target's cost curve (`backends.curves.CostCurve`: milliseconds of a
forward of n tokens, measured and updated from the rounds actually run), each drafter's cost
per proposed token and the per-round overhead; `calibrated` caches the target's part by model
files, backend, threads and machine (one for every set of drafters), and each drafter's cost
by what it runs and the machine. A call that serves several sequences runs as the backend's
passes (`LM.passes`: sequences x tokens each); `CostModel` prices it as the sum of its passes,
a pass of one sequence by the curve and a pass of several by what such passes were observed to
cost (the curve at the pass's total tokens until then). The numbers feed the controller and
the bench; this module decides nothing.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specwise.backends.base import LM
from specwise.backends.curves import EMA, CostCurve, blend, measure_curve, until_trusted
from specwise.machine import machine

if TYPE_CHECKING:
    from specwise.drafters.base import Drafter

__all__ = [
    "CostModel",
    "Pass",
    "cache_key",
    "calibrated",
    "drafter_costs",
    "measure_costs",
    "target_key",
]


def _key(parts: Sequence[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _target_parts(target: LM) -> list[str]:
    info = target.info
    parts = [machine(), f"{info.backend}:{info.library}:{info.fingerprint}:{info.threads}"]
    return parts + (["exact"] if info.exact else [])


# How the target's calls are measured; costs cached by another method are measured again
# (2: a curve is kept only where other processes took little of the CPU, `CostCurve.calm`).
METHOD = 2


def target_key(target: LM) -> str:
    """Identifies a measurement of the target's calls: machine, target weights, backend and
    its library, threads, exact mode and METHOD."""
    return _key([*_target_parts(target), f"method {METHOD}"])


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


def calibrated(target: LM, drafters: Sequence[Drafter]) -> CostModel:
    """This machine's costs for the target and the drafters, from $SPECWISE_HOME/costs, where
    what is missing is measured now and cached. The target's calls are cached once for every
    set of drafters (`target_key`), so every configuration prices them alike; each drafter's
    cost by its fingerprint. A target curve measured while something else had the CPU (not
    `CostCurve.trusted`), cached or just measured, is measured again (`until_trusted`); where
    every try was, the last is used for this process only and never cached (the costs of the
    rounds run correct it as they go)."""
    from specwise.models import home, save_json

    folder = home() / "costs"
    path = folder / f"{target_key(target)}.json"
    model = CostModel.load(path)
    if model is None or not model.target.trusted():
        print(
            "specwise: measuring the target's forward costs once for this machine...",
            file=sys.stderr,
        )
        curve, trusted = until_trusted(
            lambda: measure_curve(target, sizes=range(1, 17)), lambda c: [c]
        )
        model = CostModel(curve)
        if trusted:
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
    """The costs the controller plans with: target curve, drafter ms per token, overhead, the
    observed cost of passes over several sequences, and what a cheap drafter's offer costs in
    the engine beyond its ms per token times the tokens asked (`offer_ms`: learnt from the
    offers made, `observe_offer`; a layer's read, and its weights fetched again after each
    target call, which its own measurement, run alone, does not see)."""

    target: CostCurve
    draft_ms_per_token: dict[str, float] = field(default_factory=dict)
    overhead_ms: float = 0.5
    catch_up_ms_per_token: dict[str, float] = field(default_factory=dict)
    batched: dict[Pass, float] = field(default_factory=dict)
    offer_ms: dict[str, float] = field(default_factory=dict)

    def offer_cost(self, drafter: str, tokens: int) -> float:
        """Milliseconds of an offer of `tokens` from the cheap drafter `drafter`."""
        return self.draft_ms_per_token.get(drafter, 0.0) * tokens + self.offer_ms.get(drafter, 0.0)

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
                blend(self.batched, (s, n), share)

    def observe_draft(self, drafter: str, proposed: int, ms: float) -> None:
        if proposed > 0:
            blend(self.draft_ms_per_token, drafter, ms / proposed)

    def observe_overhead(self, ms: float) -> None:
        self.overhead_ms = (1 - EMA) * self.overhead_ms + EMA * ms

    def observe_offer(self, drafter: str, tokens: int, ms: float) -> None:
        """Blend one offer's time (`tokens` asked, `ms` taken) into the drafter's `offer_ms`."""
        extra = ms - self.draft_ms_per_token.get(drafter, 0.0) * tokens
        blend(self.offer_ms, drafter, max(0.0, extra))

    # -- persistence -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "target": {str(n): v for n, v in self.target.ms.items()},
            "draft_ms_per_token": self.draft_ms_per_token,
            "overhead_ms": self.overhead_ms,
            "catch_up_ms_per_token": self.catch_up_ms_per_token,
            "batched": [[s, n, ms] for (s, n), ms in sorted(self.batched.items())],
            "offer_ms": self.offer_ms,
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
            offer_ms={k: float(v) for k, v in data.get("offer_ms", {}).items()},
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
