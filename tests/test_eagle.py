"""The EAGLE-3-style drafter (`drafters.eagle`): exactness of its trees and chains (greedy
equality with plain decoding; the emitted distribution under sampling, every outcome
enumerated), drafting against training (what the cache and the tree compute is what the
training-time test computes), the tree's order, the layer states a backend keeps, the teacher's
data and training on a toy target, and its errors."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from specwise import Engine, SamplingParams, eagle_training, teacher
from specwise.backends.torch_hf import TorchLM
from specwise.drafters.eagle import Cache, EagleDrafter, Layer, propose_tree, rebuild_command
from specwise.drafters.eagle_layer import (
    COPY_N,
    FORMAT,
    UNNAMED,
    projected,
    restored,
    stored,
)
from specwise.drafters.ngram import continuations
from specwise.oracle import plain_decode
from test_heads import SAMPLED, assert_emits_the_target_distribution
from toy import ToyLM, ToyTokenizer, tiny_llama

LAYERS = (0, 1, 2)


def _toy_layer(lm, seed: int = 0, width: int = 16, depth: int = 3) -> Layer:
    """A layer with random weights large enough that its drafts depend on the context."""
    import torch

    v = lm.vocab_size
    layer = Layer(v * v, LAYERS, list(range(v)), v, width=width, depth=depth, seed=seed)
    with torch.no_grad():
        for p in layer.module.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
    layer.publish()
    return layer


@pytest.mark.parametrize("trees", [True, False])
def test_eagle_greedy_equals_plain(trees):
    target = ToyLM(vocab=12, seed=3, hidden=LAYERS)
    target.trees = trees
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=40)
    res = Engine(target, EagleDrafter(_toy_layer(target)), k=6).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert res.summary.proposed > 40  # it drafted in every round
    depths = [r.depth for r in res.rounds if r.proposed]
    assert any(d is not None for d in depths) == trees  # trees only where the target takes them


def test_eagle_on_a_torch_target_greedy_equals_plain():
    target = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0, layers=3), hidden=LAYERS)
    layer = Layer(target.hidden_size // 3, LAYERS, list(range(16)), 16, width=16, seed=1)
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=30)
    res = Engine(target, EagleDrafter(layer), k=3).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert res.summary.proposed > 10


@pytest.mark.parametrize("trees", [True, False])
@pytest.mark.parametrize("params", SAMPLED)
def test_eagle_sampling_emits_exactly_the_target_distribution(params, trees):
    target = ToyLM(vocab=3, seed=5, hidden=LAYERS)
    target.trees = trees
    engine = Engine(target, EagleDrafter(_toy_layer(target, depth=2), beam=2), k=3)
    # room for whole trees: the first 3 tokens are enumerated, the drafts may run past them
    assert_emits_the_target_distribution(engine, target, [0, 2, 1], replace(params, max_tokens=8))


def test_a_deliberately_wrong_tree_rule_fails_the_distribution_check(monkeypatch):
    """The check above can fail: a verifier that keeps a sampled tree's first child whatever
    the target drew emits another distribution."""
    import specwise.engine as engine_module
    from specwise.verify import Verdict

    def always_first(tokens, parents, p, sampler):
        x = sampler.categorical(p[1])  # the token after the first child, as if it were right
        return Verdict(1, [tokens[0], x], False, (0,))

    monkeypatch.setattr(engine_module, "tree_sample_and_match", always_first)
    target = ToyLM(vocab=3, seed=5, hidden=LAYERS)
    engine = Engine(target, EagleDrafter(_toy_layer(target, depth=2), beam=2), k=3)
    with pytest.raises(AssertionError):
        params = replace(SAMPLED[0], max_tokens=8)
        assert_emits_the_target_distribution(engine, target, [0, 2, 1], params)


def test_eagle_under_the_controller_greedy_equals_plain(tmp_path, monkeypatch):
    """k=auto over the layer and the n-gram drafter: the controller takes prefixes of the
    layer's trees; rounds it gives the n-gram drafter leave positions the layer reads later."""
    from specwise.controller import Controller
    from specwise.drafters import NgramDrafter

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target = ToyLM(vocab=12, seed=3, hidden=LAYERS, delay_ms=(2.0, 0.1))
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=60)
    drafters = [NgramDrafter(), EagleDrafter(_toy_layer(target))]
    stops = []
    propose = drafters[1].propose

    def recorded(*a):
        stops.append((a[2], a[5]))  # tokens asked, the controller's rule for the tree
        return propose(*a)

    drafters[1].propose = recorded
    ctl = Controller.calibrated(target, drafters)
    engine = Engine(target, drafters, k="auto", controller=ctl)
    res = engine.generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert stops and all(  # a rule wherever the offer costs something
        callable(stop) != ctl._free_offer(drafters[1], n) for n, stop in stops
    )


def test_drafting_computes_what_the_training_time_test_computes():
    """Committed positions read in pieces, then a chain expanded on the data's own tokens,
    each with its copy: the logits of every depth are those of `unroll` over the whole
    sequence (float), and the int8 copy's within int8's error. The copy's gate is set at
    random (it starts at zero), so a copy read at the wrong position changes the logits."""
    import torch

    target = ToyLM(vocab=8, seed=1, hidden=LAYERS)
    layer = _toy_layer(target, width=24, depth=4)
    with torch.no_grad():
        layer.module.gate.weight.normal_(0.0, 1.0)
        layer.module.gate.bias.normal_(0.0, 1.0)
    layer.publish()
    rng = np.random.default_rng(0)
    s = rng.standard_normal((12, layer.state_size)).astype(np.float32)
    t = rng.integers(0, 8, size=15)
    ids, sizes = continuations(t.tolist(), COPY_N)
    assert (sizes > 0).sum() > 8  # the copies are read, and most positions have one
    c, n = (torch.from_numpy(x) for x in (layer.index(ids), sizes.astype(np.int64)))
    with torch.inference_mode():
        whole = layer.module.unroll(
            torch.from_numpy(s)[None], torch.from_numpy(layer.index(t))[None], c[None], n[None], 4
        )
        no_copy = layer.module.unroll(
            torch.from_numpy(s)[None], torch.from_numpy(layer.index(t))[None],
            torch.full_like(c, len(layer.ids))[None], torch.zeros_like(n)[None], 4,
        )
        assert not np.allclose(whole[0].numpy(), no_copy[0].numpy(), atol=1e-3)
        for net, tol in ((layer.module, 1e-4), (layer._fast, None)):
            i, at = 7, 0
            cache = Cache(net, torch.zeros(8, 0, 3), torch.zeros(8, 0, 3))
            for m in (1, 3, 4):
                a, st, lg = net.read(
                    torch.from_numpy(s[at : at + m]), torch.from_numpy(layer.index(t[at : at + m])),
                    c[at : at + m], n[at : at + m], cache,
                )
                at += m
            assert at == i + 1 and cache.n == 8
            got = [lg]
            f, st, ck, cv = a[None], st[None], torch.zeros(1, 0, 8, 3), torch.zeros(1, 0, 8, 3)
            for j in range(1, 4):
                x = torch.from_numpy(layer.index([t[i + j]]))
                f, st, lgj, ck, cv = net.expand(
                    f, st, x, c[i + j : i + j + 1], n[i + j : i + j + 1], cache, ck, cv
                )
                got.append(lgj[0])
            for j in range(4):
                want = whole[j][0, i].numpy()
                if tol:
                    np.testing.assert_allclose(got[j].numpy(), want, atol=tol)
                elif j == 0:
                    np.testing.assert_allclose(got[j].numpy(), want, atol=0.06 * abs(want).max())
                else:  # int8's error compounds through the features fed back
                    assert np.corrcoef(got[j].numpy(), want)[0, 1] > 0.95


def test_a_tree_lists_the_best_nodes_a_parent_before_its_children():
    target = ToyLM(vocab=10, seed=2, hidden=LAYERS)
    layer = _toy_layer(target, width=16, depth=4)
    cache = layer.new_cache()
    rng = np.random.default_rng(1)
    root = layer.read(cache, rng.standard_normal((5, layer.state_size)), [1, 2, 3, 4, 5])
    tree = propose_tree(layer, cache, root, 15, 3)
    assert len(tree.tokens) == 15 and tree.parents[0] == -1
    assert all(q < i for i, q in enumerate(tree.parents))  # a parent first
    assert tree.cumulative == sorted(tree.cumulative, reverse=True)
    for i, q in enumerate(tree.parents):  # cumulative = the product along the path
        want = tree.confidence[i] * (tree.cumulative[q] if q >= 0 else 1.0)
        assert tree.cumulative[i] == pytest.approx(want, rel=1e-6)
    chain = propose_tree(layer, cache, root, 15, 1)
    assert chain.parents == [-1, 0, 1, 2]  # beam 1: the best chain, the layer's depth long
    assert chain.tokens[0] == tree.tokens[0]


def test_a_short_tree_is_the_long_trees_prefix_and_skips_the_levels_it_cannot_use():
    """Levels are drafted only while a child could still enter the best k: every k-token
    tree equals the first k tokens of the tree drafted with no such stop, and a 1-token
    draft makes no call of the layer past its root."""
    target = ToyLM(vocab=10, seed=2, hidden=LAYERS)
    layer = _toy_layer(target, width=16, depth=4)
    rng = np.random.default_rng(3)
    for trial in range(4):
        cache = layer.new_cache()
        n = 2 + trial
        root = layer.read(cache, rng.standard_normal((n, layer.state_size)), list(range(1, n + 1)))
        calls: list[int] = []
        expand = cache.net.expand
        cache.net.expand = lambda *a, expand=expand, calls=calls: calls.append(1) or expand(*a)
        for beam in (1, 2, 3):
            full = propose_tree(layer, cache, root, 1000, beam)
            for k in range(1, len(full.tokens) + 1):
                calls.clear()
                got = propose_tree(layer, cache, root, k, beam)
                assert got.tokens == full.tokens[:k] and got.parents == full.parents[:k]
                assert got.confidence == full.confidence[:k]
                assert k > 1 or not calls


def test_a_tree_grows_only_beneath_the_nodes_keep_going_allows():
    """`keep_going` is asked of each node before its children are drafted, with the
    confidences along its path; the tree is the unstopped tree less the subtrees of the
    nodes it refused, and where it refuses every node no level past the root is drafted.
    (Token paths are compared: int8 activations are scaled per call, so a level of fewer
    nodes gives its children's confidences within ~1e-3, not bit for bit.)"""
    target = ToyLM(vocab=10, seed=2, hidden=LAYERS)
    layer = _toy_layer(target, width=16, depth=4)
    cache = layer.new_cache()
    rng = np.random.default_rng(5)
    root = layer.read(cache, rng.standard_normal((4, layer.state_size)), [1, 2, 3, 4])
    full = propose_tree(layer, cache, root, 1000, 3)

    def along(tree, i, values):
        out = []
        while i >= 0:
            out.append(values[i])
            i = tree.parents[i]
        return out[::-1]

    paths: list[list[float]] = []

    def only_the_first(path):
        paths.append(list(path))
        return len(path) == 1 and path[0] == full.confidence[0]

    got = propose_tree(layer, cache, root, 1000, 3, keep_going=only_the_first)
    conf = [along(full, i, full.confidence) for i in range(len(full.tokens))]
    assert paths and all(
        any(len(p) == len(c) and np.allclose(p, c, atol=1e-2) for c in conf) for p in paths
    )
    want = {tuple(along(full, i, full.tokens)) for i in range(len(full.tokens))
            if full.parents[i] in (-1, 0)}
    assert {tuple(along(got, i, got.tokens)) for i in range(len(got.tokens))} == want
    calls: list[int] = []
    expand = cache.net.expand
    cache.net.expand = lambda *a: calls.append(1) or expand(*a)
    none = propose_tree(layer, cache, root, 1000, 3, keep_going=lambda path: False)
    assert not calls and none.tokens
    assert none.tokens == [full.tokens[i] for i in range(len(full.tokens)) if full.parents[i] < 0]
    assert none.parents == [-1] * len(none.tokens)


def test_layer_states_are_every_fed_token_and_read_equals_forward():
    target = TorchLM(tiny_llama(vocab=16, seed=0, layers=3), hidden=(0, 2))
    assert target.hidden_layers == (0, 2) and target.hidden_size == 64
    target.forward([(1, [1, 2, 3, 4])], last_only=True)  # a prefill keeps every position
    target.forward([(1, [5, 6, 7])])
    target.truncate(1, 6)
    target.forward([(1, [8, 9])])
    got = target.hiddens(1, 0)
    assert got.shape == (8, 64)
    states, final = target.read(2, [1, 2, 3, 4, 5, 6, 8, 9])
    np.testing.assert_allclose(states, got, atol=1e-5)
    assert final.shape == (8, 32)
    with pytest.raises(ValueError, match=r"hidden layers \[0, 5\] are invalid"):
        TorchLM(tiny_llama(vocab=16, seed=0, layers=3), hidden=(0, 5))


def _prompts(n: int) -> list[str]:
    """n distinct 5-letter prompts over the toy's letters."""
    return ["".join("abcdef"[(i * 7) // 6**j % 6] for j in range(5)) for i in range(n)]


def _toy_data(folder, n_prompts: int = 60):
    """A toy target with layer states, its answers to `n_prompts` prompts (greedy and sampled
    in turn) and a read text, written by the teacher to `folder`: (target, Data)."""
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=LAYERS)
    target.tokenizer = ToyTokenizer(list("abcdef"))
    target.eos_token_ids = frozenset()
    writer = teacher.Writer(folder)
    prompts = _prompts(n_prompts)
    teacher.answer(target, prompts, writer, lambda: False, sequences=4, max_tokens=24)
    writer.flush()
    return target, teacher.Data(folder)


def test_the_teachers_answers_hold_the_target_distribution_at_every_position(tmp_path):
    import torch

    target, data = _toy_data(tmp_path, 8)
    assert len(data.meta) == 8 and data.state_size == 3 * 36
    for q, meta in enumerate(data.meta):
        a, n = int(data.starts[q]), int(data.lengths[q])
        tokens = data.tokens[a : a + n].tolist()
        assert n == 5 + 24 - 1  # the last emitted token was never fed
        np.testing.assert_array_equal(data.states(a, a + n), _states_of(target, tokens))
        p = torch.softmax(torch.from_numpy(target.next_logits(tokens[:5])), -1)
        assert data.label_ids[a + 4, 0] == int(p.argmax()) == data.top1[a + 4]
        assert not data.train[a : a + 4].any() and data.train[a + 4 : a + n].all()
        if meta["greedy"]:  # the answer's tokens are the labels' argmaxes
            assert (data.tokens[a + 5 : a + n] == data.label_ids[a + 4 : a + n - 1, 0]).all()
    # a second writer on the folder skips what was done, and resumes nothing twice
    writer = teacher.Writer(tmp_path)
    assert writer.positions("answer") == len(data)
    teacher.answer(target, _prompts(8)[:3], writer, lambda: False)
    assert writer.positions("answer") == len(data)


def _states_of(target, tokens):
    seq = 777
    states, _ = target.read(seq, tokens)
    target.release(seq)
    return states.astype(np.float16)


def test_answering_after_the_stop_starts_nothing_and_finishes_what_it_began(tmp_path):
    """The stop ends admissions, not answers: each begun answer is written whole, named by its
    prompt's index in the list."""
    target, _ = _toy_data(tmp_path / "first", 1)
    writer = teacher.Writer(tmp_path / "data")
    teacher.answer(
        target, _prompts(10), writer, lambda: len(writer.state["answer"]["done"]) >= 3,
        sequences=4, max_tokens=12,
    )
    writer.flush()
    data = teacher.Data(tmp_path / "data")
    assert [m["name"] for m in data.meta] == ["prompt-0", "prompt-1", "prompt-2"]
    assert data.lengths.tolist() == [5 + 12 - 1] * 3


def test_a_prompt_repeated_in_the_list_is_answered_once(tmp_path):
    target, _ = _toy_data(tmp_path / "first", 1)
    writer = teacher.Writer(tmp_path / "data")
    prompts = _prompts(3)
    teacher.answer(target, [prompts[0], prompts[1], prompts[0], prompts[2]], writer,
                   lambda: False, sequences=4, max_tokens=6)
    writer.flush()
    names = [m["name"] for m in teacher.Data(tmp_path / "data").meta]
    assert sorted(names) == ["prompt-0", "prompt-1", "prompt-3"]


def test_the_target_invents_asks_then_answers_them_and_a_rerun_adds_nothing(
    tmp_path, monkeypatch
):
    """`answer_invented`: the target's replies to the invention prompts are kept (source
    `invented`), the asks made of those that reached their end of turn are answered (source
    `invented-answers`), named, split and drawn by the invention's index and the ask's; a
    second run finds everything done."""
    from specwise import asks

    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=LAYERS)
    target.tokenizer = ToyTokenizer(list("abcdef"))
    target.eos_token_ids = frozenset({5})  # "f" ends a turn
    made = [("chat", p) for p in _prompts(12)]
    monkeypatch.setattr(asks, "inventions", lambda n, seed=0: made[:n])
    seen: list[str] = []
    monkeypatch.setattr(asks, "invented_asks", lambda kind, text, i, banned=None: seen.append(
        text) or ([text, text + "a"] if len(text) > 1 else []))
    writer = teacher.Writer(tmp_path)
    teacher.answer_invented(target, tmp_path, writer, 10, lambda: False, 4, max_tokens=24)
    writer.flush()
    data = teacher.Data(tmp_path)
    invented = {m["name"]: m for m in data.meta if m["source"] == "invented"}
    answers = [(q, m) for q, m in enumerate(data.meta) if m["source"] == "invented-answers"]
    assert sorted(invented) == sorted(f"invention-{i}" for i in range(10))
    replies = teacher.replies(tmp_path, target, "invented")
    ended = {int(n.split("-")[1]) for n, m in invented.items() if m["ended"]}
    assert set(replies) == ended and sorted(seen) == sorted(replies.values())
    asked = {i for i, text in replies.items() if len(text) > 1}
    names = {m["name"] for _, m in answers}
    first: dict[str, str] = {}  # an ask made of two replies alike is answered once
    for i in sorted(asked):
        for j in (0, 1):
            first.setdefault(replies[i] + "a" * j, f"invented-{i}-{j}")
    assert asked and names == set(first.values())
    for q, m in answers:
        i, j = map(int, m["name"].split("-")[1:])
        assert m["held_out"] == teacher.answer_held_out(i) and m["greedy"] == ((i + j) % 2 == 0)
        a = int(data.starts[q])
        ask = replies[i] + "a" * j
        prompt = target.tokenizer.render_chat([{"role": "user", "content": ask}])
        assert data.tokens[a : a + len(prompt)].tolist() == prompt
    before = writer.positions()
    teacher.answer_invented(
        target, tmp_path, teacher.Writer(tmp_path), 10, lambda: False, max_tokens=24
    )
    assert teacher.Writer(tmp_path).positions() == before


def test_reading_a_text_labels_it_with_the_targets_distribution(tmp_path):
    from specwise.corpus import Chunk, Document

    class Framed(ToyTokenizer):  # every chat framing is the same three tokens
        def render_chat(self, messages):
            return [0, 1, 2]

    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=LAYERS)
    target.tokenizer = Framed([*"abcdef"])
    target.eos_token_ids = frozenset({5})
    writer = teacher.Writer(tmp_path)
    doc = Document("python", "x.py", "x.py", "abcabcabd", "python")
    chunks = iter([Chunk(doc, 0, "abcabcabd")])
    import torch

    rows = torch.from_numpy(target.unembedding())
    teacher.read(target, chunks, writer, lambda: False, rows, np.arange(6))
    writer.flush()
    data = teacher.Data(tmp_path, kinds=("read",))
    head = 3
    tokens = data.tokens.tolist()
    assert tokens[-1] == 5 and len(tokens) == head + 9 + 1
    for i in range(len(tokens)):
        p = torch.softmax(torch.from_numpy(target.next_logits(tokens[: i + 1])), -1)
        assert data.label_ids[i, 0] == int(p.argmax())
        assert float(data.label_probs[i, 0]) == pytest.approx(float(p.max()), abs=1e-3)
    assert data.train.tolist() == [head - 1 <= i < len(tokens) - 1 for i in range(len(tokens))]


def test_training_on_a_toy_target_learns_a_layer_that_is_accepted(tmp_path):
    target, data = _toy_data(tmp_path / "data")
    ids = eagle_training.choose_vocab(data, 6)
    layer = Layer(36, LAYERS, ids, 6, width=32, depth=3, seed=0)
    before = eagle_training.evaluate(layer, data)
    result = eagle_training.train(layer, data, epochs=20, checkpoint=tmp_path / "l.pt", lr=3e-3)
    assert result["alpha"][0] > 0.7 and result["alpha"][0] > before["alpha"][0] + 0.2, result
    assert result["by_kind"]["greedy"]["alpha"][1] > 0.6, result  # depth 2: training-time test
    assert result["chain_accepted"] > 1.0
    greedy = SamplingParams(max_tokens=30)
    prompt = [0, 3, 1, 4]
    res = Engine(target, EagleDrafter(layer), k=6).generate(prompt, greedy)
    assert res.tokens == plain_decode(target, prompt, greedy)
    assert res.summary.mean_accepted_length > 1.8, res.summary
    again = Layer(36, LAYERS, ids, 6, width=32, depth=3, seed=5)  # resumes from the checkpoint
    got = eagle_training.train(again, data, epochs=21, checkpoint=tmp_path / "l.pt", lr=3e-3)
    assert result["steps"] < got["steps"] < result["steps"] * 1.2  # one epoch more
    assert result["precision"] in ("fp32", "bf16")


def test_the_score_splits_alpha1_by_whether_the_token_read_is_one_the_layer_names(tmp_path):
    _, data = _toy_data(tmp_path / "data")
    ids = eagle_training.choose_vocab(data, 3)
    got = eagle_training.evaluate(Layer(36, LAYERS, ids, 6, width=16, depth=2), data)
    held = np.flatnonzero(np.repeat(data.held_out(), data.lengths) & data.train)
    named = np.isin(data.tokens[held], ids)  # the token each scored position reads
    assert got["by_read"]["named"]["share"] == round(float(named.mean()), 4)
    assert got["by_read"]["other"]["share"] == round(float(1 - named.mean()), 4)
    every = eagle_training.evaluate(Layer(36, LAYERS, list(range(6)), 6, width=16, depth=2), data)
    assert list(every["by_read"]) == ["named"]
    assert every["by_read"]["named"]["alpha1"] == every["alpha"][0]


def test_a_held_out_answer_shorter_than_the_depth_is_scored_as_far_as_it_goes(tmp_path):
    """A three-position answer (the prompt's last token and two answered) beside a depth of 4:
    depth 1 scores its one label, the deeper ones have none (an answer that ended at once)."""
    target, _ = _toy_data(tmp_path, 8)
    tokens = [1, 2, 3]
    labels = np.zeros((3, teacher.K), np.int32)
    labels[:2, 0] = tokens[1:]
    meta = {"source": "answers", "name": "prompt-19", "held_out": True, "greedy": True,
            "kind": "answer"}
    writer = teacher.Writer(tmp_path)
    writer.add("answer", teacher._Seq(
        meta, [_states_of(target, tokens)], tokens, [labels],
        [np.ones((3, teacher.K), np.float16)], [np.array([True, True, False])],
        [np.array([2, 3, -1])]))
    writer.flush()
    short = teacher.Data(tmp_path)
    short.meta = [m if m["name"] == "prompt-19" else {**m, "held_out": False} for m in short.meta]
    layer = Layer(36, LAYERS, eagle_training.choose_vocab(short, 6), 6, width=16, depth=4)
    got = eagle_training.evaluate(layer, short)
    assert got["by_kind"]["all"]["positions"] == 1 and got["alpha"][1:] == [None] * 3


def test_a_smaller_training_set_is_part_of_every_larger_one_and_epochs_count_positions(tmp_path):
    _target, data = _toy_data(tmp_path / "data")
    every = eagle_training.training_sequences(data)
    assert not data.held_out()[every].any() and data.held_out().any()
    sets = [eagle_training.training_sequences(data, n) for n in (100, 300, 600)]
    for small, big in itertools.pairwise([*sets, every]):
        assert set(small) < set(big)
    for n, got in zip((100, 300, 600), sets, strict=True):
        held = int(data.lengths[got].sum())
        assert n <= held < n + data.lengths.max()
    layer = Layer(36, LAYERS, eagle_training.choose_vocab(data, 6), 6, width=16, depth=2)
    result = eagle_training.train(
        layer, data, epochs=2, positions=300, batch=2, curve=[100, 200, 10**6],
        judge=lambda net: {"held_out": eagle_training.evaluate(net, data, limit=50)},
    )
    assert all(c["positions_seen"] >= n for c, n in zip(result["curve"], (100, 200), strict=True))
    assert len(result["curve"]) == 2 and result["curve"][0]["held_out"]["alpha"]
    assert result["train_positions"] == int(data.lengths[sets[1]].sum())
    assert 2 * result["train_positions"] <= result["positions_seen"]
    assert result["positions_seen"] < 2 * result["train_positions"] + 2 * data.lengths.max()
    with pytest.raises(ValueError, match="give one of them"):
        eagle_training.train(layer, data)


def test_the_bench_answers_are_greedy_held_out_and_scored_by_category(tmp_path, monkeypatch):
    import specwise.prompts
    from specwise.prompts import Prompt

    asks = [Prompt(f"{c}-{i}", c, (p,)) for i, (c, p) in
            enumerate(zip(["chat", "math"] * 3, _prompts(6), strict=True))]
    monkeypatch.setattr(specwise.prompts, "shipped", lambda: asks)
    target, _ = _toy_data(tmp_path / "first", 1)
    teacher.bench_answers(target, tmp_path / "bench", max_tokens=10, sequences=4)
    data = teacher.Data(tmp_path / "bench")
    assert sorted(m["name"] for m in data.meta) == sorted(p.id for p in asks)
    assert all(m["greedy"] and m["held_out"] and m["source"] == "bench" for m in data.meta)
    for q, m in enumerate(data.meta):  # greedy: every answer token is the label's argmax
        a, n = int(data.starts[q]), int(data.lengths[q])
        assert (data.tokens[a + 6 : a + n] == data.label_ids[a + 5 : a + n - 1, 0]).all()
        assert m["category"] == m["name"].split("-")[0]
    layer = Layer(36, LAYERS, list(range(6)), 6, width=16, depth=2)
    got = eagle_training.evaluate(layer, data)
    assert set(got["by_kind"]) == {"all", "answer", "greedy", "chat", "math"}
    both = got["by_kind"]["chat"]["positions"] + got["by_kind"]["math"]["positions"]
    assert both == got["by_kind"]["all"]["positions"] > 0
    assert got["by_kind"]["math"]["chain_accepted"] is not None
    assert got["by_kind"]["all"]["in_vocabulary"] == 1.0  # it names every token
    # a layer naming half the tokens: α1's ceiling is the share of labels it can name
    half = eagle_training.evaluate(Layer(36, LAYERS, [0, 1, 2], 6, width=16, depth=2), data)
    labels = np.concatenate([data.label_ids[a + 1 : a + n, 0][data.train[a + 1 : a + n]]
                             for a, n in zip(data.starts, data.lengths, strict=True)])
    inside = half["by_kind"]["all"]["in_vocabulary"]
    assert inside == pytest.approx(np.isin(labels, [0, 1, 2]).mean(), abs=1e-4)
    assert 0 < inside < 1 and half["alpha"][0] <= inside
    teacher.bench_answers(target, tmp_path / "bench", max_tokens=10)  # done: asks nothing
    assert len(teacher.Data(tmp_path / "bench").meta) == 6


def test_a_layer_outscores_another_only_on_the_same_bench_answers():
    def rec(alpha1, scored=100):
        return {"bench": {"alpha": [alpha1, 0.1], "scored_positions": scored}}

    assert eagle_training.outscores(rec(0.4), rec(0.3))
    assert not eagle_training.outscores(rec(0.3), rec(0.4))
    assert not eagle_training.outscores(rec(0.3), rec(0.3))  # a tie installs the new one
    assert not eagle_training.outscores(rec(0.4, 100), rec(0.3, 120))  # other answers
    assert not eagle_training.outscores({}, rec(0.3))  # no bench score: nothing to compare
    assert not eagle_training.outscores(rec(0.4), {"bench": None})


def test_a_layer_file_keeps_matrices_in_int8_per_row_within_half_a_step_and_reads_old_ones():
    import torch

    w = torch.tensor([[0.5, -1.27, 0.004], [0.0, 0.0, 0.0], [3e-9, -2e-9, 0.0]])
    b = torch.tensor([0.1, -2.0])
    kept = stored({"w": w, "b": b})
    assert kept["w"]["int8"].dtype == torch.int8 and kept["b"].dtype == torch.float16
    assert kept["w"]["int8"][0].tolist() == [50, -127, 0]  # the row's largest is 127 steps
    back = restored(kept)
    step = w.abs().amax(dim=1) / 127
    assert torch.all((back["w"] - w).abs() <= step[:, None] / 2 + 1e-3 * step[:, None] + 1e-7)
    assert back["w"][1].tolist() == [0.0, 0.0, 0.0] and not back["w"].isnan().any()
    assert back["b"].dtype == torch.float32 and torch.allclose(back["b"], b, atol=1e-3)
    # a file written before int8 (float16 tensors) reads the same way
    assert restored({"w": w.half()})["w"].dtype == torch.float32


def test_eagle_refuses_a_target_without_its_layers_and_reads_back_what_it_saved(tmp_path):
    layer = Layer(9, LAYERS, [0, 1, 2], 3, width=8)
    with pytest.raises(ValueError, match="no layer states"):
        EagleDrafter(layer).bind(ToyLM(vocab=3))
    with pytest.raises(ValueError, match=r"reads the target's layers \[0, 1, 2\]"):
        EagleDrafter(layer).bind(ToyLM(vocab=3, hidden=(0, 1)))
    with pytest.raises(ValueError, match="vocabulary of 3 tokens"):
        EagleDrafter(Layer(16, LAYERS, [0, 1, 2], 3, width=8)).bind(ToyLM(vocab=4, hidden=LAYERS))
    with pytest.raises(ValueError, match="multiple of 8"):
        Layer(9, LAYERS, [0, 1], 3, width=12)
    with pytest.raises(ValueError, match="beam = 0"):
        EagleDrafter(layer, beam=0)
    layer.meta["key"] = "abc"
    layer.save(tmp_path / "e.pt")
    again = Layer.load(tmp_path / "e.pt")
    assert again.layers == LAYERS and again.depth == layer.depth and again.meta["key"] == "abc"
    h = np.ones((2, 27), np.float32)
    got = again.read(again.new_cache(), h, [0, 1])[2].numpy()
    want = layer.read(layer.new_cache(), h, [0, 1])[2].numpy()
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max() + 1e-3)  # int8 file
    (tmp_path / "bad.pt").write_bytes(b"not a layer")
    with pytest.raises(ValueError, match="holds no drafting layer"):
        Layer.load(tmp_path / "bad.pt")


def test_the_heads_commands_make_data_train_score_and_ship_a_layer_on_a_real_target(
    smollm2_path, tmp_path, monkeypatch, capsys
):
    """`specwise heads data`, `train --arch eagle --curve`, `score` and `ship` on the smallest
    real chat model (three bench prompts stand in for the shipped ones): one sentence for
    each bad input, and a manifest beside the shipped file. ik_llama's probe is taken as
    passed: on some CPUs it refuses SmolLM2's Q4_1 in long forwards, whose numbers this test
    of the commands' plumbing does not judge."""
    import json

    import specwise.prompts
    from specwise.backends import ik_llama
    from specwise.bench import replay, workloads
    from specwise.cli import heads as heads_cli
    from specwise.cli import main
    from specwise.drafters import eagle
    from specwise.prompts import Prompt

    if not ik_llama.available():
        pytest.skip(ik_llama.UNAVAILABLE)
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    asks = [Prompt("c-1", "chat", ("Name three colours.",)),
            Prompt("m-1", "math", ("What is 12 times 7?",)),
            Prompt("g-1", "code_generation", ("Write a Python function that adds two numbers.",))]
    def shipped(categories=None):
        return [p for p in asks if categories is None or p.category in categories]

    monkeypatch.setattr(specwise.prompts, "shipped", shipped)
    monkeypatch.setattr(workloads, "shipped", shipped)  # `bench replay`'s prompts
    monkeypatch.setattr(eagle, "shipped_path", lambda model: tmp_path / "pkg" / "eagle.pt")
    monkeypatch.setattr(ik_llama, "probe", lambda *a, **k: None)
    target = ["--target", str(smollm2_path)]
    layers = eagle.layers_for(30)  # SmolLM2-135M's 30 layers
    assert main(["heads", "train", *target, "--arch", "eagle"]) == 2
    assert "no training data for" in capsys.readouterr().err
    assert main(["heads", "data", *target, "--positions", "0"]) == 2
    assert "--positions 0" in capsys.readouterr().err
    assert main(["heads", "data", *target, "--invent", "-1"]) == 2
    assert "--invent -1" in capsys.readouterr().err
    argv = ["heads", "data", *target, "--positions", "2500", "--answers", "0.4", "--invent", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "read:" in out and "answer:" in out and "positions/s" in out and "invented " in out
    data = teacher.Data(eagle.data_path(smollm2_path, layers))
    assert len(data) >= 2500 and {m["kind"] for m in data.meta} == {"read", "answer"}
    assert teacher.bench_complete(eagle.bench_path(smollm2_path, layers))
    assert main(["heads", "train", *target, "--arch", "eagle", "--epochs", "0"]) == 2
    assert "--epochs 0" in capsys.readouterr().err
    assert main(["heads", "train", *target, "--epochs", "1"]) == 2  # the heads take no epochs
    assert "add --arch eagle" in capsys.readouterr().err
    assert main(["heads", "train", *target, "--arch", "eagle", "--kinds", "answer,poems"]) == 2
    assert "--kinds 'answer,poems': use read or answer" in capsys.readouterr().err
    assert ",".join(teacher.KINDS) == heads_cli.ALL_KINDS  # --kinds' default: all of them
    small = ["--width", "16", "--vocab", "64", "--depth", "2"]
    assert main(["heads", "train", *target, "--arch", "eagle", "--epochs", "1", "--kinds",
                 "answer", *small]) == 0
    record = json.loads(eagle.find(smollm2_path).with_suffix(".json").read_text())
    answered = teacher.Data(eagle.data_path(smollm2_path, layers), kinds=("answer",))
    assert record["kinds"] == ["answer"]
    fit = eagle_training.training_sequences(answered)
    assert record["train_positions"] == answered.lengths[fit].sum()
    capsys.readouterr()
    argv = ["heads", "train", *target, "--arch", "eagle", "--epochs", "1", "--curve", "--replace",
            "--width", "16", "--vocab", "64", "--depth", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| bench | positions | top token in vocabulary | α1 | α2 |" in out
    assert "| code_generation |" in out
    assert "learning curve" in out
    trained = eagle.find(smollm2_path)
    record = json.loads(trained.with_suffix(".json").read_text())
    assert record["curve"][-1]["positions_seen"] >= record["train_positions"]
    assert main(["heads", "score", *target]) == 0
    out = capsys.readouterr().out
    assert "| bench | positions |" in out and "| math |" in out
    record["bench"]["alpha"][0] = 1.0  # as if the layer installed were perfect on the bench
    trained.with_suffix(".json").write_text(json.dumps(record))
    before = trained.read_bytes()
    small += ["--lr", "0.01"]  # another rate: trained from the start, not resumed
    assert main(["heads", "train", *target, "--arch", "eagle", "--epochs", "1", *small]) == 0
    out = capsys.readouterr().out
    assert "kept the layer installed: on the bench's answers it scores α1 1.000" in out
    assert trained.read_bytes() == before and (trained.parent / heads_cli.NEW_FILE).is_file()
    record["format"] = FORMAT - 1  # the same layer, as if of a layout this specwise cannot read
    trained.with_suffix(".json").write_text(json.dumps(record))
    assert main(["heads", "train", *target, "--arch", "eagle", "--epochs", "1", *small]) == 0
    assert trained.read_bytes() != before and "saved to" in capsys.readouterr().out
    before = trained.read_bytes()
    assert main(["heads", "train", *target, "--replace"]) == 2  # heads: nothing to replace
    assert "add --arch eagle" in capsys.readouterr().err
    argv = ["heads", "train", *target, "--arch", "eagle", "--epochs", "1", "--replace", *small]
    assert main(argv) == 0
    assert trained.read_bytes() != before and "saved to" in capsys.readouterr().out
    assert main(["heads", "ship", *target]) == 0
    shipped = tmp_path / "pkg" / "eagle.pt"
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert shipped.read_bytes() == trained.read_bytes()
    held = sum(k["positions"] for k in manifest["data"]["kinds"].values())
    assert manifest["rebuild"] == f"make eagle-layer EAGLE_POSITIONS={held}"
    further = {"data": {"kinds": {"read": {"positions": 10}, "answer": {"positions": 990}}},
               "history": [{"positions": 500}]}  # trained further from the layer before it
    assert rebuild_command(further) == "make eagle-layer EAGLE_POSITIONS=1000 EAGLE_FROM=shipped"
    assert manifest["bench"]["by_kind"]["code_generation"]["alpha"]
    layer = Layer.load(shipped)
    assert layer.layers == layers and len(layer.ids) <= 64 + 2
    # the shipped layer trained further: its vocabulary and shape kept, its training recorded
    for start, words in [("shipped --width 16", "drop --vocab, --width and --depth"),
                         (str(tmp_path / "none.pt"), "no such file; use shipped, installed or")]:
        argv = ["heads", "train", *target, "--arch", "eagle", "--from", *start.split()]
        assert main(argv) == 2
        assert words in capsys.readouterr().err
    other = tmp_path / "other.pt"
    Layer(576, [1, 2, 3], np.arange(10), 49152, width=16, depth=1).save(other)
    assert main(["heads", "train", *target, "--arch", "eagle", "--from", str(other)]) == 2
    assert "is a layer for another model (layers [1, 2, 3]" in capsys.readouterr().err
    assert main(["heads", "train", *target, "--from", "shipped"]) == 2
    assert "add --arch eagle" in capsys.readouterr().err
    argv = ["heads", "train", *target, "--arch", "eagle", "--epochs", "1", "--from", "shipped",
            "--replace"]
    assert main(argv) == 0
    capsys.readouterr()
    further = json.loads(eagle.find(smollm2_path).with_suffix(".json").read_text())
    assert [h["positions_seen"] for h in further["history"]] == [manifest["positions_seen"]]
    assert further["positions_seen_in_all"] == sum(
        r["positions_seen"] for r in (manifest, further)
    )
    assert Layer.load(eagle.find(smollm2_path)).ids.tolist() == layer.ids.tolist()
    # the layer replayed over the bench answers and their states, priced at measured costs
    argv = ["bench", "replay", *target, "--sets", "ngram;ngram+eagle", "--max-tokens", "8",
            "--out", str(tmp_path / "replay")]
    answers = replay.from_bench(teacher.Data(eagle.bench_path(smollm2_path, layers)), 8)
    if not answers:  # where ik_llama computes SmolLM2 wrong, it ends every answer at once
        assert main(argv) == 2
        assert "ended at once: there is nothing to replay" in capsys.readouterr().err
        return
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| auto[ngram+eagle] |" in out and "| hindsight[ngram+eagle] |" in out
    assert "accepted a planned round: expected | got |" in out
    recorded = (tmp_path / "replay" / "recordings.jsonl").read_text().splitlines()
    assert len(recorded) == len(answers)


def test_each_layer_the_package_ships_loads_and_matches_its_manifest():
    """Every layer in the package's trained/ folder reads with this specwise (a change of the
    layout must ship the layer again, `make eagle-layer`), is the file its manifest hashed,
    and was made for the catalog model whose sha256 names its folder."""
    import hashlib
    import json
    from importlib import resources
    from pathlib import Path

    from specwise.drafters.eagle import FILE
    from specwise.models import CATALOG

    shipped = Path(str(resources.files("specwise"))) / "trained"
    files = sorted(shipped.glob("*/" + FILE))
    for f in files:
        manifest = json.loads((f.parent / "manifest.json").read_text())
        assert manifest["file_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
        assert f.parent.name in {m.sha256 for m in CATALOG.values()}
        layer = Layer.load(f)
        assert layer.meta["sha256"] == f.parent.name and manifest["format"] == FORMAT
        assert manifest["bench"]["alpha"] and manifest["rebuild"]
    if not files:
        pytest.skip("no layer ships in this checkout")


def test_a_layer_found_for_the_target_is_among_serve_s_default_drafters(
    smollm2_path, tmp_path, monkeypatch
):
    """With a layer trained for the target, serve's `--k auto` drafts with it beside the
    n-gram and suffix drafters (and the draft model); generate (whose start it would slow by
    seconds for one answer), a fixed k, --backend llama_cpp (which cannot keep the layers'
    states) or a target without a layer leave it out."""
    from specwise.cli import build_parser
    from specwise.cli.common import _default_drafters, _drafter_names
    from specwise.drafters import eagle

    assert _default_drafters(True, True) == ["ngram", "suffix", "model"]
    assert _default_drafters(True, True, True) == ["ngram", "suffix", "model", "eagle"]
    assert _default_drafters(False, False, True) == ["ngram"]  # a fixed k: one drafter

    def names(*flags, command="serve"):
        args = [command, "--target", str(smollm2_path), *flags]
        a = build_parser().parse_args(args + (["hi"] if command == "generate" else []))
        return _drafter_names(a, layer=command == "serve")

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    assert names("--k", "auto") == ["ngram", "suffix"]  # no layer for it
    Layer(576, eagle.layers_for(30), list(range(64)), 49152, width=16).save(
        eagle.heads_path(smollm2_path) / eagle.FILE
    )
    assert names("--k", "auto") == ["ngram", "suffix", "eagle"]
    assert names("--k", "auto", command="generate") == ["ngram", "suffix"]
    assert names("--k", "auto", "--backend", "llama_cpp") == ["ngram", "suffix"]
    assert names("--k", "4") == ["ngram"]
    assert names("--k", "auto", "--drafter", "ngram") == ["ngram"]


def test_a_default_layer_the_backend_cannot_run_is_dropped_with_a_note(
    smollm2_path, tmp_path, monkeypatch, capsys
):
    """Where the backend chosen cannot keep the layers' states (mainline llama.cpp), a layer
    among the default drafters is dropped with one line saying why and the engine drafts with
    the others; asked for by name, the error stands, in one sentence."""
    import specwise.cli.common
    from specwise.cli import build_parser, main
    from specwise.cli.common import _build_engine
    from specwise.drafters import eagle

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    Layer(576, eagle.layers_for(30), list(range(64)), 49152, width=16).save(
        eagle.heads_path(smollm2_path) / eagle.FILE
    )
    monkeypatch.setattr(specwise.cli.common, "_layer_found", lambda a: True)  # as `auto` would
    flags = ["--target", str(smollm2_path), "--backend", "llama_cpp", "--k", "auto"]
    engine = _build_engine(build_parser().parse_args(["serve", *flags]), layer=True)
    assert [d.name for d in engine.drafters] == ["ngram", "suffix"]
    assert "drafting without the eagle layer: llama_cpp gives the final hidden state only" in (
        capsys.readouterr().err
    )
    engine.target.close()
    assert main(["generate", *flags, "--drafter", "ngram,eagle", "--max-tokens", "2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "llama_cpp gives the final hidden state only" in err and "Traceback" not in err


def test_a_layer_of_an_older_format_is_refused_in_one_sentence(smollm2_path, tmp_path, monkeypatch):
    """A layer file from before the copy input (format 3) asked for by name: one sentence
    naming the file, its format and how to train it again, no traceback."""
    import torch

    from specwise.cli import build_parser
    from specwise.cli.common import UsageError, _trained
    from specwise.drafters import eagle

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    path = eagle.heads_path(smollm2_path) / eagle.FILE
    path.parent.mkdir(parents=True)
    torch.save({"format": 3, "weights": {}}, path)
    a = build_parser().parse_args(
        ["generate", "--target", str(smollm2_path), "--drafter", "eagle", "hi"]
    )
    with pytest.raises(UsageError, match=rf"format 3, this specwise reads {FORMAT}\); train it again"):
        _trained(a, "eagle")


def test_a_layer_starts_as_the_targets_reading_of_its_top_layer():
    """With the target's output rows and final norm, and Back at zero, the depth-1 logits are
    the output layer applied to the top layer's state, normalised as the target normalises."""
    rng = np.random.default_rng(3)
    d, ids = 16, [0, 2, 5, 7]
    rows = rng.standard_normal((len(ids), d)).astype(np.float32)
    norm = rng.uniform(0.5, 2.0, d).astype(np.float32)
    layer = Layer(d, LAYERS, ids, 9, width=16, unembedding=rows, final_norm=norm)
    s = rng.standard_normal((3, 3 * d)).astype(np.float32)
    _, state, logits = layer.read(layer.new_cache(), s, [1, 2, 3])
    top = s[-1, 2 * d :]
    np.testing.assert_allclose(state.numpy(), top, rtol=1e-6)
    want = rows @ (norm * top / np.sqrt((top**2).mean() + 1e-6))
    np.testing.assert_allclose(logits[:-1].numpy(), want, rtol=0.05, atol=0.05 * abs(want).max())
    assert logits[-1] == UNNAMED  # the copy slot: no copy read
    with pytest.raises(ValueError, match=r"final_norm has shape \(3,\)"):
        Layer(d, LAYERS, ids, 9, width=16, final_norm=np.ones(3))


def test_the_targets_output_rows_and_final_norm_are_read_from_its_file(smollm2, tmp_path):
    from specwise import weights

    rows = weights.unembedding(smollm2, np.array([0, 5, 9]))
    norm = weights.final_norm(smollm2)
    assert rows.shape == (3, 576) and norm.shape == (576,) and norm.dtype == np.float32
    assert np.isfinite(rows).all() and 0.1 < float(np.abs(norm).mean()) < 100
    embedded = weights.embedding(smollm2, np.array([0, 5, 9]))
    assert embedded.shape == (3, 576) and np.isfinite(embedded).all()
    torch_lm = TorchLM(tiny_llama(vocab=16, seed=0, layers=2), hidden=True)
    assert weights.final_norm(torch_lm).shape == (torch_lm.hidden_size,)
    assert weights.embedding(torch_lm, np.array([1, 2])).shape == (2, torch_lm.hidden_size)


def test_the_token_embedding_starts_from_the_targets_where_given():
    """E starts as the target's embeddings along their leading principal directions: at a
    width past their rank the angles between tokens are the target's exactly, each row at
    E's random start's scale; narrower, the directions that carry the most are kept."""
    rng = np.random.default_rng(4)
    d, ids = 12, [0, 2, 5, 7, 8]
    rows = rng.standard_normal((len(ids), d)).astype(np.float32)
    layer = Layer(d, LAYERS, ids, 9, width=16, embedding=rows)
    e = layer.module.emb.weight.detach().numpy()
    assert layer.start == "embedding" and Layer(d, LAYERS, ids, 9, width=16).start == "random"

    def cosines(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return x @ x.T

    np.testing.assert_allclose(cosines(e[: len(ids)]), cosines(rows), atol=1e-5)
    np.testing.assert_allclose(np.sqrt((e[: len(ids)] ** 2).mean(1)), 0.02, rtol=1e-5)
    assert not e[len(ids)].any()  # the index of every other id stays at zero
    low = np.outer(rng.standard_normal(len(ids)), rng.standard_normal(d))  # rank 1
    narrow = projected(low + 1e-3 * rows, 1)
    np.testing.assert_allclose(abs(cosines(narrow)), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match=r"embedding has shape \(5, 3\)"):
        Layer(d, LAYERS, ids, 9, width=16, embedding=np.ones((5, 3)))


def test_each_depth_learns_the_targets_next_states_beside_its_tokens(tmp_path):
    """The batch's regression targets are the target's top states one position further per
    depth, and a layer whose predicted states equal them pays no regression."""
    import torch

    _target, data = _toy_data(tmp_path / "data", 8)
    layer = Layer(36, LAYERS, list(range(6)), 6, width=16, depth=3)
    a, e = int(data.starts[0]), int(data.starts[0] + 10)
    *_, cols, wts, tops = eagle_training._batch(layer, data, [(a, e)], 3)
    states = data.states(a, a + 13).astype(np.float32)
    for j in range(3):
        np.testing.assert_array_equal(tops[j, 0].numpy(), states[1 + j : 11 + j, -36:])
    logits = [torch.zeros(1, 10, 7) for _ in range(3)]
    no_reg = eagle_training._loss(logits, cols, wts)
    same = eagle_training._loss(logits, cols, wts, [tops[j] for j in range(3)], tops)
    assert float(same) == pytest.approx(float(no_reg))
    off = eagle_training._loss(logits, cols, wts, [tops[j] + 1.0 for j in range(3)], tops)
    assert float(off) > float(no_reg)


def test_an_unsure_layer_grows_no_level_below_the_floor():
    """Nodes whose cumulative probability is under FLOOR get no children: a layer that is
    uniform over 200 tokens (each 1/200) drafts its first level only, with no second call."""
    import torch

    from specwise.drafters.eagle_layer import FLOOR

    layer = Layer(8, LAYERS, list(range(200)), 200, width=8, depth=4)
    with torch.no_grad():
        layer.module.out.weight.zero_()
    layer.publish()
    cache = layer.new_cache()
    root = layer.read(cache, np.ones((2, 24), np.float32), [1, 2])
    calls = []
    expand = cache.net.expand
    cache.net.expand = lambda *a: calls.append(1) or expand(*a)
    tree = propose_tree(layer, cache, root, 12, 3)
    assert FLOOR > 1 / 200 and tree.parents == [-1, -1, -1] and not calls


def test_ctrl_c_asks_data_making_to_stop_and_a_second_one_stops_it_at_once():
    """`heads data` runs its forwards with a ctypes callback that would swallow a
    KeyboardInterrupt: the first Ctrl-C sets a flag its loop reads between sequences."""
    import signal

    said: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    with teacher.interruptible(said.append) as pressed:
        assert not pressed()
        signal.raise_signal(signal.SIGINT)
        assert pressed() and "stopping after this sequence" in said[0]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_batch_reads_each_tokens_copy_within_its_sequence(tmp_path):
    """The copies a batch reads are `continuations` over the window's own sequence (not the
    data's concatenation), aligned with the tokens read."""
    _target, data = _toy_data(tmp_path / "data", 4)
    layer = Layer(36, LAYERS, list(range(6)), 6, width=16, depth=3)
    q = 2
    first, n = int(data.starts[q]), int(data.lengths[q])
    seq = data.tokens[first : first + n]
    ids, sizes = continuations(seq.tolist(), COPY_N)
    a, e = first + 3, first + 13
    _, t, c, m, *_ = eagle_training._batch(layer, data, [(a, e)], 3)
    np.testing.assert_array_equal(t[0].numpy(), layer.index(seq[4:16]))
    np.testing.assert_array_equal(c[0].numpy(), layer.index(ids[4:16]))
    np.testing.assert_array_equal(m[0].numpy(), sizes[4:16])
    assert (sizes[4:16] > 0).any() and sizes[0] == 0


def test_the_drafter_reads_each_tokens_copy_as_training_does():
    """The drafter's chain (float weights, beam 1) is, depth by depth, the argmax of the
    training-time test over the context followed by the chain itself, each token with its
    copy: the committed tokens' from the request's index, the draft tokens' along their path."""
    target = ToyLM(vocab=8, seed=1, hidden=LAYERS)
    target.trees = False
    layer = _toy_layer(target, width=24, depth=4)
    chain, cols, copies = _drafted_and_unrolled(layer, target, [1, 5, 3, 7, 2, 5, 3, 7, 2, 5, 3, 6, 1, 5])
    assert len(chain) >= 2 and layer.tokens(cols, copies).tolist() == chain


def _drafted_and_unrolled(layer: Layer, target, context: list[int]):
    """The eagle drafter's chain after `context` (float weights, beam 1), and at the context's
    last position, depth by depth along that chain, the training-time test's argmax column
    and the copy that depth reads (target ids)."""
    import torch

    layer._fast = layer.module  # draft in float: argmaxes compare exactly
    drafter = EagleDrafter(layer)
    drafter.bind(target)
    target.forward([(0, context[:-1])])
    chain = drafter.propose(0, context, 4, SamplingParams(), None).tokens
    s = torch.from_numpy(target.hiddens(0, 0).astype(np.float32))
    full = context + chain[:-1]
    ids, sizes = continuations(full, COPY_N)
    t, c = (torch.from_numpy(layer.index(x[1:])) for x in (np.array(full), ids))
    n = torch.from_numpy(sizes[1:].astype(np.int64))
    with torch.inference_mode():
        logits = layer.module.unroll(s[None], t[None], c[None], n[None], layer.depth)
    i = len(context) - 2
    cols = [int(logits[j][0, i].argmax()) for j in range(len(chain))]
    return chain, cols, [int(ids[i + 1 + j]) for j in range(len(chain))]


def _slot_layer(target, named: int, width: int = 24, depth: int = 4, odds: float = 3.0) -> Layer:
    """A random layer that names the target's first `named` ids only, its copy gate and its
    copy slot's log-odds at random (the slot's raised by `odds`, so it is drafted)."""
    import torch

    v = target.vocab_size
    small = Layer(v * v, LAYERS, list(range(named)), v, width=width, depth=depth)
    with torch.no_grad():
        for p in small.module.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
        small.module.gate.weight.normal_(0.0, 0.3)
        small.module.gate.bias.normal_(0.0, 1.0)
        small.module.slot.weight.normal_(0.0, 0.02)
        small.module.slot.bias.normal_(odds, 1.0)
    small.publish()
    return small


def test_the_copy_slot_names_the_copies_the_vocabulary_lacks():
    """`columns` maps target ids to the layer's columns (a named id's, the slot for the
    position's unnamed copy, else -1) and `tokens` maps them back, over every label, copy
    and match length of a 5-token vocabulary whose layer names 0, 2 and 3."""
    layer = Layer(8, LAYERS, [0, 2, 3], 5, width=8)
    slot = len(layer.ids)
    cases = list(itertools.product(range(-1, 5), range(-1, 5), range(3)))
    labels, copies, sizes = (np.array(x) for x in zip(*cases, strict=True))
    got = layer.columns(labels, copies, sizes)
    for (lab, cp, n), col in zip(cases, got, strict=True):
        want = {0: 0, 2: 1, 3: 2}.get(lab, slot if lab == cp and n > 0 and cp in (1, 4) else -1)
        assert col == want, (lab, cp, n)
        if col >= 0:
            assert layer.tokens([col], [cp])[0] == lab
    k = layer.columns(np.stack([labels, np.roll(labels, 1)], axis=1), copies, sizes)
    np.testing.assert_array_equal(k[:, 0], got)  # [n, K] labels: each column alike


def test_the_drafter_drafts_unnamed_copies_as_training_scores_them():
    """With the copy slot live (the layer names 6 of 8 ids; the context repeats 6 and 7), the
    drafter's chain is, depth by depth, the training-time test's argmax read through
    `Layer.tokens` (the slot naming that position's copy), and the chain holds an id the
    vocabulary lacks."""
    target = ToyLM(vocab=8, seed=1, hidden=LAYERS)
    target.trees = False
    layer = _slot_layer(target, named=6)
    chain, cols, copies = _drafted_and_unrolled(layer, target, [1, 6, 3, 7, 2, 6, 3, 7, 2, 6, 3])
    assert len(chain) >= 2 and any(x >= 6 for x in chain)
    assert layer.tokens(cols, copies).tolist() == chain
    assert len(layer.ids) in cols[1:]  # a draft token's slot names its path's copy


@pytest.mark.parametrize("trees", [True, False])
def test_eagle_greedy_equals_plain_with_unnamed_copies_drafted(trees):
    target = ToyLM(vocab=12, seed=3, hidden=LAYERS)
    target.trees = trees
    drafter = EagleDrafter(_slot_layer(target, named=8, width=16, depth=3))
    drafted: list[int] = []
    propose = drafter.propose

    def recorded(*a, **k):
        d = propose(*a, **k)
        drafted.extend(d.tokens)
        return d

    drafter.propose = recorded
    prompt = [1, 9, 3, 10, 2, 9, 3, 10, 2, 11]
    params = SamplingParams(max_tokens=40)
    res = Engine(target, drafter, k=6).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert any(x >= 8 for x in drafted)  # the slot drafted ids the layer does not name


def test_a_label_that_is_the_unnamed_copy_trains_the_slot(tmp_path):
    """In a batch, a label the vocabulary lacks is learnt at the copy slot where it is the
    position's copy, and nowhere where it is not; the loss stays finite beside the slot's
    UNNAMED logit."""
    import torch

    _target, data = _toy_data(tmp_path / "data", 8)
    layer = Layer(36, LAYERS, [0, 1, 2], 6, width=16, depth=2)
    a, e = int(data.starts[0]), int(data.starts[0] + 20)
    s, t, c, n, cols, wts, tops = eagle_training._batch(layer, data, [(a, e)], 2)
    ids, sizes = eagle_training.copies(data)
    lo = a + 1
    lab = data.label_ids[lo : lo + 19]
    want = layer.columns(lab, ids[lo : lo + 19], sizes[lo : lo + 19])
    slot = want == len(layer.ids)
    assert slot.any() and (want == -1).any()
    on = wts[0, 0, :19].numpy() > 0
    kept = (want >= 0) & (data.label_probs[lo : lo + 19] > 0) & data.train[lo : lo + 19, None]
    np.testing.assert_array_equal(on, kept)
    np.testing.assert_array_equal(cols[0, 0, :19].numpy()[on], want[on])
    logits, predicted = layer.module.unroll(s, t, c, n, 2, states=True)
    loss = eagle_training._loss(logits, cols, wts, predicted, tops)
    assert torch.isfinite(loss)
    loss.backward()
    assert layer.module.slot.bias.grad.abs().sum() > 0
