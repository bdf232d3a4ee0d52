"""`Proposer`: step 1 of a round, who drafts and what (`engine.Engine.step` makes one a step).

For one request (`propose`): with a fixed k, its drafter's draft of up to k tokens; with
k="auto", the offers of the cheap drafters the controller asks (`Controller.asks`; each drawn
by its rule, `Controller.offer_stopper`) first, then the controller's plan (a drafter and a
length, or plain decoding: k = 0), then that drafter's draft. For a batch (`propose_all`):
every request's proposal, and with k="auto", where the controller finds it pays, its joint
plan in which every sequence brings the same number of tokens (`align`: filler after the short
drafts, fed but never verified, makes the call one pass on llama.cpp); in a batch where the
controller finds planning not worth it this step (`Controller.unplanned`), every request
decodes plainly. `Proposal` records what it decided, for the rest of the round.

A drafter that raises is dropped for that request, which then decodes plainly (`drafter_call`;
the engine calls drafters through it at their prefill and commit too). What it is not: the
round (the engine scores, verifies, commits and records); it feeds the target nothing and
learns nothing (the engine tells the controller what came of the proposals).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from specwise.backends.base import LM
from specwise.controller import Batch, Controller, Offered, Plan
from specwise.drafters.base import Draft, Drafter
from specwise.request import Request

__all__ = ["CHEAP_MAX_K", "Proposal", "Proposer", "drafter_call"]

log = logging.getLogger("specwise.engine")  # a drafter that fails, failed in the engine's round
_ms = 1000.0
CHEAP_MAX_K = 15  # longest draft asked of a cheap drafter (the cost curve is measured to 16)


@dataclass
class Proposal:
    """What step 1 decided for one request in one round: who drafts (None: plain), the draft,
    the controller's plan (k="auto"), what the cheap drafters were asked for and offered, the
    drafter's catch-up (`lag`, context tokens), and, filled in later in the round, the drafting
    time, the filler fed after the draft (`padded`) and the tokens emitted."""

    drafter: Drafter | None
    draft: Draft
    plan: Plan | None = None
    offers: dict[str, Draft] = field(default_factory=dict)
    asked: dict[str, int] = field(default_factory=dict)  # tokens asked of each cheap drafter
    offer_ms: dict[str, float] = field(default_factory=dict)  # and the ms its offer took
    lag: int = 0
    ms: float = 0.0
    padded: int = 0
    emitted: int = 0


def drafter_call(req: Request, d: Drafter, fn, *args):
    """Call a drafter; if it fails, log it and go on without it for `req`."""
    if d.name in req.drafter_errors:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # a drafter bug must not fail the request
        req.drafter_errors[d.name] = f"{type(exc).__name__}: {exc}"
        log.warning("drafter %s failed for %s, going on without it: %s", d.name, req.id, exc)
        with contextlib.suppress(Exception):
            d.end(req.seq)
        return None


@dataclass(frozen=True)
class Proposer:
    """Step 1 for one engine's target, drafters, k (an integer, or "auto") and controller (k="auto"
    only); a request's own k and drafter (`Request.k`, `Request.only`) override the engine's."""

    target: LM
    drafters: Sequence[Drafter]
    k: int | str
    controller: Controller | None

    def room(self, req: Request) -> int:
        """The most draft tokens this round may hold: never past max_tokens or the context."""
        room_out = req.params.max_tokens - len(req.tokens) - 1
        room_ctx = self.target.context_length - len(req.context)
        return max(0, min(room_out, room_ctx))

    def auto(self, r: Request) -> bool:
        return (self.k if r.k is None else r.k) == "auto"

    def allowed(self, r: Request) -> list[Drafter]:
        return [d for d in self.drafters if r.only is None or d.name == r.only]

    def propose(self, r: Request, batch: Batch) -> Proposal:
        """Step 1 for one request: who drafts, the draft, how many context tokens its drafter
        caught up on first (`lag`: a catch-up is not mistaken for the cost of drafting), and
        what the cheap drafters offered. A request whose drafter failed decodes plainly."""
        room = self.room(r)
        none = Proposal(None, Draft([], None))
        k_req = self.k if r.k is None else r.k
        allowed = self.allowed(r)
        if r.drafter_errors:
            return none
        if k_req != "auto":
            d = allowed[0] if allowed else None
            k = min(int(k_req), room)
            if d is None or k <= 0:
                return none
            lag = d.lag(r.seq, r.context)
            draft = drafter_call(r, d, d.propose, r.seq, r.context, k, r.params, r.sampler)
            return Proposal(d, draft or none.draft, lag=lag)
        # The cheap drafters the controller asks propose first; it then picks a drafter and length.
        offers: dict[str, Draft] = {}
        asked: dict[str, int] = {}
        offer_ms: dict[str, float] = {}
        longest = min(room, CHEAP_MAX_K)
        for d in allowed:
            asking = d.cheap and room > 0
            n = self.controller.offer_length(d, r.id, longest, offers) if asking else 0
            if n:
                asked[d.name] = n
                stop = self.controller.offer_stopper(d, r.id, n, batch)
                t = time.perf_counter()
                got = drafter_call(r, d, d.propose, r.seq, r.context, n, r.params, r.sampler, stop)
                offer_ms[d.name] = (time.perf_counter() - t) * _ms
                offers[d.name] = got or none.draft
        lags = {d.name: d.lag(r.seq, r.context) for d in allowed if not d.cheap}
        confidences = {n: o.scores() for n, o in offers.items()}
        plan = self.controller.plan(
            r.id,
            room,
            batch,
            confidences,
            lags,
            remaining=r.params.max_tokens - len(r.tokens),
            only=r.only,
            trees={n: o.parents for n, o in offers.items()},
        )
        d = plan.drafter
        made = Proposal(None, none.draft, plan, offers=offers, asked=asked, offer_ms=offer_ms)
        if d is None or r.drafter_errors:
            return made
        if d.cheap:
            return replace(made, drafter=d, draft=offers[d.name].prefix(plan.k_max))
        draft = drafter_call(
            r, d, d.propose, r.seq, r.context, plan.k_max, r.params, r.sampler, plan.keep_going
        )
        return replace(made, drafter=d, draft=draft or none.draft, lag=lags[d.name])

    def propose_all(self, live: Sequence[Request]) -> tuple[list[Proposal], int, bool]:
        """Step 1 for the batch: each request's proposal, then (k="auto", several requests)
        the controller's alignment; returns the proposals, the tokens each sequence brings
        to the call (0: as proposed) and whether the controller planned the batch. In a
        batch of auto requests the controller may find planning not worth it this step
        (`Controller.unplanned`): then every request decodes plainly, no drafter asked."""
        props: list[Proposal] = []
        counts = {r.seq: 1 for r in live}  # tokens each puts in the call: plain, to start
        expected, draft_ms = float(len(live)), 0.0  # tokens expected, drafting time so far
        gated = self.controller is not None and len(live) > 1 and all(map(self.auto, live))
        unplanned = self.controller.unplanned(tuple(counts.items())) if gated else None
        for r in live:
            t = time.perf_counter()
            if unplanned is None:
                others = tuple((s, n) for s, n in counts.items() if s != r.seq)
                p = self.propose(r, Batch(others, expected - 1.0, draft_ms, r.seq))
            else:
                p = Proposal(None, Draft([], None), unplanned)
            p.draft = p.draft.prefix(self.room(r))  # a drafter must not overshoot
            if p.draft.parents is not None and not self.target.trees:
                p.draft = p.draft.chain()  # a drafter that ignored bind: its first chain
            p.drafter = p.drafter if p.draft.tokens else None
            p.ms = (time.perf_counter() - t) * _ms
            props.append(p)
            counts[r.seq] = 1 + len(p.draft.tokens)
            expected += (p.plan.expected_tokens if p.plan and p.draft.tokens else 1.0) - 1.0
            draft_ms += p.ms
        width = 0 if unplanned is not None else self.align(live, props, counts, draft_ms)
        return props, width, gated and unplanned is None

    def align(
        self,
        live: Sequence[Request],
        props: list[Proposal],
        counts: dict[int, int],
        draft_ms: float,
    ) -> int:
        """Step 1b: where the controller finds it pays, replace the batch's plans by a joint one
        in which every sequence brings the same number of tokens (`Controller.align`), in
        `props`; return the tokens each sequence then brings (0: as planned)."""
        if self.controller is None or len(live) < 2:
            return 0
        asks = [
            Offered(
                r.id,
                r.seq,
                self.room(r),
                {n: o.scores() for n, o in p.offers.items()},
                p.plan,
                r.only,
                {n: o.parents for n, o in p.offers.items()},
            )
            for r, p in zip(live, props, strict=True)
        ]
        joint = self.controller.align(asks, list(counts.items()), draft_ms)
        if joint is None:
            return 0
        byname = {d.name: d for d in self.drafters}
        for p, (name, m, e) in zip(props, joint.drafts, strict=True):
            d = byname[name] if name and m else None
            p.drafter, p.draft = d, p.offers[name].prefix(m) if d else Draft([], None)
            p.plan = Plan(
                d, m, m, joint.expected_goodput, joint.plain_goodput, e, reason=joint.reason
            )
        return 1 + joint.length
