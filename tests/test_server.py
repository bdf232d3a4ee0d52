"""The OpenAI-compatible server on 127.0.0.1 with the smallest real model: the official `openai`
client and raw HTTP, streaming and not, concurrency, cancellation, bad input, auth, metrics."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from specwise import Engine
from specwise.backends.curves import CostCurve
from specwise.backends.llama_cpp import LlamaCppLM
from specwise.controller import Controller
from specwise.costs import CostModel
from specwise.drafters import ModelDrafter, NgramDrafter, SuffixDrafter
from specwise.engines.process import free_port
from specwise.server.app import create_app

MODEL = "smol"
PROMPTS = [
    "List the first twelve prime numbers.",
    "Write a Python function that reverses a string.",
    "What is the capital of France? Answer in one sentence.",
    "Count from one to ten in words.",
]


def make_engine(path) -> Engine:
    target = LlamaCppLM(path, context_length=512, max_sequences=8)
    draft = LlamaCppLM(path, context_length=512, max_sequences=8)
    drafters = [NgramDrafter(), ModelDrafter(draft)]
    costs = CostModel(
        CostCurve({n: 10.0 + 2.0 * n for n in range(1, 17)}),
        {"ngram": 0.01, "model": 8.0},
        catch_up_ms_per_token={"model": 1.0},
    )
    return Engine(target, drafters, k="auto", controller=Controller(drafters, costs))


@pytest.fixture(scope="module")
def engine(smollm2_path):
    return make_engine(smollm2_path)


@contextlib.contextmanager
def serving(app):
    """The app served on a free loopback port from a thread, while the block runs: its URL."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not srv.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(engine):
    app = create_app(engine, MODEL, max_batch=4, max_queue=8)
    with serving(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="unused")


def greedy(prompt, **kw):
    return {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, **kw}


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok" and health["running"] == 0
    assert health["exact"] is False  # mainline llama.cpp: the default mode


def test_completion_and_chat_with_the_openai_client(client):
    out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0)
    assert out.choices[0].text and out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 16 and out.usage.prompt_tokens > 0
    spec = out.model_extra["speculative"]
    assert {"proposed", "accepted", "rounds", "acceptance_rate", "draft_ms", "verify_ms"} <= set(
        spec
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPTS[2]}],
        max_tokens=16,
        temperature=0.7,
        top_p=0.9,
        seed=3,
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content


def test_streaming_equals_non_streaming(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0)
    parts = list(
        client.completions.create(
            model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    chat = chat_stream(client, PROMPTS[1], stream_options={"include_usage": True})
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].usage.completion_tokens > 0


def chat_stream(client, prompt, **kw) -> list:
    """The chunks of a greedy streamed chat completion of 24 tokens."""
    return list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            temperature=0,
            stream=True,
            **kw,
        )
    )


def test_continuous_usage_counts_the_tokens_of_every_chunk(client):
    parts = chat_stream(
        client,
        PROMPTS[3],
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"speculative": {"k": 4, "drafter": "ngram"}},
    )
    counts = [p.usage.completion_tokens for p in parts]
    assert counts == sorted(counts) and counts[0] >= 1
    assert counts[-1] == 24 and parts[-1].choices == []
    assert all(p.usage is None for p in chat_stream(client, PROMPTS[3]))


def test_raw_sse_ends_with_done(server):
    with httpx.stream(
        "POST", server[0] + "/v1/completions", json=greedy(PROMPTS[0], stream=True), timeout=60
    ) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: ") :]) for ln in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)


def test_concurrent_greedy_requests_match_their_solo_outputs(server):
    url = server[0] + "/v1/completions"
    alone = [
        httpx.post(url, json=greedy(p), timeout=120).json()["choices"][0]["text"] for p in PROMPTS
    ]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(
            pool.map(
                lambda p: httpx.post(url, json=greedy(p), timeout=120).json()["choices"][0]["text"],
                PROMPTS,
            )
        )
    assert together == alone


def test_a_cancelled_stream_leaves_the_others_intact(server, engine):
    url = server[0] + "/v1/completions"
    want = httpx.post(url, json=greedy(PROMPTS[3], max_tokens=40), timeout=120).json()
    result = {}

    def other():
        result["out"] = httpx.post(url, json=greedy(PROMPTS[3], max_tokens=40), timeout=120).json()

    t = threading.Thread(target=other)
    with httpx.stream(
        "POST", url, json=greedy(PROMPTS[0], max_tokens=200, stream=True), timeout=60
    ) as r:
        t.start()
        next(r.iter_lines())  # one chunk, then hang up
    t.join(timeout=120)
    assert result["out"]["choices"][0]["text"] == want["choices"][0]["text"]
    deadline = time.time() + 10
    while httpx.get(server[0] + "/health").json()["running"] and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert not engine.target._slots, "a cancelled request kept its cache"


def test_metrics_parse(server):
    text = httpx.get(server[0] + "/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "specwise_requests",
        "specwise_ttft_seconds",
        "specwise_emitted_tokens",
        "specwise_running_batch_size",
        "specwise_queue_depth",
        "specwise_accepted_by_position",
        "specwise_inter_token_latency_seconds",
    } <= names


def test_the_speculative_counters_agree_with_the_answers(server):
    """/metrics' counts, read as `bench engines` reads every engine's (`engines.counters`),
    move by what the answers report: proposed and accepted tokens, by position."""
    from specwise.engines.counters import read

    def counts():
        return read(httpx.get(server[0] + "/metrics").text, "specwise")

    before = counts()
    answers = [
        httpx.post(
            server[0] + "/v1/completions",
            json=greedy(p, speculative={"k": 3, "drafter": "model"}),
            timeout=120,
        ).json()["speculative"]
        for p in PROMPTS[:2]
    ]
    run = counts().minus(before) if before else counts()
    assert run.proposed == sum(a["proposed"] for a in answers) > 0
    assert run.accepted == sum(a["accepted"] for a in answers) == sum(run.accepted_at)
    assert 0 < run.drafts <= sum(a["rounds"] for a in answers)
    assert run.figures()["mean_draft_length"] <= 3


@pytest.fixture(scope="module")
def local(engine):
    with TestClient(create_app(engine, MODEL, max_batch=2, max_queue=4, max_body_bytes=4096)) as c:
        yield c


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": "hi", "top_p": 2}, 400, "top_p"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "hi", "n": 2}, 400, "n"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": "hi", "stop": [1]}, 400, "stop"),
        ({"prompt": "hi", "model": "gpt-4"}, 404, "model"),
        ({"prompt": "hi", "speculative": {"k": -1}}, 400, "speculative.k"),
        ({"prompt": "hi", "speculative": {"drafter": "eagle"}}, 400, "speculative.drafter"),
        ({"prompt": "hi", "speculative": {"acceptance": "loose"}}, 400, "speculative.acceptance"),
        ({"prompt": "hi", "speculative": {"acceptance": 2}}, 400, "speculative.acceptance"),
        (  # a lossy rule is for sampled output only
            {"prompt": "hi", "temperature": 0, "speculative": {"acceptance": "typical"}},
            400,
            "speculative.acceptance",
        ),
        ({"prompt": "word " * 600}, 400, "prompt"),
        ({"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ({"prompt": "hi", "logprobs": True}, 400, "logprobs"),
        # fields that would change the answer and are not implemented: refused by name
        ({"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty"),
        ({"prompt": "hi", "frequency_penalty": "x"}, 400, "frequency_penalty"),
        ({"prompt": "hi", "logit_bias": {"42": 5}}, 400, "logit_bias"),
        ({"prompt": "hi", "echo": True}, 400, "echo"),
        ({"prompt": "hi", "best_of": 3}, 400, "best_of"),
        ({"prompt": "hi", "suffix": "end"}, 400, "suffix"),
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, 400, "response_format"),
        ({"prompt": "hi", "tools": [{"type": "function"}]}, 400, "tools"),
        ({"prompt": "hi", "tool_choice": {"type": "function"}}, 400, "tool_choice"),
    ],
)
def test_bad_input_gets_a_4xx_naming_the_field(local, body, status, param):
    r = local.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_malformed_json_oversized_body_and_bad_messages(local):
    r = local.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = local.post("/v1/completions", json={"prompt": "x" * 10_000})
    assert r.status_code == 413
    r = local.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    r = local.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # and the server still serves
    r = local.post("/v1/completions", json=greedy(PROMPTS[2], max_tokens=4))
    assert r.status_code == 200 and 1 <= r.json()["usage"]["completion_tokens"] <= 4


def test_chat_content_as_text_parts_and_fields_that_change_nothing(local):
    def chat(messages, **kw):
        body = {"messages": messages, "max_tokens": 6, "temperature": 0, **kw}
        return local.post("/v1/chat/completions", json=body)

    text = chat([{"role": "user", "content": "Say hello.\nThen stop."}])
    parts = [{"type": "text", "text": "Say hello."}, {"type": "text", "text": "Then stop."}]
    same = chat(
        [{"role": "user", "content": parts}],
        user="someone",  # fields that change nothing are accepted
        presence_penalty=0,
        logprobs=False,
        response_format={"type": "text"},
        tool_choice="none",
    )
    assert text.status_code == same.status_code == 200, same.text
    assert same.json()["choices"][0]["message"] == text.json()["choices"][0]["message"]
    developer = chat(
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    system = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert developer.json()["choices"][0] == system.json()["choices"][0]
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    r = chat([{"role": "user", "content": [parts[0], image]}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]"
    assert "'image_url'; this server takes text parts only" in r.json()["error"]["message"]
    r = chat([{"role": "user", "content": [{"type": "text", "text": 5}]}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].text"
    r = chat([{"role": "user", "content": "Hi"}], top_logprobs=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    assert "needs 'logprobs': true" in r.json()["error"]["message"]


def test_logprobs_in_the_chat_and_completions_shapes_streamed_or_not(local):
    """Greedy: each token is the most likely of its position (up to a near-tie); the pieces
    make the text; a stream carries the same log-probabilities as the whole answer."""
    body = {"max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    whole = local.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 2})
    choice = whole.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == whole.json()["usage"]["completion_tokens"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    for c in content:
        assert c["logprob"] <= 0 and len(c["top_logprobs"]) == 2
        assert c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"]
        assert c["logprob"] >= c["top_logprobs"][0]["logprob"] - 1e-3  # greedy: the top one
        assert c["bytes"] == list(c["token"].encode())
    with local.stream(
        "POST",
        "/v1/chat/completions",
        json={**body, "logprobs": True, "top_logprobs": 2, "stream": True},
    ) as r:
        chunks = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    streamed = [c for ch in chunks for c in (ch["choices"][0]["logprobs"] or {}).get("content", [])]
    assert streamed == content
    plain = local.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"] == choice["message"]
    legacy = local.post(
        "/v1/completions",
        json={"prompt": "1, 2, 3,", "max_tokens": 6, "temperature": 0, "logprobs": 3},
    ).json()["choices"][0]
    lp = legacy["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert "".join(lp["tokens"]) == legacy["text"] and lp["text_offset"][0] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])
    assert all(len(top) <= 3 and max(top.values()) <= 0 for top in lp["top_logprobs"])


@pytest.mark.parametrize("chunk, first", [(8, "short"), (None, "long")])
def test_a_short_request_is_not_held_behind_a_long_prefill(engine, chunk, first):
    """A short prompt that arrives while a long one is being prefilled gets its first token
    first when prompts go in chunks (the shortest remaining first); fed whole, it waits."""
    app = create_app(engine, MODEL, max_batch=4, prefill_chunk=chunk)
    done: list[str] = []

    def ask(name: str, prompt: str) -> None:
        body = greedy(prompt, max_tokens=1, speculative={"k": 0})
        assert c.post("/v1/completions", json=body).status_code == 200
        done.append(name)

    with TestClient(app) as c, ThreadPoolExecutor(2) as pool:
        long = pool.submit(ask, "long", "one two three four five six seven eight " * 55)
        deadline = time.time() + 30
        while c.get("/health").json()["prefilling"] == 0:  # the long prompt is going in
            assert time.time() < deadline and not long.done(), "never saw the long prefill"
        pool.submit(ask, "short", PROMPTS[2]).result()
        long.result()
    assert done[0] == first


def test_per_request_speculation_override(local):
    plain = local.post("/v1/completions", json=greedy(PROMPTS[0], speculative={"k": 0})).json()
    assert plain["speculative"]["proposed"] == 0
    fixed = local.post(
        "/v1/completions", json=greedy(PROMPTS[0], speculative={"k": 3, "drafter": "model"})
    ).json()
    assert fixed["speculative"]["proposed"] > 0
    assert fixed["choices"][0]["text"] == plain["choices"][0]["text"]
    assert plain["speculative"]["acceptance"] == fixed["speculative"]["acceptance"] == "exact"


def test_a_lossy_rule_is_named_in_the_response(local):
    body = {"prompt": PROMPTS[3], "max_tokens": 16, "temperature": 0.8, "seed": 3}
    body["speculative"] = {"k": 3, "drafter": "ngram", "acceptance": "top-2"}
    got = local.post("/v1/completions", json=body).json()
    assert got["speculative"]["acceptance"] == "top-2" and got["usage"]["completion_tokens"]


def test_api_key(engine):
    with TestClient(create_app(engine, MODEL, api_keys=["sesame", "open"])) as c:
        assert c.post("/v1/completions", json=greedy("hi", max_tokens=2)).status_code == 401
        bad = c.post(
            "/v1/completions",
            json=greedy("hi", max_tokens=2),
            headers={"Authorization": "Bearer wrong"},
        )
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models").status_code == 401
        ok = c.post(
            "/v1/completions",
            json=greedy("hi", max_tokens=2),
            headers={"Authorization": "Bearer sesame"},
        )
        assert ok.status_code == 200
        other = c.get("/v1/models", headers={"Authorization": "Bearer open"})
        assert other.status_code == 200  # every key given is accepted
        assert c.get("/health").status_code == 200  # health needs no key


def test_the_servers_limits_on_prompts_max_tokens_and_streams_per_key(engine):
    """`max_prompt`, `max_new_tokens` and `streams_per_key`: a clear 400 or 429 naming the
    limit, a default max_tokens cut to the limit, another key unaffected, and the key's slot
    given back once its request ends."""
    app = create_app(
        engine, MODEL, api_keys=["a", "b"], max_prompt=12, max_new_tokens=6, streams_per_key=1
    )

    def key(k: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {k}"}

    def ask(k: str, **body):
        return c.post("/v1/completions", json={"model": MODEL, **body}, headers=key(k))

    with TestClient(app) as c:
        r = ask("a", prompt="one two three " * 10, max_tokens=2)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "prompt" and "at most 12" in err["message"]
        r = ask("a", prompt="1, 2, 3,", max_tokens=7)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "max_tokens"
        assert "limit of 6 tokens" in err["message"]
        r = ask("a", prompt="1, 2, 3,", temperature=0)  # names no max_tokens: the default, cut
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 6
        limits = c.get("/health").json()["limits"]
        assert (limits["max_prompt"], limits["max_new_tokens"], limits["streams_per_key"]) == (
            12,
            6,
            1,
        )
        paused = {"prompt": "Hi", "max_tokens": 4, "paused": True}  # holds key a's one stream
        sid = c.post("/ui/api/sessions", json=paused, headers=key("a")).json()["id"]
        try:
            r = ask("a", prompt="1, 2,", max_tokens=2)
            assert r.status_code == 429 and "per key" in r.json()["error"]["message"]
            assert ask("b", prompt="1, 2,", max_tokens=2).status_code == 200
        finally:
            c.delete(f"/ui/api/sessions/{sid}", headers=key("a"))
        deadline = time.monotonic() + 30
        while (r := ask("a", prompt="1, 2,", max_tokens=2)).status_code == 429:
            assert time.monotonic() < deadline, "the key's slot never came back"
            time.sleep(0.05)
        assert r.status_code == 200


def test_each_api_key_is_a_tenant_of_the_suffix_memory(engine):
    """Requests under two keys are remembered apart, under hashes of the keys; the second
    tenant's repeat of the first tenant's request is not drafted from the first's text."""
    drafter = SuffixDrafter(scope="key")
    eng = Engine(engine.target, drafter, k=4)
    body = greedy("Count from one to ten in words.", max_tokens=24)
    with TestClient(create_app(eng, MODEL, api_keys=["alpha", "beta"])) as c:

        def ask(key):
            r = c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
            return r.json()

        first = ask("alpha")
        assert len(drafter.memories) == 1
        (tenant,) = drafter.memories
        assert "alpha" not in tenant and drafter.memories[tenant].documents == 1
        assert c.get("/health").json()["suffix_memory_bytes"] > 0
        again = ask("alpha")  # the same request again: drafted from memory
        other = ask("beta")  # the same request from another tenant: not
        assert len(drafter.memories) == 2
    texts = {r["choices"][0]["text"] for r in (first, again, other)}
    assert len(texts) == 1  # greedy: the same output whatever was remembered
    assert again["speculative"]["accepted"] > other["speculative"]["accepted"]


def test_a_full_queue_answers_429(engine):
    with (
        TestClient(create_app(engine, MODEL, max_batch=1, max_queue=1)) as c,
        ThreadPoolExecutor(4) as pool,
    ):
        codes = list(
            pool.map(
                lambda _: c.post("/v1/completions", json=greedy(PROMPTS[0], max_tokens=120)),
                range(4),
            )
        )
    statuses = sorted(r.status_code for r in codes)
    assert 429 in statuses and 200 in statuses
    busy = next(r for r in codes if r.status_code == 429)
    assert busy.headers["retry-after"] == "1" and busy.json()["error"]["type"] == "rate_limit_error"


def test_load_generator_against_the_server(server, tmp_path, capsys):
    from specwise.bench.load import LoadOptions, run_load

    opts = LoadOptions(
        urls={"": server[0]},
        concurrency=[1, 2],
        requests=2,
        prompts=PROMPTS,
        max_tokens=8,
        ks=["auto", 0],
        out=tmp_path / "load",
        rounds=2,
    )
    levels = run_load(opts)
    assert [(lv["concurrency"], lv["k"]) for lv in levels] == [
        (1, "auto"),
        (1, 0),
        (2, "auto"),
        (2, 0),
    ]
    assert all(lv["errors"] == 0 and lv["throughput_tokens_per_s"] > 0 for lv in levels)
    assert all(lv["requests"] == 4 and len(lv["throughput_by_round"]) == 2 for lv in levels)
    assert all(lv["ttft_s"]["p50"] is not None for lv in levels)
    assert all(lv["steady_tokens_per_s"] > 0 and len(lv["steady_by_round"]) == 2 for lv in levels)
    rows = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 * 2  # levels x settings x rounds x requests
    assert all(0 <= r["sent"] < r["first"] <= r["end"] and r["tokens"] > 0 for r in rows)
    assert all(r["progress"][-1] == [r["end"], r["tokens"]] for r in rows)
    # each round sends the next prompts, the same ones for both settings
    assert {(r["k"], r["round"], r["prompt"]) for r in rows if r["concurrency"] == 1} == {
        (k, i, p) for k in ("auto", 0) for i, ps in ((1, (0, 1)), (2, (2, 3))) for p in ps
    }
    out = capsys.readouterr().out
    ratios = json.loads(out.strip().splitlines()[-1])["ratios"]
    assert [(q["level"], q["setting"], q["vs"], len(q["by_round"])) for q in ratios] == [
        ("1", "k=auto", "k=0", 2),
        ("2", "k=auto", "k=0", 2),
    ]
    assert "concurrency   1: k=auto / k=0 = " in out
    assert (tmp_path / "load" / "throughput.png").exists()


def test_an_open_loop_run_reports_the_slo_and_where_it_breaks(server, tmp_path, capsys):
    from specwise.bench.load import LoadOptions, Slo, run_load

    opts = LoadOptions(
        urls={"": server[0]},
        concurrency=[],
        requests=3,
        prompts=PROMPTS,
        max_tokens=6,
        ks=[0],
        out=tmp_path / "open",
        rates=[1.0, 1000.0],
        slo=Slo(ttft_s=60.0, tpot_s=60.0),  # met by any answer: the arithmetic is tested apart
    )
    levels = run_load(opts)
    assert [(lv["level"], lv["rate"], lv["concurrency"]) for lv in levels] == [
        ("1/s", 1.0, None),
        ("1000/s", 1000.0, None),
    ]
    assert all(lv["errors"] == 0 and lv["slo_met"] == 1.0 for lv in levels)
    assert all(lv["goodput_requests_per_s"] == 3 / lv["wall_s"] for lv in levels)
    assert all(lv["steady_tokens_per_s"] is None for lv in levels)  # a closed-loop figure
    rows = [json.loads(x) for x in (tmp_path / "open" / "requests.jsonl").read_text().splitlines()]
    assert all(r["sent"] >= r["arrival"] - 0.01 for r in rows)
    assert max(r["arrival"] for r in rows if r["rate"] == 1.0) > 0.1  # spread out in time
    out = capsys.readouterr().out
    assert "k=0: SLO held at every rate run (up to 1000/s)" in out
    assert json.loads(out.strip().splitlines()[-1])["slo_breaks"][0]["breaks_at"] is None
    assert (tmp_path / "open" / "goodput.png").exists()


def test_a_load_run_compares_servers_side_by_side(server, tmp_path, capsys):
    from specwise.bench.load import LoadOptions, run_load

    opts = LoadOptions(
        urls={"one": server[0], "two": server[0] + "/v1"},  # the same server, twice
        concurrency=[1],
        requests=1,
        prompts=PROMPTS,
        stream=False,
        max_tokens=4,
        ks=[0],
        out=tmp_path / "load",
    )
    levels = run_load(opts)
    assert [(lv["setting"], lv["server"], lv["k"]) for lv in levels] == [
        ("one k=0", "one", 0),
        ("two k=0", "two", 0),
    ]
    assert "concurrency   1: one k=0 / two k=0 = " in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    assert [r["server"] for r in rows] == ["one", "two"]


def test_a_soak_samples_the_servers_health_while_it_is_kept_busy(server, tmp_path, capsys):
    from specwise.bench.load import LoadOptions
    from specwise.bench.soak import run_soak

    opts = LoadOptions(
        urls={"": server[0] + "/v1"},  # either form of the URL reaches /health at the root
        concurrency=[2],
        prompts=PROMPTS,
        max_tokens=8,
        ks=[4],
        out=tmp_path / "soak",
    )
    result = run_soak(opts, seconds=2.0, every=0.5)
    samples = result["samples"]
    assert samples[0]["answered"] == 0 and samples[-1]["answered"] >= 2
    assert samples[-1]["failed"] == 0
    times = [s["seconds"] for s in samples]
    assert times == sorted(times) and len(samples) >= 4 and times[-1] >= 2.0
    assert all(s["health"]["rss_mb"] > 0 and "running" in s["health"] for s in samples)
    assert samples[-1]["health"]["running"] == 0  # every request had ended
    rows = (tmp_path / "soak" / "requests.jsonl").read_text().splitlines()
    assert len(rows) == samples[-1]["answered"]
    assert (
        "| minutes | answered | failed | running | prefilling | queued | sequences | rss_mb |"
        in (capsys.readouterr().out)
    )
    assert json.loads((tmp_path / "soak" / "soak.json").read_text())["k"] == 4
    assert all(c["ok"] for c in result["checks"]) and result["alone"] is None


def test_a_soak_with_faults_checks_its_answers_against_the_same_requests_alone(
    server, tmp_path, capsys
):
    from specwise.bench.load import LoadOptions
    from specwise.bench.soak import run_soak

    opts = LoadOptions(
        urls={"": server[0]},
        concurrency=[2],
        prompts=PROMPTS[:2],
        max_tokens=8,
        ks=["auto"],
        out=tmp_path / "soak",
    )
    result = run_soak(opts, seconds=3.0, every=1.0, fault_every=1.0, alone=True)
    assert result["faults"] and all(f["ok"] for f in result["faults"]), result["faults"]
    a = result["alone"]
    assert a["answers"] >= 2 and a["matched"] + a["diverged"] == a["answers"]
    checks = {c["check"]: c["ok"] for c in result["checks"]}
    assert checks["no 5xx"] and checks["every fault taken as required"]
    assert checks["nothing left running or holding cache"]
    assert checks["greedy answers as alone, or parted at near-ties"]
    out = capsys.readouterr().out
    assert "PASS  greedy answers as alone, or parted at near-ties:" in out
    assert out.strip().splitlines()[-1].startswith("report: ")
    rows = [json.loads(x) for x in (tmp_path / "soak" / "requests.jsonl").read_text().splitlines()]
    assert rows and all("logprobs" not in r for r in rows)  # the answers are not logged whole


def test_serve_writes_every_round_to_its_trace(smollm2_path, tmp_path, monkeypatch):
    """...and builds its engine on a thread that has ended before serving (`on_own_thread`:
    a main thread that ran forwards left the scheduler's steps ~1.5x slower)."""
    import threading

    import uvicorn

    import specwise.cli.serve
    from specwise.cli import main

    tokens, builders = [], []
    build = specwise.cli.serve._build_engine

    def build_noting_the_thread(*args, **kwargs):
        builders.append(threading.current_thread())
        return build(*args, **kwargs)

    monkeypatch.setattr(specwise.cli.serve, "_build_engine", build_noting_the_thread)

    def run(app, **_):  # instead of serving: two requests at once through the app
        body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 12}
        with TestClient(app) as c, ThreadPoolExecutor(2) as pool:
            for r in pool.map(lambda _: c.post("/v1/chat/completions", json=body), [0, 1]):
                assert r.status_code == 200
                tokens.append(r.json()["usage"]["completion_tokens"])

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    trace = tmp_path / "rounds.jsonl"
    assert main(["serve", "--target", str(smollm2_path), "--trace", str(trace)]) == 0
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len({r["request_id"] for r in rows}) == 2
    assert sum(r["emitted"] for r in rows) == sum(tokens) > 0
    assert builders[0] is not threading.main_thread() and not builders[0].is_alive()


def test_the_scheduler_saves_what_the_controller_learnt_between_rounds(tmp_path):
    """Every save_every_s, between rounds (not per request, not only at shutdown)."""
    import asyncio

    from specwise.sampling import SamplingParams
    from specwise.server.metrics import Metrics
    from specwise.server.scheduler import Job, Scheduler
    from toy import ToyLM

    drafters = [NgramDrafter()]
    ctl = Controller(drafters, CostModel(CostCurve({1: 10.0, 2: 10.5}), {"ngram": 0.01}))
    ctl.remember(tmp_path / "learnt.json")
    engine = Engine(ToyLM(vocab=12, seed=1), drafters, k="auto", controller=ctl)
    sched = Scheduler(engine, Metrics(), save_every_s=0.0)
    loop = asyncio.new_event_loop()
    try:
        job = Job("r1", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=30), loop)
        sched.submit(job)

        async def finished() -> str:
            while (kind := (await job.events.get())[0]) not in ("done", "error"):
                pass
            return kind

        assert loop.run_until_complete(finished()) == "done"
    finally:
        sched.close()
        loop.close()
    saved = json.loads((tmp_path / "learnt.json").read_text())
    assert any(any(seen) for _, seen in saved["ngram"]["calibrations"])
    assert saved == ctl.state()


def test_sigterm_lets_the_requests_in_flight_finish(smollm2_path, tmp_path):
    """`specwise serve` on SIGTERM stops taking requests and drains those in flight
    (--drain-timeout), then exits cleanly."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "SPECWISE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "specwise.cli", "serve", "--target", str(smollm2_path)]
    cmd += ["--backend", "llama_cpp", "--k", "0", "--port", str(port), "--drain-timeout", "60"]
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert server.poll() is None and time.time() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health").json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        body = {"prompt": PROMPTS[0], "max_tokens": 64, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
        chunks = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                    if len(chunks) == 1:
                        server.send_signal(signal.SIGTERM)  # mid-stream
        assert chunks[-1]["usage"]["completion_tokens"] == 64  # finished, not cut
        assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
        assert server.wait(timeout=60) == 0  # the learning saved, the process left cleanly
        with pytest.raises(httpx.HTTPError):  # and takes no more requests
            httpx.get(url + "/health")
    finally:
        if server.poll() is None:
            server.kill()


def test_the_ttft_script_measures_a_short_request_behind_a_long_one(server):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "ttft_behind_long.py"
    args = ["--url", server[0], "--long-words", "150", "--after", "0.05", "--trials", "1"]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("short alone ") and "behind a 150-word prompt" in done.stdout


def toy_scheduler(max_batch: int):
    """A scheduler over a toy target that takes prompts of more than 4 tokens in chunks of 4,
    and an event loop that never runs (the jobs' events only queue up)."""
    import asyncio

    from specwise.server.metrics import Metrics
    from specwise.server.scheduler import Scheduler
    from toy import ToyLM

    toy = ToyLM(vocab=12, seed=1, delay_ms=(5.0, 1.0))
    toy.exact = False  # an exact target takes whole prompts
    engine = Engine(toy, [NgramDrafter()], k=2)
    sched = Scheduler(engine, Metrics(), max_batch=max_batch, prefill_chunk=4, whole_prompt=4)
    return engine, sched, asyncio.new_event_loop()


def wait_until(done, seconds: float = 30.0) -> None:
    """Poll `done()` until it holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_job_whose_client_left_during_a_round_ends_before_the_next_prefill_chunk():
    """A prompt's chunk may take seconds on a CPU: requests cancelled during a round, a running
    one and a queued one, are ended (caches released, counted cancelled) before the scheduler
    feeds the chunk."""
    from specwise.sampling import SamplingParams
    from specwise.server.scheduler import Job

    engine, sched, loop = toy_scheduler(max_batch=2)
    short = Job("short", [1, 2, 3], SamplingParams(max_tokens=200), loop)
    long = Job("long", [1, 2, 3, 4, 5] * 30, SamplingParams(max_tokens=2), loop)
    queued = Job("queued", [1, 2, 3], SamplingParams(max_tokens=4), loop)  # no slot left
    seen: list[tuple[str, str]] = []  # short's and queued's states at each chunk of long
    left: list[bool] = []  # once their clients have left (during a round)
    step, prefill = engine.step, engine.prefill

    def step_and_leave(reqs):
        out = step(reqs)
        if long.state == "prefilling":
            sched.cancel(short)  # their clients leave while the round runs
            sched.cancel(queued)
            left.append(True)
        return out

    def watched(req, budget=None, tenant=None):
        if req is long.req and left:  # a chunk after the round they left in
            seen.append((short.state, queued.state))
        return prefill(req, budget, tenant)

    engine.step, engine.prefill = step_and_leave, watched
    try:
        sched.submit(short)
        wait_until(lambda: short.state == "running")
        sched.submit(long)
        sched.submit(queued)
        wait_until(lambda: long.state in ("done", "failed"))
    finally:
        sched.close()
        loop.close()
    assert short.state == queued.state == "cancelled" and long.state == "done"
    both = ("cancelled", "cancelled")
    assert len(seen) > 1 and set(seen) == {both}, seen


def test_a_short_request_arriving_during_a_chunk_or_a_round_is_fed_next():
    """A short prompt that arrives while a long prompt's chunk is fed goes in before the next
    round; one that arrives during a round goes in before the next chunk (it does not wait for
    a round and a chunk)."""
    from specwise.sampling import SamplingParams
    from specwise.server.scheduler import Job

    engine, sched, loop = toy_scheduler(max_batch=4)
    jobs = {
        "running": Job("running", [1, 2, 3], SamplingParams(max_tokens=300), loop),
        "long": Job("long", [1, 2, 3, 4, 5] * 30, SamplingParams(max_tokens=2), loop),
        "a": Job("a", [4, 5], SamplingParams(max_tokens=2), loop),  # comes during a chunk
        "b": Job("b", [6, 7], SamplingParams(max_tokens=2), loop),  # comes during a round
    }
    calls: list[str] = []
    sent: dict[str, int] = {}  # job -> the index of the call it came during
    step, prefill = engine.step, engine.prefill

    def arrive(name: str) -> None:
        sent[name] = len(calls) - 1
        sched.submit(jobs[name])

    def stepped(reqs):
        out = step(reqs)
        calls.append("round")
        if "a" in sent and jobs["a"].state == "running" and "b" not in sent:
            arrive("b")
        return out

    def fed(req, budget=None, tenant=None):
        out = prefill(req, budget, tenant)
        calls.append(next(name for name, j in jobs.items() if j.req is req))
        if calls[-1] == "long" and calls.count("long") == 3:
            arrive("a")
        return out

    engine.step, engine.prefill = stepped, fed
    try:
        sched.submit(jobs["running"])
        wait_until(lambda: jobs["running"].state == "running")
        sched.submit(jobs["long"])
        wait_until(lambda: jobs["long"].state in ("done", "failed") and "b" in sent)
    finally:
        sched.close()
        loop.close()
    assert calls[sent["a"]] == "long" and calls[sent["a"] + 1] == "a", calls
    assert calls[sent["b"]] == "round" and calls[sent["b"] + 1] == "b", calls


def test_a_long_prompt_waits_in_the_queue_while_one_it_would_follow_is_prefilling():
    """Prompts are fed the shortest remaining first: a prompt longer than the one prefilling
    stays queued until that one is in, so a short request that arrives after it takes the free
    slot and runs first; a prompt longer than a chunk but shorter than what is left of the
    prefilling one is admitted and fed first. Short prompts (at most a chunk) go in whole even
    when together they take more than a chunk."""
    from specwise.sampling import SamplingParams
    from specwise.server.scheduler import Job

    engine, sched, loop = toy_scheduler(max_batch=4)
    jobs = {
        "running": Job("running", [1, 2, 3], SamplingParams(max_tokens=300), loop),
        "long": Job("long", [1, 2, 3, 4, 5] * 8, SamplingParams(max_tokens=2), loop),
        "long2": Job("long2", [5, 4, 3, 2, 1] * 10, SamplingParams(max_tokens=2), loop),
        "short": Job("short", [4, 5], SamplingParams(max_tokens=2), loop),
        "short2": Job("short2", [6, 7, 8], SamplingParams(max_tokens=2), loop),
        "medium": Job("medium", [4, 5, 6] * 3, SamplingParams(max_tokens=2), loop),
    }
    fed: list[tuple[str, str, str]] = []  # each prefill call: its job, long's and long2's state
    prefill = engine.prefill

    def feed(req, budget=None, tenant=None):
        name = next(n for n, j in jobs.items() if j.req is req)
        fed.append((name, jobs["long"].state, jobs["long2"].state))
        if name == "long" and len(fed) == 3:  # long is mid-prefill, 32 or more tokens left
            for later in ("long2", "short", "short2", "medium"):
                sched.submit(jobs[later])
        return prefill(req, budget, tenant)

    engine.prefill = feed
    try:
        sched.submit(jobs["running"])
        wait_until(lambda: jobs["running"].state == "running")
        sched.submit(jobs["long"])
        wait_until(lambda: jobs["long2"].state in ("done", "failed"))
    finally:
        sched.close()
        loop.close()
    first = {name: (lng, lng2) for name, lng, lng2 in reversed(fed)}  # states at its first feed
    assert first["short"] == first["short2"] == ("prefilling", "queued"), fed
    names = [name for name, _, _ in fed]
    assert names.count("short") == names.count("short2") == 1, fed  # whole, 5 > a chunk
    assert first["medium"] == ("prefilling", "queued"), fed
    assert first["long2"][0] in ("running", "done"), fed
    assert all(j.state == "done" for n, j in jobs.items() if n != "running"), jobs


def test_a_long_prompt_is_overtaken_by_at_most_overtakes_later_shorter_ones():
    """Shortest remaining first, bounded: a long prompt being prefilled when four shorter long
    prompts arrive lets OVERTAKES of them in before it, then gets its chunks first; the other
    two go in after it."""
    from specwise.sampling import SamplingParams
    from specwise.server.scheduler import OVERTAKES, Job

    engine, sched, loop = toy_scheduler(max_batch=6)
    huge = Job("huge", [1, 2, 3, 4, 5] * 12, SamplingParams(max_tokens=2), loop)
    later = [Job(f"m{i}", [5, 4, 3] * 4, SamplingParams(max_tokens=2), loop) for i in range(4)]
    running = Job("running", [1, 2, 3], SamplingParams(max_tokens=400), loop)
    jobs = [huge, *later]
    fed: list[tuple[str, bool]] = []  # each prefill call: whose, and whether its prompt is in
    prefill = engine.prefill

    def feed(req, budget=None, tenant=None):
        name = next((j.id for j in jobs if j.req is req), "running")
        done = prefill(req, budget, tenant)
        fed.append((name, done))
        if name == "huge" and len(fed) == 3:  # huge is mid-prefill
            for job in later:
                sched.submit(job)
        return done

    engine.prefill = feed
    try:
        sched.submit(running)
        wait_until(lambda: running.state == "running")
        sched.submit(huge)
        wait_until(lambda: all(j.state in ("done", "failed") for j in jobs))
    finally:
        sched.close()
        loop.close()
    assert all(j.state == "done" for j in jobs), jobs
    in_order = [name for name, done in fed if done and name != "running"]
    assert in_order == [
        *(j.id for j in later[:OVERTAKES]),
        "huge",
        *(j.id for j in later[OVERTAKES:]),
    ], fed


def test_a_draft_model_of_another_tokenizer_serves_greedy_as_plain(gemma_path, smollm2_path):
    """Gemma 3 checked exactly, drafted by SmolLM2 (two vocabularies): the API's greedy answer
    is plain decoding's, and the draft model drafted for it."""
    from specwise.sampling import SamplingParams

    target = LlamaCppLM(gemma_path, context_length=512, max_sequences=2, exact=True)
    draft = LlamaCppLM(smollm2_path, context_length=512, max_sequences=2)
    engine = Engine(target, ModelDrafter(draft), k=3)
    prompt = "def fibonacci(n):\n    "  # a prompt the draft drafts well for (test_vocab_map)
    ids = target.tokenizer.encode(prompt)
    want = Engine(target).generate(ids, SamplingParams(max_tokens=16)).text  # plain decoding
    with TestClient(create_app(engine, MODEL, max_batch=2)) as c:
        r = c.post("/v1/completions", json=greedy(prompt, max_tokens=16))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want
    assert r.json()["speculative"]["accepted"] > 0
