"""`specwise inspect`: the trace inspector over a saved trace or bench run, served read only
on 127.0.0.1.

Its routes and views are `server.inspector`'s and `server.saved`'s; it serves no model.
"""

from __future__ import annotations

import argparse
import sys

from specwise.cli.common import UsageError

__all__ = ["add_parser", "cmd_inspect"]


def cmd_inspect(a: argparse.Namespace) -> int:
    import uvicorn
    from fastapi import FastAPI

    from specwise.server import inspector, saved

    if not 0 < a.port < 65536:
        raise UsageError(f"--port {a.port} is invalid; use 1..65535")
    source = saved.load(a.path)
    app = FastAPI(title="specwise inspect", docs_url=None, redoc_url=None, openapi_url=None)
    inspector.add_routes(app, source)
    print(
        f"specwise: inspecting {a.path} at http://127.0.0.1:{a.port}/ui "
        f"(read only, this machine only; Ctrl-C stops)",
        file=sys.stderr,
    )
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`inspect` and its flags."""
    i = sub.add_parser(
        "inspect", help="the trace inspector (in the browser) over a saved trace or bench run"
    )
    i.add_argument("path", help="a trace (.jsonl from --trace) or a bench run folder")
    i.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (8765)")
    i.set_defaults(func=cmd_inspect)
