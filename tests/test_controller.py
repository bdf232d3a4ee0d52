"""The goodput controller: decisions on synthetic costs with known optima, estimators, probing,
batch back-off, and the engine in auto mode (still exact)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.acceptance import GLOBAL_EMA, PRIOR_ALPHA, expected_tokens
from specwise.backends.curves import CostCurve
from specwise.backends.llama_cpp import equal_passes
from specwise.backends.torch_hf import TorchLM
from specwise.controller import (
    MARGIN,
    PLAN_GAP_MAX,
    PLAN_PATIENCE,
    PROBE_FIRST,
    PROBE_MAX,
    PROBE_SHARE,
    STAKE,
    Batch,
    Controller,
    Offered,
    Plan,
    alignment,
)
from specwise.costs import CostModel, measure_costs
from specwise.drafters import Draft, ModelDrafter, NgramDrafter
from specwise.oracle import plain_decode
from toy import StubDrafter, ToyLM, tiny_llama


class Named:
    """A stand-in drafter for planning tests (the controller only reads these attributes)."""

    def __init__(self, name, cheap):
        self.name, self.cheap = name, cheap


def costs(curve, draft_ms):
    return CostModel(CostCurve(dict(curve)), dict(draft_ms), overhead_ms=0.0)


def brute_force(alpha, draft_ms, v, batch=None, passes=None):
    """argmax over m of (E_others + E(m)) / (D_others + d m + V(L_others + [1 + m])); plain
    (m = 0) unless the best speculative choice beats it by MARGIN. v prices a call's token
    counts; given `passes`, a draft that adds a pass to the batch's call is not a choice."""
    batch = batch or Batch()
    if isinstance(v, CostCurve):
        v = lambda calls, curve=v: curve(sum(n for _, n in calls))  # noqa: E731 - one pass
    g = []
    for m in range(len(alpha) + 1):
        calls = (*batch.calls, (batch.seq, 1 + m))
        if (
            passes
            and batch.calls
            and len(passes(calls)) > len(passes((*batch.calls, (batch.seq, 1))))
        ):
            g.append(0.0)
            continue
        cost = batch.draft_ms + draft_ms * m + v(calls)
        g.append((batch.expected + 1 + sum(np.prod(alpha[: i + 1]) for i in range(m))) / cost)
    best = max(range(1, len(g)), key=g.__getitem__)
    return (best, g[best]) if g[best] > MARGIN * g[0] else (0, g[0])


LINEAR = {n: 10.0 + 2.0 * (n - 1) for n in range(1, 17)}  # verification is cheap
STEEP = {n: 10.0 * n for n in range(1, 17)}  # verification costs as much as decoding
BUMPY = {
    1: 69,
    2: 103,
    3: 132,
    4: 124,
    5: 146,
    6: 210,
    7: 212,
    8: 213,
    9: 251,
    10: 260,
    11: 270,
    12: 281,
    13: 270,
    14: 265,
    15: 263,
    16: 262,
}  # measured shape, llama.cpp


@pytest.mark.parametrize("curve", [LINEAR, STEEP, BUMPY])
@pytest.mark.parametrize("alpha", [0.95, 0.8, 0.5, 0.1])
@pytest.mark.parametrize("draft_ms", [0.0, 1.0, 4.0, 40.0])
def test_plan_is_the_brute_force_optimum(curve, alpha, draft_ms):
    ctl = Controller(
        [Named("model", cheap=False)], costs(curve, {"model": draft_ms}), max_k=8, stake=None
    )
    ctl.set_prior("model", [alpha] * 8)
    plan = ctl.plan("r", room=8)
    m, g = brute_force([alpha] * 8, draft_ms, CostCurve(dict(curve)))
    assert plan.planned == m
    assert plan.expected_goodput == pytest.approx(g)
    assert (plan.drafter is None) == (m == 0)


def test_cheap_drafter_is_cut_to_its_best_prefix_and_model_used_otherwise():
    ctl = Controller(
        [Named("ngram", True), Named("model", False)],
        costs(BUMPY, {"ngram": 0.0, "model": 10.0}),
        max_k=8,
        stake=None,
    )
    ctl.set_prior("ngram", [0.9] * 16)
    ctl.set_prior("model", [0.95] * 8)
    plan = ctl.plan("r", room=20, offers={"ngram": [None] * 12})
    m, _ = brute_force([0.9] * 12, 0.0, CostCurve(dict(BUMPY)))
    assert plan.drafter.name == "ngram" and plan.k_max == plan.planned == m > 0
    plan = ctl.plan("r2", room=20, offers={"ngram": []})  # no match: the model, if it pays
    assert plan.drafter.name == "model"


def test_a_request_stakes_no_more_than_its_stake_beyond_what_its_drafts_won():
    """Each token verified costs half a plain step: with a stake of 2 plain steps a fresh
    request may propose 4 (were none accepted, 2 plain steps more than a plain round), however
    sure the estimates; drafts that come true let it stake more, and a finished request's
    winnings go with it."""
    curve = {n: 10.0 + 5.0 * (n - 1) for n in range(1, 17)}
    free, _ = brute_force([0.95] * 8, 0.0, CostCurve(curve))
    assert free > 4
    ctl = Controller([Named("ngram", True)], costs(curve, {"ngram": 0.0}), stake=2.0)
    ctl.set_prior("ngram", [0.95] * 8)
    offer = {"ngram": [None] * 8}
    assert ctl.plan("r", room=8, offers=offer).planned == 4
    unbounded = Controller([Named("ngram", True)], costs(curve, {"ngram": 0.0}), stake=None)
    unbounded.set_prior("ngram", [0.95] * 8)
    assert unbounded.plan("r", room=8, offers=offer).planned == free
    for c in (ctl, unbounded):  # 4 accepted at 20 ms more than a plain round: 20 ms won
        c.observe("r", "ngram", Draft([1, 2, 3, 4], None), 4)
    want = unbounded.plan("r", room=8, offers=offer).planned
    assert want > 4 and ctl.plan("r", room=8, offers=offer).planned == want
    ctl.forget("r")
    assert ctl.plan("r", room=8, offers=offer).planned == 4
    stake = ctl.stake
    stake.observe("q", "ngram", 3, 0)  # lost 15 ms: the stake stays 2 plain steps
    assert stake.most("q", "ngram", 8) == 4
    stake.observe("q", "ngram", 4, 4)  # won 40 - 20 - 15 = 5 ms: one token more
    assert stake.most("q", "ngram", 8) == 5


def test_batch_makes_speculation_back_off():
    curve = {n: 10.0 if n <= 4 else 10.0 * (n - 3) for n in range(1, 40)}
    ctl = Controller([Named("ngram", True)], costs(curve, {"ngram": 0.0}))
    ctl.set_prior("ngram", [0.9] * 8)
    alone = ctl.plan("a", room=8, offers={"ngram": [None] * 8})
    eight = Batch(tuple((q, 1) for q in range(1, 9)), expected=8.0)
    crowded = ctl.plan("b", room=8, batch=eight, offers={"ngram": [None] * 8})
    assert alone.drafter is not None and alone.planned == 3
    assert crowded.drafter is None
    m, _ = brute_force([0.9] * 8, 0.0, CostCurve(curve), eight)
    assert m == 0


def test_stopper_stops_on_low_confidence():
    ctl = Controller([Named("model", False)], costs(LINEAR, {"model": 2.0}), max_k=8)
    for _ in range(100):  # calibration: confident tokens are accepted, unsure ones are not
        ctl.observe("warm", "model", Draft([1], None, [0.95]), accepted=1)
        ctl.observe("warm", "model", Draft([1], None, [0.05]), accepted=0)
    ctl.set_prior("model", [0.9] * 8)
    plan = ctl.plan("r", room=8)
    assert plan.drafter is not None and plan.keep_going([0.97])
    plan = ctl.plan("r", room=8)
    assert not plan.keep_going([0.03])


def test_a_costly_offer_grows_only_beneath_paths_a_plan_could_pay_for():
    """A cheap drafter whose offer costs something draws it by the mid-round rule at plain
    decoding's goodput, path by path (in any order: the rule keeps no state between calls);
    a free offer gets no rule."""
    tree, free = Named("tree", True), Named("free", True)
    ctl = Controller([tree, free], costs(LINEAR, {"tree": 2.0, "free": 0.0}), max_k=8)
    for _ in range(100):  # calibration: confident tokens are accepted, unsure ones are not
        ctl.observe("warm", "tree", Draft([1], None, [0.95]), accepted=1)
        ctl.observe("warm", "tree", Draft([1], None, [0.05]), accepted=0)
    ctl.set_prior("tree", [0.9] * 8)
    assert ctl.offer_stopper(free, "r", 8, Batch()) is None
    stop = ctl.offer_stopper(tree, "r", 8, Batch())
    unsure, sure, deep = [0.03], [0.97], [0.97] * 8
    answers = [stop(unsure), stop(sure), stop(deep)]
    assert answers == [False, True, False]  # nothing lies past the offer's 8 tokens
    assert [stop(deep), stop(sure), stop(unsure)] == answers[::-1]
    assert stop([0.97, 0.03]) is False and stop([0.97, 0.97]) is True


def test_estimators_converge_and_follow_a_change():
    ctl = Controller([Named("model", False)], costs(LINEAR, {"model": 1.0}))
    rng = np.random.default_rng(0)
    for _ in range(400):
        acc = int(rng.random() < 0.7) + int(rng.random() < 0.7) * 0  # position 0 only
        ctl.observe("r", "model", Draft([5], None), accepted=acc)
    assert ctl.alpha("model")[0] == pytest.approx(0.7, abs=0.12)
    for _ in range(10):  # the request turns unpredictable
        ctl.observe("r", "model", Draft([5], None), accepted=0)
    assert ctl.alpha("model", "r")[0] < 0.1


def test_first_and_later_draft_tokens_are_calibrated_apart():
    """A draft's first token and its later ones (each given the one before it was accepted) are
    accepted at different rates for the same confidence: each place has its own calibration, a
    later bin starting from what the first token's says; the request's α scales either by the
    square root of its ratio to the average request's."""
    ctl = Controller([Named("suffix", True)], costs(LINEAR, {"suffix": 0.0}))
    st = ctl.estimates["suffix"]
    for i in range(100):  # one copy in two starts right at 0.85; on it, it goes on right
        ctl.observe("w", "suffix", Draft([1, 2, 3], None, [0.85] * 3), accepted=3 * (i % 2))
    ctl.forget("w")
    alpha = st.global_alpha(0), st.global_alpha(1)
    first, later = (st.calibrated(0.85, i, alpha[i]) for i in (0, 1))
    assert first == pytest.approx(st.first.predict(0.85, alpha[0])) and 0.4 < first < 0.6
    assert later == min(0.99, st.later.predict(0.85, first)) and later > 0.95
    assert st.calibrated(0.15, 1, alpha[1]) == st.calibrated(0.15, 0, alpha[0])  # no later seen
    assert st.calibrated(0.85, 0, alpha[0] / 4) == pytest.approx(first / 2)  # a poorer request
    reloaded = Controller([Named("suffix", True)], costs(LINEAR, {"suffix": 0.0}))
    reloaded.load_state(ctl.state())
    assert reloaded.state() == ctl.state()
    reloaded.load_state({"suffix": {"alpha": [0.1], "hits": [0.0] * 10, "seen": [0.0] * 10}})
    assert reloaded.state() == ctl.state()  # an older file's one calibration is not read


def test_probing_happens_with_doubling_gaps():
    """The schedule alone (no bound from what the request can lose: `stake=None`)."""
    ctl = Controller([Named("model", False)], costs(STEEP, {"model": 5.0}), stake=None)
    ctl.set_prior("model", [0.0] * 8)
    probes = [i for i in range(200) if ctl.plan("r", room=8).probe]
    assert probes[0] < PROBE_FIRST
    gaps = np.diff(probes)
    assert list(gaps[:3]) == [2 * PROBE_FIRST, 4 * PROBE_FIRST, 8 * PROBE_FIRST]


def test_a_request_probes_only_while_a_failed_probe_keeps_its_loss_within_its_share():
    """Probes that all fail never leave a request having lost more than PROBE_SHARE of its
    rounds at a plain round's price (three drafters probing on their own schedules included);
    probes still happen, later and fewer than the schedule alone would make; a request whose
    drafts have won probes on the schedule, one whose planned drafts lost as if they had not."""
    names = ("model", "model-text", "cascade")

    def run(stake, won=0.0, rounds=600):
        drafters = [Named(n, False) for n in names]
        ctl = Controller(drafters, costs(LINEAR, dict.fromkeys(names, 0.5)), stake=stake)
        for n in names:
            ctl.set_prior(n, [0.0] * 8)
        if ctl.stake is not None:
            ctl.stake.won["r"] = won
        plain = ctl.pricing.round_ms(None, 0, Batch())
        lost, probes = 0.0, []
        for i in range(rounds):
            plan = ctl.plan("r", room=8)
            if plan.drafter is not None:
                assert plan.probe
                probes.append(i)
                lost += ctl.pricing.round_ms(plan.drafter.name, plan.k_max, Batch()) - plain
                ctl.observe("r", plan.drafter.name, Draft([1] * plan.k_max, None), accepted=0)
                assert stake is None or lost <= max(won, 0) + PROBE_SHARE * i * plain + 1e-9
        return probes, lost

    bounded, lost = run(STAKE)
    free, free_lost = run(None)
    assert 3 <= len(bounded) < len(free) and lost < free_lost
    assert bounded[0] > free[0]
    assert run(STAKE, won=1000.0)[0] == free  # drafts have won: the schedule alone
    assert run(STAKE, won=-1000.0)[0] == bounded  # planned drafts' losses do not stop probes
    eagle = Named("eagle", True)  # an offer that costs is not asked for a probe not afforded
    ctl = Controller([eagle], costs(LINEAR, {"eagle": 0.1}))
    ctl.set_prior("eagle", [0.0] * 15)
    asked = []
    for _ in range(2 * PROBE_FIRST):
        asked.append(ctl.asks(eagle, "r", 15))
        ctl.plan("r", room=15, offers={"eagle": [0.1] * 15} if asked[-1] else {})
    assert [i for i, x in enumerate(asked) if x] == [0, 2 * PROBE_FIRST - 1]  # 2.1 ms > 1.4 at 7


def test_a_cheap_drafter_is_probed_only_with_an_offer_worth_trying():
    """Weak n-gram matches, known to fail, are never probed; a long match never tried before
    is, at the shortest length that would pay were it always accepted (a probe measures; a
    long one that fails costs most)."""
    ctl = Controller([Named("ngram", True)], costs(BUMPY, {"ngram": 0.0}), stake=None)
    ctl.set_prior("ngram", [0.3] * 8)  # on an average request, speculating does not pay
    for i in range(300):  # short matches (confidence 0.2) are accepted 1 time in 10
        ctl.observe("warm", "ngram", Draft([1], None, [0.2]), accepted=int(i % 10 == 0))
    weak = [ctl.plan("r", room=8, offers={"ngram": [0.2] * 8}) for _ in range(3 * PROBE_FIRST)]
    assert all(p.drafter is None for p in weak)
    strong = ctl.plan("r", room=8, offers={"ngram": [0.8] * 8})
    c = CostCurve(dict(BUMPY))
    shortest = next(m for m in range(1, 9) if (m + 1) / c(1 + m) > 1 / c(1))
    best, _ = brute_force([1.0] * 8, 0.0, c)
    assert shortest < best  # the test tells the two apart
    assert strong.probe and strong.drafter.name == "ngram" and strong.k_max == shortest


def test_a_cheap_drafter_whose_offer_costs_is_asked_while_it_pays_or_to_probe():
    """An offer is paid for before the plan: a free one (n-gram) is asked every round; one
    costing a share of a round (the eagle layer's) only while it drafts, while it pays on the
    request's average, and every probe gap while plain beats it (and the request can afford a
    probe: here it has won enough)."""
    ngram, eagle = Named("ngram", True), Named("eagle", True)
    ctl = Controller([ngram, eagle], costs(LINEAR, {"ngram": 0.001, "eagle": 0.1}))
    ctl.stake.won["r"] = 100.0
    for _ in range(300):  # its unsure tokens are known to fail (not even worth a probe),
        ctl.observe("warm", "eagle", Draft([1], None, [0.1]), accepted=0)
        ctl.observe("warm", "eagle", Draft([1], None, [0.99]), accepted=1)  # its sure ones not
    ctl.set_prior("eagle", [0.2] * 15)  # 1.5 ms an offer of 15: 15% of a plain round
    asked = []
    for _ in range(2 * PROBE_FIRST):
        asked.append(ctl.asks(eagle, "r", 15))
        assert ctl.asks(ngram, "r", 15)
        plan = ctl.plan("r", room=15, offers={"eagle": [0.1] * 15} if asked[-1] else {})
        assert plan.drafter is None
    assert [i for i, x in enumerate(asked) if x] == [0, PROBE_FIRST - 1, 2 * PROBE_FIRST - 1]
    plan = ctl.plan("s", room=15, offers={"eagle": [0.99] * 15})
    assert plan.drafter is eagle and ctl.asks(eagle, "s", 15)  # it drafted the last round
    ctl.set_prior("eagle", [0.9] * 15)  # where it pays on average, it is asked every round
    for _ in range(PROBE_FIRST):
        assert ctl.asks(eagle, "t", 15)
        ctl.plan("t", room=15, offers={})


def test_a_costly_offer_is_not_asked_where_the_offers_in_hand_plan_better():
    """The layer's offer costs before the plan: where the free offers already in hand plan a
    round better than the layer could on the request's average, it is not asked; with nothing
    in hand, or a weak offer, it is asked as before."""
    ngram, eagle = Named("ngram", True), Named("eagle", True)
    ctl = Controller([ngram, eagle], costs(LINEAR, {"ngram": 0.001, "eagle": 0.1}))
    for _ in range(300):  # long n-gram matches are accepted, short ones are not
        ctl.observe("warm", "ngram", Draft([1, 2], None, [0.95, 0.95]), accepted=2)
        ctl.observe("warm", "ngram", Draft([1], None, [0.15]), accepted=0)
    ctl.set_prior("eagle", [0.6] * 15)
    sure, weak = Draft([1] * 8, None, [0.95] * 8), Draft([1] * 8, None, [0.15] * 8)
    assert ctl.asks(eagle, "r", 15) and ctl.asks(eagle, "r", 15, {"ngram": weak})
    assert not ctl.asks(eagle, "r", 15, {"ngram": sure})
    assert ctl.offer_length(eagle, "r", 15, {"ngram": sure}) == 0
    assert ctl.asks(ngram, "r", 15, {"eagle": sure})  # a free offer is always asked


def test_the_offer_left_out_of_a_draft_is_learnt_where_the_target_said_its_next_token():
    """The tokens of an offer past the draft cut from it, that follow the draft's last accepted
    token where no drafted token does, are calibrated by the target's own next token; so a
    drafter planned one token at a time learns how its later tokens fare. Nothing is learnt
    past a rejected token, nor from an offer that is not a point mass."""
    ctl = Controller([Named("eagle", True)], costs(LINEAR, {"eagle": 0.0}))
    st = ctl.estimates["eagle"]
    later = lambda: (st.calibration(1).hits[9], st.calibration(1).seen[9])  # noqa: E731
    chain = Draft([4, 5, 6], None, [0.95] * 3)
    ctl.observe("r", "eagle", chain.prefix(1), 1, (), chain, 5)  # 4 accepted, 5 said next
    assert later() == (1.0, 1.0)  # 5 reached and right; 6 (after 5) not reached
    ctl.observe("r", "eagle", chain.prefix(1), 1, (), chain, 7)
    assert later() == (1.0, 2.0)
    ctl.observe("r", "eagle", chain.prefix(1), 0, (), chain, 7)  # 4 rejected: 5 not reached
    ctl.observe("r", "eagle", chain.prefix(1), 1, (), chain)  # the target said nothing
    sampled = Draft([4, 5], np.full((2, 8), 0.125, np.float32), [0.95] * 2)
    ctl.observe("r", "eagle", sampled.prefix(1), 1, (), sampled, 5)
    assert later() == (1.0, 2.0)
    tree = Draft([4, 3, 5, 6], None, [0.95] * 4, [-1, -1, 0, 1])  # 5 under 4, 6 under 3
    ctl.observe("r", "eagle", tree.prefix(1), 1, (0,), tree, 5)
    assert later() == (2.0, 3.0)  # 5 learnt; 3 (a sibling) and 6 (under it) not reached
    first = st.calibration(0).seen[9]
    ctl.observe("r", "eagle", tree.prefix(2), 1, (1,), tree, 6)  # 3 accepted, 6 said next
    assert later() == (3.0, 4.0) and st.calibration(0).seen[9] == first + 2


def test_a_position_no_draft_has_reached_reads_as_the_deepest_seen():
    """α at a draft position not reached yet is the deepest position's seen (not the prior,
    which would keep a drafter planned one token at a time from drafting deeper); the first
    observation there starts from it."""
    ctl = Controller([Named("eagle", True)], costs(LINEAR, {"eagle": 0.0}))
    st = ctl.estimates["eagle"]
    assert st.global_alpha(3) == PRIOR_ALPHA
    ctl.set_prior("eagle", [0.8])
    assert st.global_alpha(0) == st.global_alpha(5) == 0.8
    ctl.observe("r", "eagle", Draft([1, 2], None), accepted=2)  # both accepted
    first = 0.8 * (1 - GLOBAL_EMA) + GLOBAL_EMA  # position 0 learnt first, then 1 from it
    assert ctl.alpha("eagle") == pytest.approx([first, first * (1 - GLOBAL_EMA) + GLOBAL_EMA])


def test_an_offer_is_priced_at_what_the_engine_measured_it_cost():
    """A cheap drafter's own measurement can miss what its offers cost in the engine (the
    layer's read, its weights fetched after each target call): the offers' measured time
    beyond ms a token times tokens asked is learnt (`CostModel.observe_offer`), and an offer
    that paid on the request's average at its own price is no longer asked once it is known
    to cost more than it brings; a free-looking one stops being free."""
    eagle = Named("eagle", True)
    ctl = Controller([eagle], costs(LINEAR, {"eagle": 0.01}))
    ctl.set_prior("eagle", [0.5] * 15)
    ctl.plan("r", room=15, offers={})  # plain: the layer sits idle, asked on its average
    assert ctl.costs.offer_cost("eagle", 3) == pytest.approx(0.03)
    assert ctl.offer_stopper(eagle, "r", 3, Batch()) is None  # free: under 5% of 10 ms
    assert ctl.asks(eagle, "r", 3)
    for _ in range(50):
        ctl.costs.observe_offer("eagle", 3, 6.03)  # 6 ms an offer beyond its 0.01 a token
    assert ctl.costs.offer_ms["eagle"] == pytest.approx(6.0, rel=1e-3)
    assert ctl.costs.offer_cost("eagle", 3) == pytest.approx(6.03, rel=1e-3)
    assert ctl.offer_stopper(eagle, "r", 3, Batch()) is not None
    assert not ctl.asks(eagle, "r", 3)
    ctl.costs.observe_offer("eagle", 3, 0.0)  # never below nothing
    assert ctl.costs.offer_ms["eagle"] > 0
    again = CostModel.from_json(ctl.costs.to_json())
    assert again.offer_ms == ctl.costs.offer_ms


class SlowOffer(StubDrafter):
    """A cheap drafter whose offers take 8 ms the engine measures, whatever its own
    measurement says (0.01 ms a token)."""

    name, cheap, fingerprint = "slow", True, "slow"

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        time.sleep(0.008)
        return Draft([0] * k, None, [0.5] * k)

    def measure_cost(self):
        return 0.01, 0.0


def test_the_engine_learns_what_a_cheap_drafters_offers_cost():
    lm = ToyLM(vocab=12, seed=0, delay_ms=(4.0, 2.0))
    d = SlowOffer()
    ctl = Controller([d], costs({n: 4.0 + 2.0 * n for n in range(1, 17)}, {"slow": 0.01}))
    engine = Engine(lm, [d], k="auto", controller=ctl)
    res = engine.generate([1, 2, 3], SamplingParams(max_tokens=12))
    asked = [r.offers["slow"] for r in res.rounds if r.offers and "slow" in r.offers]
    assert asked  # its first offer is asked (it has drafted nothing yet)
    assert 7.0 < ctl.costs.offer_ms["slow"] < 40.0  # sleep(8 ms), less 0.01 ms a token


def test_a_costly_offer_is_asked_only_as_long_as_a_plan_would_take():
    """A free offer is asked in full; one paid for by the token is asked for the draft length
    the request's acceptance makes best, and one more; one not asked is 0 tokens long."""
    ngram, eagle = Named("ngram", True), Named("eagle", True)
    lengths = []
    for alpha in ([0.9] * 15, [0.5] * 15, [0.99] * 15):
        ctl = Controller([ngram, eagle], costs(LINEAR, {"ngram": 0.001, "eagle": 0.1}))
        assert ctl.offer_length(ngram, "r", 15) == 15
        ctl.set_prior("eagle", alpha)
        best, _ = brute_force(alpha, 0.1, CostCurve(dict(LINEAR)))
        lengths.append(ctl.offer_length(eagle, "r", 15))
        assert lengths[-1] == min(15, max(best, 1) + 1)
        assert ctl.offer_length(eagle, "r", 3) <= 3
    assert lengths[1] < lengths[0] < lengths[2] == 15
    ctl = Controller([ngram, eagle], costs(LINEAR, {"ngram": 0.001, "eagle": 0.1}))
    ctl.set_prior("eagle", [0.01] * 15)
    for _ in range(2):  # plain wins, the drafter sits idle: asked at probe gaps only
        ctl.plan("r", room=15, offers={})
    assert ctl.offer_length(eagle, "r", 15) == 0


def test_no_run_of_failures_locks_a_cheap_drafter_out():
    """Calibration forgets old outcomes, so a drafter that failed 1000 times is tried again
    once it starts being accepted (on other requests) — well before the successes outnumber
    the failures."""
    ctl = Controller([Named("ngram", True)], costs(BUMPY, {"ngram": 0.0}))
    ctl.set_prior("ngram", [0.3] * 8)
    for _ in range(1000):
        ctl.observe("old", "ngram", Draft([1], None, [0.8]), accepted=0)
    offer = {"ngram": [0.8] * 8}
    assert all(ctl.plan("r", room=8, offers=offer).drafter is None for _ in range(3 * PROBE_MAX))
    for _ in range(150):
        ctl.observe("other", "ngram", Draft([1], None, [0.8]), accepted=1)
    plans = [ctl.plan("r2", room=8, offers=offer) for _ in range(PROBE_MAX)]
    assert any(p.drafter is not None for p in plans)


class AlwaysWrong(StubDrafter):
    """A pathological drafter: proposes a token the target never picks."""

    name, cheap, fingerprint = "wrong", False, "wrong"

    def __init__(self, lm):
        self.lm = lm

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        best = int(np.argmax(self.lm.next_logits(context)))
        out = []
        for i in range(k):
            time.sleep(0.002)  # drafting costs something
            out.append((best + 1) % self.lm.vocab_size)
            if keep_going is not None and not keep_going([0.99] * (i + 1)):
                break
        return Draft(out, None, [0.99] * len(out))

    def measure_cost(self):
        return 1.0, 0.0


def test_an_always_rejected_drafter_is_dropped_within_a_few_rounds():
    lm = ToyLM(vocab=12, seed=0, delay_ms=(4.0, 2.0))  # verification is not free
    bad = AlwaysWrong(lm)
    ctl = Controller([bad], costs({n: 4.0 + 2.0 * n for n in range(1, 17)}, {"wrong": 2.0}))
    ctl.set_prior("wrong", [0.9] * 8)  # it starts out trusted
    res = Engine(lm, bad, k="auto", controller=ctl).generate([1, 2], SamplingParams(max_tokens=80))
    spec = [r.round for r in res.rounds if r.proposed > 0]
    assert spec[:1] == [1]  # round 0 is the prefill
    settled = [i for i in spec if i >= 4]
    assert len(settled) <= 3  # only occasional probes after the first rounds
    assert res.tokens == plain_decode(lm, [1, 2], SamplingParams(max_tokens=80))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_auto_engine_is_exact(temperature):
    target = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0))
    draft = TorchLM(tiny_llama(vocab=16, seed=3, sharpen=4.0))
    drafters = [NgramDrafter(), ModelDrafter(draft)]
    eng = Engine(
        target,
        drafters,
        k="auto",
        controller=Controller(drafters, measure_costs(target, drafters, max_tokens=8)),
    )
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=40)
    res = eng.generate(prompt, params)
    assert len(res.tokens) == 40
    assert all(r.decision for r in res.rounds[1:])  # round 0 is the prefill
    if temperature == 0.0:
        assert res.tokens == plain_decode(target, prompt, params)
    assert {r.drafter for r in res.rounds} <= {None, "ngram", "model"}


def test_expected_tokens():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == [1.0, 1.5, 1.75]


def test_fixed_k_rejects_several_drafters():
    lm = ToyLM()
    with pytest.raises(ValueError, match="use k='auto'"):
        Engine(lm, [NgramDrafter(), NgramDrafter()], k=2)
    with pytest.raises(ValueError, match="k = 'fast'"):
        Engine(lm, NgramDrafter(), k="fast")


def test_a_catch_up_is_paid_back_only_over_enough_tokens():
    model = costs(LINEAR, {"model": 1.0})
    model.catch_up_ms_per_token["model"] = 0.5
    ctl = Controller([Named("model", False)], model)
    ctl.set_prior("model", [0.95] * 8)
    lags = {"model": 400}  # 200 ms to catch up
    assert ctl.plan("short", room=8, lags=lags, remaining=10).drafter is None
    assert ctl.plan("long", room=8, lags=lags, remaining=2000).drafter is not None
    assert ctl.plan("fresh", room=8, lags={"model": 0}, remaining=10).drafter is not None


# Measured on this machine (qwen2.5-coder-1.5b Q4_K_M, llama.cpp, 2 threads, BENCHMARKS.md §4):
# one sequence by tokens, and passes over several sequences (sequences, tokens each).
SOLO = {1: 75.0, 2: 123.0, 3: 175.0, 4: 156.0, 5: 222.0, 6: 215.0, 7: 274.0, 8: 263.0}
SHARED = {(2, 1): 120.0, (2, 4): 251.0, (4, 1): 129.0, (4, 4): 361.0, (8, 1): 258.0}


class LlamaLike:
    """Stands in for a llama.cpp target whose sequences sit in the slots of their ids: only how
    it splits a call matters to the plan."""

    def passes(self, calls):
        return equal_passes(calls)


def shared_costs():
    return CostModel(CostCurve(dict(SOLO)), {"ngram": 0.0}, overhead_ms=0.0, batched=dict(SHARED))


def others(*tokens, start=1):
    """The rest of a batch, in consecutive slots from `start` (the planned request is in 0)."""
    return Batch(tuple(enumerate(tokens, start)), expected=float(len(tokens)))


BATCHES = [others(), others(1), others(1, 1, 1), others(5, 1, 1), others(*[1] * 7)]
BATCHES += [others(5, 5, 5), others(1, 1, start=2), others(1, 1, 1, start=5)]  # free slots


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("alpha", [0.95, 0.8, 0.5])
def test_a_batched_plan_is_priced_by_the_passes_its_call_runs_in(batch, alpha):
    model = shared_costs()
    ctl = Controller([Named("ngram", True)], model)
    ctl.bind(LlamaLike())
    ctl.set_prior("ngram", [alpha] * 8)
    plan = ctl.plan("r", room=7, batch=batch, offers={"ngram": [None] * 7})
    v = lambda calls: model.call_ms(equal_passes(calls))  # noqa: E731
    m, g = brute_force([alpha] * 7, 0.0, v, batch, equal_passes)
    assert plan.planned == m
    assert plan.expected_goodput == pytest.approx(g)


def test_a_draft_that_needs_a_pass_of_its_own_backs_off_where_one_pass_pricing_would_not():
    def plan(bound: bool, batch):
        ctl = Controller([Named("ngram", True)], shared_costs())
        if bound:
            ctl.bind(LlamaLike())
        ctl.set_prior("ngram", [0.95] * 8)
        return ctl.plan("r", room=4, batch=batch, offers={"ngram": [None] * 4})

    assert plan(True, others()).drafter is not None  # alone it pays
    assert plan(False, others(1, 1, 1)).drafter is not None  # priced as one pass of 8 tokens
    assert plan(True, others(1, 1, 1)).drafter is None  # 4x1 + 1x4 passes: plain is faster
    assert plan(True, others(5, 5, 5)).drafter is not None  # joining a 4x4 pass is cheap


def test_a_draft_is_not_planned_in_a_pass_of_its_own_beside_a_batch():
    model = shared_costs()
    ctl = Controller([Named("ngram", True)], model)
    ctl.bind(LlamaLike())
    ctl.set_prior("ngram", [0.95] * 8)
    v = lambda calls: model.call_ms(equal_passes(calls))  # noqa: E731
    m, _ = brute_force([0.95] * 4, 0.0, v, others(1))
    assert m > 0  # 2x1 + 1xm passes would pay as priced...
    plan = ctl.plan("r", room=4, batch=others(1), offers={"ngram": [None] * 4})
    assert plan.drafter is None  # ...but such passes cost more than priced: not planned
    plan = ctl.plan("r", room=4, batch=others(4), offers={"ngram": [None] * 4})
    assert plan.drafter is not None and plan.k_max == plan.planned == 3  # joins a 2x4 pass


def test_the_engine_learns_what_its_batched_calls_cost():
    class Split(ToyLM):
        def passes(self, calls):
            return equal_passes(calls)  # toy sequences 0, 1, ... as if in those slots

    lm = Split(vocab=12, seed=0, delay_ms=(2.0, 1.0))
    drafters = [NgramDrafter()]
    model = costs({n: 2.0 + n for n in range(1, 17)}, {"ngram": 0.0})
    eng = Engine(lm, drafters, k="auto", controller=Controller(drafters, model))
    params = SamplingParams(max_tokens=12)
    reqs = [eng.start([1, 2, 3], params), eng.start([4, 5, 6], params)]
    while not all(r.done for r in reqs):
        eng.step(reqs)
    assert (2, 1) in model.batched  # both decoded plainly in one pass at least once
    assert [eng.finish(r).tokens for r in reqs] == [
        plain_decode(lm, [1, 2, 3], params),
        plain_decode(lm, [4, 5, 6], params),
    ]


def test_in_a_batch_nothing_is_probed():
    ctl = Controller([Named("ngram", True)], shared_costs(), stake=None)  # probes not bounded
    ctl.bind(LlamaLike())
    ctl.set_prior("ngram", [0.2] * 8)  # on an average request, speculating does not pay
    alone = [ctl.plan("a", room=4, offers={"ngram": [0.9] * 4}) for _ in range(PROBE_FIRST)]
    assert any(p.probe for p in alone)
    crowded = [
        ctl.plan("b", room=4, batch=others(1, 1, 1), offers={"ngram": [0.9] * 4})
        for _ in range(4 * PROBE_MAX)
    ]
    assert all(p.drafter is None for p in crowded)


def test_batched_plans_count_only_what_plans_delivered():
    def joint(ctl):
        ctl.set_prior("ngram", [0.95] * 8)
        asks = [offered(ctl, "a", 0, [None] * 4), offered(ctl, "b", 1, [None] * 4)]
        return ctl.align(asks, [(0, 1), (1, 1)], 0.0)

    fresh = aligning()
    assert joint(fresh) is not None  # aligned, it pays as predicted
    burnt = aligning()
    for i in range(100):  # alone, its plans never come true
        burnt.set_prior("ngram", [0.95] * 8)
        plan = burnt.plan(f"r{i}", room=4, offers={"ngram": [None] * 4})
        assert plan.drafter is not None
        burnt.observe(f"r{i}", "ngram", Draft(list(range(plan.k_max)), None), accepted=0)
        burnt.forget(f"r{i}")
    assert joint(burnt) is None
    assert burnt.plan("alone", room=4, offers={"ngram": [None] * 4}).drafter is not None
    again = aligning()
    again.load_state(burnt.state())  # what was learnt is remembered
    assert joint(again) is None


ALIGNED = {(2, n): 120.0 + 10.0 * (n - 1) for n in range(1, 17)}  # one pass, cheap tokens


def aligning(shared=ALIGNED):
    ctl = Controller([Named("ngram", True), Named("model", False)], shared_costs())
    ctl.costs.batched = dict(shared)
    ctl.bind(LlamaLike())
    ctl.set_prior("ngram", [0.8] * 8)
    return ctl


def offered(ctl, rid, seq, offer, room=8, **kw):
    """A request planned on its own (the rest of the batch plain) as the engine offers it."""
    batch = Batch(((1 - seq, 1),), 1.0, 0.0, seq)
    plan = ctl.plan(rid, room, batch, {"ngram": offer}, **kw)
    return Offered(rid, seq, room, {"ngram": offer}, plan)


def test_a_batch_is_aligned_to_the_length_with_the_best_goodput_of_one_pass():
    ctl = aligning()
    asks = [offered(ctl, "a", 0, [None] * 6), offered(ctl, "b", 1, [])]
    assert [q.plan.drafter for q in asks] == [None, None]  # alone, a draft is a pass of its own
    joint = ctl.align(asks, [(0, 1), (1, 1)], 0.0)
    e = expected_tokens([0.8] * 6)
    g = [(e[n] + 1.0) / ctl.costs.pass_ms(2, 1 + n) for n in range(7)]
    best = max(range(1, 7), key=g.__getitem__)
    assert g[best] > MARGIN * g[0]
    assert joint is not None and joint.length == best
    assert joint.drafts == ((("ngram", best, pytest.approx(e[best]))), (None, 0, 1.0))
    assert joint.expected_goodput == pytest.approx(g[best])
    assert joint.plain_goodput == pytest.approx(g[0])


def test_a_batch_is_not_aligned_where_it_does_not_pay_or_cannot_be():
    dear = {(2, n): 120.0 * n for n in range(1, 17)}  # each token costs a plain step
    ctl = aligning(dear)
    asks = [offered(ctl, "a", 0, [None] * 6), offered(ctl, "b", 1, [])]
    assert ctl.align(asks, [(0, 1), (1, 1)], 0.0) is None
    ctl = aligning()
    a, b = offered(ctl, "a", 0, [None] * 6), offered(ctl, "b", 1, [])
    assert ctl.align([a], [(0, 1)], 0.0) is None  # alone
    assert ctl.align([a, replace(b, plan=None)], [(0, 1), (1, 1)], 0.0) is None  # k fixed
    drafting = replace(b.plan, drafter=ctl.drafters[1])
    assert ctl.align([a, replace(b, plan=drafting)], [(0, 1), (1, 3)], 0.0) is None
    assert ctl.align([a, replace(b, room=0)], [(0, 1), (1, 1)], 0.0) is None  # no room


def test_the_ceiling_of_an_alignment_bounds_it_and_changes_no_decision(monkeypatch):
    """`align` stops early where `ceiling` (every offered token accepted) cannot beat the bar;
    over random batches that must give the joint plan the full search gives."""
    rng = np.random.default_rng(7)
    cut = 0
    for case in range(300):
        b = int(rng.integers(2, 6))
        per_token = float(rng.uniform(2.0, 150.0))
        shared = {(b, n): 100.0 + per_token * (n - 1) for n in range(1, 17)}
        prior = [float(x) for x in rng.uniform(0.1, 0.95, 8)]
        ctls = []
        for _ in range(2):  # one stops at the ceiling, one searches in full
            ctl = Controller([Named("ngram", True), Named("model", False)], shared_costs())
            ctl.costs.batched = dict(shared)
            ctl.bind(LlamaLike())
            ctl.set_prior("ngram", prior)
            ctls.append(ctl)
        r = np.random.default_rng(case)  # the same offers for both controllers
        lengths = [int(r.integers(0, 9)) for _ in range(b)]
        confs = [
            [None if r.random() < 0.3 else float(r.random()) for _ in range(n)] for n in lengths
        ]
        asks = [
            [
                Offered(f"r{i}", i, 8, {"ngram": c}, Plan(None, 0, 0, 0.0, 0.0))
                for i, c in enumerate(confs)
            ]
            for _ in ctls
        ]
        calls = [(i, 1) for i in range(b)]
        quick = ctls[0].align(asks[0], calls, 0.0)
        cheap = [d for d in ctls[1].drafters if d.cheap]
        offered, costs = alignment.steps(asks[1], 8, 0.0, cheap, ctls[1].pricing)
        trust = max(ctls[1].estimates[d.name].hit_rate.factor() for d in cheap)
        ceiling = alignment.ceiling(b, offered, costs, trust)
        with monkeypatch.context() as m:
            m.setattr(alignment, "ceiling", lambda *a: math.inf)
            full = ctls[1].align(asks[1], calls, 0.0)
        assert quick == full
        if full is not None:
            assert full.expected_goodput <= ceiling * (1 + 1e-9)
        else:
            cut += ceiling <= MARGIN * b / ctls[1].pricing.step_ms(tuple(calls), 0.0)
    assert 30 < cut < 300  # the bound both decides cases and leaves some to the search


def test_an_aligned_batch_decodes_exactly_as_plain_decoding():
    class Split(ToyLM):
        def passes(self, calls):
            return equal_passes(calls)

        def forward(self, batch, last_only=False, rows=None, trees=None):
            out = super().forward(batch, last_only, rows, trees)
            self.asked.append(([len(t) for _, t in batch], rows))
            return out

    lm = Split(vocab=12, seed=1)
    lm.asked = []  # (tokens fed, logits rows asked for) by call
    drafters = [NgramDrafter()]
    model = CostModel(CostCurve(dict(SOLO)), {"ngram": 0.0}, 0.0, batched=dict(ALIGNED))
    ctl = Controller(drafters, model)
    ctl.set_prior("ngram", [0.9] * 8)
    eng = Engine(lm, drafters, k="auto", controller=ctl)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7]]
    params = SamplingParams(max_tokens=24)
    reqs = [eng.start(p, params) for p in prompts]
    while not all(r.done for r in reqs):
        eng.step(reqs)
    rounds = [rt for r in reqs for rt in r.rounds]
    assert any(rt.padded > 0 for rt in rounds)
    assert any(rt.proposed > 0 and rt.decision.startswith("aligned") for rt in rounds)
    assert all(rt.emitted <= rt.accepted + 1 for rt in rounds)
    # filler is fed but its logits are not asked for
    padded = [(fed, rows) for fed, rows in lm.asked if rows is not None]
    assert padded and all(
        len(set(fed)) == 1 and any(r < f for f, r in zip(fed, rows, strict=True))
        for fed, rows in padded
    )
    assert all(rows is None for fed, rows in lm.asked if len(set(fed)) > 1)
    assert [eng.finish(r).tokens for r in reqs] == [plain_decode(lm, p, params) for p in prompts]


def test_planning_backs_off_in_batches_where_no_draft_paid():
    ctl = Controller([Named("ngram", True)], shared_costs())
    ctl.bind(LlamaLike())
    four, two = [(i, 1) for i in range(4)], [(0, 1), (1, 1)]
    plain4 = ctl.costs.call_ms(equal_passes(four))

    def run(steps, drafted=None):
        """Which of `steps` steps of 4 are planned; each planned one plain, or drafted as
        (tokens fed each, tokens out, target call ms)."""
        out = []
        for _ in range(steps):
            skip = ctl.unplanned(four)
            out.append(skip is None)
            if skip is None:
                n, tokens, ms = drafted or (1, 4, plain4)
                ctl.planned([(q, n) for q, _ in four], tokens, 0.5, ms)
            else:
                assert skip.drafter is None and skip.k_max == 0 and "no draft paid" in skip.reason
                assert skip.plain_goodput == pytest.approx(4 / plain4)
        return out

    assert all(run(PLAN_PATIENCE))
    gaps, last = [], -1
    for i, planned in enumerate(run(40 * PLAN_GAP_MAX)):
        if planned:
            gaps.append(i - last)
            last = i
    assert gaps[:2] == [2, 4] and set(gaps[2:]) == {PLAN_GAP_MAX}
    assert all(ctl.unplanned(two) is None for _ in range(3 * PLAN_PATIENCE))  # by batch size
    assert ctl.unplanned([(0, 1)]) is None
    ctl.planned([(0, 5)], 1, 0.5, 1e6)  # alone, nothing is learnt: requests alone always plan
    while ctl.unplanned(four) is not None:
        pass
    run(1, drafted=(2, 5, 1.5 * plain4))  # drafted, and the 1 token it won cost more than it
    assert not all(run(2 * PLAN_GAP_MAX))  # ... so planning stays backed off
    while ctl.unplanned(four) is not None:
        pass
    run(1, drafted=(2, 7, 1.5 * plain4))  # 7 tokens for 1.5 plain steps: paid
    assert all(run(PLAN_PATIENCE))  # every step planned again


@pytest.mark.parametrize("shared", ["dear", "aligned"])
def test_planning_backs_off_where_it_does_not_pay_and_the_output_stays_exact(shared):
    class Split(ToyLM):
        def passes(self, calls):
            return equal_passes(calls)

    class Counting(NgramDrafter):
        def propose(self, *a, **kw):
            self.calls += 1
            return super().propose(*a, **kw)

    lm = Split(vocab=12, seed=1, context_length=512)
    ngram = Counting()
    ngram.calls = 0
    batched = ALIGNED if shared == "aligned" else {(2, n): 120.0 * n for n in range(1, 17)}
    model = CostModel(CostCurve(dict(SOLO)), {"ngram": 0.0}, 0.0, batched=dict(batched))
    ctl = Controller([ngram], model)
    ctl.set_prior("ngram", [0.9] * 8)
    eng = Engine(lm, [ngram], k="auto", controller=ctl)
    params = SamplingParams(max_tokens=3 * PLAN_PATIENCE)
    warm = SamplingParams(max_tokens=30)  # prompts that already hold their greedy cycles
    prompts = [[*p, *plain_decode(lm, p, warm)] for p in ([1, 2, 3], [4, 5, 6, 7])]
    reqs = [eng.start(p, params) for p in prompts]
    while not all(r.done for r in reqs):
        eng.step(reqs)
    rounds = [rt for rt in reqs[0].rounds if rt.batch_size == 2]
    unplanned = [rt for rt in rounds if rt.decision.startswith("plain: in batches of 2")]
    if shared == "dear":  # a draft never pays: after the patience, most steps are not planned
        assert not any(rt.proposed for rt in rounds)
        assert len(unplanned) > len(rounds) // 2
        assert ngram.calls < 2 * len(rounds) - len(unplanned)  # not asked in those steps
    else:  # drafts pay all along: every step is planned
        assert sum(rt.proposed > 0 for rt in rounds) > 10 and not unplanned
    assert [eng.finish(r).tokens for r in reqs] == [plain_decode(lm, p, params) for p in prompts]


def test_an_engine_is_built_in_milliseconds_without_touching_the_disk(tmp_path, monkeypatch):
    """Calibration and learnt averages are read and written by `Controller.calibrated` and
    `save` (the CLI and server call them); `Engine(...)` itself creates no file."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    lm = ToyLM(vocab=12, seed=1)
    drafters = [NgramDrafter()]
    ctl = Controller(drafters, costs({1: 10.0, 2: 11.0}, {"ngram": 0.01}))
    t = time.perf_counter()
    Engine(lm, NgramDrafter(), k=4)
    Engine(lm, drafters, k="auto", controller=ctl)
    assert time.perf_counter() - t < 0.05
    assert not list(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match="k='auto' needs a controller"):
        Engine(lm, drafters, k="auto")

    first = Controller.calibrated(lm, drafters)  # measures, and keeps the measurement
    assert len(list((tmp_path / "costs").iterdir())) == 2  # the target's calls, the drafters
    eng = Engine(lm, drafters, k="auto", controller=first)
    eng.generate([1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=40))
    assert not (tmp_path / "controller").exists()  # nothing written while serving
    first.save()
    again = Controller.calibrated(lm, drafters)
    learnt = again.state()["ngram"]["calibrations"]
    assert again.state() == first.state() and any(any(seen) for _, seen in learnt)


def test_a_catch_up_round_is_not_taken_for_the_cost_of_drafting():
    """A model drafter first picked after a long prompt feeds the whole prompt before it
    drafts (its `lag`); that round's time is not its cost per drafted token."""
    draft = ToyLM(vocab=12, seed=1, delay_ms=(0.0, 5.0))  # 5 ms per token fed
    drafters = [ModelDrafter(draft)]
    ctl = Controller(drafters, costs({n: 100.0 + n for n in range(1, 17)}, {"model": 1.0}))
    ctl.set_prior("model", [0.95] * 8)
    eng = Engine(ToyLM(vocab=12, seed=1), drafters, k="auto", controller=ctl)
    res = eng.generate(list(range(12)) * 5, SamplingParams(max_tokens=6))
    assert [r.drafter for r in res.rounds] == [None, "model"]  # the model drafted, once
    assert res.rounds[1].draft_ms > 5.0 * 55  # it caught up on the prompt first
    assert ctl.costs.draft_ms_per_token["model"] == 1.0  # and that was not taken as its cost
