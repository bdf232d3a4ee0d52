"""Step accounting of a trace: what `auto`'s speculative steps saved against its plain steps.

A step is the rounds that shared one target call: the rounds with one `RoundTrace.step` (for a
trace written before rounds carried it, the rounds with equal draft, verify and overhead
times, which a step's rounds had then). `auto`'s steps are those whose every round has a
controller decision (a request with a fixed k has none). A speculative step (any round fed
draft or filler tokens) costs T ms and emits N tokens; with P the median time of the NEAREST
plain steps of `auto` of the same batch size B (so the machine's drift, which moves all steps
alike, cancels), it saved P·N/B − T. Steps are split by whether the controller aligned the
batch (`decision` starting with "aligned") or planned requests one by one.

This module reads records and computes; `specwise bench steps` prints its table.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NEAREST", "StepAccount", "account", "fed", "read_steps", "setting", "step_ms", "table"]

NEAREST = 20  # plain steps of the same batch size whose median prices a speculative step


@dataclass
class StepAccount:
    """`auto`'s steps of one batch size: how many, their time, and what its speculative ones
    saved (ms), aligned and planned one by one."""

    batch_size: int
    steps: int = 0
    ms: float = 0.0
    aligned: int = 0
    aligned_saved_ms: float = 0.0
    planned: int = 0
    planned_saved_ms: float = 0.0


def read_steps(rows: Sequence[dict]) -> list[list[dict]]:
    """The trace's steps (rounds after round 0, grouped), in the order they ran."""
    steps: dict[object, list[dict]] = {}
    for r in rows:
        if r["round"] > 0:  # round 0 turns the prefill into the first token
            key = r.get("step")
            if key is None:
                key = (r["verify_ms"], r["draft_ms"], r["overhead_ms"])
            steps.setdefault(key, []).append(r)
    return list(steps.values())  # dicts keep the order keys first appeared


def fed(r: dict) -> int:
    """Tokens a round fed beyond the plain one (draft and filler)."""
    return r["proposed"] + r.get("padded", 0)


def step_ms(step: list[dict]) -> float:
    """A step's time: its shared draft and verify times and the least of its overheads."""
    r = step[0]
    return r["draft_ms"] + r["verify_ms"] + min(x["overhead_ms"] for x in step)


def setting(step: list[dict]) -> str:
    """Whose step it was: "auto" (every round has a controller decision), "off" (none has: a
    fixed k) or "mixed"."""
    decided = {r.get("decision") is not None for r in step}
    return "mixed" if len(decided) > 1 else "auto" if decided == {True} else "off"


def account(rows: Sequence[dict], nearest: int = NEAREST) -> list[StepAccount]:
    """Per batch size, `auto`'s steps and what its speculative steps saved."""
    auto = [s for s in read_steps(rows) if setting(s) == "auto"]
    plain: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for i, s in enumerate(auto):
        if not any(fed(r) for r in s):
            plain[s[0]["batch_size"]].append((i, step_ms(s)))
    out: dict[int, StepAccount] = {}
    for i, s in enumerate(auto):
        b, t = s[0]["batch_size"], step_ms(s)
        acc = out.setdefault(b, StepAccount(b))
        acc.steps += 1
        acc.ms += t
        if not any(fed(r) for r in s) or not plain[b]:
            continue
        near = sorted(plain[b], key=lambda x: abs(x[0] - i))[:nearest]
        saved = statistics.median(ms for _, ms in near) * sum(r["emitted"] for r in s) / b - t
        if any(r["decision"].startswith("aligned") for r in s):
            acc.aligned += 1
            acc.aligned_saved_ms += saved
        else:
            acc.planned += 1
            acc.planned_saved_ms += saved
    return [out[b] for b in sorted(out)]


def table(path: Path) -> list[str]:
    """The accounting of the trace at `path` (rounds.jsonl) as a markdown table."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise ValueError(f"cannot read the trace {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a JSONL trace (line {exc.lineno}: {exc.msg})") from None
    lines = [
        "| batch size | auto's steps | aligned | saved | planned one by one | saved |",
        "|---|---|---|---|---|---|",
    ]
    for a in account(rows):
        lines.append(
            f"| {a.batch_size} | {a.steps} | {a.aligned} | {a.aligned_saved_ms / a.ms:+.2%} | "
            f"{a.planned} | {a.planned_saved_ms / a.ms:+.2%} |"
        )
    return lines
