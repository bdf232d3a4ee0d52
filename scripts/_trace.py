"""What the trace scripts share: a trace's steps (`specwise.bench.steps`), read from a file."""

from __future__ import annotations

import json
import sys

from specwise.bench.steps import fed, read_steps, setting, step_ms

__all__ = ["fed", "rows", "setting", "step_ms", "steps"]


def rows(path: str) -> list[dict]:
    """The records of a JSONL file (a trace, or a bench's requests.jsonl)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def steps(path: str) -> list[list[dict]]:
    """The steps of the trace at `path`, in the order they ran (old and new traces alike)."""
    return read_steps(rows(path))


if __name__ == "__main__":
    sys.exit("a helper of the scripts in this folder, not a script")
