"""`Memory`: what a controller learnt across requests, kept in a JSON file between runs.

The file holds `Estimates.state()` (α by position, calibration bins and plan hit rates per
drafter) under `$SPECWISE_HOME/controller/<target, drafters>.json` (`Memory.at`). Loading never
fails a run (a missing or unreadable file means nothing was learnt yet), nor does saving (a
warning). Only the CLI and the server load and save (`Controller.calibrated`, `save`);
`Engine` never does.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from specwise.backends.base import LM
from specwise.controller.estimates import Estimates
from specwise.drafters.base import Drafter

__all__ = ["Memory"]

log = logging.getLogger(__name__)


class Memory:
    """Memory(path): the file of one target and set of drafters."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def at(cls, target: LM, drafters: Sequence[Drafter]) -> Memory:
        """The memory of `target` with `drafters` in $SPECWISE_HOME."""
        from specwise.costs import cache_key
        from specwise.models import home

        return cls(home() / "controller" / f"{cache_key(target, drafters)}.json")

    def load(self, estimates: Estimates) -> None:
        """Take what the file holds into `estimates` (nothing when there is no such file)."""
        with contextlib.suppress(OSError, ValueError):
            estimates.load_state(json.loads(self.path.read_text()))

    def save(self, estimates: Estimates) -> None:
        """Write what `estimates` learnt across requests."""
        from specwise.models import save_json

        try:
            save_json(self.path, estimates.state())
        except OSError as exc:  # learning is a bonus; never fail a request for it
            log.warning("could not save the controller's learning: %s", exc)
