"""`specwise recommend`: from a `bench engines` run's summary, the speculative settings that
were best, written for another engine, as text or JSON.

It measures and decides nothing: `engines.configs.recommend` chooses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specwise.cli.common import UsageError

__all__ = ["add_parser", "cmd_recommend"]


def cmd_recommend(a: argparse.Namespace) -> int:
    from specwise.engines.configs import recommend

    path = Path(a.run) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"{a.run!r} has no readable summary.json; give the folder of a "
            "`specwise bench engines` run"
        ) from None
    if "comparisons" not in summary:
        raise UsageError(f"{a.run!r} is not a `specwise bench engines` run (no comparisons)")
    level = str(a.concurrency) if a.concurrency is not None else None
    out = recommend(summary, a.engine, level)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(out["text"])
    if "note" in out:
        print(out["note"])
    print(out["command"])
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`recommend` and its flags."""
    r = sub.add_parser(
        "recommend",
        help="from a `bench engines` run: the speculative settings that were best, for "
        "another engine",
    )
    r.add_argument("run", help="the run's folder (its --out)")
    r.add_argument(
        "--for",
        dest="engine",
        required=True,
        choices=["llama-server", "vllm", "sglang"],
        help="the engine to write settings for",
    )
    r.add_argument(
        "--concurrency", type=int, help="requests in flight to recommend for (the run's first)"
    )
    r.add_argument("--json", action="store_true", help="the recommendation as JSON")
    r.set_defaults(func=cmd_recommend)
