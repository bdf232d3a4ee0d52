"""Log-probabilities reported with emitted tokens: the model's own distribution at each
position, the same whether a token came from plain decoding, an accepted draft, a recovered
token, a bonus token or a tree's kept path."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.drafters import NgramDrafter
from specwise.sampling import TokenLogprob, token_logprobs
from test_trees import RandomTrees
from toy import ToyLM


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def test_token_logprobs_are_the_log_softmax_and_its_most_likely_tokens_ties_by_id():
    logits = np.array([[0.0, 2.0, 1.0, 2.0, -1.0], [5.0, 5.0, 5.0, 5.0, 5.0]], np.float32)
    got = token_logprobs(logits, [2, 4], top=3)
    lp0, lp1 = log_softmax(logits[0]), log_softmax(logits[1])
    assert got[0] == TokenLogprob(2, pytest.approx(lp0[2]), got[0].top)
    assert [i for i, _ in got[0].top] == [1, 3, 2]  # 1 and 3 tie: lower id first
    assert [v for _, v in got[0].top] == pytest.approx([lp0[1], lp0[3], lp0[2]])
    assert [i for i, _ in got[1].top] == [0, 1, 2] and got[1].logprob == pytest.approx(lp1[4])
    assert np.exp(lp1[4]) == pytest.approx(0.2)
    assert token_logprobs(logits, [0, 0], top=0)[0].top == ()
    assert len(token_logprobs(logits, [0, 0], top=20)[1].top) == 5  # no more than the vocabulary


def test_logprobs_are_validated():
    assert SamplingParams(logprobs=0).logprobs == 0
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match=r"SamplingParams\.logprobs"):
            SamplingParams(logprobs=bad)


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8], [1, 1, 1, 1]]


@pytest.mark.parametrize("drafter", ["plain", "ngram", "trees"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_emitted_token_reports_the_models_distribution_at_its_position(drafter, temperature):
    kept = 0
    for seed, prompt in enumerate(PROMPTS):
        target = ToyLM(vocab=10, seed=seed, scale=3.0, eos=(9,) if seed == 0 else ())
        d = {"plain": None, "ngram": NgramDrafter(), "trees": RandomTrees(10, seed)}[drafter]
        params = SamplingParams(temperature=temperature, seed=seed, max_tokens=23, logprobs=3)
        res = Engine(target, d, k=4).generate(prompt, params)
        assert len(res.logprobs) == len(res.tokens)  # cut where EOS or max_tokens cut
        context = list(prompt)
        for t, lp in zip(res.tokens, res.logprobs, strict=True):
            want = log_softmax(target.next_logits(context))
            assert lp.token == t and lp.logprob == pytest.approx(want[t])
            assert [i for i, _ in lp.top] == sorted(range(10), key=lambda i: (-want[i], i))[:3]
            context.append(t)
        kept += sum(r.accepted for r in res.rounds)
    assert (kept > 0) == (drafter != "plain")  # drafts were kept along the way


def test_no_logprobs_unless_asked():
    res = Engine(ToyLM(vocab=10), NgramDrafter(), k=4).generate([1, 2, 1, 2], SamplingParams())
    assert res.logprobs is None
