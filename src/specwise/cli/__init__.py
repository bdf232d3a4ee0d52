"""The `specwise` command: parses arguments, builds configs, calls the library, prints results.

Thin by design: no decoding, measuring or model logic lives here. Bad input ends with one
sentence on stderr (exit status 2), never a traceback.

This module is the entry point alone: `build_parser` puts the commands' parsers together, in
the order `--help` lists them, and `main` runs the one asked for. Each command's flags, wiring
and output are in its own module (`generate`, `models`, `bench` with `bench_replay`,
`bench_adapt` and `bench_servers`, `recommend`, `serve`, `heads`, `inspect`), which imports
only the shared `common` and `options`, never another command's module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specwise.cli import (
    bench,
    bench_adapt,
    bench_replay,
    bench_servers,
    generate,
    heads,
    inspect,
    models,
    recommend,
    serve,
)
from specwise.cli.common import UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specwise", description="Exact, measured speculative decoding for local LLMs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    generate.add_parser(sub)
    models.add_parser(sub)
    bench_sub = bench.add_parser(sub)
    bench_replay.add_parser(bench_sub)
    bench_adapt.add_parser(bench_sub)
    bench_servers.add_parser(bench_sub)
    recommend.add_parser(sub)
    serve.add_parser(sub)
    heads.add_parser(sub)
    inspect.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        return a.func(a)
    except (UsageError, ValueError, OSError) as exc:
        print(f"specwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specwise: interrupted", file=sys.stderr)
        return 130
