"""`Engine`: the round loop over a batch of sequences, streaming, and stop conditions.

One round (`Engine.step`) for every running request:

1. propose — the drafter proposes up to k tokens (k = 0, or no drafter: plain decoding);
2. score   — ONE target forward over the batch: each request's last emitted token + its draft;
3. verify  — the acceptance rule keeps a prefix of the draft and emits one more token;
4. commit  — roll the target cache back to the committed tokens, tell the drafter, and cut
             the emission at EOS, a stop string or max_tokens;
5. record  — one RoundTrace per request.

Cache invariant: between rounds the target cache holds every committed token except the last
emitted one, which is the next round's first input. k = 0 draws exactly the random numbers of
plain decoding (one categorical per token), so a seed reproduces plain decoding. The engine
does not pick k itself when a controller is given, and knows no backend or drafter by type.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specwise.backends.base import LM
from specwise.detok import Detokenizer
from specwise.drafters.base import Draft, Drafter
from specwise.sampling import LazyRows, Sampler, SamplingParams
from specwise.trace import JsonlSink, RequestSummary, RoundTrace, summarize
from specwise.verify import Verdict, greedy_match, rejection_sample

__all__ = ["Engine", "GenerationResult", "Request"]

log = logging.getLogger(__name__)
_ms = 1000.0


@dataclass
class Request:
    """One sequence being generated; the engine owns and mutates it."""

    id: str
    seq: int
    params: SamplingParams
    sampler: Sampler
    arrival: float  # time.perf_counter() when the request arrived
    context: list[int]  # prompt, then every emitted token
    n_prompt: int
    detok: Detokenizer | None
    rounds: list[RoundTrace] = field(default_factory=list)
    prefill_ms: float = 0.0
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    drafter_error: str | None = None  # set when the drafter failed; the request went on plain
    ended: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.context[self.n_prompt :]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str | None:
        return None if self.detok is None else self.detok.text


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    tokens: list[int]  # emitted ids, prompt excluded (EOS / stop-completing token included)
    text: str | None  # decoded, without special tokens, cut before a stop string
    finish_reason: str
    rounds: list[RoundTrace]
    summary: RequestSummary


class Engine:
    """Engine(target, drafter=None, k=4): speculative decoding over one target LM."""

    def __init__(
        self,
        target: LM,
        drafter: Drafter | None = None,
        k: int = 4,
        *,
        trace: JsonlSink | None = None,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k = {k!r} is invalid; it must be an integer >= 0 (0: plain)")
        self.target = target
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        self.trace = trace
        if drafter is not None:
            drafter.bind(target)
        self._seq_ids = itertools.count()

    # -- requests ----------------------------------------------------------------------------
    def start(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        arrival: float | None = None,
    ) -> Request:
        """Validate a request, prefill the target (and drafter), and return it ready to step."""
        arrival = time.perf_counter() if arrival is None else arrival
        prompt = [int(t) for t in prompt]
        ctx = self.target.context_length
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token")
        if len(prompt) >= ctx:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the target's context holds {ctx} "
                f"(leave room for at least one new token)"
            )
        bad = next((t for t in prompt if not 0 <= t < self.target.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"prompt token id {bad} is out of range; valid ids are 0 .. "
                f"{self.target.vocab_size - 1}"
            )
        tok = self.target.tokenizer
        if params.stop and tok is None:
            raise ValueError("stop strings need a tokenizer, and this target has none")
        seq = next(self._seq_ids)
        req = Request(
            id=request_id or f"req-{seq}",
            seq=seq,
            params=params,
            sampler=Sampler(params.seed),
            arrival=arrival,
            context=prompt,
            n_prompt=len(prompt),
            detok=None if tok is None else Detokenizer(tok, params.stop, prompt[-4:]),
        )
        t0 = time.perf_counter()
        try:
            if len(prompt) > 1:
                self.target.forward([(seq, prompt[:-1])], last_only=True)
            if self.drafter is not None and self.k > 0:
                self._drafter_call(req, self.drafter.begin, seq, prompt)
        except BaseException:
            self.target.release(seq)
            raise
        req.prefill_ms = (time.perf_counter() - t0) * _ms
        return req

    def finish(self, req: Request) -> GenerationResult:
        """Release the request's caches and summarise it (also for a cancelled request)."""
        if req.ended is None:
            req.ended = time.perf_counter()
            self.target.release(req.seq)
            if self.drafter is not None:
                self.drafter.end(req.seq)
        if req.finish_reason is None:
            req.finish_reason = "cancelled"
        total_ms = (req.ended - req.arrival) * _ms
        summary = summarize(req.rounds, total_ms=total_ms, prefill_ms=req.prefill_ms)
        if req.detok is not None:
            req.detok.take(final=True)
        return GenerationResult(
            request_id=req.id,
            tokens=req.tokens,
            text=req.text,
            finish_reason=req.finish_reason,
            rounds=list(req.rounds),
            summary=summary,
        )

    def generate(self, prompt: Sequence[int], params: SamplingParams) -> GenerationResult:
        req = self.start(prompt, params)
        try:
            while not req.done:
                self.step([req])
        finally:
            result = self.finish(req)
        return result

    def stream(self, prompt: Sequence[int], params: SamplingParams) -> Iterator[list[int]]:
        """Yield the token ids emitted by each round, as the rounds complete."""
        req = self.start(prompt, params)
        try:
            while not req.done:
                n = len(req.context)
                self.step([req])
                if len(req.context) > n:
                    yield req.context[n:]
        finally:
            self.finish(req)

    # -- the round ---------------------------------------------------------------------------
    def _k_for(self, req: Request) -> int:
        """The proposal length this round: never past max_tokens or the context."""
        room_out = req.params.max_tokens - len(req.tokens) - 1
        room_ctx = self.target.context_length - len(req.context)
        if req.drafter_error is not None:
            return 0
        return max(0, min(self.k, room_out, room_ctx))

    def _drafter_call(self, req: Request, fn, *args):
        """Call the drafter; on failure, log it and go on with plain decoding for `req`."""
        try:
            return fn(*args)
        except Exception as exc:  # a drafter bug must not fail the request
            req.drafter_error = f"{type(exc).__name__}: {exc}"
            log.warning("drafter failed for %s, continuing without it: %s", req.id, exc)
            with contextlib.suppress(Exception):
                self.drafter.end(req.seq)
            return None

    def step(self, batch: Sequence[Request]) -> None:
        """One round for every unfinished request in `batch`."""
        live = [r for r in batch if not r.done]
        if not live:
            return
        t0 = time.perf_counter()

        # 1. Propose: each request's drafter proposes up to k tokens.
        drafts: list[Draft] = []
        for r in live:
            k = self._k_for(r)
            draft = None
            if k > 0:
                draft = self._drafter_call(
                    r, self.drafter.propose, r.seq, r.context, k, r.params, r.sampler
                )
            if draft is None:
                draft = Draft([], None)
            elif len(draft.tokens) > k:
                draft = Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])
            drafts.append(draft)
        t1 = time.perf_counter()

        # 2. Score: one target forward over the batch, [last emitted token] + draft each.
        logits = self.target.forward(
            [(r.seq, [r.context[-1], *d.tokens]) for r, d in zip(live, drafts, strict=True)]
        )
        t2 = time.perf_counter()

        # 3. Verify and 4. commit, request by request.
        verdicts: list[tuple[Verdict, int]] = []
        for r, d, lg in zip(live, drafts, logits, strict=True):
            verdict = self._verify(r, d, lg)  # lg: [k+1, V]
            self.target.truncate(r.seq, len(r.context) + verdict.accepted)
            if d.tokens and r.drafter_error is None:
                self._drafter_call(r, self.drafter.commit, r.seq, verdict.accepted, verdict.tokens)
            verdicts.append((verdict, self._emit(r, verdict.tokens)))
        t3 = time.perf_counter()

        # 5. Record: in a batch every request waited for the whole step.
        draft_ms, verify_ms = (t1 - t0) * _ms, (t2 - t1) * _ms
        overhead_ms = (t3 - t2) * _ms
        for r, d, (verdict, emitted) in zip(live, drafts, verdicts, strict=True):
            rt = RoundTrace(
                request_id=r.id,
                round=len(r.rounds),
                drafter=self.drafter.name if d.tokens else None,
                proposed=len(d.tokens),
                accepted=verdict.accepted,
                rejection_position=verdict.rejection_position,
                bonus=verdict.bonus,
                emitted=emitted,
                draft_ms=draft_ms,
                verify_ms=verify_ms,
                overhead_ms=overhead_ms,
                batch_size=len(live),
                t_ms=(t3 - r.arrival) * _ms,
            )
            r.rounds.append(rt)
            if self.trace is not None:
                self.trace.write(rt)

    def _verify(self, r: Request, d: Draft, logits: np.ndarray) -> Verdict:
        """logits [k+1, V] -> the acceptance rule's verdict."""
        if r.params.greedy:
            return greedy_match(d.tokens, np.argmax(logits, axis=-1))
        p = LazyRows(logits, r.params)  # [k+1, V], warped on demand
        return rejection_sample(d.tokens, d.probs, p, r.sampler)

    def _emit(self, r: Request, tokens: list[int]) -> int:
        """Append tokens until EOS, a stop string, max_tokens or a full context; return how many."""
        n = 0
        eos = self.target.eos_token_ids
        for t in tokens:
            r.context.append(t)
            n += 1
            if t in eos or (r.detok is not None and r.detok.push(t)):
                r.finish_reason = "stop"
            elif len(r.context) - r.n_prompt >= r.params.max_tokens:
                r.finish_reason = "length"
            if r.done:
                return n
        if len(r.context) > self.target.context_length:  # the next round has no room
            r.finish_reason = "length"
        return n
