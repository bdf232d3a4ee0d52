"""Round and request records, the metric definitions, and a JSONL sink.

The engine counts at the source (one `RoundTrace` per request per round); this module turns
those records into figures; bench, server and CLI only display them. Definitions (DESIGN.md §4):

- proposed: draft tokens scored in a round (k); accepted: the kept prefix of the draft;
- a tree draft (several continuations sharing prefixes): proposed counts its tokens, depth its
  longest path, accepted the tokens on the path kept, and positions are depths; acceptance
  rates of trees and chains are not comparable (a tree spends tokens on width);
- padded: filler tokens fed after the draft when the controller aligned the batch to one
  length (they make the call one pass; they are never verified nor counted as proposed);
- emitted: accepted + 1 per round, fewer only when EOS / a stop string / max_tokens cut a round;
- acceptance rate = Σ accepted / Σ proposed (prefix-accepted; compare only at equal k);
- mean accepted length τ = Σ emitted / rounds (includes the recovered/bonus token; plain = 1.0);
- α_i (alpha_per_position[i]) = conditional acceptance at draft position i: among rounds that
  proposed position i and accepted every position before it, the share that accepted i;
- acceptance_per_position[i] = unconditional: among rounds that proposed anything, the share
  that accepted position i (non-increasing in i by construction);
- goodput = emitted tokens per millisecond of the rounds' wall time (draft + verify + overhead);
- TTFT = request arrival to the end of the first round that emitted a token (prefills included);
- round 0 of a request turns the prefill's last logits into the first token: its forward is the
  prefill (RequestSummary.prefill_ms) and is not counted again in the round's verify_ms;
- continuation speed = (emitted − 1) / (time of the last token − time of the first token);
- acceptance: a round decided by a lossy rule (`lossy`) names it; a summary names the rule of
  any of its rounds, so pooled figures that include a lossy round are never called exact.

This module does not time anything itself and never touches models.
"""

from __future__ import annotations

import json
import resource
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any

__all__ = [
    "JsonlSink",
    "RequestSummary",
    "RoundTrace",
    "acceptance_per_position",
    "alpha_per_position",
    "choice_shares",
    "offer_figures",
    "peak_rss_mb",
    "rss_mb",
    "summarize",
    "tree_figures",
    "verify_figures",
]


@dataclass(frozen=True)
class RoundTrace:
    """One round of one request."""

    request_id: str
    round: int  # 0-based index within the request
    drafter: str | None  # None: plain decoding (k = 0)
    proposed: int
    accepted: int
    rejection_position: int | None  # first rejected draft index; None when all were accepted
    bonus: bool  # the rule's last token: True bonus, False recovered
    emitted: int  # tokens this round added to the output (after EOS / stop / max_tokens cuts)
    draft_ms: float
    verify_ms: float  # the target forward (shared by the whole batch)
    overhead_ms: float  # the rest since the request's last round: rule, rollback, bookkeeping, wait
    batch_size: int
    t_ms: float  # end of the round, ms since the request arrived
    # Controller (None when k was fixed): its choice and why.
    k_max: int | None = None  # the proposal length the controller allowed
    expected_goodput: float | None = None  # predicted tokens/ms of the chosen configuration
    plain_goodput: float | None = None  # predicted tokens/ms of plain decoding
    decision: str | None = None  # the controller's reason, in words
    padded: int = 0  # filler tokens fed after the draft to align a batch (never verified)
    step: int | None = None  # the engine's step (rounds of one batch share it); None: round 0
    depth: int | None = None  # a tree draft's longest path; None: a chain (depth = proposed)
    acceptance: str | None = None  # the lossy rule its request ran under (`lossy`); None: exact
    # Tokens asked of each cheap drafter before the plan, taken or not (paid for either way, in
    # draft_ms), and the ms each offer took; None when k was fixed.
    offers: dict[str, int] | None = None
    offer_ms: dict[str, float] | None = None

    @property
    def reach(self) -> int:
        """Draft positions the round proposed: its draft's depth."""
        return self.proposed if self.depth is None else self.depth

    @property
    def round_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.overhead_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def alpha_per_position(rounds: Iterable[RoundTrace]) -> list[float | None]:
    """Conditional acceptance α_i for i = 0 .. max proposed − 1 (None where never reached)."""
    rounds = list(rounds)
    depth = max((r.reach for r in rounds), default=0)
    out: list[float | None] = []
    for i in range(depth):
        reached = [r for r in rounds if r.reach > i and r.accepted >= i]
        out.append(sum(r.accepted > i for r in reached) / len(reached) if reached else None)
    return out


def tree_figures(rounds: Iterable[RoundTrace]) -> dict[str, float] | None:
    """What tree drafts were among the rounds that drafted: their share, and their mean tokens,
    depth and accepted tokens; None when no round drafted a tree."""
    drafted = [r for r in rounds if r.proposed]
    trees = [r for r in drafted if r.depth is not None]
    if not trees:
        return None
    return {
        "share": len(trees) / len(drafted),
        "tokens": sum(r.proposed for r in trees) / len(trees),
        "depth": sum(r.depth for r in trees) / len(trees),
        "accepted": sum(r.accepted for r in trees) / len(trees),
    }


def offer_figures(rounds: Iterable[RoundTrace]) -> dict[str, dict[str, float]] | None:
    """For each cheap drafter asked for an offer before a plan (`RoundTrace.offers`): the rounds
    that asked it, the share of them that drafted from its offer, the tokens asked and drafted
    from it, a round that asked, and the median ms an offer took (None where not recorded);
    None when no round asked any."""
    seen: dict[str, list[int]] = {}  # name -> [rounds, taken, tokens asked, tokens drafted]
    ms: dict[str, list[float]] = {}
    for r in rounds:
        for name, n in (r.offers or {}).items():
            x = seen.setdefault(name, [0, 0, 0, 0])
            taken = r.drafter == name and r.proposed > 0
            x[0] += 1
            x[1] += taken
            x[2] += n
            x[3] += r.proposed if taken else 0
            if r.offer_ms and name in r.offer_ms:
                ms.setdefault(name, []).append(r.offer_ms[name])
    if not seen:
        return None
    return {
        name: {"rounds": n, "taken": taken / n, "asked": asked / n, "drafted": drafted / n,
               "ms": statistics.median(ms[name]) if name in ms else None}
        for name, (n, taken, asked, drafted) in seen.items()
    }


def verify_figures(rounds: Iterable[RoundTrace]) -> dict[int, float] | None:
    """The median ms of a target call by the tokens it fed (the round's draft and the token
    before it), over the rounds of one sequence (batch size 1): the cost curve the engine met,
    beside the one the controller calibrated alone; None where no such round was timed."""
    ms: dict[int, list[float]] = {}
    for r in rounds:
        if r.batch_size == 1 and r.verify_ms > 0:
            ms.setdefault(r.proposed + 1, []).append(r.verify_ms)
    return {n: statistics.median(v) for n, v in sorted(ms.items())} or None


def acceptance_per_position(rounds: Iterable[RoundTrace]) -> list[float]:
    """Unconditional acceptance at each draft position over rounds that proposed anything."""
    spec = [r for r in rounds if r.proposed > 0]
    depth = max((r.reach for r in spec), default=0)
    return [sum(r.accepted > i for r in spec) / len(spec) for i in range(depth)]


def rejection_histogram(rounds: Iterable[RoundTrace]) -> dict[str, int]:
    """How often each draft position was the first rejected one ('none': all accepted)."""
    hist: dict[str, int] = {}
    for r in rounds:
        if r.proposed == 0:
            continue
        key = "none" if r.rejection_position is None else str(r.rejection_position)
        hist[key] = hist.get(key, 0) + 1
    return hist


def choice_shares(rounds: Iterable[RoundTrace]) -> dict[str, dict[str, float]]:
    """Per configuration actually run ("plain" or a drafter's name): the share of rounds and
    the mean number of tokens proposed."""
    rounds = list(rounds)
    out: dict[str, dict[str, float]] = {}
    for r in rounds:
        key = r.drafter or "plain"
        e = out.setdefault(key, {"share": 0.0, "mean_k": 0.0})
        e["share"] += 1
        e["mean_k"] += r.proposed
    for e in out.values():
        e["mean_k"] /= e["share"]
        e["share"] /= len(rounds)
    return out


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mb() -> float:
    """Resident memory of this process now (Linux), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass(frozen=True)
class RequestSummary:
    """The figures of one request (or of several requests' rounds pooled together)."""

    ttft_ms: float | None
    continuation_tokens_per_s: float | None
    total_ms: float
    prefill_ms: float  # the target's prompt prefill
    draft_prefill_ms: float  # the drafters' prompt prefill (0 when lazy or none)
    emitted: int
    rounds: int
    proposed: int
    accepted: int
    acceptance_rate: float | None
    mean_accepted_length: float | None  # τ
    alpha_per_position: list[float | None]
    acceptance_per_position: list[float]
    rejection_positions: dict[str, int]
    goodput_tokens_per_ms: float | None
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    peak_rss_mb: float
    acceptance: str = "exact"  # "exact", or the lossy rule that decided any of the rounds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def summarize(
    rounds: Sequence[RoundTrace],
    total_ms: float,
    prefill_ms: float = 0.0,
    peak_rss: float | None = None,
    draft_prefill_ms: float = 0.0,
) -> RequestSummary:
    """The figures of one request from its rounds (definitions in the module docstring)."""
    emitted = sum(r.emitted for r in rounds)
    proposed = sum(r.proposed for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    draft_ms = sum(r.draft_ms for r in rounds)
    verify_ms = sum(r.verify_ms for r in rounds)
    overhead_ms = sum(r.overhead_ms for r in rounds)
    emitting = [r for r in rounds if r.emitted > 0]
    ttft = emitting[0].t_ms if emitting else None
    continuation = None
    if emitting and emitted > 1 and emitting[-1].t_ms > emitting[0].t_ms:
        continuation = (emitted - 1) / ((emitting[-1].t_ms - emitting[0].t_ms) / 1000.0)
    return RequestSummary(
        ttft_ms=ttft,
        continuation_tokens_per_s=continuation,
        total_ms=total_ms,
        prefill_ms=prefill_ms,
        draft_prefill_ms=draft_prefill_ms,
        emitted=emitted,
        rounds=len(rounds),
        proposed=proposed,
        accepted=accepted,
        acceptance_rate=_ratio(accepted, proposed),
        mean_accepted_length=_ratio(emitted, len(rounds)),
        alpha_per_position=alpha_per_position(rounds),
        acceptance_per_position=acceptance_per_position(rounds),
        rejection_positions=rejection_histogram(rounds),
        goodput_tokens_per_ms=_ratio(emitted, draft_ms + verify_ms + overhead_ms),
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        overhead_ms=overhead_ms,
        peak_rss_mb=peak_rss_mb() if peak_rss is None else peak_rss,
        acceptance=next((r.acceptance for r in rounds if r.acceptance), "exact"),
    )


class JsonlSink:
    """Appends one JSON object per line to a file (or an open text stream)."""

    def __init__(self, target: str | Path | IO[str]) -> None:
        if isinstance(target, str | Path):
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[str] = path.open("a", encoding="utf-8")
            self._owned = True
        else:
            self._fh = target
            self._owned = False

    def write(self, record: dict[str, Any] | RoundTrace) -> None:
        if isinstance(record, RoundTrace):
            record = record.to_dict()
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if self._owned:
            self._fh.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
