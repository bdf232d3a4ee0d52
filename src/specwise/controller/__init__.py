"""k="auto": the controller, one noun per module.

- `planner`: `Controller`, the plan of each request and round (drafter, length, probes), and
  the calls that touch the disk (`calibrated`, `remember`, `save`) for the CLI and server;
- `plan`: `Plan`, the choice for one request and round (a record);
- `pricing`: `Pricing`, what a round costs by the passes its call runs in, and `Batch`;
- `estimates`: `Estimates`, each drafter's acceptance by position and calibration, learnt from
  verified rounds;
- `alignment`: `align`, the joint plan of a batch (every sequence 1 + L tokens, one pass);
- `backoff`: `Backoff`, planning every few steps at batch sizes where no draft paid;
- `memory`: `Memory`, what was learnt across requests, in a file between runs.

The arithmetic of acceptance (E(m), calibration bins, trees) is `specwise.acceptance`'s, the
measured costs `specwise.costs`'. Nothing here runs a model.
"""

from specwise.controller.alignment import Alignment, Offered
from specwise.controller.backoff import PLAN_GAP_MAX, PLAN_PATIENCE
from specwise.controller.plan import Plan
from specwise.controller.planner import PROBE_FIRST, PROBE_MAX, PROBE_SHARE, STAKE, Controller
from specwise.controller.pricing import MARGIN, Batch

__all__ = [
    "MARGIN",
    "PLAN_GAP_MAX",
    "PLAN_PATIENCE",
    "PROBE_FIRST",
    "PROBE_MAX",
    "PROBE_SHARE",
    "STAKE",
    "Alignment",
    "Batch",
    "Controller",
    "Offered",
    "Plan",
]
