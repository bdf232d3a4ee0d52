"""How an HTTP route waits on a queued `Job`, whichever API it speaks: a request body read as
JSON within the size limit, a job's events followed to its end, and its whole answer awaited
while the client is watched (a client that hangs up cancels its job, which releases its caches
at once). It formats nothing and queues nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from specwise.request import GenerationResult
from specwise.server.protocol import ApiError
from specwise.server.scheduler import Job, Scheduler

__all__ = ["Ended", "client_gone", "ended", "events", "read_json"]


async def read_json(request: Request, limit: int) -> Any:
    """The request's body as JSON. Reads no more than `limit` + 1 bytes, whatever the body's
    length (a chunked body has none): 413 past the limit. Anything else that is not JSON is a
    400: bad syntax, bytes that are not UTF-8, an integer of more digits than Python converts,
    nesting deeper than the parser recurses (the last two are not `JSONDecodeError`s)."""
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise ApiError(413, f"the request body is over the {limit}-byte limit")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, digits
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None


async def client_gone(request: Request) -> None:
    """Return once the client has hung up: after the body, the ASGI receive channel has only
    `http.disconnect` left to say. (`Request.is_disconnected` never sees it here: under the
    app's `guard` middleware, Starlette's BaseHTTPMiddleware, its instant check loses the
    message.)"""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def events(job: Job) -> AsyncIterator[tuple[str, Any]]:
    """A job's events, ("text", (text, tokens so far)) ..., up to and with its last: ("done",
    GenerationResult) or ("error", (status, message)). The caller cancels the job when it
    stops early (`Scheduler.cancel`, in its `finally`)."""
    while True:
        kind, payload = await job.events.get()
        yield kind, payload
        if kind in ("done", "error"):
            return


@dataclass(frozen=True)
class Ended:
    """A job's whole answer: its text and result, or the error it failed with."""

    text: str
    result: GenerationResult | None  # None: it failed (status, message)
    status: int = 200
    message: str = ""


async def ended(request: Request, sched: Scheduler, job: Job) -> Ended | None:
    """Wait for the job's end while watching its client; None when the client left first (the
    job is cancelled: its caches are released now)."""
    parts: list[str] = []
    gone = asyncio.ensure_future(client_gone(request))
    try:
        while True:
            event = asyncio.ensure_future(job.events.get())
            await asyncio.wait((event, gone), return_when=asyncio.FIRST_COMPLETED)
            if not event.done():  # the client left: release the request's caches now
                event.cancel()
                sched.cancel(job)
                return None
            kind, payload = event.result()
            if kind == "text":
                parts.append(payload[0])
            elif kind == "error":
                return Ended("".join(parts), None, *payload)
            elif kind == "done":
                return Ended("".join(parts), payload)
    finally:
        gone.cancel()
