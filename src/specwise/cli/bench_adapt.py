"""`specwise bench adapt`: its flags and their checks, a drafter on hidden states run as
trained and adapting against plain decoding (`bench.adapt`), and the table printed.

It trains and measures nothing itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwise.cli.common import UsageError, _load_models, _trained
from specwise.cli.options import _check_budgets, _heads_target_args

__all__ = ["add_parser"]


def _bench_adapt(a: argparse.Namespace) -> int:
    from specwise.bench import adapt
    from specwise.bench.session import default_out

    if a.requests < 1 or not 1 <= a.k <= 8 or a.max_tokens < 1:
        raise UsageError("--requests and --max-tokens need integers >= 1, --k an integer 1..8")
    _check_budgets(("--budget", a.budget), ("--idle-budget", a.idle_budget))
    if a.think < 0:
        raise UsageError(f"--think {a.think:g} is invalid; use seconds >= 0")
    if a.temperature < 0:
        raise UsageError(f"--temperature {a.temperature:g} is invalid; use >= 0")
    net = _trained(a, a.drafter)
    hidden = net.layers if a.drafter == "eagle" else True
    target, _ = _load_models(a, need_draft=False, hidden=hidden)
    out = Path(a.out) if a.out else default_out("-adapt")
    lines = adapt.run(
        target,
        net,
        out,
        requests=a.requests,
        k=a.k,
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        budget=a.budget,
        idle_budget=a.idle_budget,
        think=a.think,
        progress=lambda s: print(f"specwise: {s}", file=sys.stderr),
    )
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """`bench adapt` and its flags."""
    ba = bsub.add_parser(
        "adapt",
        help="a drafter on hidden states on requests it was not trained for, as trained and "
        "adapting (serve --adapt), against plain decoding, request after request",
    )
    _heads_target_args(ba)
    ba.add_argument(
        "--drafter",
        choices=["heads", "eagle"],
        default="heads",
        help="the drafter that adapts: the heads, or the eagle layer (heads)",
    )
    ba.add_argument("--requests", type=int, default=200, help="requests, each run three ways (200)")
    ba.add_argument("--k", type=int, default=1, help="tokens drafted a round (1; eagle drafts 1)")
    ba.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (64)")
    ba.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0)")
    ba.add_argument(
        "--budget",
        type=float,
        default=0.1,
        help="share of one core the adaptation may use while a request decodes (0.1; 0: none)",
    )
    ba.add_argument(
        "--idle-budget",
        type=float,
        default=1.0,
        help="share of one core the adaptation may use between requests (1.0)",
    )
    ba.add_argument(
        "--think",
        type=float,
        default=5.0,
        help="seconds between two requests, a user reading the answer, in which the adaptation "
        "runs alone, untimed, until it has nothing left to learn (5; 0: back to back)",
    )
    ba.add_argument("--out", help="output folder (default bench-results/<timestamp>-adapt)")
    ba.set_defaults(func=_bench_adapt)
