"""Drafting heads: the heads drafter's exactness (greedy equality with plain decoding, the
emitted distribution enumerated exactly, a broken q caught), its file, and training
(`specwise.distill`) on a toy target whose heads can be learnt."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams, distill
from specwise.backends.torch_hf import TorchLM
from specwise.drafters import Draft
from specwise.drafters.heads import Heads, HeadsDrafter
from specwise.oracle import plain_decode
from specwise.sampling import warp
from toy import ToyLM, ToyTokenizer, enumerate_outcomes, tiny_llama


def _toy_heads(lm: ToyLM, n_heads: int = 2, seed: int = 0) -> Heads:
    v = lm.vocab_size
    heads = Heads(lm.hidden_size, n_heads, list(range(v)), v, seed=seed)
    import torch

    with torch.no_grad():  # random blocks, so that heads differ from one another
        heads.module.blocks.weight.normal_(0, 1.0)
        heads.module.out.weight.normal_(0, 1.0)
    heads.publish()
    return heads


@pytest.mark.parametrize("k", [1, 2, 3])
def test_heads_greedy_equals_plain(k):
    target = ToyLM(vocab=12, seed=3, hidden=True)
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=40)
    want = plain_decode(target, prompt, params)
    eng = Engine(target, HeadsDrafter(_toy_heads(target, n_heads=3)), k=k)
    res = eng.generate(prompt, params)
    assert res.tokens == want
    assert res.summary.proposed > 0  # the heads did draft


def test_heads_on_a_torch_target_greedy_equals_plain():
    target = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0), hidden=True)
    heads = Heads(target.hidden_size, 3, list(range(16)), 16, seed=1)
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=30)
    res = Engine(target, HeadsDrafter(heads), k=3).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)


def _joint(target, prompt, params, n):
    """P(first n tokens), enumerated from the target alone."""
    out: dict[tuple, float] = {}

    def walk(ctx, prob, got):
        if len(got) == n:
            out[tuple(got)] = out.get(tuple(got), 0.0) + prob
            return
        row = target.forward([(999, ctx)], last_only=True)[0][-1]
        target.release(999)
        p = warp(row, params)
        for x in np.flatnonzero(p > 0):
            walk([*ctx, int(x)], prob * p[x], [*got, int(x)])

    walk(list(prompt), 1.0, [])
    return out


def _emitted(engine, prompt, params, n):
    """The exact distribution of the engine's first n tokens: every random choice enumerated."""

    def run(sampler):
        req = engine.admit(prompt, params)
        req.sampler = sampler
        engine.prefill(req)
        while not req.done and len(req.context) - req.n_prompt < n:
            engine.step([req])
        tokens = tuple(req.context[req.n_prompt : req.n_prompt + n])
        engine.finish(req)
        return tokens

    return enumerate_outcomes(run)


SAMPLED = [  # the settings a drafter on hidden states is checked under, every outcome enumerated
    SamplingParams(temperature=1.0, max_tokens=3),
    SamplingParams(temperature=0.7, top_k=2, max_tokens=3),
]


def toy_training_data(folder):
    """A toy target with hidden states and the self-distillation data it writes to `folder`
    answering 60 prompts (24 tokens each, greedy and sampled in turn): (target, data)."""
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=True)
    target.tokenizer = ToyTokenizer(list("abcdef"))
    distill.generate(target, toy_prompts(60), seconds=60, folder=folder, sequences=4, max_tokens=24)
    return target, distill.load_data(folder)


def toy_prompts(n: int, salt: int = 0) -> list[str]:
    """n distinct prompts over the toy's letters."""
    return ["".join("abcdef"[(i * 7 + salt) // 6**j % 6] for j in range(5)) for i in range(n)]


def assert_greedy_plain_and_accepted(engine, target) -> None:
    """A trained drafter, drafting greedily: plain decoding's tokens, most drafts accepted."""
    greedy = SamplingParams(max_tokens=30)
    prompt = [0, 3, 1, 4]
    res = engine.generate(prompt, greedy)
    assert res.tokens == plain_decode(target, prompt, greedy)
    assert res.summary.acceptance_rate > 0.6, res.summary.acceptance_rate


def assert_emits_the_target_distribution(engine, target, prompt, params, n: int = 3) -> None:
    """The engine's first n tokens are distributed exactly as the target's alone."""
    got = _emitted(engine, prompt, params, n)
    want = _joint(target, prompt, params, n)
    assert set(got) <= set(want)
    for seq, prob in want.items():
        assert abs(got.get(seq, 0.0) - prob) < 1e-9, (seq, got.get(seq), prob)


@pytest.mark.parametrize("params", SAMPLED)
def test_heads_sampling_emits_exactly_the_target_distribution(params):
    target = ToyLM(vocab=3, seed=5, hidden=True)
    engine = Engine(target, HeadsDrafter(_toy_heads(target)), k=2)
    assert_emits_the_target_distribution(engine, target, [0, 2, 1], params)


def test_a_heads_drafter_that_misstates_q_fails_the_same_check():
    """Drawing from q but reporting another q (uniform) is not lossless: the check must see it."""

    class Misstated(HeadsDrafter):
        def propose(self, *args, **kw):
            d = super().propose(*args, **kw)
            if d.probs is None:
                return d
            flat = np.full_like(d.probs, 1.0 / d.probs.shape[1])
            return Draft(d.tokens, flat, d.confidence)

    target = ToyLM(vocab=3, seed=5, hidden=True)
    params = SamplingParams(temperature=1.0, max_tokens=3)
    engine = Engine(target, Misstated(_toy_heads(target)), k=2)
    got = _emitted(engine, [0, 2, 1], params, 3)
    want = _joint(target, [0, 2, 1], params, 3)
    assert max(abs(got.get(s, 0.0) - p) for s, p in want.items()) > 1e-3


def test_heads_refuse_a_target_without_hidden_states_or_of_another_shape():
    heads = Heads(9, 2, [0, 1, 2], 3)
    with pytest.raises(ValueError, match="loaded without them"):
        HeadsDrafter(heads).bind(ToyLM(vocab=3))
    with pytest.raises(ValueError, match="width 9"):
        HeadsDrafter(heads).bind(ToyLM(vocab=4, hidden=True))
    with pytest.raises(ValueError, match="distinct"):
        Heads(9, 2, [0, 0], 3)
    with pytest.raises(ValueError, match="outside"):
        Heads(9, 2, [0, 3], 3)


def test_heads_file_round_trip_and_a_bad_file(tmp_path):
    target = ToyLM(vocab=4, seed=0, hidden=True)
    heads = _toy_heads(target)
    heads.meta["key"] = "abc"
    heads.save(tmp_path / "h.pt")
    again = Heads.load(tmp_path / "h.pt")
    h = target.table[0, 1]  # any vector of the right width
    h = np.resize(h, target.hidden_size).astype(np.float32)
    np.testing.assert_array_equal(again.logits(h), heads.logits(h))
    assert again.meta["key"] == "abc" and list(again.ids) == [0, 1, 2, 3]
    (tmp_path / "bad.pt").write_bytes(b"not heads")
    with pytest.raises(ValueError, match="holds no heads"):
        Heads.load(tmp_path / "bad.pt")


def test_training_on_a_toy_target_learns_heads_that_are_accepted(tmp_path):
    """The whole path of `specwise heads train` but the model: generate data with the target,
    choose the vocabulary, train, score held-out; then the heads draft, and are accepted."""
    target, data = toy_training_data(tmp_path)
    assert len(data) == 60 * 24 and data.hidden.shape[1] == 36
    ids = distill.choose_vocab(data, 6)
    heads = Heads(36, 2, ids, 6, seed=0)
    result = distill.train(heads, data, seconds=0.0, checkpoint=tmp_path / "ckpt.pt", lr=0.05)
    assert result["epochs"] == 1 and (tmp_path / "ckpt.pt").exists()
    result = distill.train(heads, data, seconds=5.0, checkpoint=tmp_path / "ckpt.pt", lr=0.05)
    assert result["epochs"] > 1  # resumed from the checkpoint, then went on
    other = Heads(36, 2, ids[::-1].copy(), 6, seed=0)  # another vocabulary: not resumed
    assert distill.train(other, data, seconds=0.0, checkpoint=tmp_path / "ckpt.pt")["epochs"] == 1
    assert result["alone"][0] > 0.7, result  # 1 in 6 by chance; some held-out text is sampled
    assert_greedy_plain_and_accepted(Engine(target, HeadsDrafter(heads), k=2), target)


def test_generating_again_asks_only_what_was_never_asked_even_from_a_changed_list(
    tmp_path, monkeypatch
):
    """The work folder knows its prompts by their text: a run on a changed list (new asks
    first, the old ones reordered) asks each prompt once; a folder that counted its prompts
    (`next`) resumes on the list as it did."""
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=True)
    target.tokenizer = ToyTokenizer(list("abcdef"))
    asked: list[str] = []
    render = target.tokenizer.render_chat
    monkeypatch.setattr(
        target.tokenizer, "render_chat", lambda m: asked.append(m[0]["content"]) or render(m)
    )

    def run(prompts, folder=tmp_path):
        asked.clear()
        distill.generate(target, prompts, 60, folder, sequences=4, max_tokens=6)
        return list(asked)

    first = toy_prompts(12)
    assert run(first) == first
    new = toy_prompts(5, salt=1)
    assert run(new + first[::-1]) == new  # the old ones are not asked again
    assert run(first + new) == []
    assert len(distill.load_data(tmp_path)) == len(first + new) * 6  # one answer each
    old = tmp_path / "old"
    old.mkdir()
    (old / "progress.json").write_text('{"next": 7, "seconds": 1.0}')
    assert run(first, old) == first[7:]


def test_vocab_is_the_most_frequent_top_tokens_and_labels_stay_in_their_sequence():
    data = distill.Data(
        hidden=np.zeros((6, 2), dtype=np.float16),
        top_ids=np.array([[3] * 16, [3] * 16, [1] * 16, [1] * 16, [1] * 16, [7] * 16]),
        top_probs=np.full((6, 16), 1 / 16, dtype=np.float16),
        seq=np.array([0, 0, 0, 1, 1, 1]),
        tokens=np.array([3, 3, 1, 1, 1, 7]),
        greedy=np.ones(6, dtype=bool),
    )
    assert list(distill.choose_vocab(data, 2)) == [1, 3]
    assert list(distill.choose_vocab(data, 1, always=[9])) == [1, 9]
    label = distill._targets(data, np.array([1, 3]), 10, 2)[0]
    assert label.tolist() == [[1, 2], [2, -1], [-1, -1], [4, 5], [5, -1], [-1, -1]]


def test_answers_that_share_a_prompt_index_stay_apart(tmp_path):
    """Two calls of `generate` from different lists can give neighbouring answers, across a
    shard boundary, the same prompt index: their labels must not run into each other, and
    whether an answer was greedy stays its prompt's (even: greedy)."""

    def answer(i, n, x):
        row = (np.full(2, x, np.float16), np.full(16, x, np.int32), np.full(16, 1 / 16), x)
        return {"i": i, "records": [row] * n}

    distill._write_shard(tmp_path, [answer(4, 2, 1), answer(9, 3, 2)])
    distill._write_shard(tmp_path, [answer(9, 2, 3), answer(0, 1, 4)])  # another list's 9
    data = distill.load_data(tmp_path)
    assert data.seq.tolist() == [1, 1, 2, 2, 2, 3, 3, 0]  # by prompt index, then place
    assert data.greedy.tolist() == [True] * 2 + [False] * 5 + [True]
    label = distill._targets(data, np.array([1, 2, 3, 4]), 10, 1)[0]
    assert label[:, 0].tolist() == [1, -1, 3, 4, -1, 6, -1, -1]


def test_heads_under_the_controller_greedy_equals_plain(tmp_path, monkeypatch):
    """k=auto over the heads (not cheap: run only when planned) and the n-gram drafter; the
    controller never plans more tokens than there are heads."""
    from specwise.controller import Controller
    from specwise.drafters import NgramDrafter

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target = ToyLM(vocab=12, seed=3, hidden=True, delay_ms=(2.0, 0.1))
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=60)
    drafters = [NgramDrafter(), HeadsDrafter(_toy_heads(target, n_heads=2))]
    engine = Engine(target, drafters, k="auto", controller=Controller.calibrated(target, drafters))
    res = engine.generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    heads_rounds = [r for r in res.rounds if r.drafter == "heads"]
    assert all(r.proposed <= 2 and (r.k_max or 0) <= 2 for r in heads_rounds)


@pytest.mark.parametrize(
    "drafter, words",
    [
        ("heads", ["no drafting heads are trained for", "specwise heads train"]),
        ("eagle", ["no drafting layer is trained for", "--arch eagle"]),
    ],
)
def test_drafting_with_a_network_never_trained_is_one_clear_error(
    smollm2_path, tmp_path, monkeypatch, capsys, drafter, words
):
    from specwise.cli import main

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    argv = ["generate", "--target", str(smollm2_path), "--drafter", drafter, "--k", "1", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "Traceback" not in err


def test_heads_are_kept_by_the_model_they_were_trained_for(smollm2_path, tmp_path):
    from specwise.drafters.heads import heads_path, model_key
    from specwise.models import CATALOG

    assert model_key(smollm2_path) == CATALOG["smollm2-135m-instruct"].sha256
    other = tmp_path / "m.gguf"
    other.write_bytes(b"GGUF" + bytes(100))
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    keys = {model_key(smollm2_path), model_key(other), model_key(folder)}
    assert len(keys) == 3 and model_key(other) == model_key(other)
    assert heads_path(other).name == model_key(other)[:20]
