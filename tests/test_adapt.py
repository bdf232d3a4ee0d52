"""Online adaptation of the heads and of the eagle layer (`specwise.adapt`): the examples
served requests become, the training thread that learns from them and swaps the weights in,
exactness while it does, and keeping tenants apart."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from specwise import Engine, SamplingParams, distill
from specwise.adapt import Adapter, Answers, Replay
from specwise.drafters.eagle import COPY_N, EagleDrafter, Layer
from specwise.drafters.heads import Heads, HeadsDrafter
from specwise.drafters.ngram import continuations
from specwise.eagle_training import FINAL_LR
from specwise.oracle import plain_decode
from toy import ToyLM


def _setup(scope="global", **kw):
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=True)
    heads = Heads(target.hidden_size, 2, list(range(6)), 6, seed=0)
    heads.ready()
    adapter = Adapter(heads, scope=scope, **kw)
    engine = Engine(target, HeadsDrafter(heads, adapter), k=2, learner=adapter)
    return target, heads, adapter, engine


def _setup_layer(**kw):
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=(0, 1, 2))
    layer = Layer(36, (0, 1, 2), list(range(6)), 6, width=16, seed=0)
    layer.ready()
    adapter = Adapter(layer, **kw)
    engine = Engine(target, EagleDrafter(layer, adapter), k=1, learner=adapter)
    return target, layer, adapter, engine


def _torch_equal(a, b) -> bool:
    return bool((a.detach() == b).all())


def _prompts(n, offset=0):
    return [[(i * j + j + offset) % 6 for j in range(5)] for i in range(n)]


def _serve(engine, prompt, params, tenant):
    req = engine.start(prompt, params, tenant=tenant)
    while not req.done:
        engine.step([req])
    return engine.finish(req)


def _wait(adapter, timeout=60.0):
    end = time.monotonic() + timeout
    while adapter.busy():
        assert time.monotonic() < end, adapter.stats()
        time.sleep(0.05)


def test_replay_keeps_the_newest_examples():
    r = Replay(3, 2, 1)
    r.add(np.arange(8).reshape(4, 2), np.array([[0], [1], [2], [3]]))
    assert r.size == 3 and r.added == 4
    assert sorted(r.labels[:, 0].tolist()) == [1, 2, 3]
    r.add(np.zeros((1, 2)), np.array([[5]]))
    assert sorted(r.labels[:, 0].tolist()) == [2, 3, 5]
    h, lab = r.sample(10, np.random.default_rng(0))
    assert h.shape == (10, 2) and set(lab[:, 0].tolist()) <= {2, 3, 5}


def test_a_finished_request_becomes_examples_labelled_with_the_tokens_after_each_state():
    """Every position of the answer, from the prompt's last on, each state labelled with the
    H tokens after the one it predicted (the last position with any such token included)."""
    _target, _heads, adapter, engine = _setup()
    prompt = [0, 3, 1, 4]
    res = engine.generate(prompt, SamplingParams(max_tokens=12))
    ctx = prompt + res.tokens
    replay = adapter._tenants[None].replay
    n = replay.size
    assert n == adapter.examples > len(res.tokens) - 2
    first = len(ctx) - 2 - n  # position len(ctx) - 2 predicted the last token: nothing after it
    assert first <= len(prompt) - 1  # what the target kept: the toy keeps the prompt's states
    for i, (h, lab) in enumerate(zip(replay.hidden[:n], replay.labels[:n], strict=True)):
        p = first + i
        if p:  # the toy's state is the one-hot code of the last two tokens: it names p
            assert divmod(int(np.argmax(h[:36])), 6) == (ctx[p - 1], ctx[p])  # its first layer
        assert lab.tolist() == [ctx[p + 1 + j] if p + 1 + j < len(ctx) else -1 for j in (1, 2)]
    assert adapter._states == {} and adapter._seqs == {}  # nothing kept of the request


def test_a_cancelled_request_teaches_nothing():
    _target, _heads, adapter, engine = _setup()
    req = engine.start([0, 3, 1, 4], SamplingParams(max_tokens=12))
    engine.step([req])
    engine.finish(req)  # cancelled
    assert adapter.examples == 0 and adapter._states == {}


@pytest.mark.parametrize(
    "kind, kw",
    [("heads", {"lr": 0.05}), ("eagle", {"lr": 0.02, "batch": 32})],
)
def test_adapting_raises_acceptance_and_greedy_output_stays_plain(kind, kw):
    setup = _setup if kind == "heads" else _setup_layer
    target, net, adapter, engine = setup(budget=1.0, passes=40, swap_every=5, **kw)
    greedy = SamplingParams(max_tokens=24)
    probe = [[0, 3, 1, 4], [5, 2, 2, 1]]
    before = [engine.generate(p, greedy).summary for p in probe]
    trained = {k: v.clone() for k, v in net.module.state_dict().items()}
    adapter.start()
    try:
        for p in _prompts(40):
            res = engine.generate(p, greedy)
            assert res.tokens == plain_decode(target, p, greedy)  # exact while it adapts
        _wait(adapter)
    finally:
        adapter.close()
    assert adapter.stats()["steps"] > 0 and adapter.stats()["swaps"] > 0
    assert adapter.net_for(10**6) is not net  # the adapted copy
    after = [engine.generate(p, greedy) for p in probe]
    for p, res in zip(probe, after, strict=True):
        assert res.tokens == plain_decode(target, p, greedy)
    rate = lambda ss: sum(s.accepted for s in ss) / sum(s.proposed for s in ss)  # noqa: E731
    assert rate([r.summary for r in after]) > max(0.6, 1.5 * rate(before))
    for name, w in net.module.state_dict().items():  # the trained network was not touched
        assert _torch_equal(w, trained[name]), name


def test_adapted_heads_are_kept_across_a_restart_for_the_same_heads_and_scope(tmp_path, caplog):
    _target, heads, adapter, engine = _setup(scope="key", budget=1.0, passes=2)
    adapter.start()
    try:
        for tenant in ("alice", "bob"):
            _serve(engine, [0, 3, 1, 4], SamplingParams(max_tokens=20), tenant)
        _wait(adapter)
    finally:
        adapter.close()
    path = tmp_path / "adapted.pt"
    assert adapter.save(path) == 2
    again = Adapter(heads, scope="key")
    assert again.load(path) == 2
    h = np.linspace(-1, 1, heads.hidden_size).astype(np.float32)
    for tenant in ("alice", "bob"):
        np.testing.assert_array_equal(
            again._tenants[tenant].net.logits(h), adapter._tenants[tenant].net.logits(h)
        )
        assert not np.array_equal(again._tenants[tenant].net.logits(h), heads.logits(h))
    engine = Engine(_target, HeadsDrafter(heads, again), k=2, learner=again)
    _serve(engine, [0, 3, 1, 4], SamplingParams(max_tokens=20), "alice")
    again.step(again._tenants["alice"], np.random.default_rng(0))  # goes on learning
    assert again._tenants["alice"].steps == adapter._tenants["alice"].steps + 1
    assert Adapter(heads, scope="global").load(path) == 0  # kept for another scope
    other = Heads(heads.hidden_size, 2, list(range(6)), 6, seed=1, meta={"key": "other"})
    assert Adapter(other, scope="key").load(path) == 0  # grown from other heads
    assert "starting from the trained heads" in caplog.text
    assert Adapter(heads).load(tmp_path / "none.pt") == 0
    (tmp_path / "bad.pt").write_bytes(b"not a file of adapted heads")
    with pytest.raises(ValueError, match="holds no adapted drafter"):
        Adapter(heads).load(tmp_path / "bad.pt")


def test_answers_keep_the_newest_positions_whole():
    a = Answers(5)
    for n in (2, 3, 2):
        a.add(np.zeros((n, 1)), np.zeros(n, np.int64), np.full(n, n))
    assert [len(x[2]) for x in a.items] == [3, 2] and a.size == 5 and a.added == 7
    got = a.sample(4, np.random.default_rng(0))
    assert sum(len(x[2]) for x in got) >= 4
    a.add(np.zeros((9, 1)), np.zeros(9, np.int64), np.arange(9))  # longer than the buffer: its end
    assert [x[2].tolist() for x in a.items] == [[4, 5, 6, 7, 8]]


def test_a_finished_request_becomes_one_answer_for_the_layer():
    """Every position from the prompt's last on, with its state, the token that followed it,
    that token's copy over the whole context and the token after it as the label."""
    _target, layer, adapter, engine = _setup_layer()
    prompt = [0, 3, 1, 4]
    res = engine.generate(prompt, SamplingParams(max_tokens=12))
    ctx = prompt + res.tokens
    ((hidden, tokens, copied, sizes, labels),) = adapter._tenants[None].replay.items
    ids, n = continuations(ctx, COPY_N)
    first = len(ctx) - 1 - len(labels)  # to the last position but one: the last has no state
    assert first <= len(prompt) - 1  # what the target kept: the toy keeps the prompt's states
    for i, h in enumerate(hidden):
        p = first + i
        if p:  # the toy's state names the last two tokens, so its position
            assert divmod(int(np.argmax(h[:36])), 6) == (ctx[p - 1], ctx[p])  # its first layer
        assert tokens[i] == ctx[p + 1]
        assert (copied[i], sizes[i]) == (layer.index([ids[p + 1]])[0], n[p + 1])
        assert labels[i] == (ctx[p + 2] if p + 2 < len(ctx) else -1)
    assert adapter.examples == len(labels) - 1 and adapter._states == {}


def test_a_request_drafts_to_its_end_with_the_weights_it_began_with():
    """The layer's cache was filled by the weights of its first proposal: a copy published
    mid-request serves the requests begun after it."""
    _target, _layer, adapter, engine = _setup_layer(budget=1.0, passes=2)
    engine.generate([0, 3, 1, 4], SamplingParams(max_tokens=12))
    drafter = engine.drafters[0]
    req = engine.start([5, 2, 2, 1], SamplingParams(max_tokens=12))
    engine.step([req])
    began = drafter._seqs[req.seq].cache.net
    adapter.step(adapter._tenants[None], np.random.default_rng(0))
    adapter._publish()
    assert adapter.net_for(req.seq)._fast is not began  # new weights published
    while not req.done:
        engine.step([req])
        assert drafter._seqs[req.seq].cache.net is began
    engine.finish(req)
    req = engine.start([5, 2, 2, 1], SamplingParams(max_tokens=4))
    engine.step([req])
    assert drafter._seqs[req.seq].cache.net is adapter.net_for(req.seq)._fast
    engine.finish(req)


def test_an_adapted_layer_is_kept_across_a_restart_and_never_taken_for_heads(tmp_path, caplog):
    _target, layer, adapter, engine = _setup_layer(scope="key", budget=1.0, passes=2)
    _serve(engine, [0, 3, 1, 4], SamplingParams(max_tokens=20), "alice")
    adapter.step(adapter._tenants["alice"], np.random.default_rng(0))
    path = tmp_path / "adapted.pt"
    assert adapter.save(path) == 1
    again = Adapter(layer, scope="key")
    assert again.load(path) == 1
    for name, w in adapter._tenants["alice"].net.module.state_dict().items():
        assert _torch_equal(again._tenants["alice"].net.module.state_dict()[name], w), name
    heads = Heads(layer.hidden_size, 1, list(range(6)), 6, seed=0)
    assert Adapter(heads, scope="key").load(path) == 0  # a layer's copies are no heads'
    assert "starting from the trained heads" in caplog.text


def test_without_traffic_the_thread_does_no_work():
    _target, _heads, adapter, engine = _setup(budget=1.0, passes=2)
    adapter.start()
    try:
        engine.generate([0, 3, 1, 4], SamplingParams(max_tokens=20))
        _wait(adapter)
        steps = adapter.steps
        assert steps > 0
        time.sleep(0.3)
        assert adapter.steps == steps and not adapter.busy()
    finally:
        adapter.close()


def test_the_engine_tells_the_adapter_when_no_request_is_in():
    """Idle from `finish` of the last request to `begin` of the next, a failed prefill
    included: what the training thread's budgets follow."""
    target, _heads, adapter, engine = _setup()
    assert adapter._idle.is_set()
    a = engine.start([0, 3, 1, 4], SamplingParams(max_tokens=6))
    b = engine.admit([2, 2, 1], SamplingParams(max_tokens=6))
    assert not adapter._idle.is_set()
    engine.finish(a)
    assert not adapter._idle.is_set()  # b is in
    target.forward = lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("the forward failed"))
    with pytest.raises(RuntimeError):
        engine.prefill(b)
    assert adapter._idle.is_set() and adapter._live == set()


def test_with_no_budget_while_serving_the_thread_learns_only_while_idle():
    _target, _heads, adapter, engine = _setup(budget=0.0, passes=2)
    engine.generate([0, 3, 1, 4], SamplingParams(max_tokens=20))  # examples to learn from
    req = engine.start([2, 2, 1], SamplingParams(max_tokens=8))  # a request in
    adapter.start()
    try:
        time.sleep(0.3)
        assert adapter.steps == 0 and adapter.busy()
        while not req.done:
            engine.step([req])
        engine.finish(req)
        _wait(adapter)
        assert adapter.steps > 0 and adapter.idle_steps == adapter.steps
    finally:
        adapter.close()


def test_pause_returns_once_the_step_in_progress_has_ended():
    """A benchmark pauses the thread before it times another engine: no step may run on."""
    import threading

    _target, _heads, adapter, engine = _setup(budget=1.0)
    began, ended = threading.Event(), []
    train = adapter.step

    def slow_step(tenant, rng):
        began.set()
        time.sleep(0.2)
        train(tenant, rng)
        ended.append(True)

    adapter.step = slow_step
    engine.generate([0, 3, 1, 4], SamplingParams(max_tokens=20))
    adapter.start()
    try:
        assert began.wait(10)
        adapter.pause()
        assert ended  # the step had ended when pause returned
        steps = adapter.steps
        time.sleep(0.3)
        assert adapter.steps == steps  # and no other began
    finally:
        adapter.close()


def test_per_key_adaptation_keeps_tenants_apart_and_drops_the_least_recent():
    _target, heads, adapter, engine = _setup(scope="key", budget=1.0, tenants=2)
    greedy = SamplingParams(max_tokens=16)
    adapter.start()
    try:
        for tenant in ("a", "b"):
            _serve(engine, [0, 3, 1, 4], greedy, tenant)
        _wait(adapter)
        a, b = adapter._tenants["a"].net, adapter._tenants["b"].net
        assert a is not None and b is not None and a is not b
        req = engine.start([2, 2, 1], greedy, tenant="c")  # a new tenant drafts with the trained
        assert adapter.net_for(req.seq) is heads
        while not req.done:
            engine.step([req])
        engine.finish(req)
        assert list(adapter._tenants) == ["b", "c"]  # "a" was the least recently served
    finally:
        adapter.close()


def test_global_scope_shares_one_copy_across_tenants():
    _target, _heads, adapter, engine = _setup(scope="global")
    for tenant in ("a", "b"):
        _serve(engine, [0, 3, 1, 4], SamplingParams(max_tokens=8), tenant)
    assert list(adapter._tenants) == [None]


def test_a_learner_that_fails_is_dropped_and_the_request_goes_on(caplog):
    class Broken:
        def begin(self, req):
            pass

        def observe(self, *args):
            raise RuntimeError("boom")

    target = ToyLM(vocab=6, seed=2, hidden=True)
    engine = Engine(target, learner=Broken())
    prompt = [0, 3, 1, 4]
    res = engine.generate(prompt, SamplingParams(max_tokens=8))
    assert res.tokens == plain_decode(target, prompt, SamplingParams(max_tokens=8))
    assert engine.learner is None and "learner failed" in caplog.text


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"scope": "tenant"}, "scope 'tenant' is invalid"),
        ({"budget": -0.1}, "budget of -0.1 is invalid"),
        ({"budget": 1.5}, "budget of 1.5 is invalid"),
        ({"idle_budget": 0.0}, "idle adaptation budget of 0 is invalid"),
        ({"capacity": 0}, "capacity of 0 is invalid"),
        ({"lr": 0.0}, "lr and passes > 0"),
    ],
)
def test_bad_settings_are_one_clear_error(kw, words):
    heads = Heads(4, 1, [0, 1], 2)
    with pytest.raises(ValueError, match=words):
        Adapter(heads, **kw)


def test_each_network_adapts_at_the_rate_it_was_trained_at():
    assert Adapter(Heads(4, 1, [0, 1], 2)).lr == distill.HEADS_LR
    assert Adapter(Layer(4, (0, 1), [0, 1], 2, width=8)).lr == FINAL_LR < distill.HEADS_LR
    assert Adapter(Heads(4, 1, [0, 1], 2), lr=0.01).lr == 0.01


def test_the_server_adapts_per_key_and_reports_it(smollm2_path):
    """`serve --adapt key` in small: two API keys, each request's positions go to its key's
    copy, the thread learns from them, /health and /metrics say so; answers stay plain's."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from specwise.backends.llama_cpp import LlamaCppLM
    from specwise.server.app import create_app

    target = LlamaCppLM(smollm2_path, context_length=512, max_sequences=4, hidden=True)
    heads = Heads(target.hidden_size, 2, list(range(1024)), target.vocab_size, seed=0)
    adapter = Adapter(heads, scope="key", budget=1.0)
    engine = Engine(target, HeadsDrafter(heads, adapter), k=2, learner=adapter)
    app = create_app(engine, "smol", api_keys=["k1", "k2"], adapter=adapter)
    body = {"model": "smol", "prompt": "Count from one to ten in words.", "max_tokens": 24}
    with TestClient(app) as client:
        texts = {}
        for key, k in (("k1", 2), ("k2", 2), ("k1", 0)):
            got = client.post(
                "/v1/completions",
                json={**body, "temperature": 0, "speculative": {"k": k}},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert got.status_code == 200, got.text
            texts.setdefault(k, set()).add(got.json()["choices"][0]["text"])
        assert texts[2] == texts[0]  # drafting with the heads, adapting or not, changes nothing
        _wait(adapter)
        health = client.get("/health").json()["adapt"]
        assert health["scope"] == "key" and health["tenants"] == 2
        assert health["steps"] > 0 and health["examples"] > 0 and health["error"] is None
        metrics = {
            s.name: s.value
            for f in text_string_to_metric_families(client.get("/metrics").text)
            for s in f.samples
        }
        assert metrics["specwise_adapt_examples_total"] == health["examples"]
        assert metrics["specwise_adapt_steps_total"] == health["steps"]
        assert metrics["specwise_adapt_idle_steps_total"] == health["idle_steps"] > 0
    assert not adapter._thread.is_alive()  # the app's end stopped it


@pytest.mark.parametrize("d", ["heads", "eagle"])
def test_bench_adapt_reports_windows_and_the_last_over_the_first(d):
    from specwise.bench.adapt import table

    rows = []
    for i in range(100):
        for c, acc in (("plain", 0), (d, 2), (f"{d}+adapt", 2 if i < 50 else 6)):
            rows.append(
                {
                    "index": i,
                    "config": c,
                    "proposed": 0 if c == "plain" else 10,
                    "accepted": acc,
                    "speedup": 1.0 if c == "plain" else 1.0 + acc / 10,
                    "tokens_per_s": 20.0,
                    "same_as_plain": not (c == d and i in (7, 8)),
                    "near_tie": i == 7,
                }
                | ({"think_s": 0.5 if i else 2.0} if c.endswith("+adapt") else {})
            )
    meta = {"model": "m", "backend": "b", "k": 1, "max_tokens": 8, "temperature": 0.0}
    meta |= {"drafter": d} if d != "heads" else {}  # a run before --drafter: the heads
    meta |= {"budget": 0.1, "steps": 5, "swaps": 1, "examples": 99}
    assert "requests back to back" in table(rows, meta)[0]  # a run before think time
    meta |= {"idle_budget": 1.0, "think": 5.0, "idle_steps": 3}
    text = "\n".join(table(rows, meta))
    assert "0.1 of a core while a request decodes, 1 in up to 5 s of think time" in text
    assert "5 training steps (3 in think time), 1 swaps" in text
    assert "used after a request: median 0.50 s, at most 2.00 s (of 5 s)" in text
    assert "| 1–50 | 0.200 | 0.200 | 1.20x | 1.20x | 20.0 |" in text
    assert "| 51–100 | 0.200 | 0.600 | 1.20x | 1.60x | 20.0 |" in text
    assert f"{d} k=1" in text and f"| acceptance, {d} | acceptance, {d}+adapt |" in text
    assert f"{d}+adapt: acceptance over requests 51–100 is 3.00x that over 1–50" in text
    assert f"{d}: acceptance over requests 51–100 is 1.00x" in text
    assert f"acceptance, {d}+adapt over {d}, window by window: 1.00x, 3.00x" in text
    assert f"differing from plain: {d} 2 (1 at a near-tie), {d}+adapt 0 (0 at a" in text


def test_bench_adapt_runs_the_eagle_layer_three_ways_on_a_real_target(
    smollm2_path, tmp_path, capsys
):
    from specwise.backends import ik_llama
    from specwise.bench import adapt
    from specwise.cli import main
    from specwise.drafters.eagle import layers_for

    if not ik_llama.available():
        pytest.skip(ik_llama.UNAVAILABLE)
    layers = layers_for(30)  # SmolLM2-135M's 30 layers
    target = ik_llama.IkLlamaLM(smollm2_path, context_length=512, max_sequences=4, hidden=layers)
    d = target.hidden_size // 3
    layer = Layer(d, layers, list(range(1024)), target.vocab_size, width=16)
    lines = adapt.run(target, layer, tmp_path, requests=2, max_tokens=6, budget=1.0)
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["config"] for r in rows] == ["plain", "eagle", "eagle+adapt"] * 2
    assert rows[2]["think_s"] > 0 and rows[2]["adapt_idle_steps"] > 0  # it learnt between them
    assert all(r["same_as_plain"] or r["near_tie"] for r in rows)
    assert "eagle k=1" in lines[0] and (tmp_path / "by_request.png").exists()
    (tmp_path / "report.md").unlink()
    assert main(["bench", "report", str(tmp_path)]) == 0  # rebuilt from the run's files
    assert (tmp_path / "report.md").read_text() == "\n".join(lines) + "\n"
    (tmp_path / "requests.jsonl").write_text("")
    assert main(["bench", "report", str(tmp_path)]) == 2
    assert "has no requests; nothing to report" in capsys.readouterr().err
