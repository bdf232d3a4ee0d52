"""`Backoff`: planning backs off at batch sizes where no draft has paid.

Planning has a cost of its own (the cheap drafters' proposals, the plans, the alignment), and in
a batch where nothing can pay it is the controller's whole cost: measured in the server, 0.43 ms
a step of 4 (0.3% of it), in which `auto` never drafted (BENCHMARKS.md §4). So per batch size of
2 or more: after PLAN_PATIENCE planned steps in a row with no draft that paid, only every
gap-th step is planned, the gap doubling up to PLAN_GAP_MAX; a step that pays plans every step
again. A request alone is always planned (its probes need that). Whether a step paid is the
controller's to judge (`Controller.planned`); this module only counts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PLAN_GAP_MAX", "PLAN_PATIENCE", "Backoff"]

PLAN_PATIENCE = 100  # planned steps of a batch size without a draft that paid, before backing off
PLAN_GAP_MAX = 8  # the most steps between planned ones where planning backs off


@dataclass
class _Size:
    """Planned steps since a draft last paid, and the gap between planned steps."""

    since: int = 0
    gap: int = 1
    wait: int = 0  # steps left before the next planned one


class Backoff:
    """Backoff(): by batch size, whether to plan the next step."""

    def __init__(self) -> None:
        self._by_size: dict[int, _Size] = {}

    def skip(self, size: int) -> str | None:
        """None: plan this step of `size` sequences. Otherwise the step decodes plainly, and
        this says why."""
        p = self._by_size.get(size)
        if p is None or not p.wait:
            return None
        p.wait -= 1
        return (
            f"plain: in batches of {size}, no draft paid in the last {p.since} planned "
            f"steps; planning every {p.gap}"
        )

    def learn(self, size: int, paid: bool) -> None:
        """Count a planned step of `size` sequences (sizes below 2 are always planned)."""
        if size < 2:
            return
        p = self._by_size.setdefault(size, _Size())
        p.since = 0 if paid else p.since + 1
        p.gap = 1 if p.since < PLAN_PATIENCE else min(2 * p.gap, PLAN_GAP_MAX)
        p.wait = p.gap - 1
