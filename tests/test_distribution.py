"""End to end: the joint distribution of emitted tokens over thousands of seeded runs matches
the target's exact distribution (chi-square at a fixed seed), and the same test catches a
deliberately broken acceptance rule. The first token comes from the prefill (round 0), so the
window tested is the first three tokens: tokens 2 and 3 come out of one speculative round."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import chisquare

import specwise.engine
from specwise import Engine, SamplingParams
from specwise.backends.torch_hf import TorchLM
from specwise.drafters import ModelDrafter, NgramDrafter, make_drafters
from specwise.sampling import warp
from specwise.verify import Verdict
from toy import ToyLM, cross_pair, tiny_llama

WINDOW = slice(0, 3)  # tokens 1 to 3
MAX_TOKENS = 4  # so round 1 may propose 2 tokens


def exact_joint(lm, prompt, params):
    """P(tokens 1, 2 and 3), enumerated from the target alone."""

    def next_probs(ctx):
        seq = 10_000_000 + len(ctx)
        try:
            row = lm.forward([(seq, ctx)], last_only=True)[0][-1]
        finally:
            lm.release(seq)
        return warp(row, params)

    joint: dict[tuple[int, int, int], float] = {}
    p1 = next_probs(list(prompt))
    for a in np.flatnonzero(p1 > 0):
        p2 = next_probs([*prompt, int(a)])
        for b in np.flatnonzero(p2 > 0):
            p3 = next_probs([*prompt, int(a), int(b)])
            for c in np.flatnonzero(p3 > 0):
                joint[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    return joint


def sampled_counts(engine, prompt, params, n):
    counts = {}
    for seed in range(n):
        res = engine.generate(prompt, replace(params, seed=seed, max_tokens=MAX_TOKENS))
        key = tuple(res.tokens[WINDOW])
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi2_pvalue(counts, joint, n):
    cells = sorted(joint, key=lambda c: -joint[c])
    big = [c for c in cells if joint[c] * n >= 5]
    small = [c for c in cells if joint[c] * n < 5]
    obs = [counts.get(c, 0) for c in big]
    exp = [joint[c] * n for c in big]
    if small:
        obs.append(sum(counts.get(c, 0) for c in small))
        exp.append(sum(joint[c] for c in small) * n)
    outside = sum(v for c, v in counts.items() if c not in joint)
    assert outside == 0, f"{outside} samples outside the target's support"
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return chisquare(obs, exp).pvalue


PARAMS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.7,top_k=5": SamplingParams(temperature=0.7, top_k=5),
    "top_p=0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "T=1.5,min_p=0.1": SamplingParams(temperature=1.5, min_p=0.1),
}
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


@pytest.mark.parametrize("name", list(PARAMS))
def test_model_drafter_distribution(name):
    target, draft = ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    engine = Engine(target, ModelDrafter(draft), k=3)
    params = PARAMS[name]
    n = 6000
    p = chi2_pvalue(
        sampled_counts(engine, PROMPT, params, n), exact_joint(target, PROMPT, params), n
    )
    assert p > 1e-3, p


@pytest.mark.parametrize("drafter", ["model", "model-text"])
@pytest.mark.parametrize("name", ["T=1", "top_p=0.8"])
def test_a_draft_model_with_another_tokenizer_distribution(name, drafter, monkeypatch, tmp_path):
    """TLI (model: the draft restricted to the tokens both vocabularies share) and the draft's
    text re-tokenized (model-text); tests/test_vocab_map.py enumerates one round exactly, this
    runs whole requests through the engine."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target, draft = cross_pair()
    engine = Engine(target, make_drafters([drafter], draft), k=3)
    params = PARAMS[name]
    prompt = [7, 1, 2, 4, 3, 1, 4, 2]
    n = 6000
    counts = sampled_counts(engine, prompt, params, n)
    assert chi2_pvalue(counts, exact_joint(target, prompt, params), n) > 1e-3


def test_ngram_point_mass_distribution():
    target = ToyLM(vocab=12, seed=4)
    params = SamplingParams(temperature=0.8)
    prompt = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]  # repeats, so n-gram drafts are proposed
    engine = Engine(target, NgramDrafter(), k=3)
    n = 6000
    counts = sampled_counts(engine, prompt, params, n)
    assert chi2_pvalue(counts, exact_joint(target, prompt, params), n) > 1e-3


def test_torch_models_distribution():
    target = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=3.0))
    draft = TorchLM(tiny_llama(vocab=16, seed=5, sharpen=3.0))
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.9)  # a support chi-square can see
    engine = Engine(target, ModelDrafter(draft), k=2)
    n = 1500
    counts = sampled_counts(engine, PROMPT, params, n)
    assert chi2_pvalue(counts, exact_joint(target, PROMPT, params), n) > 1e-3


def test_the_same_check_detects_a_broken_rule(monkeypatch):
    def accept_all(draft, q, p, sampler):
        return Verdict(len(draft), [*draft, sampler.categorical(p[len(draft)])], bonus=True)

    monkeypatch.setattr(specwise.engine, "rejection_sample", accept_all)
    target, draft = ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    engine = Engine(target, ModelDrafter(draft), k=3)
    params = PARAMS["T=1"]
    n = 6000
    p = chi2_pvalue(
        sampled_counts(engine, PROMPT, params, n), exact_joint(target, PROMPT, params), n
    )
    assert p < 1e-6, p


def test_cells_cover_the_joint():
    target = ToyLM(vocab=12, seed=1)
    joint = exact_joint(target, PROMPT, PARAMS["T=0.7,top_k=5"])
    assert abs(sum(joint.values()) - 1) < 1e-9
    assert all(len(c) == 3 for c in itertools.islice(joint, 3))


def test_auto_controller_distribution():
    """The controller's choices depend only on the past, so the output stays the target's."""
    from specwise.backends.curves import CostCurve
    from specwise.controller import Controller
    from specwise.costs import CostModel

    target, draft = ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    drafters = [NgramDrafter(), ModelDrafter(draft)]
    costs = CostModel(CostCurve({n: 10.0 + n for n in range(1, 17)}), {"ngram": 0.0, "model": 1.0})
    engine = Engine(target, drafters, k="auto", controller=Controller(drafters, costs))
    params = SamplingParams(temperature=1.0, top_k=6)
    n = 6000
    counts = sampled_counts(engine, PROMPT, params, n)
    assert chi2_pvalue(counts, exact_joint(target, PROMPT, params), n) > 1e-3


def test_aligned_batch_distribution():
    """A batch aligned to one length (drafts padded with filler the engine never verifies)
    still emits the target's distribution (the request beside it brings filler wherever it
    has no n-gram offer of that length)."""
    from specwise.backends.curves import CostCurve
    from specwise.backends.llama_cpp import equal_passes
    from specwise.controller import Controller
    from specwise.costs import CostModel

    class Split(ToyLM):
        def passes(self, calls):
            return equal_passes(calls)

    target = Split(vocab=12, seed=4)
    params = SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS)
    prompt, other = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8], [5, 3, 9]
    n, aligned, counts = 6000, 0, {}
    for seed in range(n):
        drafters = [NgramDrafter()]
        costs = CostModel(
            CostCurve({m: 10.0 * m for m in range(1, 17)}),  # alone, a draft does not pay
            {"ngram": 0.0},
            batched={(2, m): 12.0 + m for m in range(1, 17)},  # one aligned pass is cheap
        )
        ctl = Controller(drafters, costs)
        ctl.set_prior("ngram", [0.9] * 8)
        engine = Engine(target, drafters, k="auto", controller=ctl)
        reqs = [
            engine.start(prompt, replace(params, seed=seed)),
            engine.start(other, replace(params, seed=n + seed)),
        ]
        while not all(r.done for r in reqs):
            engine.step(reqs)
        aligned += any(rt.padded for r in reqs for rt in r.rounds)
        key = tuple(engine.finish(reqs[0]).tokens[WINDOW])
        engine.finish(reqs[1])
        counts[key] = counts.get(key, 0) + 1
    assert aligned > n // 2, aligned
    assert chi2_pvalue(counts, exact_joint(target, prompt, params), n) > 1e-3
