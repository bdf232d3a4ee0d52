"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions,
/v1/chat/completions (streaming as server-sent events), /health and /metrics, the trace
inspector's page and data (/ui, /ui/api: `inspector`), and Ollama's API beside them (/api/chat,
/api/generate, /api/tags, ...: `ollama`, which translates into the same request path).

Requests are validated by `protocol`, queued on the `Scheduler` (HTTP 429 with Retry-After when
the queue is full), and streamed back as the scheduler publishes text. A client that goes away
is cancelled, which releases its caches at once. With API keys, every /v1, /api and /ui/api
route needs `Authorization: Bearer KEY` with one of them; each key is a tenant (drafters that
learn across requests keep each tenant's text apart). Bad input of any kind gets a 4xx with an
OpenAI-style error body (Ollama's on its routes); nothing reaches the client as a traceback.
/health reports the load, the sequences holding cache (0 when idle: none leaked) and the
server's limits (context, batch, queue, body bytes), by which `bench.faults` sizes its faults.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from specwise.engine import Engine, check_acceptance
from specwise.server import jobs, ollama, protocol
from specwise.server.inspector import Live, add_routes
from specwise.server.metrics import Metrics
from specwise.server.protocol import ApiError, ParsedRequest
from specwise.server.scheduler import PREFILL_CHUNK, WHOLE_PROMPT, Job, QueueFull, Scheduler
from specwise.trace import rss_mb

if TYPE_CHECKING:
    from specwise.adapt import Adapter

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _error(exc: ApiError, path: str = "") -> JSONResponse:
    """The error response: OpenAI's body, or Ollama's ({"error": ...}) on its routes."""
    body = ollama.error_body(exc.message) if ollama.speaks(path) else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def create_app(
    engine: Engine,
    model_name: str,
    *,
    max_batch: int = 4,
    max_queue: int = 64,
    api_keys: Sequence[str] = (),
    cors_origins: list[str] | None = None,
    max_body_bytes: int = 4 << 20,
    prefill_chunk: int | None = PREFILL_CHUNK,
    whole_prompt: int = WHOLE_PROMPT,
    max_prompt: int = 0,
    max_new_tokens: int = 0,
    streams_per_key: int = 0,
    adapter: Adapter | None = None,
) -> FastAPI:
    """The OpenAI-compatible app over `engine`. Limits (0: none beyond the model's context):
    `max_prompt` prompt tokens, `max_new_tokens` a request may ask for (the default of a
    request that names none is cut to it), `streams_per_key` requests of one API key queued
    or running at once (with `api_keys` only; 429 past it). `adapter`: the engine's learner
    adapting its heads (`serve --adapt`), whose training thread runs while the app does."""
    metrics = Metrics()
    state: dict[str, Scheduler] = {}

    async def lifespan(app: FastAPI):
        state["scheduler"] = Scheduler(
            engine,
            metrics,
            max_batch=max_batch,
            max_queue=max_queue,
            prefill_chunk=prefill_chunk,
            whole_prompt=whole_prompt,
        )
        if adapter is not None:
            adapter.start()
        yield
        state.pop("scheduler").close()
        if adapter is not None:
            adapter.close()

    app = FastAPI(title="specwise", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = metrics
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"], allow_headers=["*"]
        )

    @app.middleware("http")
    async def guard(request: Request, call_next):
        request.state.tenant = None
        path = request.url.path
        if path.startswith(("/v1", "/ui/api", ollama.PREFIX)) and api_keys:
            got = request.headers.get("authorization", "").encode()
            key = next(
                (k for k in api_keys if hmac.compare_digest(got, f"Bearer {k}".encode())), None
            )
            if key is None:
                return _error(
                    ApiError(
                        401,
                        "missing or wrong API key; send 'Authorization: Bearer <key>'",
                        kind="authentication_error",
                        code="invalid_api_key",
                    ),
                    path,
                )
            request.state.tenant = hashlib.sha256(key.encode()).hexdigest()[:16]
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            return _error(
                ApiError(413, f"the request body has {size} bytes; the limit is {max_body_bytes}"),
                path,
            )
        try:
            return await call_next(request)
        except Exception:
            log.exception("unhandled error on %s", path)
            error = ApiError(500, "internal error; see the server log", kind="server_error")
            return _error(error, path)

    @app.get("/health")
    async def health() -> dict:
        load = state["scheduler"].load
        status = "busy" if load["queued"] >= max_queue else "ok"  # new requests would get 429
        out = {"status": status, "model": model_name, **load}
        out["sequences"] = engine.target.in_use()  # 0 when idle: no request kept its cache
        out["limits"] = {
            "context_length": engine.target.context_length,
            "max_batch": max_batch,
            "max_queue": max_queue,
            "max_body_bytes": max_body_bytes,
            "max_prompt": max_prompt or engine.target.context_length,
            "max_new_tokens": max_new_tokens or None,
            "streams_per_key": streams_per_key or None,
        }
        out["exact"] = engine.target.exact
        out["rss_mb"] = round(rss_mb(), 1)
        for d in engine.drafters:
            if d.name == "suffix":
                out["suffix_memory_bytes"] = sum(m.nbytes for m in d.memories.values())
        if adapter is not None:
            out["adapt"] = {"scope": adapter.scope, "busy": adapter.busy(), **adapter.stats()}
        return out

    @app.get("/metrics")
    async def prometheus() -> Response:
        if adapter is not None:
            metrics.observe_adapter(adapter.stats())
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "specwise"}],
        }

    def start(
        body: Any, chat: bool, tenant: str | None, job_id: str | None = None, **how: Any
    ) -> tuple[ParsedRequest, Job]:
        """Parse, check and tokenize a request body and queue it as a Job (ApiError when it
        cannot be); `how`: the Job's inspector fields (inspect, paused)."""
        return queue(body, protocol.parse(body, chat, [model_name]), tenant, job_id, **how)

    def queue(
        body: Any, req: ParsedRequest, tenant: str | None, job_id: str | None = None, **how: Any
    ) -> tuple[ParsedRequest, Job]:
        """Check and tokenize a parsed request (of `body`, in OpenAI's fields) and queue it as
        a Job: the one way in for every API (ApiError when it cannot go in)."""
        req = _hold_max_tokens(body, req, max_new_tokens)
        if streams_per_key and tenant is not None:
            held = state["scheduler"].in_flight(tenant)
            if held >= streams_per_key:
                raise ApiError(
                    429,
                    f"this API key already has {held} of its {streams_per_key} requests at "
                    f"once queued or running (the server's limit per key); retry when one ends",
                    kind="rate_limit_error",
                    headers={"Retry-After": "1"},
                )
        try:
            engine.check_override(req.k, req.drafter)
        except ValueError as exc:
            field = "speculative.drafter" if "drafter" in str(exc) else "speculative.k"
            raise ApiError(400, str(exc), field) from None
        try:
            check_acceptance(req.acceptance, req.params)
        except ValueError as exc:
            raise ApiError(400, str(exc), "speculative.acceptance") from None
        job = Job(
            job_id or protocol.new_id(req.chat),
            _tokenize(engine, req, max_prompt),
            req.params,
            asyncio.get_running_loop(),
            k=req.k,
            drafter=req.drafter,
            acceptance=req.acceptance,
            tenant=tenant,
            label=protocol.label(req),
            **how,
        )
        try:
            state["scheduler"].submit(job)
        except QueueFull:
            raise ApiError(
                429,
                "the server is busy (queue full); retry shortly",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            ) from None
        return req, job

    async def handle(request: Request, chat: bool) -> Response:
        try:
            body = await jobs.read_json(request, max_body_bytes)
            req, job = start(body, chat, request.state.tenant)
        except ApiError as exc:
            return _error(exc)
        except ClientDisconnect:  # it left before its body was in (a slow client giving up)
            return Response(status_code=499)
        n_prompt = len(job.prompt)
        if req.stream:
            return StreamingResponse(
                _stream(state["scheduler"], job, req, n_prompt, _piece(engine)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _complete(request, state["scheduler"], job, req, n_prompt, _piece(engine))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    ollama.add_routes(
        app,
        ollama.Served(
            engine,
            model_name,
            lambda: state["scheduler"],
            queue,
            lambda request: jobs.read_json(request, max_body_bytes),
        ),
    )

    max_paused = max(1, max_batch // 2)  # paused sessions may hold at most half the slots
    add_routes(
        app,
        Live(
            engine,
            model_name,
            lambda: state["scheduler"],
            start,
            max_paused,
            lambda request: jobs.read_json(request, max_body_bytes),
        ),
    )

    return app


def _piece(engine: Engine):
    """A token id's text (the tokenizer's, special tokens left out), for log-probabilities."""
    tok = engine.target.tokenizer
    return lambda t: tok.decode([t])


def _hold_max_tokens(body: dict, req: ParsedRequest, limit: int) -> ParsedRequest:
    """The request with its `max_tokens` held to the server's `limit` (0: none): 400 when the
    client asked for more, the default cut to it when the client named none."""
    if not limit or req.params.max_tokens <= limit:
        return req
    field = next((f for f in ("max_completion_tokens", "max_tokens") if body.get(f)), None)
    if field is None:
        return dataclasses.replace(req, params=dataclasses.replace(req.params, max_tokens=limit))
    raise ApiError(
        400,
        f"'{field}' = {req.params.max_tokens} is over this server's limit of {limit} tokens",
        field,
    )


def _tokenize(engine: Engine, req: ParsedRequest, limit: int = 0) -> list[int]:
    """The request's prompt as token ids, checked here (400) so that a prompt the context
    cannot hold, or longer than the server's `limit` (0: none), is refused before a stream
    starts (the engine would fail it inside one)."""
    tok = engine.target.tokenizer
    if tok is None:
        raise ApiError(500, "the model has no tokenizer", kind="server_error")
    try:
        ids = tok.render_chat(req.messages) if req.chat else tok.encode(req.prompt)
        engine.check_prompt(ids)
        if limit and len(ids) > limit:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; this server takes prompts of at most {limit}"
            )
        return ids
    except ValueError as exc:
        raise ApiError(400, str(exc), "messages" if req.chat else "prompt") from None


async def _complete(
    request: Request, sched: Scheduler, job: Job, req: ParsedRequest, n_prompt: int, piece
) -> Response:
    end = await jobs.ended(request, sched, job)
    if end is None:
        return Response(status_code=499)
    if end.result is None:
        field = ("messages" if req.chat else "prompt") if end.status == 400 else None
        kind = "invalid_request_error" if end.status < 500 else "server_error"
        return _error(ApiError(end.status, end.message, field, kind=kind))
    logprobs = protocol.logprobs(req, end.result.logprobs or [], piece)
    return JSONResponse(
        protocol.response(
            req, job.id, end.text, end.result.finish_reason, n_prompt, end.result.summary, logprobs
        )
    )


async def _stream(
    sched: Scheduler, job: Job, req: ParsedRequest, n_prompt: int, piece
) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk per text event, carrying the log-probabilities (if asked) of
    the tokens emitted since the last chunk; the finish chunk carries the rest."""
    created = int(time.time())
    sent = {"tokens": 0, "chars": 0}  # log-probabilities sent so far, their text's length

    def logprobs(items) -> dict | None:
        out = protocol.logprobs(req, items, piece, sent["chars"])
        sent["tokens"] += len(items)
        sent["chars"] += sum(len(piece(x.token)) for x in items) if out else 0
        return out

    def sse(obj: dict) -> bytes:
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()

    def with_usage(obj: dict, completion_tokens: int) -> dict:
        if req.continuous_usage:
            obj["usage"] = protocol.usage(n_prompt, completion_tokens)
        return obj

    first = True
    try:
        async for kind, payload in jobs.events(job):
            if kind == "text":
                text, emitted = payload
                lp = logprobs(job.req.logprobs[sent["tokens"] : emitted]) if job.req else None
                obj = protocol.chunk(req, job.id, created, text, None, first, lp)
                yield sse(with_usage(obj, emitted))
                first = False
            elif kind == "error":
                status, message = payload
                yield sse(
                    protocol.error_body(
                        message, "invalid_request_error" if status < 500 else "server_error"
                    )
                )
            elif kind == "done":
                result = payload
                lp = logprobs((result.logprobs or [])[sent["tokens"] :])
                obj = protocol.chunk(req, job.id, created, None, result.finish_reason, first, lp)
                yield sse(with_usage(obj, result.summary.emitted))
                if req.include_usage:
                    yield sse(protocol.usage_chunk(req, job.id, created, n_prompt, result.summary))
        yield b"data: [DONE]\n\n"
    finally:
        sched.cancel(job)  # a client that left mid-stream: release its caches now
