"""The trace inspector's HTTP side: the page at `/ui` (static files shipped in the package:
`ui/index.html`, `inspector.js`, `inspector.css`; no build step, no CDN) and its data under
`/ui/api` (the contract: docs/INSPECTOR.md).

The data comes from a source: `Live` (a running server's requests, through its scheduler) or a
saved trace or bench run (`saved`). With `Live`, the page can also start requests of its own
(sessions): each one is inspected (every round's detail recorded) and may start paused, then
run one round per `step`, with the drafter, k or sampling parameters given for that step.

The page itself holds no data and is served to anyone who can reach the server; every data
endpoint obeys the server's API keys (the `guard` middleware of `app`), and a tenant sees only
its own requests and sessions.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

from specwise.detok import pieces
from specwise.engine import Engine
from specwise.sampling import SamplingParams
from specwise.server.protocol import ApiError
from specwise.server.scheduler import Job, Scheduler
from specwise.server.views import request_row, request_view, round_view

__all__ = ["Live", "add_routes"]

UI = Path(__file__).with_name("ui")
STATIC = {"inspector.js": "text/javascript", "inspector.css": "text/css"}
LIVE_EVERY_S = 0.5  # seconds between two updates of the live list
UNWATCHED_S = 60.0  # a session whose events nobody reads within this is cancelled
PAUSED_IDLE_S = 600.0  # a paused session with no step for this long is cancelled
STEP_FIELDS = ("temperature", "top_k", "top_p", "min_p")


def _text(obj: Any) -> str:
    """JSON with NaN and infinities as null (the page's JSON.parse takes nothing else); the
    walk that replaces them runs only when there are some."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_clean(obj), separators=(",", ":"))


def _sse(obj: dict) -> bytes:
    return f"data: {_text(obj)}\n\n".encode()


def _json(obj: Any) -> Response:
    return Response(_text(obj), media_type="application/json")


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


class Live:
    """A running server's requests, as the inspector shows them. `start(body, tenant, ...)`
    `start(body, chat, tenant, job_id, **how)` turns an OpenAI-style body into a queued `Job`
    exactly as the API does (raising `ApiError`), and `read_json` reads a body as the API does
    (within its size limit); the scheduler is looked up when needed (it lives as long as the
    app)."""

    def __init__(
        self,
        engine: Engine,
        model: str,
        scheduler: Callable[[], Scheduler],
        start: Callable[..., tuple[Any, Job]],
        max_paused: int,
        read_json: Callable[[Request], Awaitable[Any]],
    ) -> None:
        self.engine, self.model = engine, model
        self.scheduler, self.start, self.max_paused = scheduler, start, max_paused
        self.read_json = read_json
        self.sessions: dict[str, Job] = {}

    def info(self) -> dict[str, Any]:
        return {
            "mode": "live",
            "model": self.model,
            "drafters": [d.name for d in self.engine.drafters],
            "auto": self.engine.controller is not None,
            "default_k": self.engine.k,
            "read_only": False,
            "source": None,
        }

    def _mine(self, tenant: str | None) -> list[Job]:
        return [j for j in self.scheduler().jobs() if j.tenant == tenant]

    @staticmethod
    def _state(job: Job) -> str:
        return (
            "paused"
            if job.held and job.state in ("queued", "prefilling", "running")
            else (job.state)
        )

    def rows(self, tenant: str | None, **_: str | None) -> list[dict]:
        return [
            request_row(
                j.id,
                j.label,
                self._state(j),
                [r.to_dict() for r in (list(j.req.rounds) if j.req else [])],
                "ui" if j.inspect else "api",
            )
            for j in self._mine(tenant)
        ]

    def view(self, tenant: str | None, rid: str) -> dict | None:
        job = next((j for j in self._mine(tenant) if j.id == rid), None)
        if job is None:
            return None
        req, tok = job.req, self.engine.target.tokenizer
        rounds = [r.to_dict() for r in list(req.rounds)] if req else []
        tokens = list(req.tokens) if req else []
        result = job.result
        return request_view(
            job.id,
            job.label,
            self._state(job),
            rounds,
            tokens,
            None if tok is None else pieces(tok, tokens, job.prompt),
            list(req.details) if req else [],
            prompt=None if tok is None else tok.decode(job.prompt),
            text=req.text if req else None,
            finish_reason=req.finish_reason if req else None,
            summary=None if result is None else result.summary.to_dict(),
        )

    def round(self, job: Job, index: int) -> dict:
        """Round `index` of an inspected job, as the page shows it."""
        req = job.req
        return round_view(req.rounds[index].to_dict(), None, None, req.details[index])


def add_routes(app: FastAPI, source: Any) -> None:
    """The page and its data over `source` (`Live`, or a `saved` source)."""
    live = source if isinstance(source, Live) else None

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    def tenant(request: Request) -> str | None:
        return getattr(request.state, "tenant", None)

    @app.get("/ui", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(UI / "index.html", media_type="text/html")

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> FileResponse:
        if name not in STATIC:
            raise ApiError(404, f"no such file: {name!r}")
        return FileResponse(UI / name, media_type=STATIC[name])

    @app.get("/ui/api/info")
    async def info() -> Response:
        return _json(source.info())

    @app.get("/ui/api/requests")
    async def requests(
        request: Request,
        config: str | None = None,
        category: str | None = None,
        prompt_id: str | None = None,
    ) -> Response:
        rows = source.rows(tenant(request), config=config, category=category, prompt_id=prompt_id)
        return _json({"requests": rows})

    @app.get("/ui/api/requests/{rid:path}")
    async def one(request: Request, rid: str) -> Response:
        view = source.view(tenant(request), rid)
        if view is None:
            raise ApiError(404, f"no request {rid!r} here (or it is not yours)")
        return _json(view)

    if hasattr(source, "bench"):
        _bench_routes(app, source)
    if live is not None:
        _live_routes(app, live, tenant)


def _bench_routes(app: FastAPI, source: Any) -> None:
    @app.get("/ui/api/bench")
    async def bench() -> Response:
        return _json(source.bench())

    @app.get("/ui/api/bench/plots/{name}")
    async def plot(name: str) -> FileResponse:
        path = source.plot(name)
        if path is None:
            raise ApiError(404, f"no plot named {name!r} in this run")
        return FileResponse(path, media_type="image/png")

    @app.get("/ui/api/compare")
    async def compare(a: str, b: str) -> Response:
        out = source.compare(a, b)
        if out is None:
            raise ApiError(404, f"no request {a!r} or {b!r} in this run")
        return _json(out)


def _live_routes(app: FastAPI, live: Live, tenant: Callable[[Request], str | None]) -> None:
    def session(request: Request, sid: str) -> Job:
        job = live.sessions.get(sid)
        if job is None or job.tenant != tenant(request):
            raise ApiError(404, f"no session {sid!r} (it ended, or it is not yours)")
        return job

    @app.get("/ui/api/live")
    async def updates(request: Request) -> StreamingResponse:
        who = tenant(request)

        async def stream() -> AsyncIterator[bytes]:
            while True:
                yield _sse({"requests": live.rows(who)})
                await asyncio.sleep(LIVE_EVERY_S)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/ui/api/sessions")
    async def create(request: Request) -> Response:
        body = await _body(live, request)
        paused = body.get("paused", False)
        if not isinstance(paused, bool):
            raise ApiError(400, "'paused' must be true or false", "paused")
        sched = live.scheduler()
        held = sum(1 for j in sched.jobs() if j.paused and j.state in _ACTIVE)
        if paused and held >= live.max_paused:
            raise ApiError(
                429,
                f"{held} paused sessions already hold the server's batch slots (at most "
                f"{live.max_paused}); finish or cancel one first",
                kind="rate_limit_error",
            )
        sid = "ui-" + uuid.uuid4().hex[:16]
        chat, oa = _openai_body(body)
        _, job = live.start(oa, chat, tenant(request), sid, inspect=True, paused=paused)
        live.sessions[sid] = job
        asyncio.get_running_loop().call_later(UNWATCHED_S, _drop_unwatched, live, sid)
        return _json({"id": sid})

    @app.get("/ui/api/sessions/{sid}/events")
    async def events(request: Request, sid: str) -> StreamingResponse:
        job = session(request, sid)
        if job.watched:
            raise ApiError(409, f"session {sid!r} already has its events stream open")
        job.watched = True

        async def stream() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        kind, payload = await asyncio.wait_for(job.events.get(), PAUSED_IDLE_S)
                    except TimeoutError:
                        if not job.held:
                            continue
                        minutes = f"{PAUSED_IDLE_S / 60:g}"
                        message = f"no step for {minutes} minutes: cancelled to free its slot"
                        yield _sse({"type": "error", "message": message})
                        return
                    if kind == "round":
                        yield _sse({"type": "round", "round": live.round(job, payload)})
                    elif kind == "done":
                        yield _sse(
                            {
                                "type": "done",
                                "text": payload.text,
                                "finish_reason": payload.finish_reason,
                                "summary": payload.summary.to_dict(),
                            }
                        )
                        return
                    elif kind == "error":
                        yield _sse({"type": "error", "message": payload[1]})
                        return
            finally:  # ended, or the page went away: release the session's caches
                live.scheduler().cancel(job)
                live.sessions.pop(sid, None)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/ui/api/sessions/{sid}/step")
    async def step(request: Request, sid: str) -> Response:
        job = session(request, sid)
        settings = _step_settings(live.engine, job, await _body(live, request))
        live.scheduler().grant(job, settings)
        return _json({"ok": True})

    @app.post("/ui/api/sessions/{sid}/run")
    async def run(request: Request, sid: str) -> Response:
        live.scheduler().resume(session(request, sid))
        return _json({"ok": True})

    @app.delete("/ui/api/sessions/{sid}")
    async def cancel(request: Request, sid: str) -> Response:
        live.scheduler().cancel(session(request, sid))
        live.sessions.pop(sid, None)
        return _json({"ok": True})


_ACTIVE = ("queued", "prefilling", "running")


def _drop_unwatched(live: Live, sid: str) -> None:
    job = live.sessions.get(sid)
    if job is not None and not job.watched:
        live.scheduler().cancel(job)
        live.sessions.pop(sid, None)


async def _body(live: Live, request: Request) -> dict:
    """A request body as a JSON object (an empty body: {})."""
    body = await live.read_json(request) if request.headers.get("content-length") != "0" else {}
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _openai_body(body: dict) -> tuple[bool, dict]:
    """The page's session form as (chat, the OpenAI-style body the API parses), so that a
    session decodes exactly as the same request sent to /v1 would."""
    chat = body.get("chat", False)
    if not isinstance(chat, bool):
        raise ApiError(400, "'chat' must be true or false", "chat")
    prompt = body.get("prompt")
    out: dict[str, Any] = {
        k: body[k] for k in ("max_tokens", "seed", *STEP_FIELDS) if body.get(k) is not None
    }
    if chat:
        out["messages"] = [{"role": "user", "content": prompt}]
    else:
        out["prompt"] = prompt
    spec = {k: body[k] for k in ("k", "drafter", "acceptance") if body.get(k) not in (None, "")}
    if spec:
        out["speculative"] = spec
    return chat, out


def _step_settings(engine: Engine, job: Job, body: dict) -> dict[str, Any]:
    """A step's settings, checked: k and drafter as a request may override them, sampling
    parameters as `SamplingParams` validates them (the request's own seed, stops and limits
    stay)."""
    out: dict[str, Any] = {}
    k, drafter = body.get("k"), body.get("drafter")
    if drafter == "":
        drafter = None
    try:
        engine.check_override(k, drafter)
    except ValueError as exc:
        raise ApiError(400, str(exc), "drafter" if "drafter" in str(exc) else "k") from None
    if "k" in body:
        out["k"] = k
    if "drafter" in body:
        out["drafter"] = drafter
    changes = {f: body[f] for f in STEP_FIELDS if body.get(f) is not None}
    if changes:
        base: SamplingParams = job.req.params if job.req else job.params
        try:
            out["params"] = replace(base, **changes)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, str(exc)) from None
    return out
