"""Ollama's API beside OpenAI's: the translation on a toy engine (field names, defaults, errors
in Ollama's shape naming Ollama's fields, NDJSON streams and their last object's statistics),
then a real `specwise serve --target ollama:... --ollama-port` on the smallest real model, kept
in an Ollama store, driven by the official `ollama` client, streamed and not, through bad
input it answers in one sentence and goes on serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from specwise import Engine
from specwise.drafters import NgramDrafter
from specwise.engines.process import free_port
from specwise.models import CATALOG
from specwise.server.app import create_app
from test_stores import link_blob, manifest, put_manifest
from toy import ToyLM, ToyTokenizer

PIECES = list("abcdefgh ")
STATS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration")
STATS += ("eval_count", "eval_duration")


@pytest.fixture(scope="module")
def toy():
    lm = ToyLM(vocab=len(PIECES), seed=3, context_length=64)
    lm.tokenizer = ToyTokenizer(PIECES)
    app = create_app(Engine(lm, [NgramDrafter()], k=2), "toy", max_batch=2, api_keys=())
    with TestClient(app) as client:
        yield client


def lines(r) -> list[dict]:
    return [json.loads(x) for x in r.text.splitlines() if x]


def test_the_model_is_listed_shown_and_versioned(toy):
    (entry,) = toy.get("/api/tags").json()["models"]
    assert entry["name"] == entry["model"] == "toy:latest" and len(entry["digest"]) == 64
    assert toy.get("/api/ps").json()["models"][0]["context_length"] == 64
    assert toy.get("/api/version").json()["version"]
    shown = toy.post("/api/show", json={"model": "toy"}).json()
    assert shown["specwise"]["drafters"] == ["ngram"] and shown["capabilities"] == ["completion"]
    assert toy.post("/api/show", json={"name": "toy:latest"}).status_code == 200  # legacy field
    assert toy.post("/api/show", json={"model": "llama3"}).json()["error"].startswith("model")
    r = toy.post("/api/pull", json={"model": "x"})
    assert r.status_code == 404 and "/api/chat" in r.json()["error"]
    assert toy.get("/").status_code == 200 and toy.head("/").status_code == 200


def test_chat_streams_ndjson_ending_with_the_statistics(toy):
    body = {"model": "toy", "messages": [{"role": "user", "content": "abc abc"}]}
    body["options"] = {"temperature": 0, "num_predict": 6}
    r = toy.post("/api/chat", json=body)  # streamed: Ollama's default
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    parts = lines(r)
    assert all(not p["done"] and p["message"]["role"] == "assistant" for p in parts[:-1])
    last = parts[-1]
    assert last["done"] and last["done_reason"] == "length" and last["eval_count"] == 6
    assert all(isinstance(last[k], int) for k in STATS) and last["prompt_eval_count"] == 7
    assert last["eval_duration"] <= last["total_duration"]
    assert {"proposed", "accepted", "acceptance_rate"} <= set(last["speculative"])
    whole = toy.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"]["content"] == "".join(p["message"]["content"] for p in parts)
    assert whole["done"] and whole["eval_count"] == 6


def test_generate_raw_or_templated_with_ollamas_defaults(toy):
    got = toy.post("/api/generate", json={"prompt": "ab", "stream": False}).json()
    assert got["model"] == "toy:latest" and got["response"] and got["done"]  # sampled at 0.8
    raw = {"prompt": "ab ab", "raw": True, "stream": False}
    raw["options"] = {"temperature": 0, "num_predict": 4, "seed": -1}
    once = toy.post("/api/generate", json=raw).json()
    assert once["eval_count"] == 4 and once["done_reason"] == "length"
    again = toy.post("/api/generate", json={**raw, "system": "ignored when raw"}).json()
    assert again["response"] == once["response"]  # greedy: the same answer
    streamed = lines(toy.post("/api/generate", json={**raw, "stream": True}))
    assert "".join(p["response"] for p in streamed) == once["response"]


def test_no_prompt_loads_the_model_and_keep_alive_zero_unloads_it(toy):
    assert toy.post("/api/generate", json={"model": "toy"}).json()["done_reason"] == "load"
    gone = toy.post("/api/generate", json={"prompt": "", "keep_alive": 0}).json()
    assert gone["done_reason"] == "unload" and gone["response"] == ""
    assert toy.post("/api/chat", json={"messages": [], "keep_alive": "0s"}).json()["done"]
    streamed = toy.post("/api/generate", json={"prompt": "ab", "stream": None})  # the default
    assert streamed.headers["content-type"] == "application/x-ndjson"
    assert toy.post("/api/generate", json={"model": "nope"}).status_code == 404


@pytest.mark.parametrize(
    "body, status, says",
    [
        ({"model": "llama3"}, 404, "model 'llama3' not found"),
        ({"options": {"temperature": "hot"}}, 400, "'options.temperature' must be a number"),
        ({"options": {"top_p": 0}}, 400, "'options.top_p' = 0"),
        ({"options": {"top_k": -1}}, 400, "'options.top_k'"),
        ({"options": {"num_predict": 0}}, 400, "'options.num_predict' = 0 is invalid"),
        ({"options": {"num_predict": "ten"}}, 400, "'options.num_predict'"),
        ({"options": {"stop": [1]}}, 400, "'options.stop' must be"),
        ({"options": {"seed": 1.5}}, 400, "'options.seed' must be an integer"),
        ({"options": {"repeat_penalty": 1.1}}, 400, "'options.repeat_penalty' = 1.1"),
        ({"options": {"mirostat": 2}}, 400, "'options.mirostat'"),
        ({"options": [1]}, 400, "'options' must be an object"),
        ({"format": "json"}, 400, "'format' (a JSON answer)"),
        ({"images": ["aGk="]}, 400, "'images'"),
        ({"context": [1, 2]}, 400, "'context'"),
        ({"raw": "yes"}, 400, "'raw' must be true or false"),
        ({"keep_alive": [5]}, 400, "'keep_alive' must be"),
        ({"stream": "yes"}, 400, "'stream' must be true or false"),
        ({"speculative": {"k": -1}}, 400, "'speculative.k'"),
        ({"prompt": "zzz"}, 400, "no piece"),  # not in the toy's vocabulary
        ({"prompt": "ab " * 40}, 400, "the target's context holds 64"),
    ],
)
def test_bad_input_is_one_sentence_in_ollamas_shape(toy, body, status, says):
    r = toy.post("/api/generate", json={"prompt": "ab", "stream": False, **body})
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and says in r.json()["error"]
    ok = toy.post("/api/generate", json={"prompt": "ab", "stream": False})
    assert ok.status_code == 200 and ok.json()["done"]  # and the next request is served


def test_bad_chat_messages_and_bodies(toy):
    for body, says in [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "a", "images": ["x"]}]}, "images"),
        ({"messages": "hello"}, "'messages' must be"),
        ({"messages": [{"role": "user", "content": "a"}], "tools": [{}]}, "'tools'"),
    ]:
        r = toy.post("/api/chat", json=body)
        assert r.status_code == 400 and says in r.json()["error"], r.text
    r = toy.post("/api/chat", content=b"{no", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_api_keys_guard_ollamas_routes_too():
    lm = ToyLM(vocab=len(PIECES), seed=3)
    lm.tokenizer = ToyTokenizer(PIECES)
    with TestClient(create_app(Engine(lm, [], k=0), "toy", api_keys=["k1"])) as c:
        r = c.post("/api/generate", json={"prompt": "ab", "stream": False})
        assert r.status_code == 401 and "API key" in r.json()["error"]
        r = c.post(
            "/api/generate",
            json={"prompt": "ab", "stream": False},
            headers={"Authorization": "Bearer k1"},
        )
        assert r.status_code == 200


# -- a real server and the official client ---------------------------------------------------
@pytest.fixture(scope="module")
def ollama_store(smollm2_path, tmp_path_factory):
    """An Ollama store holding the smallest real model as smol:135m (its blob a link to the
    catalog's file: nothing copied)."""
    root = tmp_path_factory.mktemp("ollama")
    digest = link_blob(root, smollm2_path, CATALOG["smollm2-135m-instruct"].sha256)
    put_manifest(root, "manifests-v2/ollama.com/library/smol/135m", manifest(digest), link=True)
    return root


@pytest.fixture(scope="module")
def served(ollama_store, tmp_path_factory):
    """`specwise serve --target ollama:smol:135m --ollama-port P`: (main URL, Ollama URL)."""
    port, oport = free_port(), free_port()
    env = {**os.environ, "OLLAMA_MODELS": str(ollama_store)}
    env["SPECWISE_HOME"] = str(tmp_path_factory.mktemp("home"))
    cmd = [sys.executable, "-m", "specwise.cli", "serve", "--target", "ollama:smol:135m"]
    cmd += ["--backend", "llama_cpp", "--k", "3", "--drafter", "ngram", "--max-batch", "2"]
    cmd += ["--port", str(port), "--ollama-port", str(oport)]
    log = tmp_path_factory.mktemp("log") / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    urls = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{oport}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, "the server did not start: " + log.read_text()
            try:
                if httpx.get(urls[1] + "/api/version").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield urls
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def client(served):
    import ollama

    return ollama.Client(host=served[1])


GREEDY = {"temperature": 0, "num_predict": 16}
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_the_client_lists_and_shows_the_ollama_model(client):
    (m,) = client.list().models
    assert m.model == "smol:135m" and m.details.quantization_level == "Q4_1"
    assert m.details.family == "llama" and m.details.parameter_size == "135M"
    assert m.digest == CATALOG["smollm2-135m-instruct"].sha256  # the blob's own name
    shown = client.show("smol:135m")
    assert shown.details.format == "gguf" and "{%" in shown.template  # the GGUF's template
    assert shown.modelinfo["general.architecture"] == "llama"


def test_chat_with_the_client_streamed_and_not(client):
    whole = client.chat(model="smol:135m", messages=ASK, options=GREEDY, stream=False)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length") and whole.eval_count <= 16
    assert whole.prompt_eval_count > 0 and whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model="smol:135m", messages=ASK, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count


def test_generate_with_the_client_streamed_and_not(client, served):
    prompt = "Count from one to five:"
    whole = client.generate(model="smol:135m", prompt=prompt, options=GREEDY, stream=False)
    assert whole.response and whole.done and whole.eval_count <= 16
    parts = list(client.generate(model="smol:135m", prompt=prompt, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = httpx.post(  # the speculative figures ride in the last object, beside Ollama's
        served[1] + "/api/generate",
        json={"model": "smol:135m", "prompt": prompt, "options": GREEDY, "stream": False},
        timeout=120,
    ).json()
    assert raw["response"] == whole.response and raw["speculative"]["rounds"] > 0
    stopped = client.generate(  # a stop string ends it before it is written
        model="smol:135m", prompt=prompt, options={**GREEDY, "stop": [whole.response[3:6]]}
    )
    assert whole.response[3:6] not in stopped.response and stopped.done_reason == "stop"


def test_the_client_gets_one_sentence_and_the_server_goes_on(client):
    import ollama

    bad = [
        ({"model": "llama3:8b"}, 404, "model 'llama3:8b' not found"),
        ({"options": {"temperature": -1}}, 400, "'options.temperature' = -1"),
        ({"options": {"num_predict": -5}}, 400, "'options.num_predict' = -5"),
        ({"options": {"repeat_penalty": 1.3}}, 400, "'options.repeat_penalty'"),
    ]
    for kw, status, says in bad:
        kw = {"model": "smol:135m", "prompt": "Hi", **kw}
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(**kw, stream=False)
        assert err.value.status_code == status and says in err.value.error
        with pytest.raises(ollama.ResponseError):  # streamed: refused before any line
            list(client.generate(**kw, stream=True))
        ok = client.chat(model="smol:135m", messages=ASK, options=GREEDY)
        assert ok.done and ok.message.content


def test_both_apis_on_both_ports(served):
    from openai import OpenAI

    main = served[0]
    out = OpenAI(base_url=main + "/v1", api_key="x").completions.create(
        model="smol:135m", prompt="Hello", max_tokens=4, temperature=0
    )
    assert out.usage.completion_tokens <= 4 and out.model_extra["speculative"]
    for url in served:
        assert httpx.get(url + "/api/tags").json()["models"][0]["name"] == "smol:135m"
        assert httpx.get(url + "/health").json()["model"] == "smol:135m"


def test_a_taken_ollama_port_is_one_sentence(ollama_store, served, tmp_path):
    """The second port is taken before any model loads: one sentence, at once."""
    taken = served[1].rsplit(":", 1)[1]
    env = {**os.environ, "OLLAMA_MODELS": str(ollama_store), "SPECWISE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "specwise.cli", "serve", "--target", "ollama:smol:135m"]
    done = subprocess.run(
        [*cmd, "--port", str(free_port()), "--ollama-port", taken],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--ollama-port {taken}: cannot listen" in done.stderr and "Ollama itself" in done.stderr
