"""`Estimates`: what the controller knows of each drafter, and how it learns it.

Per drafter: α by position (the conditional acceptance of each draft position) across requests
and per running request, a calibration of the drafter's own confidences (confidence bin ->
observed acceptance) for a draft's first token and one for the tokens after it, how far its
plans came true (`PlanHitRate`), and per request the rounds since it was last used and between
probes. Where a_i comes from:
- the drafter's own confidence in a token (a model drafter's probability, an n-gram drafter's
  match length), where it gives one: mapped through the calibration of the token's place and
  scaled by the square root of how this request's α there compares with the average
  request's. A first token and a later one, given the one before it was accepted, are
  accepted at different rates for the same confidence (a copy that started right goes on
  right), so they are calibrated apart; and the confidence already says part of how this
  request is going, so the request's own ratio counts at half its strength (over the bench's
  answers, `specwise bench replay`, the full ratio over one calibration had the copiers' plans
  expect 2.68 accepted tokens a round and get 2.40, their first token 0.83 against 0.71;
  with no ratio the suffix drafter, whose copies run longer, was hardly ever chosen);
- otherwise, per request, an exponential average of the observed α_i by position, started
  from the drafter's average over earlier requests, so a request that changes character
  (copying code, then writing prose) is followed within a few rounds.
A tree draft's token is estimated at its depth, given its parent; a depth no draft has reached
reads as the deepest one reached. The calibrations learn from the tokens verified and from
those of the offer a draft was cut from that the target's next token judges (`observe`), so
a drafter planned one token at a time learns how its later tokens fare (over the bench's
answers the eagle layer's planned rounds went from 0.89 to 1.70 accepted tokens). What is
learnt across requests is `state()` (JSON-able) and comes back with `load_state`; the files are
the controller's (`Controller.remember`). The arithmetic is `specwise.acceptance`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specwise.acceptance import (
    BINS,
    GLOBAL_EMA,
    PRIOR_ALPHA,
    REQUEST_EMA,
    Calibration,
    PlanHitRate,
    positions,
    reached,
)
from specwise.drafters.base import Draft

__all__ = ["DrafterState", "Estimates"]


@dataclass
class DrafterState:
    """One drafter's acceptance estimates (across requests, and per running request) and its
    per-request probe bookkeeping."""

    alpha: list[float] = field(default_factory=list)  # across requests, by position
    first: Calibration = field(default_factory=Calibration)  # of a draft's first tokens
    later: Calibration = field(default_factory=Calibration)  # ... of the tokens after them
    requests: dict[str, list[float]] = field(default_factory=dict)  # id -> α by position
    idle: dict[str, int] = field(default_factory=dict)  # id -> rounds since last used
    gap: dict[str, int] = field(default_factory=dict)  # id -> rounds between probes
    hit_rate: PlanHitRate = field(default_factory=PlanHitRate)
    planned: dict[str, list[float]] = field(default_factory=dict)  # id -> E(0..m) of its plan

    def global_alpha(self, i: int) -> float:
        """α at draft position i across requests: where no draft has reached i yet, the
        deepest position's seen (a draft that started right tends to go on right; a prior
        below it would keep a drafter planned one token at a time from ever drafting
        deeper, so never learning how deeper tokens fare); PRIOR_ALPHA before anything."""
        return self.alpha[min(i, len(self.alpha) - 1)] if self.alpha else PRIOR_ALPHA

    def calibration(self, i: int) -> Calibration:
        """The calibration of draft position (depth) i."""
        return self.first if i == 0 else self.later

    def calibrated(self, confidence: float, i: int, request_alpha: float) -> float:
        """Acceptance of a token at draft position (depth) i with this confidence, in a request
        whose α at i is request_alpha: its place's calibration (a later token's bin starts from
        what a first token's says, so a drafter that has drafted no more than one token so far
        is not held to one by its later tokens' prior), scaled by the square root of the
        request's α over the average request's."""
        first = self.first.predict(confidence, self.global_alpha(0))
        base = first if i == 0 else self.later.predict(confidence, first)
        return min(0.99, base * math.sqrt(request_alpha / max(self.global_alpha(i), 0.05)))

    def request_alpha(self, rid: str, n: int) -> list[float]:
        a = self.requests.setdefault(rid, [])
        while len(a) < n:
            a.append(self.global_alpha(len(a)))
        return a[:n]


class Estimates:
    """Estimates(names): a `DrafterState` for each drafter name."""

    def __init__(self, names: Sequence[str]) -> None:
        self._by_name = {name: DrafterState() for name in names}

    def __getitem__(self, name: str) -> DrafterState:
        return self._by_name[name]

    def acceptances(
        self,
        name: str,
        rid: str,
        n: int,
        offer: Sequence[float | None] | None,
        parents: Sequence[int] | None = None,
    ) -> list[float]:
        """Predicted acceptance of draft tokens 0..n-1 for request rid (of a tree's: given
        their parent's): its α at their position (a tree token's: its depth), informed by the
        offer's own confidences where there are any (calibrated)."""
        st = self._by_name[name]
        depth = positions(parents, n)
        a = st.request_alpha(rid, max(depth, default=-1) + 1)
        if offer is None:
            return [a[i] for i in depth]
        return [
            a[i] if c is None else st.calibrated(c, i, a[i])
            for i, c in zip(depth, offer, strict=False)
        ]

    def observe(
        self,
        rid: str,
        drafter: str,
        draft: Draft,
        accepted: int,
        path: Sequence[int] = (),
        offer: Draft | None = None,
        target_token: int | None = None,
    ) -> None:
        """Learn from one verified round of `drafter`: which draft positions were reached and
        accepted (path: a tree draft's accepted tokens, root first). α by position learns
        whether anything was accepted at each depth reached; the calibration, from every token
        reached (in a tree, the siblings of the accepted tokens too) and from the tokens of
        the `offer` the draft was cut from (a point mass) that were left out of the draft
        where they follow its last accepted token, and no drafted token does: the target's
        own next token there (`target_token`) says whether each would have been accepted (at
        temperature 0 exactly, above it as often: a point mass on x is accepted with the
        target's probability of x, the chance it samples x); the plan hit rate, from a
        planned round (not a probe). So the tokens past the plan are learnt as well, and a
        drafter planned one token at a time still learns how its later ones fare."""
        st = self._by_name[drafter]
        e = st.planned.pop(rid, None)
        if e is not None:
            st.hit_rate.observe(e[min(len(draft.tokens), len(e) - 1)] - 1.0, float(accepted))
        shape = draft.shape()
        seen = reached(shape, path if draft.parents is not None else range(accepted))
        depth = positions(shape, len(shape))
        reqa = st.requests.setdefault(rid, [])
        st.request_alpha(rid, max(depth) + 1)  # grows reqa to the draft's depth
        for i in sorted({depth[j] for j, _ in seen}):
            ok = float(i < accepted)
            reqa[i] = (1 - REQUEST_EMA) * reqa[i] + REQUEST_EMA * ok
            while len(st.alpha) <= i:
                st.alpha.append(st.global_alpha(i))
            st.alpha[i] = (1 - GLOBAL_EMA) * st.alpha[i] + GLOBAL_EMA * ok
        if draft.confidence is not None:
            for j, ok in seen:
                st.calibration(depth[j]).observe(draft.confidence[j], ok)
        if offer is not None and target_token is not None:
            last = (path[-1] if path else -1) if draft.parents is not None else accepted - 1
            _left_out(st, offer, len(draft.tokens), last, target_token)

    def forget(self, rid: str) -> None:
        """Drop a finished request's estimates (the averages over requests stay)."""
        for st in self._by_name.values():
            st.requests.pop(rid, None)
            st.idle.pop(rid, None)
            st.gap.pop(rid, None)
            st.planned.pop(rid, None)

    def state(self) -> dict:
        """What was learnt across requests, as JSON-able data."""
        return {
            name: {
                "alpha": st.alpha,
                "calibrations": [[c.hits, c.seen] for c in (st.first, st.later)],
                "plan_hit_rate": [st.hit_rate.predicted, st.hit_rate.realised],
            }
            for name, st in self._by_name.items()
        }

    def load_state(self, data: dict) -> None:
        """Take back what `state` gave (entries of another shape are ignored)."""
        for name, st in self._by_name.items():
            d = data.get(name) or {}
            cals = d.get("calibrations", ())
            if len(cals) == 2 and all(len(x) == 2 and len(x[0]) == len(x[1]) == BINS for x in cals):
                st.alpha = [float(x) for x in d["alpha"]]
                st.first, st.later = (
                    Calibration([float(x) for x in h], [float(x) for x in n]) for h, n in cals
                )
                if len(d.get("plan_hit_rate", ())) == 2:
                    st.hit_rate = PlanHitRate(*(float(x) for x in d["plan_hit_rate"]))


def _left_out(st: DrafterState, offer: Draft, n: int, last: int, target_token: int) -> None:
    """Calibrate the tokens of `offer` past its first n (the draft) whose parent is the draft's
    last accepted token (`last`; -1: none was), where the draft holds no child of it: each was
    reached, and would have been accepted were it the target's own next token."""
    shape = offer.shape()
    if offer.confidence is None or offer.probs is not None or last in shape[:n]:
        return
    depth = positions(shape, len(shape))
    for j in range(n, len(shape)):
        if shape[j] == last:
            st.calibration(depth[j]).observe(offer.confidence[j], offer.tokens[j] == target_token)
