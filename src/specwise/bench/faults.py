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

What this is not: a load generator (`bench.load`; a soak, `bench.soak`, runs these faults beside its load), a
benchmark, a check that answers are right (tests/test_resilience.py compares greedy answers with
the same requests run alone), or a leak check (the caller reads /health's `sequences` and
`rss_mb` once the server is idle).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from specwise.bench.ties import NEAR_TIE_FACTOR, alone_check, near_ties

__all__ = ["FAULTS", "client_for", "error_problem", "limits", "run_faults"]

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# where /health reports no limits (not specwise): sizes that exceed any usual server's
DEFAULT_LIMITS = {
    "context_length": 32768,
    "max_batch": 16,
    "max_queue": 64,
    "max_body_bytes": 4 << 20,
}
REQUEST_S = 15.0  # the longest a request that must be answered may take (default patience)
CANCEL_S = 3.0  # the longest a left request may take to be cancelled
GIVE_UP_S = 0.5  # how long a client that gives up waits for its answer
SLOW_S = 2.5  # how long a slow client crawls before it gives up
BURST_S = 10.0  # the longest a burst's requests wait for each other
TICK_S = 0.02  # a slow client's pace: one byte per connection per tick


# -- what the server should answer --------------------------------------------------------------
def error_problem(body: Any) -> str | None:
    """What is wrong with an error response's body, or None where it is OpenAI's format:
    {"error": {"message": non-empty str, "type": str, "param": str | None, "code": str |
    None}}."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return f"the body is not {{'error': {{...}}}}: {str(body)[:120]!r}"
    missing = [key for key in ("message", "type", "param", "code") if key not in err]
    if missing:
        return f"the error lacks {', '.join(missing)}: {err!r:.160}"
    if not isinstance(err["message"], str) or not err["message"]:
        return f"the error's message is empty or not a string: {err['message']!r:.80}"
    if not isinstance(err["type"], str):
        return f"the error's type is not a string: {err['type']!r:.80}"
    if not all(err[key] is None or isinstance(err[key], str) for key in ("param", "code")):
        return f"the error's param or code is neither a string nor null: {err!r:.160}"
    return None


def _body(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text[:200]


def refusal_problem(r: httpx.Response, status: int, param: str | None) -> str | None:
    """What is wrong with an answer that should be `status` (a 4xx) in OpenAI's error format
    naming `param`, or None."""
    body = _body(r)
    if r.status_code != status:
        return f"got {r.status_code}, not {status}: {str(body)[:160]}"
    problem = error_problem(body)
    if problem is not None:
        return problem
    if body["error"]["param"] != param:
        return f"the error's param is {body['error']['param']!r}, not {param!r}"
    return None


@dataclass(frozen=True)
class Bad:
    """A bad request and the refusal it should get: `body` is sent as is (bytes) or as JSON."""

    path: str
    body: bytes | dict[str, Any]
    param: str | None = None
    status: int = 400


def _send(client: httpx.Client, bad: Bad) -> httpx.Response:
    if isinstance(bad.body, bytes):
        headers = {"content-type": "application/json"}
        return client.post(bad.path, content=bad.body, headers=headers)
    return client.post(bad.path, json=bad.body)


def _refusals(client: httpx.Client, cases: Sequence[Bad]) -> tuple[int | None, list[str], str]:
    """Send every case; a problem for each answer that is not its refusal."""
    problems, status = [], None
    for i, bad in enumerate(cases):
        r = _send(client, bad)
        problem = refusal_problem(r, bad.status, bad.param)
        if problem is not None:
            status = r.status_code if not problems else status
            problems.append(f"case {i} ({bad.path}): {problem}")
        elif not problems:
            status = r.status_code
    return status, problems, f"{len(cases)} bad requests, each refused as required"


# -- the server's state, as a client sees it ----------------------------------------------------
def limits(client: httpx.Client) -> dict[str, int]:
    """The limits the server's /health reports (specwise: "limits"), the defaults for the rest."""
    try:
        reported = client.get("/health").json().get("limits", {})
    except (httpx.HTTPError, ValueError, AttributeError):
        reported = {}
    return {key: int(reported.get(key, v)) for key, v in DEFAULT_LIMITS.items()}


def _healthy(client: httpx.Client) -> str | None:
    """None if /health answers 200, else the problem."""
    try:
        r = client.get("/health")
    except httpx.HTTPError as exc:
        return f"/health did not answer: {type(exc).__name__}: {exc}"
    return None if r.status_code == 200 else f"/health answered {r.status_code}"


def _cancelled(client: httpx.Client) -> float | None:
    """Requests the server has cancelled so far (specwise's /metrics), None where it has no such
    count."""
    try:
        r = client.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "specwise_requests" not in r.text:
        return None
    found = re.search(r'^specwise_requests_total\{status="cancelled"\} (\S+)$', r.text, re.M)
    return float(found.group(1)) if found else 0.0


def _cancel_problem(client: httpx.Client, before: float | None) -> str | None:
    """None once the server's count of cancelled requests has risen past `before` (or where it
    keeps none), else the problem after CANCEL_S."""
    deadline = time.monotonic() + CANCEL_S
    while before is not None:
        now = _cancelled(client)
        if now is None or now > before:
            return None
        if time.monotonic() > deadline:
            return f"the request whose client left was not cancelled within {CANCEL_S:g} s"
        time.sleep(0.05)
    return None


def _served(
    client: httpx.Client, path: str, body: dict, stream: bool = False, timeout: Any = None
) -> httpx.Response:
    """Send a request the server should serve, waiting out 429s (a queue kept full by other
    load) for up to the client's patience. With `stream` the response is open: the caller
    closes it. timeout: this request's, if not the client's."""
    deadline = time.monotonic() + patience(client)
    timeout = client.timeout if timeout is None else timeout
    while True:
        request = client.build_request("POST", path, json=body, timeout=timeout)
        r = client.send(request, stream=stream)
        if r.status_code != 429 or time.monotonic() > deadline:
            return r
        r.close()
        time.sleep(0.25)


def _connect(client: httpx.Client, timeout: float | None = None) -> socket.socket:
    """A raw connection to the server, for what httpx does not do (crawl, leave a body open);
    timeout: its sockets', if not the client's patience."""
    url = client.base_url
    timeout = patience(client) if timeout is None else timeout
    return socket.create_connection((url.host, url.port or 80), timeout=timeout)


def patience(client: httpx.Client) -> float:
    """How long a request that must be answered may take: the client's read timeout."""
    return client.timeout.read or REQUEST_S


def _head(client: httpx.Client, length: int | None) -> bytes:
    """The head of a raw POST to /v1/completions: its body `length` bytes, or chunked (None)."""
    auth = client.headers.get("authorization")
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {client.base_url.host}\r\n"
        "Content-Type: application/json\r\n"
        + (f"Authorization: {auth}\r\n" if auth else "")
        + framing
        + "\r\n\r\n"
    ).encode()


def _answer(sock: socket.socket) -> httpx.Response:
    """The answer (status and a Content-Length-framed body) read from a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(1 << 16)
        if not more:
            raise ConnectionError("the server closed the connection without an answer")
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
    length = int(fields.get("content-length", "0"))
    while len(body) < length and (more := sock.recv(1 << 16)):
        body += more
    return httpx.Response(int(lines[0].split()[1]), content=body[:length])


def _chat(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0, **fields}


LONG_ANSWER = "Count from 1 to 1000, one number per line."  # a long answer (a chat's)
COUNTING = ", ".join(map(str, range(1, 21))) + ","  # continued for as long as it may go


def _events(r: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, as they come."""
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


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
        if not problems and (problem := _healthy(client)) is not None:
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
    before = _cancelled(client)
    read, ended = rng.randint(1, 3), False
    body = _chat(LONG_ANSWER, stream=True, max_tokens=cap)
    with contextlib.closing(_served(client, CHAT, body, stream=True)) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [f"the stream was refused: {_body(r)!s:.160}"], ""
        for i, event in enumerate(_events(r)):
            ended = any(c.get("finish_reason") for c in event.get("choices", []))
            if i + 1 >= read or ended:
                break
    if ended:
        return 200, [], f"the answer ended within {read} chunks, before the hang-up"
    problem = _cancel_problem(client, before)
    return 200, [problem] if problem else [], f"hung up after {read} chunks; cancelled"


@_fault
def abandoned_request(client: httpx.Client, rng: random.Random):
    """Ask for an answer as long as the context without streaming, and give up waiting: it is
    cancelled."""
    cap = limits(client)["context_length"]
    before = _cancelled(client)
    body = {"prompt": COUNTING, "max_tokens": cap, "temperature": 0}
    try:
        r = _served(
            client, COMPLETIONS, body, timeout=httpx.Timeout(patience(client), read=GIVE_UP_S)
        )
    except httpx.ReadTimeout:
        problem = _cancel_problem(client, before)
        return None, [problem] if problem else [], f"gave up after {GIVE_UP_S:g} s; cancelled"
    if r.status_code != 200:
        return r.status_code, [f"got {r.status_code}: {_body(r)!s:.160}"], ""
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
    return _refusals(client, [Bad(rng.choice(paths), c) for c in cases])


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
    with contextlib.closing(_connect(client, timeout=CANCEL_S)) as sock:
        sock.sendall(_head(client, None))
        for part in chunks():
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))  # and never the last chunk
        try:
            endless = _answer(sock)
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
    return _refusals(client, cases)


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
    return _refusals(client, cases)


@_fault
def huge_max_tokens(client: httpx.Client, rng: random.Random):
    """max_tokens past any limit (400), and the largest accepted one (streamed, then left)."""
    cases = [
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 10**400}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 2**64}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 1e300}, "max_tokens"),
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": -(2**70)}, "max_tokens"),
        Bad(CHAT, _chat("hi", max_completion_tokens=10**30), "max_completion_tokens"),
    ]
    status, problems, _ = _refusals(client, cases)
    before = _cancelled(client)
    body = _chat(LONG_ANSWER, stream=True, max_tokens=1 << 20)  # cut at the context's end
    with contextlib.closing(_served(client, CHAT, body, stream=True)) as r:
        status = status if problems else r.status_code
        if r.status_code == 200:
            first = next(_events(r), None)
            if first is None or "error" in first:
                problems.append(f"a stream with max_tokens 2**20 began with {first!r:.160}")
        elif 400 <= r.status_code < 500:
            r.read()
            if (problem := error_problem(_body(r))) is not None:
                problems.append(f"max_tokens 2**20 refused badly: {problem}")
        else:
            problems.append(f"max_tokens 2**20 got {r.status_code}")
    if r.status_code == 200 and not problems and (problem := _cancel_problem(client, before)):
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
        Bad(CHAT, _chat(prompt, max_tokens=4, stream=True), "messages"),
    ]
    rng.shuffle(cases)
    status, problems, _ = _refusals(client, cases)
    return status, problems, f"{words} words refused, plain and streamed"


@_fault
def n_above_one(client: httpx.Client, rng: random.Random):
    """More than one choice (n > 1, or n = 0): 400 naming n."""
    cases = [
        Bad(COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "n": rng.randint(2, 8)}, "n"),
        Bad(CHAT, _chat("hi", max_tokens=4, n=rng.randint(2, 8), stream=True), "n"),
        Bad(CHAT, _chat("hi", max_tokens=4, n=0), "n"),
    ]
    return _refusals(client, cases)


@_fault
def unknown_fields(client: httpx.Client, rng: random.Random):
    """Fields the API does not define, at the top and inside a message: the server answers and
    they change nothing (specwise ignores unknown fields): the greedy answer is the same as
    without them, or (outside exact mode, where other load batched with each request differs)
    parts from it only at a near-tie, judged by the two answers' log-probabilities as a soak
    judges its answers (`bench.ties.alone_check`)."""
    prompt = rng.choice(["Name three colours.", "Say hello in French.", "What is 2 + 2?"])
    plain = _chat(prompt, max_tokens=8, logprobs=True, top_logprobs=2)
    odd = {**plain, "frobnicate": {"deep": [1, {"x": None}]}, "x_trace": "abc"}
    odd["messages"] = [{**plain["messages"][0], "mood": "curious"}]
    answers = [_served(client, CHAT, body) for body in (plain, odd)]
    bad = [r for r in answers if r.status_code != 200]
    if bad:
        return bad[0].status_code, [f"got {bad[0].status_code}: {_body(bad[0])!s:.160}"], ""
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
    payload = _head(client, len(body)) + body[: len(body) // 2]  # never the whole body
    socks = [_connect(client, timeout=1.0) for _ in range(3)]
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
        r = _served(client, COMPLETIONS, {"prompt": "hi", "max_tokens": 4})
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
    body = _chat(LONG_ANSWER, stream=True, max_tokens=256)
    pool = httpx.Limits(max_connections=n, max_keepalive_connections=0)

    def one(crowd: httpx.Client) -> tuple[int | None, str | None]:
        try:
            with crowd.stream("POST", CHAT, json=body) as r:
                problem = None
                if r.status_code != 200:
                    r.read()
                    problem = error_problem(_body(r))
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
