"""The cascade drafter (`drafters.cascade`): the draft model guided by cheap drafters drafts
exactly what it drafts alone (tokens, q, random draws), for guesses right, partly right, wrong
or absent, with fewer draft-model calls where the guess is right; greedy output equals plain
decoding; sampled output keeps the target's distribution, and a cascade that trusts its guess
instead of the draft model breaks both checks."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends.curves import CostCurve
from specwise.controller import Controller
from specwise.costs import CostModel
from specwise.drafters import CascadeDrafter, Draft, ModelDrafter, make_drafters
from specwise.oracle import plain_decode
from specwise.sampling import Sampler
from test_distribution import PARAMS, PROMPT, chi2_pvalue, exact_joint, sampled_counts
from toy import StubDrafter, ToyLM


class Guide(StubDrafter):
    """A cheap drafter that offers a fixed guess (a function of the context)."""

    name = "guide"

    def __init__(self, guess):
        self.guess = guess

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        return Draft(list(self.guess(context))[:k], None)


def greedy_path(lm: ToyLM, context, n):
    """The draft model's own greedy continuation of `context`, n tokens."""
    out = list(context)
    for _ in range(n):
        out.append(int(np.argmax(lm.next_logits(out))))
    return out[len(context) :]


GUESSES = {
    "right": lambda draft: lambda ctx: greedy_path(draft, ctx, 6),
    "first two right": lambda draft: lambda ctx: [*greedy_path(draft, ctx, 2), 11, 11, 11],
    "wrong": lambda draft: lambda ctx: [(t + 1) % 12 for t in greedy_path(draft, ctx, 4)],
    "none": lambda draft: lambda ctx: [],
}


@pytest.mark.parametrize("guess", list(GUESSES))
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0)])
def test_the_cascade_drafts_what_the_draft_model_drafts_alone(guess, params):
    alone_lm, guided_lm = ToyLM(vocab=12, seed=2), ToyLM(vocab=12, seed=2)
    alone = ModelDrafter(alone_lm)
    guided = CascadeDrafter(guided_lm, guides=[Guide(GUESSES[guess](guided_lm))])
    target = ToyLM(vocab=12, seed=1)
    for d in (alone, guided):
        d.bind(target)
        d.begin(0, PROMPT)
    s1, s2 = Sampler(7), Sampler(7)
    context = list(PROMPT)
    for accepted in (4, 1, 0, 3, 4):  # rounds: all, some, none of the draft kept
        a = alone.propose(0, context, 4, params, s1)
        b = guided.propose(0, context, 4, params, s2)
        assert a.tokens == b.tokens and a.confidence == b.confidence
        assert (a.probs is None) == (b.probs is None)
        if a.probs is not None:
            assert np.array_equal(a.probs, b.probs)
        assert s1.state() == s2.state()  # the same random draws
        emitted = [*a.tokens[:accepted], (context[-1] + 3) % 12]
        context += emitted
        alone.commit(0, accepted, emitted)
        guided.commit(0, accepted, emitted)
        # a cache only ever holds committed tokens and the drafts of the round
        assert guided_lm.caches[0] == context[: len(guided_lm.caches[0])]


def test_a_right_guess_saves_draft_model_calls():
    calls = {}
    for guess in ("right", "none"):
        lm = ToyLM(vocab=12, seed=2)
        d = CascadeDrafter(lm, guides=[Guide(GUESSES[guess](lm))])
        d.bind(ToyLM(vocab=12, seed=1))
        d.begin(0, PROMPT)
        before = lm.calls
        d.propose(0, PROMPT, 5, SamplingParams(), Sampler(0))
        calls[guess] = lm.calls - before
    assert calls == {"right": 1, "none": 5}


@pytest.mark.parametrize("k", [2, 4, 8])
def test_greedy_cascade_equals_plain(k):
    target = ToyLM(vocab=12, seed=1)
    draft = ToyLM(vocab=12, seed=2)
    params = SamplingParams(max_tokens=40)
    want = plain_decode(target, PROMPT, params)
    assert (
        Engine(target, make_drafters(["cascade"], draft), k=k).generate(PROMPT, params).tokens
        == want
    )
    drafters = make_drafters(["cascade", "model"], draft)  # the cascade's own n-gram guide
    costs = CostModel(CostCurve({n: 10.0 + n for n in range(1, 17)}), {"cascade": 1, "model": 1})
    auto = Engine(target, drafters, k="auto", controller=Controller(drafters, costs))
    res = auto.generate(PROMPT, params)
    assert res.tokens == want
    assert any(r.drafter == "cascade" for r in res.rounds)


def test_the_cascade_shares_the_model_drafters_caches_and_the_engines_guides():
    ngram, suffix, model, cascade = make_drafters(
        ["ngram", "suffix", "model", "cascade"], ToyLM(vocab=12, seed=2)
    )
    assert cascade.model is model and cascade.guides == [ngram, suffix]


def _trusting(self, seq, context, k, params, sampler, keep_going=None):
    """A broken cascade: the guess's tokens, with the draft model's q, as if it had drawn them."""
    draft = self.model.propose(seq, context, k, params, sampler, keep_going)
    guess = self.guess(seq, context, len(draft.tokens), params)
    tokens = [*guess, *draft.tokens[len(guess) :]]
    return Draft(tokens, draft.probs, draft.confidence)


@pytest.mark.parametrize("broken", [False, True])
def test_sampled_cascade_distribution(broken, monkeypatch):
    if broken:
        monkeypatch.setattr(CascadeDrafter, "propose", _trusting)
    target, draft = ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    guide = Guide(lambda ctx: [ctx[-1], (ctx[-1] + 1) % 12])  # sometimes the draft's pick
    engine = Engine(target, CascadeDrafter(draft, guides=[guide]), k=3)
    params = PARAMS["T=1"]
    n = 6000
    p = chi2_pvalue(
        sampled_counts(engine, PROMPT, params, n), exact_joint(target, PROMPT, params), n
    )
    assert p < 1e-6 if broken else p > 1e-3, p


def test_a_cascade_that_trusts_its_guess_fails_the_equality_check(monkeypatch):
    monkeypatch.setattr(CascadeDrafter, "propose", _trusting)
    lm = ToyLM(vocab=12, seed=2)
    alone = ModelDrafter(ToyLM(vocab=12, seed=2))
    guided = CascadeDrafter(lm, guides=[Guide(GUESSES["wrong"](lm))])
    for d in (alone, guided):
        d.bind(ToyLM(vocab=12, seed=1))
        d.begin(0, PROMPT)
    greedy = SamplingParams()
    assert (
        alone.propose(0, PROMPT, 4, greedy, Sampler(0)).tokens
        != guided.propose(0, PROMPT, 4, greedy, Sampler(0)).tokens
    )


def test_a_guess_is_fed_only_as_far_as_it_is_expected_to_pay():
    d = CascadeDrafter(ToyLM(vocab=12, seed=2), guides=[Guide(lambda ctx: [])])
    assert d.worth(0, 3) == 3  # nothing timed yet: feed the whole guess
    d.ms, d.hits = {"step": 10.0, "row": 6.0}, {0: 0.9, 1: 0.7, 2: 0.5}
    assert d.worth(0, 3) == 2  # 0.9 and 0.7 of a 10 ms step beat a 6 ms row; 0.5 does not
    assert d.worth(0, 1) == 1 and d.worth(0, 0) == 0


@pytest.mark.parametrize("guess", ["right", "wrong"])
def test_the_cascade_learns_its_guides_and_its_draft_models_costs(guess):
    """A draft model whose forward costs 4 ms + 8 ms a token: a step 12 ms, a row 8 ms (long
    enough that a busy machine's late wake-ups, ~1 ms, stay within the tolerance). A right
    guess keeps being fed (one call a round); a wrong one soon is not (the draft model's calls
    are then its one-token steps alone), its steps and rows timed on the way."""
    lm = ToyLM(vocab=12, seed=2, delay_ms=(4.0, 8.0))
    d = CascadeDrafter(lm, guides=[Guide(GUESSES[guess](lm))])
    d.bind(ToyLM(vocab=12, seed=1))
    d.begin(0, PROMPT)
    context = list(PROMPT)
    for _ in range(12):
        draft = d.propose(0, context, 4, SamplingParams(), Sampler(0))
        emitted = [*draft.tokens, (context[-1] + 5) % 12]
        context += emitted
        d.commit(0, len(draft.tokens), emitted)
    before = lm.calls
    d.propose(0, context, 4, SamplingParams(), Sampler(0))
    if guess == "right":  # every row came from the guess: no step timed, so it feeds them all
        assert d.hits[0] > 0.99 and lm.calls - before == 1
    else:
        assert d.ms["step"] == pytest.approx(12.0, abs=3.0)
        assert d.ms["row"] == pytest.approx(8.0, abs=3.0)
        assert d.hits[0] < 0.3 and d.worth(0, 3) == 0 and lm.calls - before == 4
