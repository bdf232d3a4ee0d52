"""How `bench.faults` talks to a server and judges its answers, as a client sees it.

What the server must answer: a refusal in OpenAI's error format, {"error": {"message",
"type", "param", "code"}} (`error_problem`), with the status and `param` required
(`refusal_problem`; a bad request and its refusal: `Bad`, sent in turn by `refusals`). Its
state: the limits /health reports (`limits`, with generous defaults where it reports none),
whether /health answers (`healthy`), the requests /metrics counts cancelled (`cancelled`,
`cancel_problem`). Talking to it: a request it must answer, waiting out 429s for the client's
`patience` (`served`); raw connections for what httpx does not do, a crawling or never-ending
body (`connect`, `raw_head`, `read_answer`); a chat body (`chat_body`) and a stream's events
(`events`).

What this is not: the catalogue of faults, nor their running (`bench.faults`); it decides no
fault's outcome.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "CANCEL_S",
    "CHAT",
    "COMPLETIONS",
    "REQUEST_S",
    "Bad",
    "answer_body",
    "cancel_problem",
    "cancelled",
    "chat_body",
    "connect",
    "error_problem",
    "events",
    "healthy",
    "limits",
    "patience",
    "raw_head",
    "read_answer",
    "refusal_problem",
    "refusals",
    "served",
]

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


def answer_body(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text[:200]


def refusal_problem(r: httpx.Response, status: int, param: str | None) -> str | None:
    """What is wrong with an answer that should be `status` (a 4xx) in OpenAI's error format
    naming `param`, or None."""
    body = answer_body(r)
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


def refusals(client: httpx.Client, cases: Sequence[Bad]) -> tuple[int | None, list[str], str]:
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


def healthy(client: httpx.Client) -> str | None:
    """None if /health answers 200, else the problem."""
    try:
        r = client.get("/health")
    except httpx.HTTPError as exc:
        return f"/health did not answer: {type(exc).__name__}: {exc}"
    return None if r.status_code == 200 else f"/health answered {r.status_code}"


def cancelled(client: httpx.Client) -> float | None:
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


def cancel_problem(client: httpx.Client, before: float | None) -> str | None:
    """None once the server's count of cancelled requests has risen past `before` (or where it
    keeps none), else the problem after CANCEL_S."""
    deadline = time.monotonic() + CANCEL_S
    while before is not None:
        now = cancelled(client)
        if now is None or now > before:
            return None
        if time.monotonic() > deadline:
            return f"the request whose client left was not cancelled within {CANCEL_S:g} s"
        time.sleep(0.05)
    return None


# -- talking to it ------------------------------------------------------------------------------
def served(
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


def connect(client: httpx.Client, timeout: float | None = None) -> socket.socket:
    """A raw connection to the server, for what httpx does not do (crawl, leave a body open);
    timeout: its sockets', if not the client's patience."""
    url = client.base_url
    timeout = patience(client) if timeout is None else timeout
    return socket.create_connection((url.host, url.port or 80), timeout=timeout)


def patience(client: httpx.Client) -> float:
    """How long a request that must be answered may take: the client's read timeout."""
    return client.timeout.read or REQUEST_S


def raw_head(client: httpx.Client, length: int | None) -> bytes:
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


def read_answer(sock: socket.socket) -> httpx.Response:
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


def chat_body(prompt: str, **fields: Any) -> dict[str, Any]:
    """A greedy chat request's body: `prompt` as the user's one message, with `fields`."""
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0, **fields}


def events(r: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, as they come."""
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])
