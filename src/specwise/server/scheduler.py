"""`Scheduler`: continuous batching on one worker thread that owns the engine.

Each loop: admit waiting requests up to `max_batch` (a long prompt waits in the queue while a
long prompt it would be fed after is prefilling, so short requests behind it get the slots),
drop cancelled ones (their caches released at once), feed the short prompts whole
(`whole_prompt` tokens or fewer left: a short request that arrived during the last chunk starts
before the round, not after it), run ONE engine round over every running sequence (drafts for
each, one batched target forward), publish each request's new text to its asyncio queue, drop
the requests cancelled meanwhile (a chunk may take seconds on a CPU; a client that left waits
for none), admit the requests that arrived during the round, then feed the prompts, the
shortest remaining first: short ones whole, and a long one what is left of the chunk
(`prefill_chunk` tokens) once the loop's short prompts are in; a long prompt that OVERTAKES
later prompts have overtaken goes first among the long ones (no prompt waits for ever). So a
long prompt delays the running streams by at most a chunk a round, not by its whole prefill,
and a short request arriving behind it starts within a chunk, its prompt never split across
rounds. A request joins the rounds once its prompt is in. In exact mode prompts go in whole,
as plain one-request decoding feeds them (a chunk's kernels could round the cache
differently). If a batched round
fails, each request is retried alone, so only the request that fails alone is failed (a round
that raises leaves every request as it was: `Engine.step`). A paused job (the inspector's step
mode) holds its place and caches but runs only the rounds it is granted (`grant`), each with
the settings given for it; the other requests go on around it. The last `RECENT` finished jobs
are kept for the inspector. Every `save_every_s` seconds, between rounds, what the controller
learnt is saved (a few KB; the CLI saves it again at shutdown). The HTTP layer never touches
the engine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specwise.engine import Engine
from specwise.request import GenerationResult, Request
from specwise.sampling import SamplingParams
from specwise.server.metrics import Metrics

__all__ = ["Job", "QueueFull", "Scheduler"]

log = logging.getLogger(__name__)
SAVE_EVERY_S = 300.0  # default seconds between saves of the controller's learning
PREFILL_CHUNK = 16  # default tokens of a long prompt fed between two rounds (BENCHMARKS §8)
WHOLE_PROMPT = 64  # default: prompts of at most this many tokens go in whole (BENCHMARKS §8)
RECENT = 64  # finished jobs kept for the inspector's list
OVERTAKES = 2  # later, shorter long prompts a long prompt lets in before it; then it goes first
# what a cancelled job tells whoever still listens to its events (499: the client closed it)
CANCELLED = (499, "the request was cancelled before its end")


class QueueFull(Exception):
    pass


@dataclass
class Job:
    """One request on its way through the scheduler; events go to `events` on `loop`."""

    id: str
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    k: int | str | None = None
    drafter: str | None = None
    acceptance: str = "exact"  # the acceptance rule (`lossy`)
    tenant: str | None = None  # whose request (a hash of its API key); None without keys
    arrival: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    req: Request | None = None
    first_sent: bool = False
    inspect: bool = False  # record each round's detail and publish ("round", index) events
    paused: bool = False  # run only granted rounds (step mode)
    grants: int = 0  # rounds granted and not run yet
    settings: dict[str, Any] = field(default_factory=dict)  # next rounds' k, drafter, params
    state: str = "queued"  # queued, prefilling, running, done, cancelled, failed, rejected
    label: str = ""  # the prompt's start, for the inspector's lists
    watched: bool = False  # an inspector session whose events stream is open
    result: GenerationResult | None = None  # once done
    overtaken: int = 0  # long prompts that arrived after it and were in before it (OVERTAKES)

    @property
    def held(self) -> bool:
        """Paused with no round granted: it waits, holding its place."""
        return self.paused and self.grants == 0

    def emit(self, kind: str, payload: Any = None) -> None:
        """Thread-safe: ("text", (str, tokens emitted so far)), ("round", index) for an
        inspected job, ("done", GenerationResult) or ("error", (status, msg))."""
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutting down)
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        max_batch: int = 4,
        max_queue: int = 64,
        save_every_s: float = SAVE_EVERY_S,
        prefill_chunk: int | None = PREFILL_CHUNK,
        whole_prompt: int = WHOLE_PROMPT,
    ) -> None:
        if max_batch < 1 or max_queue < 0:
            raise ValueError(
                f"max_batch = {max_batch} must be >= 1 and max_queue = {max_queue} >= 0"
            )
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk = {prefill_chunk} must be >= 1 (or None: whole)")
        if whole_prompt < 0:
            raise ValueError(f"whole_prompt = {whole_prompt} must be >= 0")
        self.engine, self.metrics = engine, metrics
        self.max_batch, self.max_queue = max_batch, max_queue
        self.prefill_chunk = None if engine.target.exact else prefill_chunk
        self.whole_prompt = whole_prompt
        self.save_every_s = save_every_s
        self._saved = time.monotonic()
        self._pending: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._prefilling: list[Job] = []
        self.recent: collections.deque[Job] = collections.deque(maxlen=RECENT)
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="specwise-scheduler", daemon=True)
        self._thread.start()

    # -- called from the event loop ----------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cond:
            if len(self._pending) >= self.max_queue:
                raise QueueFull
            self._pending.append(job)
            self.metrics.queue_depth.set(len(self._pending))
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    def grant(self, job: Job, settings: dict[str, Any] | None = None) -> None:
        """Run one more round of a paused job, with `settings` (k, drafter, params) from then
        on (validated by the caller)."""
        with self._cond:
            job.settings.update(settings or {})
            job.grants += 1
            self._cond.notify()

    def resume(self, job: Job) -> None:
        """Let a paused job run to its end."""
        with self._cond:
            job.paused = False
            self._cond.notify()

    def jobs(self) -> list[Job]:
        """Every job the scheduler knows now: queued, prefilling, running, then recently
        finished, newest first (a snapshot; the jobs go on changing)."""
        return [*reversed(self._live()), *reversed(self.recent)]

    def in_flight(self, tenant: str) -> int:
        """Jobs of `tenant` queued, prefilling or running now (a snapshot)."""
        return sum(1 for j in self._live() if j.tenant == tenant)

    def _live(self) -> list[Job]:
        """Running, prefilling, then queued jobs (a snapshot)."""
        return [*self._running, *self._prefilling, *self._pending]

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)

    @property
    def load(self) -> dict[str, int]:
        return {
            "running": len(self._running),
            "prefilling": len(self._prefilling),
            "queued": len(self._pending),
        }

    # -- the worker thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._ready()):
                    self._cond.wait()
                if self._stop:
                    break
            self._admit_waiting()
            self._drop_cancelled()
            budget = math.inf if self.prefill_chunk is None else self.prefill_chunk
            budget -= self._prefill(0)  # short prompts that came during the last chunk
            if any(not j.held for j in self._running):
                self._round()
                self._save_learning()
                self._drop_cancelled()  # a client that left during the round: before a chunk
                self._admit_waiting()  # one that came during the round: fed after it
            self._prefill(budget)
        for job in self._running + self._prefilling + list(self._pending):
            job.emit("error", (503, "the server is shutting down"))
            if job.req is not None:
                self.engine.finish(job.req)

    def _admit_waiting(self) -> None:
        """Admit the queued jobs `_admissible` names, dropping the queued jobs whose clients
        left."""
        with self._cond:
            self._drop_queued()
            admit = self._admissible()
            for job in admit:
                self._pending.remove(job)
            self.metrics.queue_depth.set(len(self._pending))
        for job in admit:
            self._admit(job)

    def _admissible(self) -> list[Job]:
        """The queued jobs to admit now (the caller holds the lock): in the queue's order while
        slots are free, except that a long prompt waits while a long prompt with no more tokens
        left than it has is prefilling: prompts are fed the shortest remaining first, so it
        would be fed only after that one, and meanwhile it would hold a slot that a short
        request behind it in the queue can use; unless OVERTAKES later prompts have been let
        in before it already."""
        busy = len(self._running) + len(self._prefilling)
        ahead = [_left(j) for j in self._prefilling if not j.held and not self._short(_left(j))]
        admit: list[Job] = []
        for job in self._pending:
            if busy + len(admit) >= self.max_batch:
                break
            n = len(job.prompt)
            if not self._short(n):
                if any(r <= n for r in ahead) and job.overtaken < OVERTAKES:
                    continue
                ahead.append(n)
            admit.append(job)
        return admit

    def _short(self, tokens: int) -> bool:
        """A prompt with this many tokens left goes in whole (every prompt when unchunked)."""
        return self.prefill_chunk is None or tokens <= self.whole_prompt

    def _drop_queued(self) -> None:
        """Take the queued jobs whose clients left out of the queue (the caller holds the lock)."""
        for job in [j for j in self._pending if j.cancelled]:
            self._pending.remove(job)
            job.state = "cancelled"
            job.emit("error", CANCELLED)
            self.metrics.requests.labels("cancelled").inc()

    def _drop_cancelled(self) -> None:
        """End the jobs whose clients left: admitted ones (their caches released now) and
        queued ones."""
        for job in [j for j in self._running + self._prefilling if j.cancelled]:
            self._end(job, "cancelled")
        with self._cond:
            self._drop_queued()
            self.metrics.queue_depth.set(len(self._pending))

    def _ready(self) -> bool:
        """There is work: a job to admit, to drop, or that can go on. (Paused jobs holding every
        slot, or a paused long prompt, leave a queue waiting: the loop must not spin on it.)"""
        if any(j.cancelled for j in self._pending) or self._admissible():
            return True
        return any(not j.held or j.cancelled for j in self._running + self._prefilling)

    def _save_learning(self) -> None:
        """Save the controller's learning when `save_every_s` has passed since the last save."""
        controller = self.engine.controller
        if controller is None or time.monotonic() - self._saved < self.save_every_s:
            return
        self._saved = time.monotonic()
        controller.save()

    def _admit(self, job: Job) -> None:
        try:
            job.req = self.engine.admit(
                job.prompt,
                job.params,
                request_id=job.id,
                arrival=job.arrival,
                k=job.k,
                drafter=job.drafter,
                inspect=job.inspect,
                acceptance=job.acceptance,
            )
        except ValueError as exc:
            self.metrics.requests.labels("rejected").inc()
            job.state = "rejected"
            job.emit("error", (400, str(exc)))
            return
        job.state = "prefilling"
        self._prefilling.append(job)

    def _prefill(self, budget: float) -> float:
        """Feed prefilling requests, the shortest remaining first: a short prompt goes in
        whole, a long one gets what is left of `budget` prompt tokens after the short ones; a
        long one that OVERTAKES later prompts have overtaken already goes before the other
        long ones (else a stream of shorter prompts could keep it waiting for ever). A request
        whose prompt is in starts running. Returns the tokens fed."""
        fed = 0
        order = sorted(
            self._prefilling,
            key=lambda j: (not self._short(_left(j)), j.overtaken < OVERTAKES, _left(j)),
        )
        for job in order:
            if job.held:
                continue
            n = _left(job)
            if not self._short(n):
                if budget - fed < 1:
                    break
                n = min(n, budget - fed)
            try:
                done = self.engine.prefill(job.req, n, tenant=job.tenant)
            except Exception as exc:
                log.exception("prefill failed for %s", job.id)
                self._prefilling.remove(job)
                job.state = "failed"
                self.metrics.requests.labels("failed").inc()
                job.emit("error", (500, f"the request failed: {exc}"))
                continue
            fed += n
            if done:
                self._overtook(job)
                self._prefilling.remove(job)
                self._running.append(job)
                job.state = "running"
                job.grants = max(0, job.grants - 1)  # round 0 came with the prefill
                self._publish(job)  # the first token came with the prefill
        return fed

    def _overtook(self, job: Job) -> None:
        """`job`'s prompt is in: if it is long, each long prompt that arrived before it and
        still waits (queued or prefilling) was overtaken once more."""
        if self._short(len(job.prompt)):
            return
        with self._cond:
            waiting = [*self._prefilling, *self._pending]
        for other in waiting:
            if other.arrival < job.arrival and not self._short(len(other.prompt)):
                other.overtaken += 1

    def _round(self) -> None:
        batch = [j for j in self._running if not j.held]
        for job in batch:
            self._settle(job)
        try:
            self.engine.step([j.req for j in batch])
        except Exception:
            log.exception("a batched round failed; retrying its requests one by one")
            for job in batch:
                try:
                    self.engine.step([job.req])
                except Exception as exc:
                    self._end(job, "failed", (500, f"the request failed: {exc}"))
        self.metrics.running.set(len(self._running))
        for job in batch:
            job.grants = max(0, job.grants - 1)
        stepped = [j for j in batch if j in self._running]
        if stepped and stepped[0].req.rounds:
            last = stepped[0].req.rounds[-1]
            self.metrics.observe_step(last.draft_ms, last.verify_ms)
        for job in stepped:
            self._publish(job)

    def _settle(self, job: Job) -> None:
        """Apply the settings a step gave a job for its rounds from now on."""
        with self._cond:
            settings, job.settings = job.settings, {}
        req = job.req
        if "k" in settings:
            req.k = settings["k"]
        if "drafter" in settings:
            req.only = settings["drafter"]
        if "params" in settings:
            req.params = settings["params"]

    def _publish(self, job: Job) -> None:
        req = job.req
        if job.inspect and req.rounds:
            job.emit("round", len(req.rounds) - 1)
        if req.rounds:
            rt = req.rounds[-1]
            self.metrics.observe_round(rt, first=not job.first_sent)
            if rt.emitted and not job.first_sent:
                job.first_sent = True
                self.metrics.ttft.observe(rt.t_ms / 1000.0)
        if req.detok is not None and not req.done:
            text = req.detok.take()
            if text:
                job.emit("text", (text, len(req.tokens)))
        if req.done:
            self._end(job, "ok")

    def _end(self, job: Job, status: str, error: tuple[int, str] | None = None) -> None:
        """Finish a running (or prefilling) request: release its caches, tell its client."""
        for jobs in (self._running, self._prefilling):
            if job in jobs:
                jobs.remove(job)
        result: GenerationResult = self.engine.finish(job.req)
        job.result = result
        job.state = "done" if status == "ok" else status
        self.recent.append(job)
        self.metrics.requests.labels(status).inc()
        self.metrics.running.set(len(self._running))
        if status == "cancelled":  # whoever still listens (an inspector page) hears the end
            job.emit("error", CANCELLED)
        elif error is not None:
            job.emit("error", error)
        elif status == "ok":
            tail = job.req.detok.take(final=True) if job.req.detok is not None else ""
            if tail:
                job.emit("text", (tail, len(job.req.tokens)))
            job.emit("done", result)


def _left(job: Job) -> int:
    """Prompt tokens of an admitted job not in the target's cache yet."""
    return job.req.n_prompt - job.req.prefilled
