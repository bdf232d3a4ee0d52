"""Exact mode (`--exact`): a target whose logits rows depend on the sequence's own tokens alone,
bit for bit, so greedy speculative decoding equals plain decoding token for token, whatever the
drafter, k or the other requests in a batch. On ik_llama, on torch, and on mainline llama.cpp
(a forward a token)."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends import ik_llama, load_pair
from specwise.backends.ik_llama import EXACT_WIDTH
from specwise.backends.llama_cpp import LlamaCppLM
from specwise.backends.torch_hf import TorchLM
from specwise.drafters import Draft, NgramDrafter
from specwise.oracle import plain_decode
from toy import tiny_llama

needs_ik = pytest.mark.skipif(not ik_llama.available(), reason=ik_llama.UNAVAILABLE)
PROMPTS = [
    "def fibonacci(n):",
    "Explain what a mutex is in two sentences.",
    "List three colours: red, green,",
]


class NoisyCopy:
    """Drafts the plain continuation with every third token wrong: long accepted runs and
    rejections at every position, the rounds where a kernel's rounding could show."""

    name = "noisy"
    cheap = False
    fingerprint = "noisy"

    def __init__(self, continuations: dict[int, list[int]], vocab: int) -> None:
        self.cont, self.vocab, self.start = continuations, vocab, {}

    def bind(self, target):
        pass

    def begin(self, seq, prompt, tenant=None):
        self.start[seq] = (len(prompt), self.cont[len(prompt)])

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        n, cont = self.start[seq]
        done = len(context) - n
        out = cont[done : done + k]
        return Draft(
            [(t + 1) % self.vocab if (done + i) % 3 == 2 else t for i, t in enumerate(out)]
        )

    def lag(self, seq, context):
        return 0

    def commit(self, seq, accepted, emitted):
        pass

    def end(self, seq):
        self.start.pop(seq, None)


def _rows_alike(lm, prompt: list[int], cont: list[int]) -> None:
    """Rows of calls of every width equal one-token forwards bit for bit, alone or beside
    another sequence in the same call."""
    lm.forward([(0, prompt)], last_only=True)
    one = np.stack([lm.forward([(0, [t])])[0][0] for t in cont])
    for width in (2, 5, EXACT_WIDTH, len(cont)):
        lm.truncate(0, len(prompt))
        got = np.concatenate(
            [lm.forward([(0, cont[i : i + width])])[0] for i in range(0, len(cont), width)]
        )
        assert np.array_equal(got, one), f"a call of {width} tokens rounds differently"
    lm.truncate(0, len(prompt))
    lm.forward([(1, prompt[::-1])], last_only=True)
    both = lm.forward([(1, cont[:3]), (0, cont[:7])])
    assert np.array_equal(both[1], one[:7]), "another sequence in the call changed the rows"
    lm.release(0)
    lm.release(1)


def _greedy_equal(target, prompts: list[list[int]], max_tokens: int = 24) -> None:
    """Greedy speculative == plain for every prompt, drafter and k; and a batch of every
    prompt in flight at once == each alone."""
    params = SamplingParams(max_tokens=max_tokens)
    plain = {len(p): plain_decode(target, p, params) for p in prompts}
    assert len(plain) == len(prompts), "test prompts need distinct lengths"
    for drafter in (NgramDrafter(), NoisyCopy(plain, target.vocab_size)):
        for k in (2, 8):  # a short chain and one past the NoisyCopy's wrong tokens
            eng = Engine(target, drafter, k=k)
            for p in prompts:
                assert eng.generate(p, params).tokens == plain[len(p)], (drafter.name, k)
            reqs = [eng.start(p, params) for p in prompts]  # all in flight at once
            while not all(r.done for r in reqs):
                eng.step(reqs)
            for p, r in zip(prompts, reqs, strict=True):
                assert eng.finish(r).tokens == plain[len(p)], (drafter.name, k, "batched")


@needs_ik
def test_ik_exact_rows_do_not_depend_on_the_call(gemma_path, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    assert ik_llama.probe(gemma_path, False, True, exact=True) is None
    lm = ik_llama.IkLlamaLM(gemma_path, context_length=512, max_sequences=2, exact=True)
    assert lm.exact and not lm.repack and not lm.flash_attn and lm.info.exact
    assert lm.passes([(0, 5), (1, 40)]) == [(1, 5), (1, 16), (1, 16), (1, 8)]
    tok = lm.tokenizer
    _rows_alike(lm, tok.encode(PROMPTS[0]), tok.encode(" return n if n < 2 else " * 4)[:40])


@needs_ik
def test_ik_exact_greedy_speculative_equals_plain(gemma_path):
    target, _ = load_pair(gemma_path, backend="ik_llama", max_sequences=3, exact=True)
    assert target.exact
    tok = target.tokenizer
    _greedy_equal(target, [tok.encode(p) for p in PROMPTS])


def test_mainline_exact_runs_a_forward_a_token(smollm2_path):
    lm = LlamaCppLM(smollm2_path, context_length=512, max_sequences=3, exact=True)
    assert lm.exact and lm.info.exact and not lm.trees
    assert lm.passes([(0, 3), (1, 1)]) == [(1, 1)] * 4
    tok = lm.tokenizer
    _rows_alike(lm, tok.encode(PROMPTS[0]), tok.encode(" return n if n < 2 else " * 4)[:24])
    _greedy_equal(lm, [tok.encode(p) for p in PROMPTS], max_tokens=16)


def test_exact_gguf_targets_run_on_ik_llama_where_it_can_else_on_mainline(
    smollm2_path, monkeypatch, capsys
):
    from specwise.backends import _exact_gguf

    assert _exact_gguf(smollm2_path, "llama_cpp", 1) == "llama_cpp"  # asked for
    target, _ = load_pair(smollm2_path, backend="llama_cpp", max_sequences=2, exact=True)
    assert target.exact and target.info.exact and target.info.backend == "llama_cpp"
    monkeypatch.setattr(ik_llama, "available", lambda: False)
    assert _exact_gguf(smollm2_path, "auto", 1) == "llama_cpp"
    assert "--exact runs on llama_cpp, a forward a token" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"--exact cannot run .* on ik_llama here"):
        _exact_gguf(smollm2_path, "ik_llama", 1)


def test_torch_exact_rows_and_greedy_equality():
    model = tiny_llama(vocab=16, seed=0, sharpen=4.0)
    lm = TorchLM(model, exact=True)
    assert lm.passes([(0, 3)]) == [(1, 1)] * 3
    _rows_alike(lm, [1, 5, 3, 7, 2, 5], [2, 9, 4, 4, 1, 7, 3, 8, 0, 5, 6, 2])
    _greedy_equal(lm, [[1, 5, 3, 7, 2, 5, 3, 7, 2, 9], [3, 3, 1], [4, 1, 2, 8, 8]])


def test_the_calibration_of_an_exact_target_is_its_own(smollm2_path):
    from specwise.costs import cache_key

    model = tiny_llama(vocab=16, seed=0)
    assert cache_key(TorchLM(model), []) != cache_key(TorchLM(model, exact=True), [])
