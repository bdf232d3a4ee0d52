"""`Engine`: the round loop over a batch of sequences, streaming, and stop conditions.

One round (`Engine.step`) for every running request:

1. propose — the drafter proposes up to k tokens (k = 0, or no drafter: plain decoding); with
             k="auto" and several requests, the controller may then align the batch: every
             sequence brings the same number of tokens, drafts padded with filler that is fed
             (one pass on llama.cpp instead of several) but never verified;
2. score   — ONE target forward over the batch: each request's last emitted token + its draft
             (a tree draft as a tree: each token sees only its ancestors, `LM.trees`);
3. verify  — the acceptance rule keeps a prefix of the draft (a path of a tree) and emits one
             more token (the exact rules of `verify`, unless a sampled request names a lossy
             rule of `lossy`, which then flags its every round);
4. commit  — roll the target cache back to the committed tokens (keep the accepted path of a
             tree), tell the drafter, and cut the emission at EOS, a stop string or max_tokens;
5. record  — one RoundTrace per request (and a learner shown the target's hidden states).

Step 1 is `proposer.Proposer`'s (who drafts and what, the batch's alignment); the engine runs
the round around it and owns the requests: admitted, prefilled, stepped and finished.

With k="auto" a `Controller` chooses the drafter and k for each request in each round (k = 0
when plain decoding is expected to be faster) and learns from the outcome; otherwise k is fixed.

Round 0 is the prefill: the whole prompt in one forward, whose last logits give the first
token, exactly as plain decoding (and llama.cpp) does it; the drafters are prefilled after the
first token is out, so TTFT is the target's prefill alone.

Cache invariant: between rounds the target cache holds every committed token except the last
emitted one, which is the next round's first input. k = 0 draws exactly the random numbers of
plain decoding (one categorical per token), so a seed reproduces plain decoding. The engine
knows no backend or drafter by type.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from specwise.backends.base import LM, new_sequence
from specwise.controller import Controller
from specwise.detail import round_detail
from specwise.detok import Detokenizer
from specwise.drafters.base import Draft, Drafter
from specwise.lossy import EXACT, check_rule, keep_rule, lossy_sample
from specwise.proposer import CHEAP_MAX_K, Proposal, Proposer, drafter_call
from specwise.request import GenerationResult, Request
from specwise.sampling import LazyRows, Sampler, SamplingParams, token_logprobs
from specwise.trace import JsonlSink, RoundTrace, summarize
from specwise.verify import (
    Verdict,
    greedy_match,
    rejection_sample,
    tree_greedy_match,
    tree_sample_and_match,
)

__all__ = ["CHEAP_MAX_K", "Engine", "Proposal", "check_acceptance"]

log = logging.getLogger(__name__)
_ms = 1000.0


def check_acceptance(acceptance: str, params: SamplingParams) -> None:
    """Raise ValueError unless a request may use this acceptance rule with these parameters."""
    check_rule(acceptance)
    if acceptance != EXACT and params.greedy:
        raise ValueError(
            f"acceptance {acceptance!r} is for sampled requests (temperature > 0); at "
            f"temperature 0 the exact rule already keeps every draft token the target agrees with"
        )


def _rows(verdict: Verdict, n: int) -> list[int]:
    """The rows of the round's logits that the verdict's first n tokens came from: a chain's
    in order, a tree's along its kept path (row 0 is the last emitted token's)."""
    if not verdict.path:
        return list(range(n))
    return [0, *(i + 1 for i in verdict.path)][:n]


def _fed_tree(draft: Draft, fed: int) -> list[int] | None:
    """The parents of the `fed` tokens a round feeds for a tree draft (`LM.forward`'s trees):
    the last emitted token first (-1), the draft's tokens under it, then any filler as a chain
    after the draft's last token. None for a chain draft."""
    if draft.parents is None:
        return None
    n = len(draft.tokens)
    return [-1, *(q + 1 for q in draft.parents), *range(n, fed - 1)]


class Engine:
    """Engine(target, drafter=None, k=4): speculative decoding over one target LM.

    drafter: one drafter, or several for k="auto"; k: draft tokens per round (0: plain), or
    "auto" for the goodput `controller`, which k="auto" needs (`Controller.calibrated` reads
    or measures this machine's costs); learner: shown each request as it is admitted
    (`begin(req)`), the target after every round of it, to read the hidden states it learns
    from (`observe(req, target)`), and its end, also a failed prefill's (`finish(req)`):
    `specwise.adapt.Adapter`, which adapts a drafter on hidden states to the traffic and
    trains hardest while no request is in.
    Constructing an Engine touches no disk and measures nothing."""

    def __init__(
        self,
        target: LM,
        drafter: Drafter | Sequence[Drafter] | None = None,
        k: int | str = 4,
        *,
        trace: JsonlSink | None = None,
        controller: Controller | None = None,
        learner: Any = None,
    ) -> None:
        drafters = (
            []
            if drafter is None
            else [drafter]
            if not isinstance(drafter, Sequence)
            else list(drafter)
        )
        auto = k == "auto"
        if not auto and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"k = {k!r} is invalid; use an integer >= 0 (0: plain) or 'auto'")
        if not auto and len(drafters) > 1:
            raise ValueError(f"a fixed k uses one drafter, got {len(drafters)}; use k='auto'")
        if len({d.name for d in drafters}) != len(drafters):
            raise ValueError("each drafter needs its own name")
        self.target = target
        self.drafters = drafters
        self.k: int | str = k if drafters else 0
        self.trace = trace
        self.learner = learner
        for d in drafters:
            d.bind(target)
        self.controller: Controller | None = None
        if auto and drafters:
            if controller is None:
                raise ValueError(
                    "k='auto' needs a controller: pass controller=Controller.calibrated(target, "
                    "drafters) (it reads this machine's measured costs, or measures them once)"
                )
            controller.bind(target)
            self.controller = controller
        self._steps = itertools.count(1)  # numbers the steps, for the traces

    @property
    def drafter(self) -> Drafter | None:
        """The drafter of a fixed-k engine (the first one of an auto engine)."""
        return self.drafters[0] if self.drafters else None

    # -- requests ----------------------------------------------------------------------------
    def start(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        arrival: float | None = None,
        k: int | str | None = None,
        drafter: str | None = None,
        tenant: str | None = None,
        inspect: bool = False,
        acceptance: str = EXACT,
    ) -> Request:
        """Validate a request, prefill the target (and drafters), and return it ready to step:
        `admit`, then `prefill` of the whole prompt."""
        req = self.admit(
            prompt,
            params,
            request_id=request_id,
            arrival=arrival,
            k=k,
            drafter=drafter,
            inspect=inspect,
            acceptance=acceptance,
        )
        self.prefill(req, tenant=tenant)
        return req

    def admit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        arrival: float | None = None,
        k: int | str | None = None,
        drafter: str | None = None,
        inspect: bool = False,
        acceptance: str = EXACT,
    ) -> Request:
        """Validate a request and give it a sequence; nothing is fed yet (`prefill`). `k` and
        `drafter` override the engine's choice for this request only; `inspect` records each
        round's detail (`Request.details`, and the trace sink's lines); `acceptance` names the
        rule (`lossy`: a lossy one, for sampled requests only, flags every round)."""
        arrival = time.perf_counter() if arrival is None else arrival
        self.check_override(k, drafter)
        check_acceptance(acceptance, params)
        prompt = [int(t) for t in prompt]
        self.check_prompt(prompt)
        tok = self.target.tokenizer
        if params.stop and tok is None:
            raise ValueError("stop strings need a tokenizer, and this target has none")
        seq = new_sequence(self.target)
        req = Request(
            id=request_id or f"req-{seq}",
            seq=seq,
            params=params,
            sampler=Sampler(params.seed),
            arrival=arrival,
            context=list(prompt),  # grows; `prompt` stays the prompt
            n_prompt=len(prompt),
            detok=None if tok is None else Detokenizer(tok, params.stop, prompt[-4:]),
            k=k,
            only=drafter,
            inspect=inspect,
            acceptance=acceptance,
        )
        self._tell_learner("begin", req)
        return req

    def prefill(self, req: Request, budget: int | None = None, tenant: str | None = None) -> bool:
        """Feed the target the next `budget` tokens of the prompt (None: the rest); True once
        the whole prompt is in. With the last of it comes round 0: the first token, from the
        prompt's last logits exactly as plain decoding takes it, and the drafters' prefill
        (`tenant`: whose request, for drafters that learn across requests, `Drafter.begin`).
        Its forwards are the request's `prefill_ms`; the time between chunks is round 0's
        overhead. If it raises, the request's caches are released and the learner is told it
        ended."""
        if budget is not None and budget < 1:
            raise ValueError(f"a prefill budget of {budget} tokens is invalid; use >= 1")
        req.tenant = tenant
        prompt, seq, start = req.context[: req.n_prompt], req.seq, req.prefilled
        end = req.n_prompt if budget is None else min(req.n_prompt, start + budget)
        t0 = time.perf_counter()
        try:
            last = self.target.forward([(seq, prompt[start:end])], last_only=True)[0]  # [1, V]
            t1 = time.perf_counter()
            req.prefilled, req.prefill_ms = end, req.prefill_ms + (t1 - t0) * _ms
            if end < req.n_prompt:
                return False
            verdict = self._verify(req, Draft([], None), last)
            emitted = self._emit(req, verdict.tokens, last, [0])
            first = Proposal(None, Draft([], None), emitted=emitted)
            req.clock = req.arrival + req.prefill_ms / _ms  # round 0's overhead: the rest
            self._record(req, first, verdict, 0.0, 0.0, 1, logits=last)
            t2 = req.clock  # round 0's end: the drafters' prefill starts where it stops
            # With k="auto", drafters that cost a forward per token are prefilled lazily, when the
            # controller first picks them: a request that never uses one does not pay for it.
            # An inspected request begins every cheap drafter: a step may switch to any.
            k_req = self.k if req.k is None else req.k
            allowed = self._proposer.allowed(req)
            for d in self.drafters:
                eager = d in allowed and k_req != 0 and (k_req != "auto" or d.cheap)
                if (eager or (req.inspect and d.cheap)) and not req.done:
                    drafter_call(req, d, d.begin, seq, prompt, tenant)
        except BaseException:
            self.target.release(seq)
            for d in self.drafters:
                with contextlib.suppress(Exception):
                    d.end(seq)
            self._tell_learner("finish", req)  # no finish_reason: nothing to learn from
            raise
        req.clock = time.perf_counter()
        req.draft_prefill_ms = (req.clock - t2) * _ms
        return True

    def finish(self, req: Request) -> GenerationResult:
        """Release the request's caches and summarise it (also for a cancelled request)."""
        if req.ended is None:
            req.ended = time.perf_counter()
            self.target.release(req.seq)
            for d in self.drafters:
                d.end(req.seq)
            if self.controller is not None:
                self.controller.forget(req.id)
        if req.finish_reason is None:
            req.finish_reason = "cancelled"
        self._tell_learner("finish", req)
        total_ms = (req.ended - req.arrival) * _ms
        summary = summarize(
            req.rounds,
            total_ms=total_ms,
            prefill_ms=req.prefill_ms,
            draft_prefill_ms=req.draft_prefill_ms,
        )
        if req.detok is not None:
            req.detok.flush()
        return GenerationResult(
            request_id=req.id,
            tokens=req.tokens,
            text=req.text,
            finish_reason=req.finish_reason,
            rounds=list(req.rounds),
            summary=summary,
            logprobs=None if req.params.logprobs is None else list(req.logprobs),
        )

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, acceptance: str = EXACT
    ) -> GenerationResult:
        req = self.start(prompt, params, acceptance=acceptance)
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
            if req.tokens:
                yield list(req.tokens)  # round 0, from the prefill
            while not req.done:
                n = len(req.context)
                self.step([req])
                if len(req.context) > n:
                    yield req.context[n:]
        finally:
            self.finish(req)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """Raise ValueError unless the prompt can be decoded: not empty, shorter than the
        target's context (room for one new token), every id in the vocabulary. `admit` checks
        it; a server checks it before queueing, so that no answer starts for a bad prompt."""
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

    def check_override(self, k: int | str | None, drafter: str | None) -> None:
        """Raise ValueError unless this engine can honour a request's own k and drafter."""
        names = [d.name for d in self.drafters]
        if drafter is not None and drafter not in names:
            raise ValueError(
                f"speculative.drafter {drafter!r} is not available; available: "
                f"{', '.join(names) or 'none (this engine decodes plainly)'}"
            )
        if k is None:
            return
        if k == "auto":
            if self.controller is None:
                raise ValueError("speculative.k 'auto' needs an engine started with k='auto'")
        elif isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 32:
            raise ValueError(f"speculative.k = {k!r} is invalid; use an integer 0..32 or 'auto'")
        elif k > 0 and not self.drafters:
            raise ValueError("speculative.k > 0 needs a drafter, and this engine has none")

    # -- the round ---------------------------------------------------------------------------
    @property
    def _proposer(self) -> Proposer:
        """Step 1 with this engine's target, drafters, k and controller."""
        return Proposer(self.target, self.drafters, self.k, self.controller)

    def step(self, batch: Sequence[Request]) -> None:
        """One round for every unfinished request in `batch`. Atomic: if it raises, every
        request and cache is as it was before the round (`_undo`), so the round can be run
        again, a request at a time, with the same output."""
        live = [r for r in batch if not r.done]
        if not live:
            return
        rngs = [r.sampler.state() for r in live]
        try:
            t0 = time.perf_counter()
            props, width, planned = self._proposer.propose_all(live)  # 1. propose
            t1 = time.perf_counter()
            calls, logits = self._score(live, props, width)  # 2. score
            t2 = time.perf_counter()
            verdicts = [  # 3. verify
                self._verify(r, p.draft, lg) for r, p, lg in zip(live, props, logits, strict=True)
            ]
        except BaseException:  # nothing was committed yet
            for r, rng in zip(live, rngs, strict=True):
                self._undo(r, rng)
            raise
        for r, p, v, lg in zip(live, props, verdicts, logits, strict=True):  # 4. commit
            p.emitted = self._commit(r, p, v, lg)
        t3 = time.perf_counter()
        draft_ms, verify_ms = (t1 - t0) * _ms, (t2 - t1) * _ms
        self._learn(props, verdicts, calls, planned, draft_ms, verify_ms, (t3 - t2) * _ms)
        step = next(self._steps)
        for r, p, v, lg in zip(live, props, verdicts, logits, strict=True):  # 5. record
            self._record(r, p, v, draft_ms, verify_ms, len(live), step, lg)

    def _score(
        self, live: Sequence[Request], props: Sequence[Proposal], width: int
    ) -> tuple[list[tuple[int, list[int]]], list[np.ndarray]]:
        """Step 2: ONE target forward over the batch, [last emitted token] + draft each (a tree
        draft as a tree under that token), and filler up to `width` tokens where the batch was
        aligned (fed after the draft's last token, never verified: its logits are not asked
        for). Returns the calls and each request's logits [k+1, V]."""
        for p in props:
            p.padded = max(0, width - 1 - len(p.draft.tokens))
        calls = [
            (r.seq, [r.context[-1], *p.draft.tokens] + [r.context[-1]] * p.padded)
            for r, p in zip(live, props, strict=True)
        ]
        trees = [_fed_tree(p.draft, len(c)) for p, (_, c) in zip(props, calls, strict=True)]
        rows = [1 + len(p.draft.tokens) for p in props] if width else None
        return calls, self.target.forward(calls, rows=rows, trees=trees)

    def _commit(self, r: Request, p: Proposal, verdict: Verdict, logits: np.ndarray) -> int:
        """Step 4 for one request: roll the target cache back to the committed tokens, tell
        the drafter, emit (`logits`: the round's rows, for log-probabilities); returns the
        tokens emitted."""
        if p.draft.parents is None:
            self.target.truncate(r.seq, len(r.context) + verdict.accepted)
        else:
            self.target.keep(r.seq, [0, *(i + 1 for i in verdict.path)])
        if p.drafter is not None:
            d = p.drafter
            drafter_call(r, d, d.commit, r.seq, verdict.accepted, verdict.tokens)
            if self.controller is not None:
                after = verdict.tokens[verdict.accepted :]  # the target's own next token
                self.controller.observe(
                    r.id, d.name, p.draft, verdict.accepted, verdict.path,
                    p.offers.get(d.name), after[0] if after else None,
                )
        return self._emit(r, verdict.tokens, logits, _rows(verdict, len(verdict.tokens)))

    def _undo(self, r: Request, rng: dict) -> None:
        """Put a request back as it was before a round that failed: its target cache holds
        every committed token but the last, its random state is as it was. (A drafter
        with a cache drops drafts left behind at its next `propose`.)"""
        with contextlib.suppress(Exception):  # a broken backend must not hide the first error
            if self.target.length(r.seq) > len(r.context) - 1:
                self.target.truncate(r.seq, len(r.context) - 1)
        r.sampler.set_state(rng)

    def _learn(
        self,
        props: Sequence[Proposal],
        verdicts: Sequence[Verdict],
        calls: Sequence[tuple[int, list[int]]],
        planned: bool,
        draft_ms: float,
        verify_ms: float,
        commit_ms: float,
    ) -> None:
        """The controller's costs and batch plans learn from this round (k="auto")."""
        if self.controller is None:
            return
        fed = [(s, len(t)) for s, t in calls]
        if planned:
            self.controller.planned(fed, sum(len(v.tokens) for v in verdicts), draft_ms, verify_ms)
        costs = self.controller.costs
        costs.observe_verify(self.target.passes(fed), verify_ms)
        costs.observe_overhead(commit_ms)
        for p in props:
            d = p.drafter
            if d is not None and not d.cheap and p.lag <= 1:  # not a catch-up round
                costs.observe_draft(d.name, len(p.draft.tokens), p.ms)
            for name, ms in p.offer_ms.items():
                costs.observe_offer(name, p.asked[name], ms)

    def _record(
        self,
        r: Request,
        p: Proposal,
        verdict: Verdict,
        draft_ms: float,
        verify_ms: float,
        batch_size: int,
        step: int | None = None,
        logits: np.ndarray | None = None,
    ) -> None:
        """Step 5: one RoundTrace for request r, ending now. Its overhead is the rest of the
        time since r's previous round ended (rollback, bookkeeping, and any wait between
        rounds), so a request's rounds account for all of its time. An inspected request's
        detail (from the round's `logits`) is computed after the round's end: its cost falls
        in overhead (its next round's, and this round's of the requests recorded after it),
        never in a cost the controller learns. A trace sink that fails is logged and
        dropped; the round stands."""
        now = time.perf_counter()
        plan = p.plan
        rt = RoundTrace(
            request_id=r.id,
            round=len(r.rounds),
            drafter=None if p.drafter is None else p.drafter.name,
            proposed=len(p.draft.tokens),
            accepted=verdict.accepted,
            rejection_position=verdict.rejection_position,
            bonus=verdict.bonus,
            emitted=p.emitted,
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            overhead_ms=max(0.0, (now - r.clock) * _ms - draft_ms - verify_ms),
            batch_size=batch_size,
            t_ms=(now - r.arrival) * _ms,
            k_max=None if plan is None else plan.k_max,
            expected_goodput=None if plan is None else plan.expected_goodput,
            plain_goodput=None if plan is None else plan.plain_goodput,
            decision=None if plan is None else plan.reason,
            padded=p.padded,
            step=step,
            depth=None if p.draft.parents is None else p.draft.depth(),
            acceptance=None if r.acceptance == EXACT else r.acceptance,
            offers=None if plan is None else dict(p.asked),
            offer_ms=None if plan is None else {n: round(ms, 3) for n, ms in p.offer_ms.items()},
        )
        r.rounds.append(rt)
        r.clock = now
        if self.learner is not None:
            self._tell_learner("observe", r, self.target)
        line: RoundTrace | dict = rt
        if r.inspect and logits is not None:
            n = p.emitted
            detail = round_detail(
                p.draft.tokens,
                p.draft.probs,
                p.draft.parents,
                verdict.path,
                r.context[len(r.context) - n :],
                logits,
                _rows(verdict, n),
                r.params,
                self.target.tokenizer,
                r.context[: len(r.context) - n],
            )
            first = r.details[0]["params"] if r.details else detail["params"]
            detail["params_changed"] = detail["params"] != first
            r.details.append(detail)
            line = {**rt.to_dict(), "detail": detail}
        if self.trace is not None:
            try:
                self.trace.write(line)
            except Exception as exc:
                log.warning("the trace sink failed, tracing no more: %s", exc)
                self.trace = None

    def _tell_learner(self, what: str, *args) -> None:
        """Call the learner; one that fails is logged and dropped, the round stands."""
        if self.learner is None:
            return
        try:
            getattr(self.learner, what)(*args)
        except Exception as exc:
            log.warning("the learner failed, learning no more: %s", exc)
            self.learner = None

    def _verify(self, r: Request, d: Draft, logits: np.ndarray) -> Verdict:
        """logits [k+1, V] -> the acceptance rule's verdict (a tree draft's: point masses,
        always exact; a chain's by the request's rule)."""
        if r.params.greedy:
            top = np.argmax(logits, axis=-1)
            if d.parents is not None:
                return tree_greedy_match(d.tokens, d.parents, top)
            return greedy_match(d.tokens, top)
        p = LazyRows(logits, r.params)  # [k+1, V], warped on demand
        if d.parents is not None:
            return tree_sample_and_match(d.tokens, d.parents, p, r.sampler)
        if r.acceptance != EXACT:
            return lossy_sample(d.tokens, p, r.sampler, keep_rule(r.acceptance))
        return rejection_sample(d.tokens, d.probs, p, r.sampler)

    def _emit(self, r: Request, tokens: list[int], logits: np.ndarray, path: Sequence[int]) -> int:
        """Append tokens until EOS, a stop string, max_tokens or a full context; return how
        many. Token i came from row path[i] of `logits` (`_rows`); each one appended gets its
        log-probabilities where asked."""
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
                break
        if not r.done and len(r.context) > self.target.context_length:  # no room for a round
            r.finish_reason = "length"
        if r.params.logprobs is not None:
            r.logprobs += token_logprobs(logits[list(path[:n])], tokens[:n], r.params.logprobs)
        return n
