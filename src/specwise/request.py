"""`Request`, one sequence being generated (the engine owns and mutates it), and
`GenerationResult`, what a finished request returns. Records only; no decoding here."""

from __future__ import annotations

from dataclasses import dataclass, field

from specwise.detok import Detokenizer
from specwise.sampling import Sampler, SamplingParams, TokenLogprob
from specwise.trace import RequestSummary, RoundTrace

__all__ = ["GenerationResult", "Request"]


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
    prefilled: int = 0  # prompt tokens in the target's cache (`Engine.prefill`)
    prefill_ms: float = 0.0  # the target's
    draft_prefill_ms: float = 0.0  # the drafters' (begin)
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    drafter_errors: dict[str, str] = field(default_factory=dict)  # failed drafters, not used again
    clock: float = 0.0  # time.perf_counter() when its last round (or its start) ended
    k: int | str | None = None  # this request's own k (None: the engine's)
    only: str | None = None  # this request's only drafter (None: any of the engine's)
    acceptance: str = "exact"  # the acceptance rule: exact, or a lossy one (`lossy`)
    tenant: str | None = None  # whose request (`Engine.prefill`), for what learns across requests
    ended: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token (params.logprobs)
    # Inspection (`detail.round_detail`, for the trace inspector): one detail per round, and
    # the cheap drafters begun even at k = 0, so that a step may switch to any of them.
    inspect: bool = False
    details: list[dict] = field(default_factory=list)

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
    logprobs: list[TokenLogprob] | None = None  # one per token, when params.logprobs asked
