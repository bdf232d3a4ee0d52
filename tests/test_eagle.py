"""The EAGLE-style drafter (`drafters.eagle`): exactness (greedy equality with plain decoding;
the emitted distribution under sampling, enumerated), the layer's cache read in pieces against
one forward over the whole answer, the hidden states a backend keeps (`LM.hiddens`), training
on a toy target, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams, distill
from specwise.backends.base import HiddenLog
from specwise.backends.torch_hf import TorchLM
from specwise.drafters.eagle import EagleDrafter, Layer
from specwise.drafters.heads import Heads
from specwise.oracle import plain_decode
from test_heads import (
    SAMPLED,
    assert_emits_the_target_distribution,
    assert_greedy_plain_and_accepted,
    toy_training_data,
)
from toy import ToyLM, tiny_llama


def _toy_layer(lm, seed: int = 0, width: int = 16) -> Layer:
    import torch

    v = lm.vocab_size
    layer = Layer(lm.hidden_size, list(range(v)), v, width=width, seed=seed)
    with torch.no_grad():  # a random way back, so that the layer's drafts depend on the answer
        layer.module.back.weight.normal_(0, 1.0)
        layer.module.out.weight.normal_(0, 1.0)
    layer.publish()
    return layer


def test_eagle_greedy_equals_plain():
    target = ToyLM(vocab=12, seed=3, hidden=True)
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=40)
    res = Engine(target, EagleDrafter(_toy_layer(target)), k=1).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert res.summary.proposed > 20  # it drafted in (nearly) every round


def test_eagle_on_a_torch_target_greedy_equals_plain():
    target = TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0), hidden=True)
    layer = Layer(target.hidden_size, list(range(16)), 16, width=16, seed=1)
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=30)
    res = Engine(target, EagleDrafter(layer), k=1).generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    assert res.summary.proposed > 10


@pytest.mark.parametrize("params", SAMPLED)
def test_eagle_sampling_emits_exactly_the_target_distribution(params):
    target = ToyLM(vocab=3, seed=5, hidden=True)
    engine = Engine(target, EagleDrafter(_toy_layer(target)), k=1)
    assert_emits_the_target_distribution(engine, target, [0, 2, 1], params)


def test_eagle_under_the_controller_greedy_equals_plain(tmp_path, monkeypatch):
    """k=auto over the layer and the n-gram drafter: rounds the layer is not given leave
    positions it reads later (all of them: the target keeps every state)."""
    from specwise.controller import Controller
    from specwise.drafters import NgramDrafter

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target = ToyLM(vocab=12, seed=3, hidden=True, delay_ms=(2.0, 0.1))
    prompt = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]
    params = SamplingParams(max_tokens=60)
    drafters = [NgramDrafter(), EagleDrafter(_toy_layer(target))]
    engine = Engine(target, drafters, k="auto", controller=Controller.calibrated(target, drafters))
    res = engine.generate(prompt, params)
    assert res.tokens == plain_decode(target, prompt, params)
    eagle = [r for r in res.rounds if r.drafter == "eagle"]
    assert eagle and all(r.proposed == 1 for r in eagle)  # begun lazily, at its first round


def test_the_cache_read_in_pieces_gives_the_logits_of_one_forward_over_the_answer():
    """What the drafter computes round by round is what training computes over a whole answer."""
    import torch

    target = ToyLM(vocab=8, seed=1, hidden=True)
    layer = _toy_layer(target, width=24)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((9, target.hidden_size)).astype(np.float32)
    t = rng.integers(0, 8, size=9)
    with torch.inference_mode():
        whole = layer.module(torch.from_numpy(h)[None], torch.from_numpy(layer.index(t))[None])[0]
        cache, at = layer.new_cache(), 0
        for n in (1, 3, 1, 4):
            last = layer.module.step(
                torch.from_numpy(h[at : at + n]),
                torch.from_numpy(layer.index(t[at : at + n])),
                cache,
            )
            at += n
            np.testing.assert_allclose(last.numpy(), whole[at - 1].numpy(), rtol=1e-4, atol=1e-4)
    assert cache.n == 9 and len(cache.keys) >= 9
    cache = layer.new_cache()  # the int8 copy the drafter runs: the same logits, to int8's error
    layer.step(cache, h[:5], t[:5])
    fast, want = layer.step(cache, h[5:], t[5:]), whole[-1].numpy()
    np.testing.assert_allclose(fast, want, atol=0.05 * np.abs(want).max())


def test_a_hidden_log_keeps_consecutive_positions_through_cuts_and_a_kept_path():
    log = HiddenLog(2)
    rows = np.arange(20, dtype=np.float32).reshape(10, 2)
    log.put(4, rows[:1])  # a prefill's last row: position 4
    assert log.since(0, 5).tolist() == [[0, 1]] and log.since(0, 4) is None
    log.put(5, rows[1:4])  # positions 5..7
    log.cut(6)  # rollback to 6 tokens
    assert log.since(4, 6).tolist() == rows[:2].tolist() and log.since(4, 7) is None
    assert log.since(5, 6).tolist() == rows[1:2].tolist()
    log.put(6, rows[4:8])  # a tree of 4 at 6: keep tree tokens 0, 2
    log.reorder(6, [0, 2])
    assert log.since(6, 8).tolist() == [rows[4].tolist(), rows[6].tolist()]
    log.put(12, rows[8:])  # not following on: the log starts again
    assert len(log.since(8, 14)) == 2 and log.at(13).tolist() == rows[9].tolist()
    assert log.at(11) is None


def test_a_torch_target_keeps_every_state_through_a_rollback():
    target = TorchLM(tiny_llama(vocab=16, seed=0), hidden=True)
    target.forward([(1, [1, 2, 3, 4])], last_only=True)
    target.forward([(1, [5, 6, 7])])
    target.truncate(1, 6)
    target.forward([(1, [8, 9])])
    got = target.hiddens(1, 3)
    target.forward([(2, [1, 2, 3, 4, 5, 6, 8, 9])])
    want = target.hiddens(2, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert len(target.hiddens(1, 0)) == 5  # the prefill kept its last row only: from 3 on
    assert target.hiddens(1, 9).shape == (0, target.hidden_size)  # past the sequence's end
    np.testing.assert_array_equal(target.hidden(1), got[-1])


def test_training_on_a_toy_target_learns_a_layer_that_is_accepted(tmp_path):
    """`specwise heads train --arch eagle` but the model: data with the tokens that followed,
    training, a held-out score; then the layer drafts and is accepted."""
    target, data = toy_training_data(tmp_path)
    assert data.tokens.shape == (60 * 24,)
    assert (data.tokens[data.seq % 2 == 0] == data.top_ids[data.seq % 2 == 0, 0]).all()
    layer = Layer(36, distill.choose_vocab(data, 6), 6, width=32, seed=0)
    result = distill.train_layer(layer, data, seconds=8.0, checkpoint=tmp_path / "l.pt", lr=3e-3)
    assert result["alone"][0] > 0.7, result  # 1 in 6 by chance; some held-out text is sampled
    assert_greedy_plain_and_accepted(Engine(target, EagleDrafter(layer), k=1), target)


def test_data_written_before_tokens_were_recorded_reads_the_greedy_answers_tokens(tmp_path):
    hidden = np.zeros((4, 2), np.float16)
    ids = np.array([[5] * 16, [6] * 16, [7] * 16, [8] * 16], np.int32)
    np.savez(
        tmp_path / "shard-00000.npz",
        hidden=hidden,
        ids=ids,
        probs=np.ones((4, 16), np.float16),
        seq=[0, 0, 1, 1],
    )
    assert distill.load_data(tmp_path).tokens.tolist() == [5, 6, -1, -1]


def test_eagle_refuses_a_target_without_hidden_states_or_of_another_shape(tmp_path):
    layer = Layer(9, [0, 1, 2], 3, width=8)
    with pytest.raises(ValueError, match="loaded without them"):
        EagleDrafter(layer).bind(ToyLM(vocab=3))
    with pytest.raises(ValueError, match="width 9"):
        EagleDrafter(layer).bind(ToyLM(vocab=4, hidden=True))
    with pytest.raises(ValueError, match="multiple of 8"):
        Layer(9, [0, 1], 3, width=12)
    layer.meta["key"] = "abc"
    layer.save(tmp_path / "e.pt")
    again = Layer.load(tmp_path / "e.pt")
    h = np.ones((2, 9), np.float32)
    np.testing.assert_array_equal(
        again.step(again.new_cache(), h, [0, 1]), layer.step(layer.new_cache(), h, [0, 1])
    )
    (tmp_path / "bad.pt").write_bytes(b"not a layer")
    with pytest.raises(ValueError, match="holds no drafting layer"):
        Layer.load(tmp_path / "bad.pt")


def test_score_splits_the_held_out_answers_into_greedy_and_sampled(tmp_path):
    _target, data = toy_training_data(tmp_path)
    layer = Layer(36, distill.choose_vocab(data, 6), 6, width=16, seed=0)
    got = distill.score(layer, data)
    held = distill._split(data)[1]
    assert got["all"] == distill.evaluate_layer(layer, data, held)
    assert got["greedy"]["scored"] + got["sampled"]["scored"] == got["all"]["scored"] > 0
    greedy = held[data.seq[held] % 2 == 0]
    assert got["greedy"] == distill.evaluate_layer(layer, data, greedy)
    heads = Heads(36, 2, distill.choose_vocab(data, 6), 6, seed=0)
    assert distill.score(heads, data)["all"] == distill.evaluate(heads, data, held)


def test_heads_score_prints_each_trained_network_held_out(
    smollm2_path, tmp_path, monkeypatch, capsys
):
    """`specwise heads score`: the networks in the target's folder, scored on its data; a file
    that is no network, a missing one, and no data are one sentence each."""
    from specwise.cli import main
    from specwise.drafters.heads import heads_path

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    argv = ["heads", "score", "--target", str(smollm2_path)]
    assert main(argv) == 2
    assert "no drafting heads or layer are trained" in capsys.readouterr().err
    folder = heads_path(smollm2_path)
    layer = Layer(36, [0, 1, 2, 3, 4, 5], 6, width=16, seed=0, meta={"positions": 7})
    folder.mkdir(parents=True)
    layer.save(folder / "eagle.pt")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds no self-distillation data" in err and "Traceback" not in err
    toy_training_data(folder / "work")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{folder / 'eagle.pt'}: trained on 7 positions; held out, its argmax" in out
    assert "(greedy answers 0." in out and ", sampled 0." in out
    (tmp_path / "bad.pt").write_bytes(b"no network")
    for f, words in ((tmp_path / "bad.pt", "holds neither"), (tmp_path / "no.pt", "no such file")):
        assert main([*argv, "--file", str(f)]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1
