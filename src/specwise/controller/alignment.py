"""`align`: a joint plan for a batch whose requests were planned one by one.

On llama.cpp a sequence with more tokens than the rest of its call costs a pass of its own,
but a call in which every sequence brings the same number of tokens is one pass, which costs
far less: 8 sequences x 2 tokens cost 1.49x a plain step, and 2 x 2 cost 1.15x (BENCHMARKS.md
§4). So after the requests are planned, the batch is weighed as a whole: every sequence brings
1 + L tokens, its cheap drafter's offer up to L and filler after it (fed, never verified), with
L the length of best expected goodput for the batch; taken when that beats the plans made one
by one, and plain decoding by MARGIN. In a batch a wrong estimate costs every sequence in the
call, so a drafter's expected accepted tokens are scaled by how far its plans came true
(`PlanHitRate`). Only batches whose every request may take a cheap drafter's offer are
aligned (a model drafter drafts after the plan, token by token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specwise.acceptance import expected_tokens, scaled
from specwise.controller.estimates import Estimates
from specwise.controller.plan import Plan
from specwise.controller.pricing import MARGIN, Pricing
from specwise.drafters.base import Drafter

__all__ = ["Alignment", "Offered", "align", "ceiling", "steps"]


@dataclass(frozen=True)
class Offered:
    """A request as the batch's joint plan sees it."""

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


def align(
    requests: Sequence[Offered],
    calls: Sequence[tuple[int, int]],
    draft_ms: float,
    drafters: Sequence[Drafter],
    pricing: Pricing,
    estimates: Estimates,
) -> Alignment | None:
    """The joint plan of best expected goodput for `requests` (planned one by one into
    `calls`, the (seq, tokens) each put in the call), or None to keep their own plans. A plan
    taken becomes each drafting request's plan in `estimates` (what its hit rate is judged
    against)."""
    if len(requests) < 2 or any(
        o.plan is None or (o.plan.drafter is not None and not o.plan.drafter.cheap)
        for o in requests
    ):
        return None
    cheap = [d for d in drafters if d.cheap]
    longest = min(o.room for o in requests)
    offered, costs = steps(requests, longest, draft_ms, cheap, pricing)  # costs[0]: plain
    now = sum(o.plan.expected_tokens if o.plan.drafter else 1.0 for o in requests)
    plain = len(requests) / costs[0]
    bar = max(now / pricing.step_ms(tuple(calls), draft_ms), MARGIN * plain)
    trust = max((estimates[d.name].hit_rate.factor() for d in cheap), default=0.0)
    if ceiling(len(requests), offered, costs, trust) <= bar * (1 - 1e-9):  # rounding slack
        return None  # mostly so: then no acceptance needs working out
    # per request and cheap drafter: E(0..) of its offer, as predicted (raw) and as trusted
    # in a batch (scaled by how far its plans came true)
    raw: list[dict[str, list[float]]] = []
    expect: list[dict[str, list[float]]] = []
    for o in requests:
        raw.append({})
        expect.append({})
        for d in cheap:
            offer = o.offers.get(d.name, ())[:longest]
            if offer and o.only in (None, d.name):
                shape = o.trees.get(d.name)
                a = estimates.acceptances(d.name, o.rid, len(offer), offer, shape)
                e = expected_tokens(a, shape)
                raw[-1][d.name] = e
                expect[-1][d.name] = scaled(e, estimates[d.name].hit_rate.factor())
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
        g = sum(x[2] for x in picks) / costs[n]
        if g > (bar if best is None else best.expected_goodput):
            reason = f"aligned: {len(requests)} x {1 + n} tokens, {g:.4f} > {bar:.4f} tokens/ms"
            best = Alignment(n, tuple(picks), g, plain, reason)
    if best is not None:
        for o, r, (name, m, _) in zip(requests, raw, best.drafts, strict=True):
            for d in drafters:
                st = estimates[d.name]
                st.planned.pop(o.rid, None)
                if d.name == name and m:
                    st.idle[o.rid] = 0
                    st.planned[o.rid] = r[name][: m + 1]
    return best


def steps(
    requests: Sequence[Offered],
    longest: int,
    draft_ms: float,
    cheap: Sequence[Drafter],
    pricing: Pricing,
) -> tuple[list[int], list[float]]:
    """The most tokens each request has on offer from the `cheap` drafters (up to `longest`),
    and the ms of a round in which every sequence brings 1 + n tokens, for n = 0 .. the most
    offered."""
    offered = [
        max(
            (len(o.offers.get(d.name, ())[:longest]) for d in cheap if o.only in (None, d.name)),
            default=0,
        )
        for o in requests
    ]
    costs = [
        pricing.step_ms(tuple((o.seq, 1 + n) for o in requests), draft_ms)
        for n in range(max(offered, default=0) + 1)
    ]
    return offered, costs


def ceiling(size: int, offered: Sequence[int], costs: Sequence[float], trust: float) -> float:
    """An upper bound on the goodput of any alignment of `size` requests with these offers and
    round costs (`steps`): every offered token accepted, as far as the drafters' plans have come
    true in batches (`trust`, the best hit rate factor)."""
    return max(
        ((size + trust * sum(min(n, x) for x in offered)) / costs[n] for n in range(1, len(costs))),
        default=0.0,
    )
