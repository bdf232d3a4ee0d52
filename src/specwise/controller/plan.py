"""`Plan`: the controller's choice for one request and round (`planner` makes it, `alignment`
weighs a batch's plans together, the engine carries it in its `Proposal`). A record only: it
plans nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwise.drafters.base import Drafter, KeepGoing

__all__ = ["Plan"]


@dataclass(frozen=True)
class Plan:
    """The controller's choice for one request and round."""

    drafter: Drafter | None  # None: plain decoding
    k_max: int  # the most tokens to draft (a model drafter may stop earlier)
    planned: int  # the length the plan expects to be best
    expected_goodput: float  # tokens/ms of the round (the whole batch) as planned
    plain_goodput: float  # ... had this request decoded plainly
    expected_tokens: float = 1.0  # E(m) for this request
    draft_ms: float = 0.0  # predicted drafting time
    keep_going: KeepGoing | None = None
    probe: bool = False
    reason: str = ""
