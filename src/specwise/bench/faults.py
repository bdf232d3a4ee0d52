"""Faults to throw at a running OpenAI-compatible server: a catalogue (`FAULTS`) and `run_faults`.

Each fault is a function `fault(client, rng) -> dict` that makes one kind of faulty interaction
with the server's OpenAI routes (/v1/chat/completions, /v1/completions) through `client` (an
`httpx.Client` whose base URL is the server's root, with its API key header if it needs one)
and says how the server took it:

    {"fault": name, "status": an HTTP status it got (a wrong one if any; None: none),
     "ok": the server behaved as required, "detail": what went wrong, or what happened,
     "seconds": how long the fault took}

Required of the server: bad input gets a 4xx whose body is OpenAI's error format, {"error":
{"message": a non-empty string, "type": a string, "param": the field or null, "code": a string
or null}}, with `param` naming the offending field where there is one; nothing gets a 5xx; a
client that leaves mid-answer, crawls, or crowds in past the queue leaves the server healthy
(/health answers 200), and a request whose client left is cancelled where the server counts
cancellations (specwise's /metrics). The faults size themselves by the limits /health reports
(specwise: context, batch, queue, body bytes; `limits`), with generous defaults where it reports
none. Every fault ends within a few seconds (plus, for the few that need an answer, the time
the server takes to generate a few tokens), whatever the server does.

How a fault talks to the server and judges what it answers (the error format, the limits and
health /health reports, the cancellations /metrics counts, raw connections) is
`bench.fault_client`'s; this module holds the faults themselves and runs them.

What this is not: a load generator (`bench.load`; a soak, `bench.soak`, runs these faults
beside its load), a benchmark, a check that answers are right (tests/test_resilience.py
compares greedy answers with the same requests run alone), or a leak check (the caller reads
/health's `sequences` and `rss_mb` once the server is idle).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from specwise.bench.fault_client import (
    CANCEL_S,
    CHAT,
    COMPLETIONS,
    REQUEST_S,
    Bad,
    answer_body,
    cancel_problem,
    cancelled,
    chat_body,
    connect,
    error_problem,
    events,
    healthy,
    limits,
    patience,
    raw_head,
    read_answer,
    refusal_problem,
    refusals,
    served,
)
from specwise.bench.ties import NEAR_TIE_FACTOR, alone_check, near_ties

__all__ = ["FAULTS", "REQUEST_S", "client_for", "error_problem", "limits", "run_faults"]

GIVE_UP_S = 0.5  # how long a client that gives up waits for its answer
SLOW_S = 2.5  # how long a slow client crawls before it gives up
BURST_S = 10.0  # the longest a burst's requests wait for each other
TICK_S = 0.02  # a slow client's pace: one byte per connection per tick
LONG_ANSWER = "Count from 1 to 1000, one number per line."  # a long answer (a chat's)
COUNTING = ", ".join(map(str, range(1, 21))) + ","  # continued for as long as it may go


# -- the catalogue --------------------------------------------------------------------------------
FaultFn = Callable[[httpx.Client, random.Random], dict[str, Any]]
FAULTS: dict[str, FaultFn] = {}


def _fault(fn: Callable[[httpx.Client, random.Random], tuple[int | None, list[str], str]]):
    """Register `fn(client, rng) -> (status, problems, note)` as the fault of its name; the
    registered function returns the outcome dict (a fault that raises is not ok)."""
    name = fn.__name__

    def run(client: httpx.Client, rng: random.Random) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            status, problems, note = fn(client, rng)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            status, problems, note = None, [f"{type(exc).__name__}: {exc}"], ""
        if not problems and (problem := healthy(client)) is not None:
            problems = [f"after the fault, {problem}"]
        return {
            "fault": name,
            "status": status,
            "ok": not problems,
            "detail": "; ".join(problems) or note,
            "seconds": round(time.monotonic() - t0, 3),
        }

    run.__name__, run.__doc__ = name, fn.__doc__
    FAULTS[name] = run
    return run


@_fault
def disconnect_mid_stream(client: httpx.Client, rng: random.Random):
    """Open a streamed chat answer, read a chunk or three, hang up: it is cancelled."""
    cap = limits(client)["context_length"]
    before = cancelled(client)
    read, ended = rng.randint(1, 3), False
    body = chat_body(LONG_ANSWER, stream=True, max_tokens=cap)
    with contextlib.closing(served(client, CHAT, body, stream=True)) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [f"the stream was refused: {answer_body(r)!s:.160}"], ""
        for i, event in enumerate(events(r)):
            ended = any(c.get("finish_reason") for c in event.get("choices", []))
            if i + 1 >= read or ended:
                break
    if ended:
        return 200, [], f"the answer ended within {read} chunks, before the hang-up"
    problem = cancel_problem(client, before)
    return 200, [problem] if problem else [], f"hung up after {read} chunks; cancelled"


@_fault
def abandoned_request(client: httpx.Client, rng: random.Random):
    """Ask for an answer as long as the context without streaming, and give up waiting: it is
    cancelled."""
    cap = limits(client)["context_length"]
    before = cancelled(client)
    body = {"prompt": COUNTING, "max_tokens": cap, "temperature": 0}
    try:
        r = served(
            client, COMPLETIONS, body, timeout=httpx.Timeout(patience(client), read=GIVE_UP_S)
        )
    except httpx.ReadTimeout:
        problem = cancel_problem(client, before)
        return None, [problem] if problem else [], f"gave up after {GIVE_UP_S:g} s; cancelled"
    if r.status_code != 200:
        return r.status_code, [f"got {r.status_code}: {answer_body(r)!s:.160}"], ""
    return 200, [], f"answered within {GIVE_UP_S:g} s, before the client gave up"


@_fault
def malformed_json(client: httpx.Client, rng: random.Random):
    """Bodies that are not JSON, or not a JSON object: 400."""
    depth = min(5000, limits(client)["max_body_bytes"] // 2 - 1)  # deeper than Python recurses
    cases = [
        b"{not json",
        b"",
        b'{"prompt": "hi", "max_tokens": 4,}',
        b'{"prompt": "hi", "max_tokens": 4',
        b'{"prompt": "hi"} {"prompt": "again"}',
        b"\x00\x01\x02\x03",
        b"[" * depth + b"]" * depth,
        b'{"prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}",  # more digits than Python reads
        b"[1, 2, 3]",
        b'"hello"',
        b"null",
    ]
    paths = [CHAT, COMPLETIONS]
    return refusals(client, [Bad(rng.choice(paths), c) for c in cases])


@_fault
def oversized_body(client: httpx.Client, rng: random.Random):
    """A body one byte over the limit, with a Content-Length and chunked (without one): 413;
    and a chunked body that goes past the limit and never ends: 413 all the same (a server that
    reads on before it checks would wait for the end, or read until its memory runs out)."""
    limit = limits(client)["max_body_bytes"]
    head = b'{"max_tokens": 4, "prompt": "'
    body = head + b"x" * (limit + 1 - len(head) - 2) + b'"}'
    r = client.post(COMPLETIONS, content=body)
    problems = []
    if (problem := refusal_problem(r, 413, None)) is not None:
        problems.append(f"with a Content-Length: {problem}")
    piece = 1 << rng.randint(12, 16)

    def chunks() -> Iterator[bytes]:
        yield from (body[i : i + piece] for i in range(0, len(body), piece))

    chunked = client.post(COMPLETIONS, content=chunks())
    if (problem := refusal_problem(chunked, 413, None)) is not None:
        problems.append(f"chunked: {problem}")
    with contextlib.closing(connect(client, timeout=CANCEL_S)) as sock:
        sock.sendall(raw_head(client, None))
        for part in chunks():
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))  # and never the last chunk
        try:
            endless = read_answer(sock)
        except TimeoutError:
            endless = None
            problems.append(f"a body past the limit that never ends: no answer in {CANCEL_S:g} s")
    if endless is not None and (problem := refusal_problem(endless, 413, None)) is not None:
        problems.append(f"a body past the limit that never ends: {problem}")
    statuses = [r.status_code, chunked.status_code, endless and endless.status_code]
    status = next((s for s in statuses if s != 413), 413)
    return status, problems, f"{limit + 1} bytes refused: with a length, chunked, never ending"


@_fault
def wrong_types(client: httpx.Client, rng: random.Random):
    """Fields of the wrong type: 400 naming the field."""
    user = [{"role": "user", "content": "hi"}]
    chat = [
        ({"messages": user, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": "hi", "max_tokens": 4}, "messages"),
        ({"messages": [{"role": 5, "content": "hi"}], "max_tokens": 4}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}], "max_tokens": 4}, "messages[0].content"),
        ({"messages": user, "max_tokens": 4, "stream_options": [1]}, "stream_options"),
        ({"messages": user, "max_tokens": 4, "temperature": "hot"}, "temperature"),
    ]
    completions = [
        ({"prompt": {"text": "hi"}, "max_tokens": 4}, "prompt"),
        ({"prompt": "hi", "max_tokens": 4, "stream": "yes"}, "stream"),
        ({"prompt": "hi", "max_tokens": 4, "stop": [1, 2]}, "stop"),
        ({"prompt": "hi", "max_tokens": 4, "seed": 1.5}, "seed"),
        ({"prompt": "hi", "max_tokens": 4, "model": 7}, "model"),
        ({"prompt": "hi", "max_tokens": 4, "top_p": [0.5]}, "top_p"),
        ({"prompt": "hi", "max_tokens": [4]}, "max_tokens"),
    ]
    cases = [Bad(CHAT, b, p) for b, p in chat] + [Bad(COMPLETIONS, b, p) for b, p in completions]
    rng.shuffle(cases)
    return refusals(client, cases)


@_fault
def invalid_utf8(client: httpx.Client, rng: random.Random):
    """Text that is not UTF-8 (400: the body is not JSON) or not Unicode (a lone surrogate,
    escaped or encoded, which Python's JSON reader lets through: 400 naming the text's field)."""
    not_utf8 = [b"caf\xe9", b"\xff\xfe\xfd", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80"]
    surrogates = [b"\xed\xa0\x80", b"\\ud800", b"\\udc00"]
    kinds = [(j, None, None) for j in not_utf8] + [(j, "prompt", "messages") for j in surrogates]
    cases = []
    for junk, prompt_param, messages_param in kinds:
        at = rng.randint(0, 5)  # where in the text the junk goes
        text = b"hello"[:at] + junk + b"hello"[at:]
        prompt = b'{"max_tokens": 4, "prompt": "' + text + b'"}'
        messages = b'[{"role": "user", "content": "' + text + b'"}]'
        cases.append(Bad(COMPLETIONS, prompt, prompt_param))
        cases.append(Bad(CHAT, b'{"max_tokens": 4, "messages": ' + messages + b"}", messages_param))
    return refusals(client, cases)


@_fault
def huge_max_tokens(client: httpx.Client, rng: random.Random):
    """max_tokens past any limit (400), and the largest accepted one (streamed, then left)."""
    cases = [
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 10**400}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 2**64}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 1e300}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": -(2**70)}, "max_tokens"),
        Bad(CHAT, chat_body("hi", max_completion_tokens=10**30), "max_completion_tokens"),
    ]
    status, problems, _ = refusals(client, cases)
    before = cancelled(client)
    body = chat_body(LONG_ANSWER, stream=True, max_tokens=1 << 20)  # cut at the context's end
    with contextlib.closing(served(client, CHAT, body, stream=True)) as r:
        status = status if problems else r.status_code
        if r.status_code == 200:
            first = next(events(r), None)
            if first is None or "error" in first:
                problems.append(f"a stream with max_tokens 2**20 began with {first!r:.160}")
        elif 400 <= r.status_code < 500:
            r.read()
            if (problem := error_problem(answer_body(r))) is not None:
                problems.append(f"max_tokens 2**20 refused badly: {problem}")
        else:
            problems.append(f"max_tokens 2**20 got {r.status_code}")
    if r.status_code == 200 and not problems and (problem := cancel_problem(client, before)):
        problems.append(problem)
    return status, problems, f"{len(cases)} refused; max_tokens 2**20 answered {r.status_code}"


@_fault
def prompt_over_context(client: httpx.Client, rng: random.Random):
    """A prompt longer than the context, plain and streamed: 400 before any answer starts."""
    lim = limits(client)
    words = min(2 * lim["context_length"], (lim["max_body_bytes"] - 200) // 5)
    prompt = "word " * words
    cases = [
        Bad(COMPLETIONS, {"prompt": prompt, "max_tokens": 4}, "prompt"),
        Bad(CHAT, chat_body(prompt, max_tokens=4, stream=True), "messages"),
    ]
    rng.shuffle(cases)
    status, problems, _ = refusals(client, cases)
    return status, problems, f"{words} words refused, plain and streamed"


@_fault
def n_above_one(client: httpx.Client, rng: random.Random):
    """More than one choice (n > 1, or n = 0): 400 naming n."""
    cases = [
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "n": rng.randint(2, 8)}, "n"),
        Bad(CHAT, chat_body("hi", max_tokens=4, n=rng.randint(2, 8), stream=True), "n"),
        Bad(CHAT, chat_body("hi", max_tokens=4, n=0), "n"),
    ]
    return refusals(client, cases)


@_fault
def unknown_fields(client: httpx.Client, rng: random.Random):
    """Fields the API does not define, at the top and inside a message: the server answers and
    they change nothing (specwise ignores unknown fields): the greedy answer is the same as
    without them, or (outside exact mode, where other load batched with each request differs)
    parts from it only at a near-tie, judged by the two answers' log-probabilities as a soak
    judges its answers (`bench.ties.alone_check`)."""
    prompt = rng.choice(["Name three colours.", "Say hello in French.", "What is 2 + 2?"])
    plain = chat_body(prompt, max_tokens=8, logprobs=True, top_logprobs=2)
    odd = {**plain, "frobnicate": {"deep": [1, {"x": None}]}, "x_trace": "abc"}
    odd["messages"] = [{**plain["messages"][0], "mood": "curious"}]
    answers = [served(client, CHAT, body) for body in (plain, odd)]
    bad = [r for r in answers if r.status_code != 200]
    if bad:
        return bad[0].status_code, [f"got {bad[0].status_code}: {answer_body(bad[0])!s:.160}"], ""
    choices = [r.json()["choices"][0] for r in answers]
    texts = [c["message"]["content"] for c in choices]
    if texts[0] == texts[1]:
        return 200, [], "accepted and ignored: the same greedy answer as without them"
    entries = [(c.get("logprobs") or {}).get("content") for c in choices]
    judged = near_ties([alone_check(*entries)], NEAR_TIE_FACTOR) if all(entries) else None
    if judged is not None and judged["diverged"] == judged["at_near_ties"] == 1:
        return 200, [], f"accepted and ignored: parted at a near-tie ({judged})"
    return 200, [f"the unknown fields changed the answer: {texts[0]!r} vs {texts[1]!r}"], ""


def slow_client(client: httpx.Client, rng: random.Random):
    """Slowloris: three connections send a request's headers and part of its body a byte at a
    time for a few seconds, then give up; meanwhile a normal request is answered."""
    body = json.dumps({"prompt": "hi", "max_tokens": 4}).encode()
    payload = raw_head(client, len(body)) + body[: len(body) // 2]  # never the whole body
    socks = [connect(client, timeout=1.0) for _ in range(3)]
    stop = threading.Event()

    def crawl() -> None:
        sent = [0] * len(socks)
        while not stop.wait(TICK_S * rng.uniform(0.5, 1.5)):
            for i, s in enumerate(socks):
                if sent[i] < len(payload):
                    try:
                        s.sendall(payload[sent[i] : sent[i] + 1])
                        sent[i] += 1
                    except OSError:
                        sent[i] = len(payload)  # the server closed it: fine

    crawler = threading.Thread(target=crawl, daemon=True)
    crawler.start()
    try:
        time.sleep(SLOW_S / 3)
        r = served(client, COMPLETIONS, {"prompt": "hi", "max_tokens": 4})
        time.sleep(max(0.0, SLOW_S - SLOW_S / 3))
    finally:
        stop.set()
        crawler.join(timeout=1.0)
        for s in socks:
            s.close()
    if r.status_code != 200:
        return r.status_code, [f"a normal request beside slow clients got {r.status_code}"], ""
    return 200, [], f"3 slow clients for {SLOW_S:g} s; a normal request was answered meanwhile"


@_fault
def burst(client: httpx.Client, rng: random.Random):
    """More streamed requests at once than the batch and the queue hold, all kept open until
    each has its status: the surplus gets 429 in OpenAI's format, nothing a 5xx."""
    lim = limits(client)
    n = lim["max_batch"] + lim["max_queue"] + rng.randint(4, 8)
    gate = threading.Barrier(n, timeout=BURST_S)
    body = chat_body(LONG_ANSWER, stream=True, max_tokens=256)
    pool = httpx.Limits(max_connections=n, max_keepalive_connections=0)

    def one(crowd: httpx.Client) -> tuple[int | None, str | None]:
        try:
            with crowd.stream("POST", CHAT, json=body) as r:
                problem = None
                if r.status_code != 200:
                    r.read()
                    problem = error_problem(answer_body(r))
                with contextlib.suppress(threading.BrokenBarrierError):
                    gate.wait()  # every request is in before any leaves
                return r.status_code, problem
        except httpx.HTTPError as exc:
            gate.abort()
            return None, f"{type(exc).__name__}: {exc}"

    with (
        httpx.Client(
            base_url=client.base_url, headers=client.headers, timeout=client.timeout, limits=pool
        ) as crowd,
        ThreadPoolExecutor(n) as threads,
    ):
        answers = list(threads.map(lambda _: one(crowd), range(n)))
    statuses = [s for s, _ in answers]
    counts = {s: statuses.count(s) for s in sorted(set(statuses), key=str)}
    problems = [f"{s}: {p}" for s, p in answers if p is not None]
    problems += [f"{c} answers of {s}" for s, c in counts.items() if s not in (200, 429)]
    if 429 not in counts:
        problems.append(f"none of {n} requests got 429 ({lim})")
    worst = max((s for s in statuses if s is not None), default=None)
    return (
        worst,
        problems,
        f"{n} requests at once: " + ", ".join(f"{c} x {s}" for s, c in counts.items()),
    )


# -- running them -------------------------------------------------------------------------------
def client_for(url: str, api_key: str | None = None, patience_s: float = REQUEST_S) -> httpx.Client:
    """A client of the server at `url` (its root, or its /v1), with its API key if any, that
    waits up to `patience_s` for what must be answered."""
    root = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=root, headers=headers, timeout=patience_s)


def run_faults(
    url: str,
    api_key: str | None = None,
    faults: Sequence[str] | None = None,
    rng: random.Random | None = None,
    patience_s: float = REQUEST_S,
) -> list[dict[str, Any]]:
    """Run the named faults (None: every one, in the catalogue's order) one after another
    against the server at `url`; their outcomes, in order. `rng` (default: seeded with 0)
    picks what varies: where a stream is left, the pace of a slow client, a burst's size.
    patience_s: how long a request that must be answered may take (a loaded server answers
    later: a soak scales it by the latency its own requests see)."""
    names = list(FAULTS) if faults is None else list(faults)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; the faults are {', '.join(FAULTS)}")
    rng = random.Random(0) if rng is None else rng
    with client_for(url, api_key, patience_s) as client:
        return [FAULTS[name](client, rng) for name in names]
