"""Acceptance estimators: what the controller predicts a drafter's tokens are accepted with.

- `Calibration`: a drafter's confidence in a token -> the observed acceptance, by bin, learnt
  online (old outcomes fade), with an optimistic bound for deciding what is worth trying;
- `PlanHitRate`: how many of the accepted tokens a drafter's plans predicted came true;
- `expected_tokens`: E(m) = 1 + Σ_{i<=m} Π_{j<=i} a_j, the tokens a round of m drafted
  tokens emits (of a tree's first m tokens: 1 + Σ_{i<=m} Π_{j on i's path} a_j), and
  `scaled`, E with its accepted part scaled;
- `reached`: which tokens of a draft verification reached, and which of them it accepted.

Records and arithmetic only: no planning (`controller`), no costs (`costs`), no models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "BINS",
    "GLOBAL_EMA",
    "PRIOR_ALPHA",
    "REQUEST_EMA",
    "Calibration",
    "PlanHitRate",
    "expected_tokens",
    "positions",
    "reached",
    "scaled",
]

REQUEST_EMA = 0.3  # weight of one observation in a request's α estimate
GLOBAL_EMA = 0.05  # ... in the drafter's average over requests
PRIOR_ALPHA = 0.4  # α before anything was observed (below break-even on slow verification)
BINS = 10  # confidence calibration bins over [0, 1]
CAL_WINDOW = 200  # outcomes a calibration bin remembers (older ones fade)
UCB_Z = 1.645  # width of the optimistic estimate that decides what is worth probing


@dataclass
class Calibration:
    """Confidence -> acceptance, from observed outcomes. A confidence is only a score until it
    has been calibrated, so every bin starts at the same prior (weight 2)."""

    hits: list[float] = field(default_factory=lambda: [0.0] * BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * BINS)

    @staticmethod
    def _bin(confidence: float) -> int:
        return min(int(confidence * BINS), BINS - 1)

    def predict(self, confidence: float, prior: float = PRIOR_ALPHA) -> float:
        b = self._bin(confidence)
        return (self.hits[b] + 2.0 * prior) / (self.seen[b] + 2.0)

    def optimistic(self, confidence: float) -> float:
        """An upper estimate (Wilson's bound at 95% one-sided), for deciding what is worth
        trying: 1 for an unseen bin, narrowing towards the observed rate as outcomes come in,
        never to it, so nothing learnt locks a drafter out for good."""
        b = self._bin(confidence)
        n = self.seen[b]
        if n <= 0:
            return 1.0
        p, z2 = self.hits[b] / n, UCB_Z**2
        centre = p + z2 / (2 * n)
        spread = UCB_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return min(1.0, (centre + spread) / (1 + z2 / n))

    def observe(self, confidence: float, accepted: bool) -> None:
        b = self._bin(confidence)
        if self.seen[b] >= CAL_WINDOW:  # forget old outcomes: keep a window's worth
            scale = (CAL_WINDOW - 1) / self.seen[b]
            self.hits[b] *= scale
            self.seen[b] *= scale
        self.hits[b] += float(accepted)
        self.seen[b] += 1.0


@dataclass
class PlanHitRate:
    """How far a drafter's planned rounds come true: accepted tokens realised over accepted
    tokens predicted (both exponential averages), never above 1."""

    predicted: float = 0.0
    realised: float = 0.0

    def factor(self) -> float:
        return 1.0 if self.predicted <= 0 else min(1.0, self.realised / self.predicted)

    def observe(self, predicted: float, realised: float) -> None:
        self.predicted += GLOBAL_EMA * (predicted - self.predicted)
        self.realised += GLOBAL_EMA * (realised - self.realised)


def scaled(e: Sequence[float], scale: float) -> list[float]:
    """E with its expected accepted tokens (E - 1) multiplied by scale."""
    return [1.0 + scale * (x - 1.0) for x in e]


def expected_tokens(a: Sequence[float], parents: Sequence[int] | None = None) -> list[float]:
    """E(m) for m = 0..len(a): 1 + Σ_{i<=m} Π_{j<=i} a_j for a chain; for a tree (`parents`,
    -1 for a token that follows the context) the product runs over token i's path, since a
    token is accepted when it and every ancestor are (a_i: given its parent was)."""
    out, run, path = [1.0], 1.0, []  # path[i]: the chance that token i is accepted
    for i, x in enumerate(a):
        q = i - 1 if parents is None else parents[i]
        path.append(x * (path[q] if q >= 0 else 1.0))
        run += path[-1]
        out.append(run)
    return out


def positions(parents: Sequence[int] | None, n: int) -> list[int]:
    """The position of each of a draft's first n tokens: its depth in a tree (0: it follows
    the context; parents[i] = -1), its index in a chain (parents None)."""
    if parents is None:
        return list(range(n))
    depth: list[int] = []
    for q in parents[:n]:
        depth.append(0 if q < 0 else depth[q] + 1)
    return depth


def reached(parents: Sequence[int], path: Sequence[int]) -> list[tuple[int, bool]]:
    """(token, accepted) for every token of a draft that verification reached: the children of
    the context and of each accepted token; accepted: the tokens on the accepted `path`. For a
    chain that accepted m tokens: tokens 0..m, the first m accepted."""
    on = set(path)
    return [(i, i in on) for i, q in enumerate(parents) if q == -1 or q in on]
