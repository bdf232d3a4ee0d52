"""`Controller`: each round, per request, the drafter and proposal length with the best expected
goodput (emitted tokens per ms), and k = 0 — plain decoding — when nothing beats it.

The decision (names as in DESIGN.md §4): with a_i the predicted conditional acceptance of draft
position i, a request proposing m tokens emits E(m) = 1 + Σ_{i<=m} Π_{j<=i} a_j tokens. A round
is one target call shared by the batch, so the controller maximises the batch's goodput

    G(m) = (E_others + E(m)) / (D_others + d·m + V(L_others + [1 + m]) + overhead)

where d is the drafter's measured ms per token, V(L) the measured time of a target call with
the token counts L by sequence, and the *_others terms are what the rest of the batch already
put in the call (for a single request they are 0, and V(1 + m) is the cost curve). V prices a
call as the passes the backend runs it in (`LM.passes`). Plain decoding is m = 0. As the batch
grows, the extra verify tokens cost more than they return, so speculation backs off by itself.
In a batch a wrong estimate costs every sequence in the call, so there the controller also (a)
does not probe, and (b) scales a drafter's expected accepted tokens by how many of the tokens it
predicted were accepted in the rounds run so far (`PlanHitRate`, in `acceptance`; why:
BENCHMARKS.md §4).

On llama.cpp a sequence with more tokens than the rest of its call costs a pass of its own,
and such a pass beside a batch costs more than the same tokens alone. So a request planned on
its own in a batch drafts only what joins the passes the batch runs anyway
(`_sharing`): beside plain sequences, nothing. But a call in which every sequence brings
the same number of tokens is one pass, which costs far less (BENCHMARKS.md §4). So after
the requests are planned, `align` weighs the batch as a whole: every sequence brings 1 + L
tokens, its cheap drafter's offer up to L and filler after it (fed, never verified), with L the length of best expected
goodput for the batch; taken when that beats the plans made one by one, and plain decoding by
MARGIN.

Where a_i comes from:
- per request and drafter, an exponential average of the observed α_i by position, started
  from the drafter's average over earlier requests, so a request that changes character
  (copying code, then writing prose) is followed within a few rounds;
- the drafter's own confidence in each token (a model drafter's probability, an n-gram
  drafter's match length), mapped through a calibration table (confidence bin -> observed
  acceptance) learnt online, and scaled by how this request compares with the average one.
  A model drafter stops mid-round as soon as no longer draft is worth its cost: it goes on
  while, for some m > i, E(m) − E(i) > G·(C(m) − C(i)), with G the goodput planned.

Estimates are noisy, so speculation must beat plain decoding by MARGIN to be chosen.

Planning has a cost of its own (the cheap drafters' proposals, the plans, the alignment), and
in a batch where nothing can pay it is the controller's whole cost. So at a batch size where no
draft has paid for PLAN_PATIENCE planned steps, planning backs off to every few steps
(`planned`, `unplanned`); the first draft that pays brings it back to every step.

Cheap drafters (n-gram) propose before the decision, and the controller takes the best prefix.
A model drafter that has fallen behind the context (it is prefilled only once chosen) must
first catch up; that one-time cost is spread over the tokens the request has left, so it is
chosen only when it can pay the catch-up back. When plain wins, each drafter is still probed
now and then (with doubling gaps while probes keep losing) so a request that becomes
predictable is noticed. A cheap drafter is probed only with an offer that would pay on an
average request by an optimistic reading of its calibration (an upper confidence bound, which
every bin keeps because old outcomes fade), at the shortest length that reading says pays:
probing every weak match costs more than it finds where verification is dear. A model
drafter is probed with 2 tokens, and only when catching up costs no more than one plain
round. This module runs no model; the engine calls `plan` before and `observe` after each
round.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from specwise.acceptance import (
    BINS,
    GLOBAL_EMA,
    PRIOR_ALPHA,
    REQUEST_EMA,
    Calibration,
    PlanHitRate,
    expected_tokens,
    positions,
    reached,
    scaled,
)
from specwise.backends.base import LM
from specwise.costs import CostModel, Pass
from specwise.drafters.base import Draft, Drafter, KeepGoing

__all__ = ["Alignment", "Batch", "Controller", "Offered", "Plan"]

log = logging.getLogger(__name__)

MARGIN = 1.05  # speculate only when expected goodput beats plain decoding's by this factor
PROBE_FIRST, PROBE_MAX = 8, 64  # rounds between probes of a drafter that plain beats
PLAN_PATIENCE = 100  # planned steps of a batch size without a draft that paid, before backing off
PLAN_GAP_MAX = 8  # the most steps between planned ones where planning backs off


@dataclass(frozen=True)
class Batch:
    """What the rest of the batch already put into this round's target call, and the sequence
    of the request being planned."""

    calls: tuple[tuple[int, int], ...] = ()  # (seq, tokens) of each of the other sequences
    expected: float = 0.0  # tokens those requests are expected to emit
    draft_ms: float = 0.0
    seq: int = 0


@dataclass(frozen=True)
class Plan:
    """The controller's choice for one request and round."""

    drafter: Drafter | None  # None: plain decoding
    k_max: int  # the most tokens to draft (a model drafter may stop earlier)
    planned: int  # the length the plan expects to be best
    expected_goodput: float  # tokens/ms of the round (the whole batch) as planned
    plain_goodput: float  # ... had this request decoded plainly
    expected_tokens: float = 1.0  # E(m) for this request
    draft_ms: float = 0.0  # predicted drafting time
    keep_going: KeepGoing | None = None
    probe: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Offered:
    """A request as the batch's joint plan (`Controller.align`) sees it."""

    rid: str
    seq: int
    room: int  # the most draft tokens (and filler) this round may hold
    offers: dict[str, Sequence[float | None]]  # cheap drafter -> confidence of each token
    plan: Plan | None  # its own plan (None: k was fixed)
    only: str | None = None
    trees: dict[str, Sequence[int] | None] = field(default_factory=dict)  # offer -> parents


@dataclass(frozen=True)
class Alignment:
    """A joint plan: every sequence brings 1 + length tokens, drafts[i] = (drafter or None,
    draft tokens, expected tokens) of request i, the rest of its tokens filler."""

    length: int
    drafts: tuple[tuple[str | None, int, float], ...]
    expected_goodput: float
    plain_goodput: float
    reason: str


@dataclass
class _DrafterState:
    """One drafter's acceptance estimates: across requests, and per running request."""

    alpha: list[float] = field(default_factory=list)  # across requests, by position
    calibration: Calibration = field(default_factory=Calibration)
    requests: dict[str, list[float]] = field(default_factory=dict)  # id -> α by position
    idle: dict[str, int] = field(default_factory=dict)  # id -> rounds since last used
    gap: dict[str, int] = field(default_factory=dict)  # id -> rounds between probes
    hit_rate: PlanHitRate = field(default_factory=PlanHitRate)
    planned: dict[str, list[float]] = field(default_factory=dict)  # id -> E(0..m) of its plan

    def global_alpha(self, i: int) -> float:
        return self.alpha[i] if i < len(self.alpha) else PRIOR_ALPHA

    def calibrated(self, confidence: float, i: int, request_alpha: float) -> float:
        """Acceptance of draft position i: the calibrated confidence, scaled by how this
        request's α at i compares with the average request's."""
        base = self.calibration.predict(confidence, self.global_alpha(0))
        return min(0.99, base * request_alpha / max(self.global_alpha(i), 0.05))

    def request_alpha(self, rid: str, n: int) -> list[float]:
        a = self.requests.setdefault(rid, [])
        while len(a) < n:
            a.append(self.global_alpha(len(a)))
        return a[:n]


@dataclass
class _Planning:
    """Whether planning pays in batches of one size: planned steps since a draft last paid,
    and the gap between planned steps."""

    since: int = 0
    gap: int = 1
    wait: int = 0  # steps left before the next planned one


def _one_pass(calls: Sequence[tuple[int, int]]) -> list[Pass]:
    return [(1, sum(n for _, n in calls))]


class Controller:
    """Controller(drafters, costs, max_k): plans rounds and learns from them."""

    def __init__(self, drafters: Sequence[Drafter], costs: CostModel, max_k: int = 8) -> None:
        self.drafters = list(drafters)
        self.costs = costs
        self.max_k = max_k
        self._state = {d.name: _DrafterState() for d in self.drafters}
        self._memory: Path | None = None
        self._passes: Callable[[tuple[tuple[int, int], ...]], Sequence[Pass]] = _one_pass
        self._planning: dict[int, _Planning] = {}  # by batch size

    def bind(self, target: LM) -> None:
        """Price target calls the way `target` runs them (until bound: one pass of all tokens).
        A call's passes depend only on its shape, and a server's steps repeat a few shapes, so
        they are remembered."""
        self._passes = functools.lru_cache(maxsize=4096)(lambda calls: tuple(target.passes(calls)))

    def _step_ms(self, calls: tuple[tuple[int, int], ...], draft_ms: float) -> float:
        """A round whose target call holds `calls` ((seq, tokens) each), after draft_ms of
        drafting."""
        return draft_ms + self.costs.call_ms(self._passes(calls)) + self.costs.overhead_ms

    def _round_ms(self, name: str | None, m: int, batch: Batch) -> float:
        d = self.costs.draft_ms_per_token.get(name, 0.0) * m if name else 0.0
        return self._step_ms((*batch.calls, (batch.seq, 1 + m)), batch.draft_ms + d)

    def plan(
        self,
        rid: str,
        room: int,
        batch: Batch = Batch(),
        offers: dict[str, Sequence[float | None]] | None = None,
        lags: dict[str, int] | None = None,
        remaining: int = 1 << 30,
        only: str | None = None,
        trees: dict[str, Sequence[int] | None] | None = None,
    ) -> Plan:
        """Choose for request `rid`. room: the most draft tokens this round may hold; offers:
        for each cheap drafter, the confidence of each token it has on offer (None where it
        has none); lags: context tokens each drafter
        must catch up on first; remaining: tokens the request may still emit; only: consider
        just this drafter; trees: the parents of each offer that is a tree (a parent before
        its children: a plan takes a prefix of the offer, which is a tree too)."""
        offers, lags, trees = offers or {}, lags or {}, trees or {}
        plain_ms = self._round_ms(None, 0, batch)
        plain_g = (batch.expected + 1.0) / plain_ms
        best = Plan(None, 0, 0, plain_g, plain_g, reason="plain decoding is expected fastest")
        passed_over: list[tuple[Drafter, int]] = []
        predicted: list[float] = []  # E(0..) of the best plan, before any scaling
        for d in self.drafters:
            cap = min(room, len(offers.get(d.name, ())) if d.cheap else self.max_k)
            if cap <= 0 or (only is not None and d.name != only):
                continue
            lengths = self._sharing(batch, cap)
            if lengths == [0]:
                continue  # beside this batch any draft is a pass of its own
            catch_up = lags.get(d.name, 0) * self.costs.catch_up_ms_per_token.get(d.name, 0.0)
            st = self._state[d.name]
            shape = trees.get(d.name) if d.cheap else None  # its first `cap` tokens are used
            a = self._acceptances(d.name, rid, cap, offers.get(d.name) if d.cheap else None, shape)
            scale = st.hit_rate.factor() if batch.calls else 1.0
            m, g, e = self._best_length(
                d.name, a, batch, catch_up / max(remaining, 1), scale, lengths, shape
            )
            if m > 0 and g[m] > max(best.expected_goodput, MARGIN * plain_g):
                dms = self.costs.draft_ms_per_token.get(d.name, 0.0) * m + catch_up
                reason = f"{d.name} m={m}: {g[m]:.4f} > plain {plain_g:.4f} tokens/ms"
                k = m if d.cheap or batch.calls else cap  # a longer draft could need a pass
                best = Plan(d, k, m, g[m], plain_g, e[m], dms, reason=reason)
                predicted = expected_tokens(a, shape)
            elif batch.calls:  # no probes in a batch: see the module docstring
                continue
            elif d.cheap:
                probe_m = self._worth_probing(d, offers[d.name][:cap], batch, shape)
                if probe_m:
                    passed_over.append((d, probe_m))
            elif catch_up <= plain_ms:
                passed_over.append((d, min(cap, 2)))
        if best.drafter is None:
            best = self._probe(rid, passed_over, plain_g) or best
        for d in self.drafters:
            st = self._state[d.name]
            st.idle[rid] = 0 if d is best.drafter else st.idle.get(rid, 0) + 1
            st.planned.pop(rid, None)
            if d is best.drafter and not best.probe:
                st.gap[rid] = PROBE_FIRST
                st.planned[rid] = predicted
        if best.drafter is not None and not best.drafter.cheap:
            stop = self._stopper(best.drafter.name, rid, best.expected_goodput, best.k_max, batch)
            best = replace(best, keep_going=stop)
        return best

    def unplanned(self, calls: Sequence[tuple[int, int]]) -> Plan | None:
        """None: plan this step of a batch, whose sequences bring (seq, 1) each. Otherwise
        planning backs off at this batch size (`planned`), and this is the plan of every request
        in the step: plain decoding, with no drafter asked and nothing planned."""
        p = self._planning.get(len(calls))
        if p is None or not p.wait:
            return None
        p.wait -= 1
        g = len(calls) / self._step_ms(tuple(calls), 0.0)
        reason = (
            f"plain: in batches of {len(calls)}, no draft paid in the last {p.since} planned "
            f"steps; planning every {p.gap}"
        )
        return Plan(None, 0, 0, g, g, reason=reason)

    def planned(
        self, calls: Sequence[tuple[int, int]], tokens: int, planning_ms: float, verify_ms: float
    ) -> None:
        """Learn from a planned step of a batch whether planning pays at its size. calls: (seq,
        tokens fed) of each sequence; tokens: how many verification gave out. A step paid when
        it drafted and the plain steps its tokens would have taken (as the cost model prices
        them) cost more than its planning and target call. After PLAN_PATIENCE planned steps
        in a row with none that paid, only every gap-th step is planned, the gap doubling up to
        PLAN_GAP_MAX; a step that pays plans every step again. In batches, planning is the
        controller's whole cost where nothing can pay: measured in the server, 0.43 ms a step
        of 4 (0.3% of it), in which `auto` never drafted (BENCHMARKS.md §4)."""
        if len(calls) < 2:
            return
        p = self._planning.setdefault(len(calls), _Planning())
        paid = False
        if any(n > 1 for _, n in calls):
            plain = self.costs.call_ms(self._passes(tuple((s, 1) for s, _ in calls)))
            paid = tokens * plain / len(calls) > planning_ms + verify_ms
        p.since = 0 if paid else p.since + 1
        p.gap = 1 if p.since < PLAN_PATIENCE else min(2 * p.gap, PLAN_GAP_MAX)
        p.wait = p.gap - 1

    def _acceptances(
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
        st = self._state[name]
        depth = positions(parents, n)
        a = st.request_alpha(rid, max(depth, default=-1) + 1)
        if offer is None:
            return [a[i] for i in depth]
        return [
            a[i] if c is None else st.calibrated(c, i, a[i])
            for i, c in zip(depth, offer, strict=False)
        ]

    def align(
        self, requests: Sequence[Offered], calls: Sequence[tuple[int, int]], draft_ms: float
    ) -> Alignment | None:
        """A joint plan for a batch whose requests were planned one by one (into `calls`, the
        (seq, tokens) each put in the call, with their Plans), or None to keep those plans.

        One sequence with more tokens than the rest costs a pass of its own (`LM.passes`), but
        every sequence bringing the same number of tokens is one pass: on llama.cpp, 8
        sequences x 2 tokens cost 1.49x a plain step, and 2 x 2 cost 1.15x. So here every
        request brings 1 + L tokens: its cheap drafter's offer up to L, the rest filler that the
        engine feeds but never verifies. L is the length with the best expected goodput of the
        whole batch; the alignment is taken when that beats the plans made one by one and
        plain decoding by MARGIN."""
        if len(requests) < 2 or any(
            o.plan is None or (o.plan.drafter is not None and not o.plan.drafter.cheap)
            for o in requests
        ):
            return None
        longest = min(o.room for o in requests)
        offered, steps = self._aligned_steps(requests, longest, draft_ms)  # steps[0]: plain
        now = sum(o.plan.expected_tokens if o.plan.drafter else 1.0 for o in requests)
        plain = len(requests) / steps[0]
        bar = max(now / self._step_ms(tuple(calls), draft_ms), MARGIN * plain)
        if self._ceiling(requests, offered, steps) <= bar * (1 - 1e-9):  # rounding slack
            return None  # mostly so: then no acceptance needs working out
        # per request and cheap drafter: E(0..) of its offer, as predicted (raw) and as
        # trusted in a batch (scaled by how far its plans came true)
        raw: list[dict[str, list[float]]] = []
        expect: list[dict[str, list[float]]] = []
        for o in requests:
            raw.append({})
            expect.append({})
            for d in self.drafters:
                offer = o.offers.get(d.name, ())[:longest]
                if d.cheap and offer and o.only in (None, d.name):
                    shape = o.trees.get(d.name)
                    a = self._acceptances(d.name, o.rid, len(offer), offer, shape)
                    e = expected_tokens(a, shape)
                    raw[-1][d.name] = e
                    expect[-1][d.name] = scaled(e, self._state[d.name].hit_rate.factor())
        best: Alignment | None = None
        for n in range(1, max((len(e) - 1 for p in expect for e in p.values()), default=0) + 1):
            picks = [
                max(
                    ((name, min(n, len(e) - 1), e[min(n, len(e) - 1)]) for name, e in p.items()),
                    key=lambda x: x[2],
                    default=(None, 0, 1.0),
                )
                for p in expect
            ]
            g = sum(x[2] for x in picks) / steps[n]
            if g > (bar if best is None else best.expected_goodput):
                reason = f"aligned: {len(requests)} x {1 + n} tokens, {g:.4f} > {bar:.4f} tokens/ms"
                best = Alignment(n, tuple(picks), g, plain, reason)
        if best is not None:
            for o, r, (name, m, _) in zip(requests, raw, best.drafts, strict=True):
                for d in self.drafters:
                    st = self._state[d.name]
                    st.planned.pop(o.rid, None)
                    if d.name == name and m:
                        st.idle[o.rid] = 0
                        st.planned[o.rid] = r[name][: m + 1]
        return best

    def _aligned_steps(
        self, requests: Sequence[Offered], longest: int, draft_ms: float
    ) -> tuple[list[int], list[float]]:
        """For `align`: the most tokens each request has on offer (up to `longest`), and the ms
        of a round in which every sequence brings 1 + n tokens, for n = 0 .. the most offered."""
        cheap = [d for d in self.drafters if d.cheap]
        offered = [
            max(
                (
                    len(o.offers.get(d.name, ())[:longest])
                    for d in cheap
                    if o.only in (None, d.name)
                ),
                default=0,
            )
            for o in requests
        ]
        steps = [
            self._step_ms(tuple((o.seq, 1 + n) for o in requests), draft_ms)
            for n in range(max(offered, default=0) + 1)
        ]
        return offered, steps

    def _ceiling(
        self, requests: Sequence[Offered], offered: list[int], steps: list[float]
    ) -> float:
        """An upper bound on the goodput of any alignment of `requests` (`align`): every offered
        token accepted, as far as the drafters' plans have come true in batches."""
        trust = max(
            (self._state[d.name].hit_rate.factor() for d in self.drafters if d.cheap), default=0.0
        )
        return max(
            (
                (len(requests) + trust * sum(min(n, x) for x in offered)) / steps[n]
                for n in range(1, len(steps))
            ),
            default=0.0,
        )

    def _best_length(
        self,
        name: str,
        a: Sequence[float],
        batch: Batch,
        ms_per_expected: float = 0.0,
        scale: float = 1.0,
        lengths: Sequence[int] | None = None,
        parents: Sequence[int] | None = None,
    ) -> tuple[int, list[float], list[float]]:
        """(m, G, E): the draft length m <= len(a) with the best goodput G[m] of the round,
        given the acceptances a by position (m = 0 is plain decoding), with E = E(0..len(a)).
        ms_per_expected charges each expected token a share of a one-time cost (a catch-up);
        scale multiplies the expected accepted tokens E - 1; lengths (default: all) are the
        ones that may be chosen, G is 0 at the others; parents: the draft's, for a tree (m
        is then the number of its first tokens)."""
        e = scaled(expected_tokens(a, parents), scale)
        g = [0.0] * len(e)
        for m in range(len(e)) if lengths is None else lengths:
            c = self._round_ms(name, m, batch) + (ms_per_expected * e[m] if m else 0.0)
            g[m] = (batch.expected + e[m]) / c
        return max(range(len(g)), key=g.__getitem__), g, e

    def _sharing(self, batch: Batch, cap: int) -> list[int]:
        """The draft lengths 0..cap that keep this request in the passes the rest of its batch
        runs anyway (alone: all of them). A pass of its own, beside them, is not planned: such
        passes mostly cost 1.3-1.6x what a request alone pays for as many tokens, and the
        one-by-one drafts that needed them lost 11% of their steps' time in the server
        (BENCHMARKS.md §4)."""
        if not batch.calls:
            return list(range(cap + 1))
        plain = len(self._passes((*batch.calls, (batch.seq, 1))))
        return [0] + [
            m
            for m in range(1, cap + 1)
            if len(self._passes((*batch.calls, (batch.seq, 1 + m)))) <= plain
        ]

    def _worth_probing(
        self,
        d: Drafter,
        offer: Sequence[float | None],
        batch: Batch,
        parents: Sequence[int] | None = None,
    ) -> int:
        """The shortest proposal length that would pay were this request an average one and
        the offer's confidences as good as their calibration optimistically allows; 0 when
        none would beat plain decoding. The shortest, not the best: a probe is there to measure
        acceptance, and before anything is learnt every bin reads as certain, so the best
        length under that reading is the longest offer, whose verification costs most when it
        fails (measured on mainline from an empty home: three such probes of code generation
        cost 1,592 ms for 6 tokens that plain decoding takes 385 ms for, BENCHMARKS.md §0)."""
        st = self._state[d.name]
        a = [
            st.global_alpha(i) if c is None else st.calibration.optimistic(c)
            for i, c in zip(positions(parents, len(offer)), offer, strict=True)
        ]
        _, g, _ = self._best_length(d.name, a, batch, parents=parents)
        return next((m for m in range(1, len(g)) if g[m] > g[0]), 0)

    def _probe(
        self, rid: str, passed_over: list[tuple[Drafter, int]], plain_g: float
    ) -> Plan | None:
        """A proposal (drafter, length) from one that plain has beaten for a while, to measure
        it again; the gap between probes doubles while probes keep losing."""
        for d, k in passed_over:
            st = self._state[d.name]
            gap = st.gap.setdefault(rid, PROBE_FIRST)
            if st.idle.get(rid, 0) + 1 >= gap:
                st.gap[rid] = min(gap * 2, PROBE_MAX)
                return Plan(d, k, k, plain_g, plain_g, probe=True, reason=f"probing {d.name}")
        return None

    def _stopper(self, name: str, rid: str, g: float, cap: int, batch: Batch) -> KeepGoing:
        """The mid-round rule for a drafter that drafts token by token."""
        st = self._state[name]
        known: list[float] = []

        def keep_going(i: int, confidence: float) -> bool:
            known.append(st.calibrated(confidence, i - 1, st.request_alpha(rid, i)[i - 1]))
            a = known + st.request_alpha(rid, cap)[i:]
            e = expected_tokens(a)
            c_i = self._round_ms(name, i, batch)
            return any(
                e[m] - e[i] > g * (self._round_ms(name, m, batch) - c_i)
                for m in range(i + 1, cap + 1)
            )

        return keep_going

    # -- learning ----------------------------------------------------------------------------
    def observe(
        self,
        rid: str,
        drafter: str | None,
        draft: Draft,
        accepted: int,
        path: Sequence[int] = (),
    ) -> None:
        """Learn from one verified round: which draft positions were reached and accepted
        (path: a tree draft's accepted tokens, root first). α by position learns whether
        anything was accepted at each depth reached; the calibration, from every token
        reached (in a tree, the siblings of the accepted tokens too)."""
        if drafter is None or not draft.tokens:
            return
        st = self._state[drafter]
        e = st.planned.pop(rid, None)
        if e is not None:  # a planned round (not a probe): how much of the plan came true
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
                st.alpha.append(PRIOR_ALPHA)
            st.alpha[i] = (1 - GLOBAL_EMA) * st.alpha[i] + GLOBAL_EMA * ok
        if draft.confidence is not None:
            for j, ok in seen:
                st.calibration.observe(draft.confidence[j], ok)

    def forget(self, rid: str) -> None:
        """Drop a finished request's estimates (the averages over requests stay, and are saved
        when `remember` was called)."""
        for st in self._state.values():
            st.requests.pop(rid, None)
            st.idle.pop(rid, None)
            st.gap.pop(rid, None)
            st.planned.pop(rid, None)

    @classmethod
    def calibrated(
        cls, target: LM, drafters: Sequence[Drafter], remember: bool = True
    ) -> Controller:
        """A controller with this machine's costs for target and drafters (read from
        $SPECWISE_HOME/costs, or measured now and saved there) and, with remember, what
        earlier runs learnt ($SPECWISE_HOME/controller; `save` writes it back). The disk and
        the measuring are here, for the CLI and the server to call; `Engine` touches neither."""
        from specwise.costs import cache_key, calibrated
        from specwise.models import home

        controller = cls(drafters, calibrated(target, drafters))
        if remember:
            controller.remember(home() / "controller" / f"{cache_key(target, drafters)}.json")
        return controller

    def remember(self, path: Path) -> None:
        """Keep what is learnt across requests in `path`: load it now; `save` writes it."""
        self._memory = path
        with contextlib.suppress(OSError, ValueError):
            self.load_state(json.loads(path.read_text()))

    def save(self) -> None:
        """Write what was learnt across requests to the `remember` path (if any)."""
        if self._memory is None:
            return
        from specwise.models import save_json

        try:
            save_json(self._memory, self.state())
        except OSError as exc:  # learning is a bonus; never fail a request for it
            log.warning("could not save the controller's learning: %s", exc)

    def state(self) -> dict:
        """What was learnt across requests, as JSON-able data."""
        return {
            name: {
                "alpha": st.alpha,
                "hits": st.calibration.hits,
                "seen": st.calibration.seen,
                "plan_hit_rate": [st.hit_rate.predicted, st.hit_rate.realised],
            }
            for name, st in self._state.items()
        }

    def load_state(self, data: dict) -> None:
        for name, st in self._state.items():
            d = data.get(name)
            if d and len(d.get("hits", ())) == BINS and len(d.get("seen", ())) == BINS:
                st.alpha = [float(x) for x in d["alpha"]]
                st.calibration = Calibration(
                    [float(x) for x in d["hits"]], [float(x) for x in d["seen"]]
                )
                if len(d.get("plan_hit_rate", ())) == 2:
                    st.hit_rate = PlanHitRate(*(float(x) for x in d["plan_hit_rate"]))

    def set_prior(self, drafter: str, alpha: Sequence[float]) -> None:
        """Start new requests of `drafter` from these α by position (e.g. from earlier runs)."""
        self._state[drafter].alpha = [float(a) for a in alpha]

    def alpha(self, drafter: str, rid: str | None = None) -> list[float]:
        """Current α estimates by position (of a request, or across requests)."""
        st = self._state[drafter]
        return list(st.requests.get(rid, [])) if rid is not None else list(st.alpha)
