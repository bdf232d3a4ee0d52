"""`Controller`: each round, per request, the drafter and proposal length with the best expected
goodput (emitted tokens per ms), and k = 0 — plain decoding — when nothing beats it.

The decision (names as in DESIGN.md §4): with a_i the predicted conditional acceptance of draft
position i (`Estimates`), a request proposing m tokens emits E(m) = 1 + Σ_{i<=m} Π_{j<=i} a_j
tokens (a tree's first m tokens: the products along each token's path). A round is one target
call shared by the batch, so the controller maximises the batch's goodput

    G(m) = (E_others + E(m)) / (D_others + d·m + V(L_others + [1 + m]) + overhead)

where d is the drafter's measured ms per token, V(L) the measured time of a target call with
the token counts L by sequence, priced as the passes the backend runs it in (`Pricing`), and
the *_others terms are what the rest of the batch already put in the call (for a single request
they are 0). Plain decoding is m = 0. As the batch grows, the extra verify tokens cost more than
they return, so speculation backs off by itself. Estimates are noisy, so speculation must beat
plain decoding by MARGIN to be chosen.

In a batch a wrong estimate costs every sequence in the call, so there the controller (a) does
not probe, (b) scales a drafter's expected accepted tokens by how far its plans came true
(`PlanHitRate`, BENCHMARKS.md §4), and (c) plans a request only to draft lengths that join the
passes the batch runs anyway (`Pricing.sharing`): beside plain sequences, nothing. The batch as
a whole may then be aligned (`alignment.align`), and where no draft has paid for long at a
batch size, planning backs off (`Backoff`).

Cheap drafters (n-gram, suffix, the eagle layer) propose before the decision, and the
controller takes the best prefix. An offer is paid for whether taken or not, so a drafter
whose offer is not free (the eagle layer's: its read and a layer call a level, priced as the
engine has measured its offers, `CostModel.offer_cost`) is asked only while it drafts, while
it pays on the request's average, or every probe gap, and never where the offers already in
hand plan better than it could on that average (`asks`), and for no more tokens than its
best plan on that average and one (`offer_length`); it grows the offer (the layer's tree, a
level a call) only beneath a path that the mid-round rule below, with plain decoding's
goodput, says some plan could pay for (`offer_stopper`).
A model drafter that has fallen behind the context (it is prefilled only once chosen)
must first catch up; that one-time cost is spread over the tokens the request has left, so it
is chosen only when it can pay the catch-up back; it stops mid-round as soon as no longer draft
is worth its cost: it goes on while, for some m > i, E(m) − E(i) > G·(C(m) − C(i)), with G the
goodput planned.

A request stakes on a proposal no more than it can lose: a proposal of m tokens may cost, were
none accepted, at most STAKE plain steps more than a plain round, plus what the request's
drafts have won so far (`Stake`, priced by the cost model). What was learnt on other requests
(or on none: a fresh machine reads every calibration bin at its prior) says little of a request
that has shown nothing yet, and where verification is steep the only proposals that can pay are
long ones, which cost several plain steps when they fail (BENCHMARKS §0c). So no single
proposal loses a request more than STAKE plain steps beyond its winnings; where verification
is cheap the stake allows long proposals from the start.

When plain wins, each drafter is still probed now and then (with doubling gaps
while probes keep losing) so a request that becomes predictable is noticed, but only while
the request can afford it: a probe that failed would leave the request's probes having lost
no more than PROBE_SHARE of its plain rounds' time beyond what they, and its drafts where
these are ahead, have won (`Stake.affords`).
Each drafter keeps its own gap, so where nothing drafts well, several drafters' probes would
add up without that bound (BENCHMARKS §0c, "Probes"). A cheap drafter is probed
only with an offer that would pay on an average request by an optimistic reading of its
calibration (an upper confidence bound, which every bin keeps because old outcomes fade), at the
shortest length that reading says pays. A model drafter is probed with 2 tokens, and only when
catching up costs no more than one plain round.

The disk is touched only by `calibrated` (costs measured or read, and what earlier runs learnt),
`remember` and `save` (`Memory`), for the CLI and the server to call. This module runs no model; the
engine calls `plan` before and `observe` after each round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from specwise.acceptance import expected_tokens, positions, scaled
from specwise.backends.base import LM
from specwise.controller.alignment import Alignment, Offered, align
from specwise.controller.backoff import Backoff
from specwise.controller.estimates import Estimates
from specwise.controller.memory import Memory
from specwise.controller.plan import Plan
from specwise.controller.pricing import MARGIN, Batch, Pricing
from specwise.costs import CostModel
from specwise.drafters.base import Draft, Drafter, KeepGoing

__all__ = ["PROBE_FIRST", "PROBE_MAX", "PROBE_SHARE", "STAKE", "Controller", "Stake"]

PROBE_FIRST, PROBE_MAX = 8, 64  # rounds between probes of a drafter that plain beats
STAKE = 4.0  # plain steps a request may lose beyond what its drafts have won
PROBE_SHARE = 0.02  # of a request's plain rounds' time its probes may lose beyond its winnings
OFFER_FREE = 0.05  # a cheap drafter's offer costing under this share of a plain round is free


class Stake:
    """Stake(pricing, steps=STAKE, probe_share=PROBE_SHARE): per request, the ms its drafts
    have won against plain decoding (each round: its accepted tokens at a plain round's price,
    less what it cost beyond one) and the rounds it has run; the longest proposal it may stake:
    one whose round, were nothing accepted, costs at most `steps` plain rounds plus the ms won
    (never less than `steps`) more than a plain round; and whether it can afford a probe
    (`affords`; what its probes won and lost is kept apart, so that the losses of its planned
    drafts, the estimates' errors, do not stop it probing). All at a lone request's prices."""

    def __init__(
        self, pricing: Pricing, steps: float = STAKE, probe_share: float = PROBE_SHARE
    ) -> None:
        self.pricing, self.steps, self.probe_share = pricing, steps, probe_share
        self.won: dict[str, float] = {}
        self.probed: dict[str, float] = {}  # what its probes won (less what they lost)
        self.rounds: dict[str, int] = {}
        self._probing: set[str] = set()  # requests whose round in flight is a probe

    def most(self, rid: str, name: str, cap: int) -> int:
        plain = self.pricing.round_ms(None, 0, Batch())
        budget = self.steps * plain + max(0.0, self.won.get(rid, 0.0))
        m = 0
        while m < cap and self.pricing.round_ms(name, m + 1, Batch()) - plain <= budget:
            m += 1
        return m

    def affords(self, rid: str, name: str, m: int) -> bool:
        """Whether a probe of m tokens from `name` that failed would leave the request's probes
        having lost at most `probe_share` of its rounds so far at a plain round's price, beyond
        what they, and its drafts where these are ahead, have won."""
        plain = self.pricing.round_ms(None, 0, Batch())
        loss = self.pricing.round_ms(name, m, Batch()) - plain
        budget = self.probe_share * self.rounds.get(rid, 0) * plain
        return loss <= self.probed.get(rid, 0.0) + max(0.0, self.won.get(rid, 0.0)) + budget

    def plan(self, rid: str, probe: bool) -> None:
        """Count one round of the request, planned as a probe or not."""
        self.rounds[rid] = self.rounds.get(rid, 0) + 1
        if probe:
            self._probing.add(rid)
        else:
            self._probing.discard(rid)

    def observe(self, rid: str, name: str, proposed: int, accepted: int) -> None:
        plain = self.pricing.round_ms(None, 0, Batch())
        net = accepted * plain - (self.pricing.round_ms(name, proposed, Batch()) - plain)
        self.won[rid] = self.won.get(rid, 0.0) + net
        if rid in self._probing:
            self.probed[rid] = self.probed.get(rid, 0.0) + net

    def forget(self, rid: str) -> None:
        for table in (self.won, self.probed, self.rounds):
            table.pop(rid, None)
        self._probing.discard(rid)


class Controller:
    """Controller(drafters, costs, max_k, stake=STAKE): plans rounds and learns from them.
    stake=None: no bound from what a request can lose (tests of the plan's optimum)."""

    def __init__(
        self,
        drafters: Sequence[Drafter],
        costs: CostModel,
        max_k: int = 8,
        stake: float | None = STAKE,
    ) -> None:
        self.drafters = list(drafters)
        self.max_k = max_k
        self.pricing = Pricing(costs)
        self.stake = None if stake is None else Stake(self.pricing, stake)
        self.estimates = Estimates([d.name for d in self.drafters])
        self.backoff = Backoff()
        self._memory: Memory | None = None

    @property
    def costs(self) -> CostModel:
        return self.pricing.costs

    def bind(self, target: LM) -> None:
        """Price target calls the way `target` runs them (until bound: one pass of all tokens)."""
        self.pricing.bind(target)

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
        plain_ms = self.pricing.round_ms(None, 0, batch)
        plain_g = (batch.expected + 1.0) / plain_ms
        best = Plan(None, 0, 0, plain_g, plain_g, reason="plain decoding is expected fastest")
        passed_over: list[tuple[Drafter, int]] = []
        predicted: list[float] = []  # E(0..) of the best plan, before any scaling
        for d in self.drafters:
            most = len(offers.get(d.name, ())) if d.cheap else self.max_k
            cap = min(room, most, getattr(d, "max_tokens", None) or most)
            if self.stake is not None:
                cap = self.stake.most(rid, d.name, cap)
            if cap <= 0 or (only is not None and d.name != only):
                continue
            lengths = self.pricing.sharing(batch, cap)
            if lengths == [0]:
                continue  # beside this batch any draft is a pass of its own
            catch_up = lags.get(d.name, 0) * self.costs.catch_up_ms_per_token.get(d.name, 0.0)
            st = self.estimates[d.name]
            shape = trees.get(d.name) if d.cheap else None  # its first `cap` tokens are used
            a = self.estimates.acceptances(
                d.name, rid, cap, offers.get(d.name) if d.cheap else None, shape
            )
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
        if self.stake is not None:
            self.stake.plan(rid, best.probe)
        for d in self.drafters:
            st = self.estimates[d.name]
            st.idle[rid] = 0 if d is best.drafter else st.idle.get(rid, 0) + 1
            st.planned.pop(rid, None)
            if d is best.drafter and not best.probe:
                st.gap[rid] = PROBE_FIRST
                st.planned[rid] = predicted
        if best.drafter is not None and not best.drafter.cheap:
            stop = self._stopper(best.drafter.name, rid, best.expected_goodput, best.k_max, batch)
            best = replace(best, keep_going=stop)
        return best

    def asks(
        self, d: Drafter, rid: str, longest: int, have: Mapping[str, Draft] | None = None
    ) -> bool:
        """Whether to ask the cheap drafter `d` for an offer of up to `longest` tokens in
        request `rid`'s round (the offer is made before the plan, so it is paid for whether
        taken or not). Always where the offer is free (under OFFER_FREE of a plain round, as
        `CostModel.offer_cost` prices it: the drafter's measured ms a token and what its
        offers cost beyond that in the engine); never where the offers already in hand
        (`have`: drafter -> offer) plan a round that beats plain decoding by MARGIN and `d` on
        the request's average so far with its offer's cost counted; else where it drafted the
        request's last round (or it has none yet), where on that average it pays, or every
        probe gap (PROBE_FIRST, doubling while its probes lose) while it sits idle."""
        if self._free_offer(d, longest):
            return True
        plain = self.pricing.round_ms(None, 0, Batch())
        per = self.costs.draft_ms_per_token.get(d.name, 0.0)
        offer = self.costs.offer_cost(d.name, longest)
        st = self.estimates[d.name]
        e = expected_tokens(st.request_alpha(rid, longest))
        average = max(
            (
                e[m] / (self.pricing.round_ms(d.name, m, Batch()) + offer - per * m)
                for m in range(1, len(e))
            ),
            default=0.0,  # nothing asked for: pays nothing
        )
        if have and max(average, MARGIN / plain) <= self._in_hand(rid, have):
            return False  # a plan in hand that would be taken, and better
        idle = st.idle.get(rid, 0)
        if idle == 0:
            return True
        if (idle + 1) % st.gap.get(rid, PROBE_FIRST) == 0 and self._affords(rid, d.name, 1):
            return True
        return average > MARGIN / plain

    def _in_hand(self, rid: str, have: Mapping[str, Draft]) -> float:
        """The goodput of the best plan the offers in `have` make for a lone request."""
        best = 0.0
        for name, o in have.items():
            if o.tokens:
                a = self.estimates.acceptances(name, rid, len(o.tokens), o.scores(), o.parents)
                _, g, _ = self._best_length(name, a, Batch(), parents=o.parents)
                best = max(best, *g[1:])
        return best

    def offer_length(
        self, d: Drafter, rid: str, longest: int, have: Mapping[str, Draft] | None = None
    ) -> int:
        """How many tokens to ask the cheap drafter `d` to offer in request `rid`'s round, with
        the offers in `have` made already: 0 where it is not asked (`asks`); all `longest`
        where its offer is free; else the draft length its acceptance in the request so far
        makes best, and one more (the offer's own confidences may lengthen the plan): an offer
        is paid for by the token asked, and tokens no plan would take are not worth asking
        for."""
        if not self.asks(d, rid, longest, have):
            return 0
        if self._free_offer(d, longest):
            return longest
        m, _, _ = self._best_length(d.name, self.estimates[d.name].request_alpha(rid, longest), Batch())
        return min(longest, max(m, 1) + 1)

    def offer_stopper(self, d: Drafter, rid: str, tokens: int, batch: Batch) -> KeepGoing | None:
        """The rule a cheap drafter's offer of `tokens` drafts by where it draws its tokens
        one call at a time (a tree's level): what `_stopper` says with plain decoding's
        goodput, which any plan taken must beat, so no token it cuts could enter a plan that
        pays. None where the offer is free."""
        if self._free_offer(d, tokens):
            return None
        plain_g = (batch.expected + 1.0) / self.pricing.round_ms(None, 0, batch)
        return self._stopper(d.name, rid, MARGIN * plain_g, tokens, batch)

    def _free_offer(self, d: Drafter, tokens: int) -> bool:
        """Whether an offer of `tokens` from `d` costs under OFFER_FREE of a plain round, as
        `CostModel.offer_cost` prices it."""
        offer = self.costs.offer_cost(d.name, tokens)
        return offer <= OFFER_FREE * self.pricing.round_ms(None, 0, Batch())

    def unplanned(self, calls: Sequence[tuple[int, int]]) -> Plan | None:
        """None: plan this step of a batch, whose sequences bring (seq, 1) each. Otherwise
        planning backs off at this batch size (`Backoff`), and this is the plan of every request
        in the step: plain decoding, with no drafter asked and nothing planned."""
        reason = self.backoff.skip(len(calls))
        if reason is None:
            return None
        g = len(calls) / self.pricing.step_ms(tuple(calls), 0.0)
        return Plan(None, 0, 0, g, g, reason=reason)

    def planned(
        self, calls: Sequence[tuple[int, int]], tokens: int, planning_ms: float, verify_ms: float
    ) -> None:
        """Learn from a planned step of a batch whether planning pays at its size. calls: (seq,
        tokens fed) of each sequence; tokens: how many verification gave out. A step paid when
        it drafted and the plain steps its tokens would have taken (as the cost model prices
        them) cost more than its planning and target call."""
        paid = False
        if any(n > 1 for _, n in calls):
            plain = self.costs.call_ms(self.pricing.passes(tuple((s, 1) for s, _ in calls)))
            paid = tokens * plain / len(calls) > planning_ms + verify_ms
        self.backoff.learn(len(calls), paid)

    def align(
        self, requests: Sequence[Offered], calls: Sequence[tuple[int, int]], draft_ms: float
    ) -> Alignment | None:
        """A joint plan for a batch whose requests were planned one by one (`alignment.align`),
        or None to keep those plans."""
        return align(requests, calls, draft_ms, self.drafters, self.pricing, self.estimates)

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
            c = self.pricing.round_ms(name, m, batch) + (ms_per_expected * e[m] if m else 0.0)
            g[m] = (batch.expected + e[m]) / c
        return max(range(len(g)), key=g.__getitem__), g, e

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
        st = self.estimates[d.name]
        a = [
            st.global_alpha(i) if c is None else st.calibration(i).optimistic(c)
            for i, c in zip(positions(parents, len(offer)), offer, strict=True)
        ]
        _, g, _ = self._best_length(d.name, a, batch, parents=parents)
        return next((m for m in range(1, len(g)) if g[m] > g[0]), 0)

    def _probe(
        self, rid: str, passed_over: list[tuple[Drafter, int]], plain_g: float
    ) -> Plan | None:
        """A proposal (drafter, length) from one that plain has beaten for a while, to measure
        it again, where the request can afford it (`Stake.affords`); the gap between probes
        doubles while probes keep losing."""
        for d, k in passed_over:
            st = self.estimates[d.name]
            gap = st.gap.setdefault(rid, PROBE_FIRST)
            if st.idle.get(rid, 0) + 1 >= gap and self._affords(rid, d.name, k):
                st.gap[rid] = min(gap * 2, PROBE_MAX)
                return Plan(d, k, k, plain_g, plain_g, probe=True, reason=f"probing {d.name}")
        return None

    def _affords(self, rid: str, name: str, m: int) -> bool:
        return self.stake is None or self.stake.affords(rid, name, m)

    def _stopper(self, name: str, rid: str, g: float, cap: int, batch: Batch) -> KeepGoing:
        """The mid-draft rule: whether to draft beneath a path of i tokens (their confidences,
        each given the one before): for some m > i, E(m) - E(i) > G·(C(m) - C(i)), with the
        path's acceptances calibrated and the request's α past it."""
        st = self.estimates[name]

        def keep_going(path: Sequence[float]) -> bool:
            i = len(path)
            alpha = st.request_alpha(rid, cap)
            a = [st.calibrated(c, j, alpha[j]) for j, c in enumerate(path[:cap])] + alpha[i:]
            e = expected_tokens(a)
            c_i = self.pricing.round_ms(name, i, batch)
            return any(
                e[m] - e[i] > g * (self.pricing.round_ms(name, m, batch) - c_i)
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
        offer: Draft | None = None,
        target_token: int | None = None,
    ) -> None:
        """Learn from one verified round (`Estimates.observe`: offer, the cheap drafter's offer
        the draft was cut from; target_token, the token the target emitted after the accepted
        ones); a plain round teaches nothing."""
        if drafter is not None and draft.tokens:
            self.estimates.observe(rid, drafter, draft, accepted, path, offer, target_token)
            if self.stake is not None:
                self.stake.observe(rid, drafter, len(draft.tokens), accepted)

    def forget(self, rid: str) -> None:
        """Drop a finished request's estimates (the averages over requests stay, and are saved
        when `remember` was called)."""
        self.estimates.forget(rid)
        if self.stake is not None:
            self.stake.forget(rid)

    @classmethod
    def calibrated(
        cls, target: LM, drafters: Sequence[Drafter], remember: bool = True
    ) -> Controller:
        """A controller with this machine's costs for target and drafters (read from
        $SPECWISE_HOME/costs, or measured now and saved there) and, with remember, what
        earlier runs learnt (`Memory.at`; `save` writes it back). The disk and the measuring
        are here, for the CLI and the server to call; `Engine` touches neither."""
        from specwise.costs import calibrated

        controller = cls(drafters, calibrated(target, drafters))
        if remember:
            controller.remember(Memory.at(target, drafters).path)
        return controller

    def remember(self, path: Path) -> None:
        """Keep what is learnt across requests in `path`: load it now; `save` writes it."""
        self._memory = Memory(path)
        self._memory.load(self.estimates)

    def save(self) -> None:
        """Write what was learnt across requests to the `remember` path (if any)."""
        if self._memory is not None:
            self._memory.save(self.estimates)

    def state(self) -> dict:
        """What was learnt across requests, as JSON-able data."""
        return self.estimates.state()

    def load_state(self, data: dict) -> None:
        self.estimates.load_state(data)

    def set_prior(self, drafter: str, alpha: Sequence[float]) -> None:
        """Start new requests of `drafter` from these α by position (e.g. from earlier runs)."""
        self.estimates[drafter].alpha = [float(a) for a in alpha]

    def alpha(self, drafter: str, rid: str | None = None) -> list[float]:
        """Current α estimates by position (of a request, or across requests)."""
        st = self.estimates[drafter]
        return list(st.requests.get(rid, [])) if rid is not None else list(st.alpha)
