"""Drafting with a model whose tokenizer is not the target's: the map of shared tokens, the
translation of a context, and exactness by enumeration (every random outcome of one round,
no Monte Carlo), including a map that is not one-to-one, which the same check catches."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.drafters import ModelDrafter, TextDrafter, make_drafters
from specwise.oracle import plain_decode
from specwise.sampling import warp
from specwise.verify import rejection_sample
from specwise.vocab_map import SPECIAL, VocabMap, token_keys
from toy import CROSS_DRAFT, ToyLM, ToyTokenizer, cross_pair, enumerate_outcomes

SHARED = {0: 0, 1: 7, 2: 3, 4: 1, 6: 2, 7: 4}  # draft id -> target id in `cross_pair`
DRAFT_TOKENS = len(CROSS_DRAFT)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    return tmp_path


def test_a_token_stands_for_its_text_a_special_one_for_its_entry():
    keys = token_keys(ToyTokenizer(["<s>", "a", "b", "a", "\ufffd", "ab"]))
    assert keys == [SPECIAL + "<s>", "a", "b", "a", None, "ab"]


def test_shared_tokens_map_one_to_one_the_lowest_id_of_a_text_standing_for_it():
    vmap = VocabMap.between(["x", "y", "x", "z", None], ["z", "x", "w", "x", None, "y"])
    assert vmap.to_target.tolist() == [3, 0, -1, -1, -1, 1]
    assert vmap.to_draft.tolist() == [1, 5, -1, 0, -1]
    assert vmap.shared == 3
    with pytest.raises(ValueError, match="one-to-one"):
        VocabMap(np.array([0, 0, -1]), 2)


def test_the_toy_pair_shares_what_its_pieces_share(home):
    target, draft = cross_pair()
    vmap = VocabMap.for_pair(target.tokenizer, draft.tokenizer)
    assert {d: int(t) for d, t in enumerate(vmap.to_target) if t >= 0} == SHARED
    assert len(list((home / "vocab-maps").iterdir())) == 1  # cached
    again = VocabMap.for_pair(target.tokenizer, draft.tokenizer)
    assert again.to_target.tolist() == vmap.to_target.tolist()


def test_a_context_is_retokenized_by_the_draft_and_specials_are_mapped():
    target, draft = cross_pair()
    vmap = VocabMap.for_pair(target.tokenizer, draft.tokenizer)
    ids = [7, 4, 3, 5]  # <|im|> ab c ba: the text "abcba"
    assert vmap.translate(ids, first=True) == [0, 1, 7, 2, 6, 4]  # <s> <|im|> ab c b a
    assert vmap.translate([6]) == [2, 2]  # "cc": the draft has no such piece


def test_a_draft_text_is_retokenized_for_the_target_a_cut_character_left_out():
    target, draft = cross_pair()
    vmap = VocabMap.for_pair(target.tokenizer, draft.tokenizer)
    assert vmap.back([1, 4, 3, 5]) == [7, 4, 6, 1]  # <|im|> a bc ca: the text "abcca"
    assert vmap.special(1) and not vmap.special(3)
    cut = VocabMap.for_pair(ToyTokenizer(["<s>", "a", "b"]), ToyTokenizer(["<s>", "a", "\ufffd"]))
    assert cut.back([1, 1, 2]) == [1, 1]  # "aa\ufffd": the character it ends in is cut


def test_restrict_and_spread_put_the_draft_only_on_shared_tokens():
    target, draft = cross_pair()
    vmap = VocabMap.for_pair(target.tokenizer, draft.tokenizer)
    q = warp(vmap.restrict(np.arange(DRAFT_TOKENS, dtype=np.float32)), SamplingParams(1.0))
    assert q[[3, 5]].sum() == 0 and q.sum() == pytest.approx(1.0)
    spread = vmap.spread(q, 9)  # a target row with a padding column
    assert spread.sum() == pytest.approx(1.0) and spread[[5, 6, 8]].sum() == 0
    for d, t in SHARED.items():
        assert spread[t] == q[d]


def test_bind_drafts_across_tokenizers_and_refuses_a_vocabulary_sharing_too_little():
    target, draft = cross_pair()
    drafter = ModelDrafter(draft)
    drafter.bind(target)
    assert drafter.vocab is not None and "another tokenizer" in drafter.note
    stranger = ToyLM(vocab=21, seed=2)
    stranger.tokenizer = ToyTokenizer([*(chr(ord("d") + i) for i in range(20)), "a"])
    with pytest.raises(ValueError, match="shares 1 of its 21 tokens"):
        ModelDrafter(stranger).bind(target)


PROMPT = [7, 1, 2, 4, 3]
PARAMS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.7,top_k=3": SamplingParams(temperature=0.7, top_k=3),
    "T=1.3,top_p=0.9": SamplingParams(temperature=1.3, top_p=0.9),
}


def exact_two(target, prompt, params):
    """P(tokens 1 and 2), from the target alone."""

    def probs(ctx):
        seq = 10_000 + len(ctx)
        try:
            return warp(target.forward([(seq, list(ctx))], last_only=True)[0][-1], params)
        finally:
            target.release(seq)

    p1 = probs(prompt)
    out = np.zeros((len(p1), len(p1)))
    for a in np.flatnonzero(p1 > 0):
        out[a] = p1[a] * probs([*prompt, int(a)])
    return out


def tli_two(target, drafter, prompt, params, k=2):
    """P(tokens 1 and 2) of one TLI round (the draft's k tokens verified by rejection
    sampling; a plain step after it if it emitted one token), every outcome enumerated."""
    seqs = iter(range(1, 10**9))

    def rows(ctx, draft):
        out = []
        for i in range(len(draft) + 1):
            seq = next(seqs)
            try:
                row = target.forward([(seq, [*ctx, *draft[:i]])], last_only=True)[0][-1]
            finally:
                target.release(seq)
            out.append(warp(row, params))
        return np.stack(out)

    def run(s):
        seq = next(seqs)
        try:
            draft = drafter.propose(seq, prompt, k, params, s)
        finally:
            drafter.end(seq)
        verdict = rejection_sample(draft.tokens, draft.probs, rows(prompt, draft.tokens), s)
        tokens = list(verdict.tokens)
        if len(tokens) < 2:
            tokens.append(s.categorical(rows([*prompt, *tokens], [])[0]))
        return tuple(tokens[:2])

    dist = enumerate_outcomes(run)
    v = target.vocab_size
    out = np.zeros((v, v))
    for (a, b), prob in dist.items():
        out[a, b] += prob
    return out


@pytest.mark.parametrize("name", list(PARAMS))
def test_a_draft_on_the_shared_tokens_is_verified_exactly(name):
    target, draft = cross_pair()
    drafter = ModelDrafter(draft)
    drafter.bind(target)
    params = PARAMS[name]
    got = tli_two(target, drafter, PROMPT, params)
    np.testing.assert_allclose(got, exact_two(target, PROMPT, params), atol=1e-9)


@pytest.mark.parametrize("name", list(PARAMS))
def test_a_text_draft_is_verified_exactly(name):
    """model-text: the draft's argmax text, re-tokenized, as a point mass, also when sampling."""
    target, draft = cross_pair()
    drafter = TextDrafter(draft)
    drafter.bind(target)
    params = PARAMS[name]
    got = tli_two(target, drafter, PROMPT, params, k=3)
    np.testing.assert_allclose(got, exact_two(target, PROMPT, params), atol=1e-9)


def test_a_map_with_two_draft_tokens_on_one_target_token_is_caught():
    """Were "ca" mapped onto "a" too, q would state half of what the draft proposes "a" with."""
    target, draft = cross_pair()
    drafter = ModelDrafter(draft)
    drafter.bind(target)
    vmap = drafter.vocab
    vmap.to_target[5] = vmap.to_target[4]  # "ca" -> the target's "a"
    vmap.draft_ids = np.flatnonzero(vmap.to_target >= 0)
    vmap._mask = None
    params = PARAMS["T=1"]
    got = tli_two(target, drafter, PROMPT, params)
    assert np.abs(got - exact_two(target, PROMPT, params)).max() > 1e-3


def test_greedy_across_tokenizers_equals_plain():
    target, draft = cross_pair(seed=3)
    params = SamplingParams(max_tokens=20)
    plain = Engine(target).generate(PROMPT, params).tokens
    for k in (1, 2, 4):
        engine = Engine(target, ModelDrafter(draft), k=k)
        res = engine.generate(PROMPT, params)
        assert res.tokens == plain, k
        assert res.summary.accepted > 0  # the draft did draft


def test_greedy_drafting_text_across_tokenizers_equals_plain():
    target, draft = cross_pair(seed=3)
    params = SamplingParams(max_tokens=20)
    plain = Engine(target).generate(PROMPT, params).tokens
    for k in (1, 2, 4):
        res = Engine(target, TextDrafter(draft), k=k).generate(PROMPT, params)
        assert res.tokens == plain, k
        assert res.summary.accepted > 0, k


def test_the_two_drafters_of_one_draft_model_share_its_cache_round_by_round():
    """Rounds alternating between model and model-text on one sequence: each drafts from the
    other's commits, and the draft's cache holds only committed tokens after every round."""
    target, draft = cross_pair(seed=17)  # a seed whose draft both ways gets drafts accepted
    tokens, text = make_drafters(["model", "model-text"], draft)
    assert text.model is tokens
    for d in (tokens, text):
        d.bind(target)
    greedy = SamplingParams(max_tokens=60)
    plain = plain_decode(target, PROMPT, greedy)
    context, seq, accepted = list(PROMPT), 5, {"model": 0, "model-text": 0}
    for i in range(20):
        d = (tokens, text)[i % 2]
        proposed = d.propose(seq, context, 3, greedy, None).tokens
        want = plain[len(context) - len(PROMPT) :]
        n = next(
            (j for j, (a, b) in enumerate(zip(proposed, want, strict=False)) if a != b),
            len(proposed),
        )
        d.commit(seq, n, want[: n + 1])
        accepted[d.name] += n
        context += want[: n + 1]
        ids, cache = tokens._ids[seq], draft.caches.get(seq, [])
        assert cache == ids[: len(cache)], i
    assert all(accepted.values()), accepted
    text.end(seq)
    assert seq not in draft.caches and seq not in tokens._ids


@pytest.mark.parametrize("names", [["model"], ["model-text"], ["model", "model-text"]])
def test_a_real_pair_with_different_tokenizers_decodes_greedy_as_plain(
    names, gemma_path, smollm2_path
):
    """Gemma 3 (262k tokens) checked by an exact target, drafted by SmolLM2 (49k tokens): its
    shared tokens, its text, or either as the controller picks."""
    from specwise.backends.curves import CostCurve
    from specwise.backends.llama_cpp import LlamaCppLM
    from specwise.controller import Controller
    from specwise.costs import CostModel

    target = LlamaCppLM(gemma_path, context_length=512, max_sequences=2, exact=True)
    draft = LlamaCppLM(smollm2_path, context_length=512, max_sequences=2)
    drafters = make_drafters(names, draft)
    if len(names) == 1:
        engine = Engine(target, drafters, k=4)
    else:  # costs under which drafting pays, so that the controller drafts (not measured)
        costs = CostModel(CostCurve({n: 20.0 + n for n in range(1, 17)}), dict.fromkeys(names, 1.0))
        engine = Engine(target, drafters, k="auto", controller=Controller(drafters, costs))
    assert getattr(drafters[0], "model", drafters[0]).vocab.shared > 10_000
    tok = target.tokenizer
    params = SamplingParams(max_tokens=24)
    for text in ["The capital of France is", "def fibonacci(n):\n    "]:
        prompt = tok.encode(text)
        res = engine.generate(prompt, params)
        assert res.tokens == plain_decode(target, prompt, params), text
        if len(names) == 1:
            assert res.summary.accepted > 0, text
