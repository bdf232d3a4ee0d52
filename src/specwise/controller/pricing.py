"""`Pricing`: what a round costs and what it is worth, in the controller's terms.

A round is one target call shared by the batch. Its time is the drafting, the call priced as
the passes the backend runs it in (`LM.passes`, from the measured `CostModel`) and the
measured overhead; its worth is the tokens it is expected to emit, so a plan is judged by its
goodput, emitted tokens per ms. `Batch` is what the rest of a batch already put in the call
while one request is planned. Runs no model and learns nothing: the costs learn themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specwise.backends.base import LM
from specwise.costs import CostModel, Pass

__all__ = ["MARGIN", "Batch", "Pricing"]

MARGIN = 1.05  # speculate only when expected goodput beats plain decoding's by this factor


@dataclass(frozen=True)
class Batch:
    """What the rest of the batch already put into this round's target call, and the sequence
    of the request being planned."""

    calls: tuple[tuple[int, int], ...] = ()  # (seq, tokens) of each of the other sequences
    expected: float = 0.0  # tokens those requests are expected to emit
    draft_ms: float = 0.0
    seq: int = 0


def _one_pass(calls: Sequence[tuple[int, int]]) -> list[Pass]:
    return [(1, sum(n for _, n in calls))]


class Pricing:
    """Pricing(costs): rounds priced from this machine's measured costs; until `bind`, a call
    is one pass of all its tokens."""

    def __init__(self, costs: CostModel) -> None:
        self.costs = costs
        self.passes: Callable[[tuple[tuple[int, int], ...]], Sequence[Pass]] = _one_pass

    def bind(self, target: LM) -> None:
        """Price target calls the way `target` runs them. A call's passes depend only on its
        shape, and a server's steps repeat a few shapes, so they are remembered."""
        self.passes = functools.lru_cache(maxsize=4096)(lambda calls: tuple(target.passes(calls)))

    def step_ms(self, calls: tuple[tuple[int, int], ...], draft_ms: float) -> float:
        """A round whose target call holds `calls` ((seq, tokens) each), after draft_ms of
        drafting."""
        return draft_ms + self.costs.call_ms(self.passes(calls)) + self.costs.overhead_ms

    def round_ms(self, name: str | None, m: int, batch: Batch) -> float:
        """A round in which the planned request drafts m tokens with drafter `name` (None:
        plain) beside `batch`."""
        d = self.costs.draft_ms_per_token.get(name, 0.0) * m if name else 0.0
        return self.step_ms((*batch.calls, (batch.seq, 1 + m)), batch.draft_ms + d)

    def sharing(self, batch: Batch, cap: int) -> list[int]:
        """The draft lengths 0..cap that keep this request in the passes the rest of its batch
        runs anyway (alone: all of them). A pass of its own, beside them, is not planned: such
        passes mostly cost 1.3-1.6x what a request alone pays for as many tokens, and the
        one-by-one drafts that needed them lost 11% of their steps' time in the server
        (BENCHMARKS.md §4)."""
        if not batch.calls:
            return list(range(cap + 1))
        plain = len(self.passes((*batch.calls, (batch.seq, 1))))
        return [0] + [
            m
            for m in range(1, cap + 1)
            if len(self.passes((*batch.calls, (batch.seq, 1 + m)))) <= plain
        ]
