"""Lossy acceptance rules: they accept more draft tokens than the exact rules of `verify`, and in
exchange their output is NOT the target's distribution. Each is named, says below exactly which
distribution it produces, and is flagged wherever its output goes (the round's and the request's
`acceptance`, the CLI summary, the API response); none is ever counted in an exact figure.

For one position whose draft token is x and whose target distribution (warped by the request's
sampling parameters, `sampling.warp`) is p, a rule decides `keep(p, x)`. A kept x is emitted and
the next position is looked at; at the first position not kept, the emitted token y is drawn
from p with x removed, p(y)·[y ≠ x] / (1 − p(x)); after a fully kept draft the bonus is drawn
from p. So the token emitted at a draft position is distributed as

    x with probability 1                       when keep(p, x),
    p(y)·[y ≠ x] / (1 − p(x)) for y ≠ x        otherwise

(the exact rule, `verify.rejection_sample`, keeps x with probability min(1, p(x)/q(x)) and
draws from norm(max(p − q, 0)), which makes it exactly p). The rules ignore q; they need only
the draft's tokens. They are defined for sampled requests (temperature > 0): at temperature 0
p is one-hot and the exact greedy rule already keeps every draft token it can.

- `typical` (Medusa's typical acceptance, Cai et al. 2024): keep x when
  p(x) ≥ min(ε, δ·exp(−H(p))), H the entropy of p; ε = 0.09, δ = 0.3 (Medusa's defaults). A
  flat p (high entropy) lowers the bar: plausible tokens are kept where any of many would do.
- `top-N` (N ≥ 1, e.g. `top-3`): keep x when p(x) > 0 and x is among the N most likely tokens
  of p (ties at the N-th probability included).

Pure functions of arrays and a `Sampler`, like `verify`; tests enumerate every random outcome.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from specwise.verify import Verdict, residual

__all__ = ["EXACT", "RULES", "check_rule", "keep_rule", "lossy_sample", "top_n", "typical"]

EXACT = "exact"
RULES = ("typical", "top-N")  # names a request may ask for besides "exact" (N an integer >= 1)
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3
_TOP = re.compile(r"top-([1-9][0-9]{0,3})")


def typical(p: np.ndarray, x: int) -> bool:
    """Medusa's typical acceptance: p(x) >= min(ε, δ·exp(−H(p)))."""
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum())
    return float(p[x]) >= min(TYPICAL_EPSILON, TYPICAL_DELTA * np.exp(-entropy))


def top_n(n: int) -> Callable[[np.ndarray, int], bool]:
    """keep(p, x): x has p(x) > 0 and is among p's n most likely tokens (ties included)."""

    def keep(p: np.ndarray, x: int) -> bool:
        if p[x] <= 0:
            return False
        nth = np.partition(p, -n)[-n] if n < len(p) else 0.0
        return bool(p[x] >= nth)

    return keep


def check_rule(name: str) -> str:
    """The rule's name if a request may ask for it; ValueError in one sentence otherwise."""
    if name == EXACT or name == "typical" or _TOP.fullmatch(name):
        return name
    raise ValueError(
        f"acceptance {name!r} is not a rule; use exact (the target's distribution), typical or "
        f"top-N with N >= 1 (lossy: their output is not the target's distribution)"
    )


def keep_rule(name: str) -> Callable[[np.ndarray, int], bool]:
    """The keep(p, x) test of a lossy rule by name."""
    if name == "typical":
        return typical
    m = _TOP.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a lossy rule (typical, top-N)")
    return top_n(int(m.group(1)))


def lossy_sample(
    draft: Sequence[int], p, sampler, keep: Callable[[np.ndarray, int], bool]
) -> Verdict:
    """draft [k], p [k+1, V] (an array or `sampling.LazyRows`): keep the longest prefix that
    `keep` accepts, then draw the next token from p without the first token not kept (or the
    bonus from p after the whole draft)."""
    k = len(draft)
    for i in range(k):
        x = int(draft[i])
        if keep(p[i], x):
            continue
        return Verdict(
            i, [*map(int, draft[:i]), sampler.categorical(residual(p[i], None, x))], False
        )
    return Verdict(k, [*map(int, draft), sampler.categorical(p[k])], bonus=True)
