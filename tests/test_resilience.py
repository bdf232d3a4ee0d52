"""The server under faults, on 127.0.0.1 with the smallest real model (the short version of the
soak): every fault of `bench.faults` once while greedy requests run beside them, and request
bodies fuzzed with Hypothesis. Required: each fault handled as its outcome says, never a 5xx, a
4xx always in OpenAI's error format, every completed greedy answer equal to the same request's
answer alone, and afterwards no sequence left holding cache and greedy decoding unchanged."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specwise.bench.faults import FAULTS, error_problem, run_faults
from specwise.server import protocol
from specwise.server.app import create_app
from test_server import MODEL, PROMPTS, make_engine, serving

BODY_LIMIT = 64 << 10
RSS_SLACK_MB = 64.0  # what the faults and the fuzzing may add to the server's memory


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"error": {"message": "m", "type": "t", "param": None, "code": None}}, None),
        ({"error": {"message": "m", "type": "t", "param": "n", "code": "c"}}, None),
        ({"detail": "Not Found"}, "not {'error'"),
        ({"error": "bad"}, "not {'error'"),
        ({"error": {"message": "bad", "type": "t"}}, "lacks param, code"),
        ({"error": {"message": "", "type": "t", "param": None, "code": None}}, "message is empty"),
        ({"error": {"message": "m", "type": None, "param": None, "code": None}}, "type is not"),
        ({"error": {"message": "m", "type": "t", "param": 3, "code": None}}, "neither a string"),
        ("Internal Server Error", "not {'error'"),
    ],
)
def test_the_error_format_check(body, problem):
    got = error_problem(body)
    assert got is None if problem is None else problem in got


@pytest.mark.parametrize("field", ["max_tokens", "temperature", "seed", "n", "presence_penalty"])
@pytest.mark.parametrize("value", [10**400, -(10**400), 2**64])
def test_a_number_too_large_for_a_float_is_refused_by_name(field, value):
    """It was a 500: the check converted the number to a float first (OverflowError)."""
    with pytest.raises(protocol.ApiError) as refused:
        protocol.parse({"prompt": "hi", field: value}, False, [MODEL])
    assert refused.value.status == 400 and refused.value.param == field


@pytest.fixture(scope="module")
def server(smollm2_path):
    """A server with small limits (a batch of 2, a queue of 2, 64 KiB bodies), so that the
    faults reach them quickly: (its URL, its engine)."""
    engine = make_engine(smollm2_path)
    app = create_app(engine, MODEL, max_batch=2, max_queue=2, max_body_bytes=BODY_LIMIT)
    with serving(app) as url:
        yield url, engine


def greedy(url: str, prompt: str) -> str | None:
    """The greedy answer (24 tokens) to a prompt, or None where the server was busy (429)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    if r.status_code == 429:
        return None
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def alone(server):
    """Each prompt's greedy answer with nothing else running, and the server's memory then."""
    url = server[0]
    answers = [greedy(url, p) for p in PROMPTS]
    return answers, httpx.get(url + "/health").json()["rss_mb"]


def assert_recovered(server, alone, caplog) -> None:
    """Nothing logged an error (no exception reached the server's last-resort 500, no round or
    prefill failed), and once idle: no request in the scheduler, no sequence holding cache in
    the target or the draft model, memory within RSS_SLACK_MB of the start, and greedy answers
    unchanged."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "\n".join(f"{r.name}: {r.getMessage()}" for r in errors)
    url, engine = server
    deadline = time.time() + 30
    while True:
        health = httpx.get(url + "/health").json()
        load = [health[k] for k in ("running", "prefilling", "queued", "sequences")]
        if not any(load) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert load == [0, 0, 0, 0], f"not idle 30 s after the faults: {health}"
    drafts = [d.lm.in_use() for d in engine.drafters if hasattr(d, "lm")]
    assert drafts == [0], "a draft model's sequence outlived its request"
    answers, rss = alone
    assert health["rss_mb"] < rss + RSS_SLACK_MB, f"memory grew from {rss} MB: {health}"
    assert [greedy(url, p) for p in PROMPTS[:2]] == answers[:2]


def test_every_fault_is_handled_while_greedy_requests_run_beside_it(server, alone, caplog):
    url = server[0]
    stop = threading.Event()

    def beside() -> list[tuple[int, str]]:
        """Greedy requests round the prompts until the faults are done (429s skipped)."""
        done, i = [], 0
        while not stop.is_set():
            text = greedy(url, PROMPTS[i % len(PROMPTS)])
            if text is None:
                time.sleep(0.2)
            else:
                done.append((i % len(PROMPTS), text))
            i += 1
        return done

    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(beside)
        try:
            outcomes = run_faults(url + "/v1", rng=random.Random(0))
        finally:
            stop.set()
        answered = load.result()
    assert [o["fault"] for o in outcomes] == list(FAULTS)
    failed = [o for o in outcomes if not o["ok"]]
    assert not failed, "\n".join(json.dumps(o) for o in failed)
    assert all(o["seconds"] < 15 for o in outcomes), outcomes
    left = [
        o["detail"]
        for o in outcomes
        if o["fault"] in ("disconnect_mid_stream", "abandoned_request")
    ]
    assert all(d.endswith("; cancelled") for d in left), left  # they left before the answer ended
    answers = alone[0]
    assert answered, "no greedy request was answered beside the faults"
    assert [text for _, text in answered] == [answers[i] for i, _ in answered]
    assert_recovered(server, alone, caplog)


# -- fuzzing the request schema ------------------------------------------------------------------
# A fuzzed body is a valid one (its endpoint's required fields and some optional ones, each
# drawn from valid values) with up to three fields, known or unknown, set to anything at all
# (edge values often): so that many bodies are served (about half in random runs) and the rest
# are refused for one reason or a few.
TEXT = st.text(max_size=40)
VALID = {
    "model": st.just(MODEL),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "top_k": st.integers(min_value=0, max_value=10**20),
    "min_p": st.floats(min_value=0, max_value=1),
    "seed": st.integers(min_value=0, max_value=2**63 - 1),
    "n": st.just(1),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1), max_size=4)),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "presence_penalty": st.just(0),
    "frequency_penalty": st.just(0.0),
    "response_format": st.just({"type": "text"}),
    "tool_choice": st.sampled_from(["none", "auto"]),
    "user": TEXT,
    "speculative": st.fixed_dictionaries(
        {},
        optional={
            "k": st.one_of(st.integers(min_value=0, max_value=8), st.just("auto")),
            "drafter": st.sampled_from(["ngram", "model"]),
        },
    ),
}
PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant"]),
        "content": st.one_of(TEXT, st.lists(PART, min_size=1, max_size=3)),
    }
)
REQUIRED = {
    True: {"messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    False: {"prompt": st.one_of(st.text(min_size=1, max_size=40), st.tuples(st.text(min_size=1)))},
}
EXTRA = {  # valid fields of one endpoint only
    True: {
        "logprobs": st.booleans(),
        "max_completion_tokens": st.integers(min_value=1, max_value=8),
    },
    False: {"logprobs": st.integers(min_value=0, max_value=5)},
}
OTHERS = ["top_logprobs", "tools", "functions", "logit_bias", "best_of", "echo", "suffix"]
NUMBERS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**31, 2**63, 2**64, 10**400, -(10**400), 1e300, -0.0]),
)
STRINGS = st.one_of(
    TEXT,
    st.just(""),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
)
ANYTHING = st.recursive(
    st.none() | st.booleans() | NUMBERS | STRINGS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
EDGES = st.sampled_from(  # values at the edges of what a parser or a sampler handles
    [
        *(10**400, -(10**400), 2**63, 2**64, -1, 0, 1e300, 5e-324, 2.2250738585072014e-308),
        *(float("nan"), float("inf"), -float("inf"), "", "\ud800", "ten", [], {}, True),
    ]
)
MAX_FUZZED_TOKENS = 8


def bounded(body):
    """The body, with a max_tokens that it would be served with above MAX_FUZZED_TOKENS (or none:
    256 by default) set to MAX_FUZZED_TOKENS: no fuzzed request generates more."""
    if not isinstance(body, dict):
        return body
    v = body.get("max_tokens")
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if v is None or (number and MAX_FUZZED_TOKENS < v <= 2**20):  # (NaN is neither)
        body["max_tokens"] = MAX_FUZZED_TOKENS
    return body


def bodies(chat: bool) -> st.SearchStrategy:
    """Request bodies for /v1/chat/completions (chat) or /v1/completions; now and then not an
    object at all."""
    fields = {**VALID, **EXTRA[chat]}
    required = {**REQUIRED[chat], "max_tokens": st.integers(1, MAX_FUZZED_TOKENS)}
    valid = st.fixed_dictionaries(required, optional=fields)
    names = st.one_of(st.sampled_from([*required, *fields, *OTHERS]), st.text(max_size=10))
    changes = st.lists(st.tuples(names, st.one_of(EDGES, ANYTHING)), max_size=3)
    body = st.builds(lambda b, c: bounded({**b, **dict(c)}), valid, changes)
    return st.one_of(body, body, body, body, ANYTHING)


def check_answer(r: httpx.Response) -> None:
    """200 or a 4xx; a 4xx in OpenAI's error format; a stream ends with [DONE] and carries no
    error (a bad request is refused before its stream starts)."""
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        assert error_problem(r.json()) is None, r.text[:300]
    elif r.headers["content-type"].startswith("text/event-stream"):
        lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert lines and lines[-1] == "data: [DONE]", r.text[-300:]
        for line in lines[:-1]:
            assert "error" not in json.loads(line[len("data: ") :]), line
    else:
        assert r.json()["choices"], r.text[:300]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_fuzzed_bodies_get_an_answer_or_a_4xx_never_a_5xx(server, alone, path, caplog):
    url = server[0] + path
    sent = []

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=bodies(chat=path.endswith("chat/completions")))
    def one(body) -> None:
        content = json.dumps(body).encode()  # NaN and lone surrogates as Python writes them
        headers = {"content-type": "application/json"}
        check_answer(httpx.post(url, content=content, headers=headers, timeout=60))
        sent.append(body)

    one()
    assert len(sent) >= 60
    assert_recovered(server, alone, caplog)
