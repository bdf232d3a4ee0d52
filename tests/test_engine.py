"""The round loop on tiny models: greedy equality, reproducibility, edges, cache invariants."""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends.torch_hf import TorchLM
from specwise.drafters import Draft, ModelDrafter, NgramDrafter, SuffixDrafter
from specwise.oracle import plain_decode
from toy import ToyLM, tiny_llama

PROMPT = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]


@pytest.fixture(scope="module")
def target():
    return TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0))


@pytest.fixture(scope="module")
def unrelated():
    return TorchLM(tiny_llama(vocab=16, seed=123, sharpen=4.0))


def drafter_for(kind, target, unrelated):
    if kind == "same":
        return ModelDrafter(TorchLM(target.model))  # same weights, own caches
    if kind == "unrelated":
        return ModelDrafter(unrelated)
    return SuffixDrafter() if kind == "suffix" else NgramDrafter()


@pytest.mark.parametrize("kind", ["same", "unrelated", "ngram", "suffix"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_equals_plain(target, unrelated, kind, k):
    params = SamplingParams(max_tokens=40)
    want = plain_decode(target, PROMPT, params)
    eng = Engine(target, drafter_for(kind, target, unrelated), k=k)
    res = eng.generate(PROMPT, params)
    assert res.tokens == want
    assert res.finish_reason == "length"
    s = res.summary
    assert s.emitted == 40 and s.accepted <= s.proposed
    if kind == "same":
        assert s.acceptance_rate == 1.0  # the target drafting for itself is always right
    assert not target._caches and target.in_use() == 0  # finish released every cache


def test_stream_yields_the_rounds_in_order(target):
    eng = Engine(target, NgramDrafter(), k=4)
    chunks = list(eng.stream(PROMPT, SamplingParams(max_tokens=30)))
    assert functools.reduce(operator.iadd, chunks, []) == plain_decode(
        target, PROMPT, SamplingParams(max_tokens=30)
    )
    assert all(chunks)


def test_seed_reproducibility_and_k0_is_plain_decoding(target, unrelated):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=30)
    plain = plain_decode(target, PROMPT, params)
    assert Engine(target).generate(PROMPT, params).tokens == plain
    assert Engine(target, ModelDrafter(unrelated), k=0).generate(PROMPT, params).tokens == plain
    eng = Engine(target, ModelDrafter(unrelated), k=3)
    a = eng.generate(PROMPT, params).tokens
    b = eng.generate(PROMPT, params).tokens
    assert a == b
    other = [
        eng.generate(PROMPT, SamplingParams(temperature=1.0, seed=s, max_tokens=30)).tokens
        for s in (1, 2, 3)
    ]
    assert any(o != a for o in other)


class FixedDrafter:
    """Proposes a scripted continuation, to put EOS / stop / max_tokens inside a draft."""

    name = "fixed"
    cheap = False
    fingerprint = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens
        self.n_prompt = 0

    def bind(self, target):
        pass

    def begin(self, seq, prompt, tenant=None):
        self.n_prompt = len(prompt)

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        done = len(context) - self.n_prompt  # tokens emitted so far (round 0 gave the first)
        return Draft(self.tokens[done : done + k], None)

    def lag(self, seq, context):
        return 0

    def commit(self, seq, accepted, emitted):
        pass

    def end(self, seq):
        pass


def greedy_continuation(lm, prompt, n):
    return plain_decode(lm, prompt, SamplingParams(max_tokens=n))


def test_eos_inside_a_draft_stops_there():
    plain_lm = ToyLM(vocab=12, seed=3)
    cont = greedy_continuation(plain_lm, [1, 2], 6)
    eos = cont[2]
    lm = ToyLM(vocab=12, seed=3, eos=[eos])
    first = cont.index(eos)
    res = Engine(lm, FixedDrafter(cont), k=6).generate([1, 2], SamplingParams(max_tokens=50))
    assert res.tokens == cont[: first + 1]
    assert res.finish_reason == "stop"
    if first > 0:  # round 0 (the prefill) gave cont[0]; round 1 drafted the rest
        assert len(res.rounds) == 2 and res.rounds[1].emitted == first


def test_max_tokens_inside_a_draft():
    lm = ToyLM(vocab=12, seed=4)
    cont = greedy_continuation(lm, [3, 4], 10)
    eng = Engine(lm, FixedDrafter(cont), k=8)
    res = eng.generate([3, 4], SamplingParams(max_tokens=5))
    assert res.tokens == cont[:5] and res.finish_reason == "length"
    assert res.rounds[1].proposed == 3  # k is clipped so no round can overshoot


def test_every_draft_accepted_gives_a_bonus_and_empty_draft_is_plain():
    lm = ToyLM(vocab=12, seed=5)
    cont = greedy_continuation(lm, [3, 4], 12)
    res = Engine(lm, FixedDrafter(cont), k=3).generate([3, 4], SamplingParams(max_tokens=5))
    r0, r1 = res.rounds
    assert (r0.proposed, r0.emitted) == (0, 1)  # round 0: the prefill's token
    got = (r1.proposed, r1.accepted, r1.bonus, r1.rejection_position, r1.emitted)
    assert got == (3, 3, True, None, 4)
    res = Engine(lm, FixedDrafter([]), k=3).generate([3, 4], SamplingParams(max_tokens=3))
    assert res.tokens == cont[:3]
    assert all(r.proposed == 0 and r.emitted == 1 and r.drafter is None for r in res.rounds)


def test_cache_invariant_after_each_round():
    lm, dlm = ToyLM(vocab=12, seed=6), ToyLM(vocab=12, seed=7)
    drafter = ModelDrafter(dlm)
    eng = Engine(lm, drafter, k=4)
    req = eng.start([1, 2, 3], SamplingParams(temperature=1.0, seed=0, max_tokens=40))
    while not req.done:
        eng.step([req])
        committed = req.context
        assert lm.caches[req.seq] == committed[:-1]
        d = dlm.caches.get(req.seq, [])
        assert d == committed[: len(d)]  # the drafter's cache is a prefix of the committed
    eng.finish(req)
    assert req.seq not in lm.caches and req.seq not in dlm.caches


def test_stop_string_inside_a_draft():
    class CharTok:
        eos_token_ids = frozenset()
        n_tokens = 12

        def decode(self, ids):
            return "".join("abcdefghijkl"[i] for i in ids)

        def encode(self, text, add_special=True):
            return ["abcdefghijkl".index(c) for c in text]

        def render_chat(self, messages):
            raise NotImplementedError

        def token_text(self, i):
            return "abcdefghijkl"[i]

    lm = ToyLM(vocab=12, seed=8)
    lm.tokenizer = CharTok()
    cont = greedy_continuation(lm, [0, 1], 8)
    text = lm.tokenizer.decode(cont)
    stop = text[3:5]
    cut = text.find(stop)
    res = Engine(lm, FixedDrafter(cont), k=8).generate(
        [0, 1], SamplingParams(max_tokens=20, stop=[stop])
    )
    assert res.finish_reason == "stop"
    assert res.text == text[:cut]
    assert res.tokens == cont[: cut + len(stop)]


def test_torch_rows_returns_the_first_logits_and_feeds_the_rest():
    lm = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0))
    full = lm.forward([(0, PROMPT[:6]), (1, PROMPT[6:])])
    lm.truncate(0, 0)
    lm.truncate(1, 0)
    part = lm.forward([(0, PROMPT[:6]), (1, PROMPT[6:])], rows=[2, 4])
    assert [x.shape[0] for x in part] == [2, 4] and lm.length(0) == 6
    np.testing.assert_allclose(part[0], full[0][:2], atol=1e-5)
    np.testing.assert_allclose(part[1], full[1], atol=1e-5)
    for bad in ([0, 1], [1], [1, 5]):
        with pytest.raises(ValueError, match=r"logits rows|row counts"):
            lm.forward([(0, [1]), (1, [2])], rows=bad)
    assert lm.length(0) == 6 and lm.length(1) == 4  # refused calls fed nothing


def test_prompt_errors(target):
    eng = Engine(target, NgramDrafter(), k=2)
    with pytest.raises(ValueError, match="context holds 128"):
        eng.generate([1] * 200, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        eng.generate([], SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        eng.generate([1, 99], SamplingParams())
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        eng.generate([1, 2], SamplingParams(stop=["x"]))
    with pytest.raises(ValueError, match="k = -1"):
        Engine(target, NgramDrafter(), k=-1)
    # and the engine still works afterwards
    assert eng.generate([1, 2], SamplingParams(max_tokens=3)).summary.emitted == 3


def test_vocab_mismatch_is_a_clear_error(target):
    with pytest.raises(ValueError, match=r"vocabulary \(12 tokens.*target's \(16 tokens"):
        Engine(target, ModelDrafter(ToyLM(vocab=12)), k=2)


def test_context_full_ends_with_length():
    lm = ToyLM(vocab=12, seed=9, context_length=20)
    res = Engine(lm, NgramDrafter(), k=4).generate(list(range(10)), SamplingParams(max_tokens=100))
    assert res.finish_reason == "length"
    assert len(res.tokens) == 11  # the cache never exceeded 20 tokens; the last one is not cached


def test_a_failing_drafter_falls_back_to_plain():
    lm = ToyLM(vocab=12, seed=10)

    class Broken(FixedDrafter):
        def propose(self, *a):
            raise RuntimeError("boom")

    res = Engine(lm, Broken([1]), k=2).generate([1, 2], SamplingParams(max_tokens=5))
    assert res.tokens == greedy_continuation(lm, [1, 2], 5)


def test_metric_invariants_on_a_sampled_run(target, unrelated):
    res = Engine(target, ModelDrafter(unrelated), k=4).generate(
        PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=60)
    )
    s = res.summary
    assert s.accepted <= s.proposed
    assert s.emitted == s.accepted + s.rounds  # no stop string, max_tokens clipped k
    assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.rounds)
    u = s.acceptance_per_position
    assert all(a >= b for a, b in itertools.pairwise(u))
    assert np.isclose(sum(r.emitted for r in res.rounds), len(res.tokens))


def test_a_prompt_fed_in_chunks_decodes_as_one_fed_whole():
    """`admit` + `prefill` in chunks (as the server interleaves prompts with rounds) gives what
    `start` gives; the time between chunks is round 0's overhead, not prefill."""
    import time

    lm = ToyLM(vocab=12, seed=3)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    params = SamplingParams(max_tokens=16)
    eng = Engine(lm, NgramDrafter(), k=4)
    want = eng.generate(prompt, params).tokens
    for budget in (1, 3, 9):
        req = eng.admit(prompt, params)
        assert not req.rounds and req.prefilled == 0
        fed = []
        while not eng.prefill(req, budget):
            fed.append(req.prefilled)
            time.sleep(0.01)
        assert fed == list(range(budget, len(prompt), budget))
        assert req.rounds[0].emitted == 1 and req.rounds[0].overhead_ms >= 10.0 * len(fed)
        while not req.done:
            eng.step([req])
        res = eng.finish(req)
        assert res.tokens == want, budget
        s = res.summary
        parts = s.prefill_ms + s.draft_prefill_ms + sum(r.round_ms for r in res.rounds)
        assert parts == pytest.approx(
            s.total_ms, rel=0.01, abs=0.5
        )  # abs: the tail before `finish`
    with pytest.raises(ValueError, match="a prefill budget of 0 tokens is invalid"):
        eng.prefill(eng.admit(prompt, params), 0)
