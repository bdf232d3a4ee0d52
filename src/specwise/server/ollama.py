"""Ollama's API beside OpenAI's: /api/chat and /api/generate (streamed as NDJSON unless
"stream": false, as Ollama does), /api/tags, /api/ps, /api/show and /api/version, so that an
Ollama client connects unchanged (`specwise serve --ollama-port 11434`, or the main port).

A translation only. An Ollama body becomes the OpenAI body `protocol.parse` validates — the
sampling options `options.temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop` and
`num_predict` become its fields — and goes in by the server's one way in (`queue`: the limits,
the prompt's tokens, the scheduler); the answer comes back in Ollama's shape, its last object
with Ollama's statistics (`done_reason`, `total_duration`, `prompt_eval_count`,
`prompt_eval_duration`, `eval_count`, `eval_duration`, durations in ns; `eval_duration` runs
from the first token to the last, the first coming with the prompt's prefill) and specwise's
figures beside them (`speculative`, as the OpenAI routes give it). An error is `{"error": "..."}`
with its status (mid-stream, an NDJSON line of that shape, as Ollama sends it), naming Ollama's
field (`options.num_predict`, not `max_tokens`).

Ollama's defaults where a request names none: temperature 0.8, top_k 40, top_p 0.9, and no
length limit (`num_predict` -1: until the model stops or the context is full; the server's
`--max-new-tokens` still holds). /api/generate renders its prompt (and `system`) with the
model's chat template, as Ollama does, unless `raw` (or the model has no template). A request
with no prompt (no messages) loads the model, which is always loaded: `done_reason` "load", or
"unload" with `keep_alive` 0. Options that change nothing here (`num_ctx`, `num_thread`,
`num_gpu`, `use_mmap`, `keep_alive`, ...) are accepted; those that would change the answer and
are not implemented (a repeat penalty, mirostat, `format`, `tools`, `images`, `think`, `suffix`,
`context`, ...) are refused by name. This module holds no model and no queue.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from specwise.engine import Engine
from specwise.server import jobs, protocol
from specwise.server.protocol import ApiError, ParsedRequest
from specwise.server.scheduler import Job, Scheduler

__all__ = ["PREFIX", "Served", "add_routes", "error_body", "speaks"]

PREFIX = "/api/"
VERSION = "0.12.0"  # the Ollama release whose API this answers as (clients check it)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}  # Ollama's
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "stop")  # options under OpenAI's names
NAMES = {  # OpenAI's field -> Ollama's, for the messages of errors
    **{f: f"options.{f}" for f in (*SAMPLING, "seed")},
    "max_tokens": "options.num_predict",
}
NEUTRAL = {  # options this server does not implement, and the value at which they do nothing
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "mirostat": 0,
    "typical_p": 1.0,
    "tfs_z": 1.0,
}
UNSUPPORTED = {  # top-level fields that would change the answer -> what they are
    "format": "a JSON answer",
    "tools": "function calling",
    "images": "images",
    "think": "thinking",
    "logprobs": "log-probabilities",
    "suffix": "insertion",
    "template": "a template of the request's own",
    "context": "an earlier answer's tokens (send the conversation to /api/chat instead)",
}
_ZERO = re.compile(r"^0+(\.0+)?(ns|us|µs|ms|s|m|h)?$")  # a keep_alive of zero: unload


def speaks(path: str) -> bool:
    """Whether a request path is one of Ollama's (its errors take Ollama's shape)."""
    return path.startswith(PREFIX)


def error_body(message: str) -> dict[str, str]:
    return {"error": message}


@dataclass(frozen=True)
class Served:
    """What the Ollama routes use of the server: its engine and model name, its scheduler,
    its one way in (`queue(body, parsed, tenant)` -> (request, Job)) and its body reader."""

    engine: Engine
    model_name: str
    scheduler: Callable[[], Scheduler]
    queue: Callable[..., tuple[ParsedRequest, Job]]
    read_json: Callable[[Request], Awaitable[Any]]


def add_routes(app: FastAPI, served: Served) -> None:
    model = _Model.of(served)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root() -> Response:  # Ollama's clients check that the server is up here
        return PlainTextResponse("specwise is running: Ollama's API at /api, OpenAI's at /v1")

    @app.get("/api/version")
    async def version() -> dict:
        return {"version": VERSION}

    @app.get("/api/tags")
    async def tags() -> dict:
        return {"models": [model.entry()]}

    @app.get("/api/ps")
    async def ps() -> dict:
        ctx = served.engine.target.context_length
        entry = {**model.entry(), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0}
        return {"models": [{**entry, "context_length": ctx}]}

    @app.post("/api/show")
    async def show(request: Request) -> Response:
        try:
            body = await served.read_json(request)
            if not isinstance(body, dict):
                raise ApiError(400, 'the request body must be a JSON object {"model": ...}')
            model.check(body.get("model") or body.get("name"))
        except ApiError as exc:
            return _error(exc)
        return JSONResponse(model.show(served.engine))

    @app.post("/api/chat")
    async def chat(request: Request) -> Response:
        return await _answer(request, served, model, "chat")

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        return await _answer(request, served, model, "generate")

    @app.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"])
    async def other(rest: str) -> Response:
        return _error(
            ApiError(
                404,
                f"/api/{rest} is not served here: specwise serves one model, with /api/chat, "
                f"/api/generate, /api/tags, /api/ps, /api/show and /api/version",
            )
        )


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message), status_code=exc.status, headers=exc.headers)


# -- the served model, as Ollama describes one ---------------------------------------------------
@dataclass(frozen=True)
class _Model:
    name: str  # as Ollama names models: NAME:TAG
    names: list[str]  # what a request may call it (the first: what a request naming none gets)
    path: Path
    header: Any  # its GgufHeader, None where it is not a GGUF file (a Hugging Face folder)

    @classmethod
    def of(cls, served: Served) -> _Model:
        from specwise.gguf_header import HeaderError, read_header

        name = served.model_name
        tagged = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
        path = Path(served.engine.target.info.model)
        try:
            header = read_header(path) if path.is_file() else None
        except HeaderError:
            header = None
        return cls(tagged, list(dict.fromkeys([tagged, name])), path, header)

    def check(self, asked: Any) -> None:
        if asked is not None and not isinstance(asked, str):
            raise ApiError(400, f"'model' must be a string, got {type(asked).__name__}")
        if asked and asked not in self.names:
            raise ApiError(404, f"model {asked!r} not found; this server serves {self.name!r}")

    def details(self) -> dict[str, Any]:
        h = self.header
        return {
            "parent_model": "",
            "format": "gguf" if h else ("safetensors" if self.path.is_dir() else ""),
            "family": h.architecture if h else "",
            "families": [h.architecture] if h else [],
            "parameter_size": h.parameter_size if h else "",
            "quantization_level": h.file_type if h else "",
        }

    def entry(self) -> dict[str, Any]:
        """The model as /api/tags lists one. Its digest: the blob's name for a file of
        Ollama's store (its sha256), else a hash of the file's path, size and time (an
        identity, not its content's hash, which would read the whole file)."""
        size, mtime = self._stat()
        digest = self.path.name.removeprefix("sha256-")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            digest = hashlib.sha256(f"{self.path}:{size}:{mtime}".encode()).hexdigest()
        return {
            "name": self.name,
            "model": self.name,
            "modified_at": _time(mtime),
            "size": size,
            "digest": digest,
            "details": self.details(),
        }

    def _stat(self) -> tuple[int, float | None]:
        """(bytes, modification time) of the model's file (a folder: 0 bytes; no file: now)."""
        try:
            stat = self.path.stat()
        except OSError:
            return 0, None
        return (stat.st_size if self.path.is_file() else 0), stat.st_mtime

    def show(self, engine: Engine) -> dict[str, Any]:
        meta = dict(self.header.metadata) if self.header else {}
        if self.header:
            meta["general.parameter_count"] = self.header.parameters
        template = meta.get("tokenizer.chat_template") or ""
        return {
            "license": "",
            "modelfile": f"# served by specwise\nFROM {self.path}\n",
            "parameters": "",
            "template": template,
            "details": self.details(),
            "model_info": meta,
            "capabilities": ["completion"],
            "modified_at": _time(self._stat()[1]),
            "specwise": {
                "backend": engine.target.info.backend,
                "k": engine.k,
                "drafters": [d.name for d in engine.drafters],
                "exact": engine.target.exact,
            },
        }


def _time(seconds: float | None = None) -> str:
    """A time as Ollama writes one: RFC 3339 in UTC, to the microsecond."""
    t = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- requests: Ollama's body -> OpenAI's -----------------------------------------------------------
def _translate(body: Any, endpoint: str, templated: bool) -> tuple[dict, bool, bool]:
    """(the OpenAI body, chat: whether it goes as a chat, named: whether num_predict named a
    length) of an /api/chat or /api/generate body; ApiError naming Ollama's field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for field, what in UNSUPPORTED.items():
        if body.get(field) not in (None, False, "", [], {}):
            raise ApiError(400, f"'{field}' ({what}) is not supported by this server")
    keep = body.get("keep_alive")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, str | int | float)):
        raise ApiError(400, "'keep_alive' must be a duration such as '5m' or '-1', or seconds")
    stream = True if body.get("stream") is None else body["stream"]  # unless told not to
    oa: dict[str, Any] = {"model": body.get("model"), "stream": stream}
    if "speculative" in body:  # specwise's own, as on the OpenAI routes
        oa["speculative"] = body["speculative"]
    sampling, named = _options(body.get("options"))
    oa.update(sampling)
    if endpoint == "chat":
        messages = body.get("messages")
        for i, m in enumerate(messages if isinstance(messages, list) else []):
            for field in ("images", "tool_calls"):
                if isinstance(m, dict) and m.get(field):
                    raise ApiError(400, f"messages[{i}].{field} is not supported by this server")
        return {**oa, "messages": messages}, True, named
    prompt, system = body.get("prompt"), body.get("system")
    for field, v in (("prompt", prompt), ("system", system)):
        if v is not None and not isinstance(v, str):
            raise ApiError(400, f"'{field}' must be a string, got {type(v).__name__}")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise ApiError(400, "'raw' must be true or false")
    if raw or not templated:  # as it is (with the system text before it, untemplated)
        text = f"{system}\n\n{prompt}" if system and not raw else prompt
        return {**oa, "prompt": text}, False, named
    turns = [{"role": "system", "content": system}] if system else []
    return {**oa, "messages": [*turns, {"role": "user", "content": prompt}]}, True, named


def _options(options: Any) -> tuple[dict[str, Any], bool]:
    """OpenAI's sampling fields from Ollama's options (its defaults where they name none), and
    whether num_predict named a length."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object, e.g. {\"temperature\": 0}")
    for name, neutral in NEUTRAL.items():
        v = options.get(name)
        if v is not None and v != neutral:
            raise ApiError(
                400,
                f"'options.{name}' = {v!r} is not supported by this server (only {neutral!r}, "
                f"which changes nothing)",
            )
    out = {f: DEFAULTS.get(f) if options.get(f) is None else options[f] for f in SAMPLING}
    seed = options.get("seed")
    if not (isinstance(seed, int) and not isinstance(seed, bool) and seed < 0):  # < 0: random
        out["seed"] = seed
    n = options.get("num_predict")
    if n is None or n in (-1, -2):  # -1: no limit, -2: fill the context
        return out, False
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ApiError(
            400,
            f"'options.num_predict' = {n!r} is invalid; use tokens >= 1, or -1 (until the model "
            f"stops or the context is full)",
        )
    return {**out, "max_tokens": n}, True


def _renamed(exc: ApiError) -> ApiError:
    """The error with OpenAI's field names in its message put as Ollama names them."""
    message = exc.message
    for ours, theirs in NAMES.items():
        message = message.replace(f"'{ours}'", f"'{theirs}'")
        message = message.replace(f"SamplingParams.{ours} ", f"'{theirs}' ")
    param = NAMES.get(exc.param or "", exc.param)
    return ApiError(exc.status, message, param, exc.kind, exc.code, exc.headers)


# -- answers ---------------------------------------------------------------------------------------
async def _answer(request: Request, served: Served, model: _Model, endpoint: str) -> Response:
    engine = served.engine
    templated = bool(getattr(engine.target.tokenizer, "chat_template", True))
    try:
        body = await served.read_json(request)
        oa, chat, named = _translate(body, endpoint, templated)
        model.check(oa["model"])
        if not body.get("messages" if endpoint == "chat" else "prompt"):  # nothing to answer
            unload = body.get("keep_alive") == 0 or _ZERO.match(str(body.get("keep_alive")))
            return JSONResponse(
                {
                    **_part(endpoint, oa["model"] or model.name, ""),
                    "done": True,
                    "done_reason": "unload" if unload else "load",
                }
            )
        oa["model"] = oa["model"] or model.name
        req = protocol.parse(oa, chat, model.names)
        if not named:  # Ollama's default: no limit but the context (and the server's own)
            params = dataclasses.replace(req.params, max_tokens=engine.target.context_length)
            req = dataclasses.replace(req, params=params)
        req, job = served.queue(oa, req, request.state.tenant)
    except ApiError as exc:
        return _error(_renamed(exc))
    except ClientDisconnect:  # it left before its body was in
        return Response(status_code=499)
    n_prompt = len(job.prompt)
    if req.stream:
        return StreamingResponse(
            _lines(served.scheduler(), job, endpoint, req.model, n_prompt),
            media_type="application/x-ndjson",
        )
    end = await jobs.ended(request, served.scheduler(), job)
    if end is None:
        return Response(status_code=499)
    if end.result is None:
        return _error(ApiError(end.status, end.message))
    return JSONResponse(_last(endpoint, req.model, end.text, end.result, n_prompt))


def _part(endpoint: str, model: str, text: str) -> dict[str, Any]:
    """One object of an answer: its text (a piece of it, streamed), not done."""
    out: dict[str, Any] = {"model": model, "created_at": _time()}
    if endpoint == "chat":
        out["message"] = {"role": "assistant", "content": text}
    else:
        out["response"] = text
    return {**out, "done": False}


def _last(endpoint: str, model: str, text: str, result, n_prompt: int) -> dict[str, Any]:
    """The answer's last object: done, why, Ollama's statistics and specwise's figures."""
    s = result.summary
    ns = 1_000_000  # per ms
    after_first = s.total_ms - (s.ttft_ms if s.ttft_ms is not None else s.total_ms)
    return {
        **_part(endpoint, model, text),
        "done": True,
        "done_reason": result.finish_reason,
        "total_duration": round(s.total_ms * ns),
        "load_duration": 0,
        "prompt_eval_count": n_prompt,
        "prompt_eval_duration": round(s.prefill_ms * ns),
        "eval_count": s.emitted,
        "eval_duration": max(1, round(after_first * ns)),
        "speculative": protocol.speculative_stats(s),
    }


async def _lines(
    sched: Scheduler, job: Job, endpoint: str, model: str, n_prompt: int
) -> AsyncIterator[bytes]:
    """NDJSON: an object per text event, then the last one (or an error line)."""

    def line(obj: dict) -> bytes:
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode()

    try:
        async for kind, payload in jobs.events(job):
            if kind == "text":
                yield line(_part(endpoint, model, payload[0]))
            elif kind == "error":
                yield line(error_body(payload[1]))
            elif kind == "done":
                yield line(_last(endpoint, model, "", payload, n_prompt))
    finally:
        sched.cancel(job)  # a client that left mid-stream: release its caches now
