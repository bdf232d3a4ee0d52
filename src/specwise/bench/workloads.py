"""Benchmark workloads: the prompts specwise ships (`specwise.prompts`) and, when named, the
HumanEval problems (`bench.humaneval`), as the bench's commands take them (`builtin`, and
`load_jsonl` for a file of one's own), interleaved by category and rendered for the target.
This module only reads prompts; rendering them needs the target's tokenizer (`render`).
"""

from __future__ import annotations

from collections.abc import Sequence

from specwise.bench import humaneval
from specwise.prompts import CATEGORIES, Prompt, WorkloadError, load_jsonl, shipped

__all__ = ["HUMANEVAL", "builtin", "interleaved", "load_jsonl", "render"]

HUMANEVAL = "humaneval"  # a category named only when asked: problems whose tests are run


def builtin(categories: Sequence[str] | None = None) -> list[Prompt]:
    """The shipped prompts, category by category (all categories by default), and, when named,
    the `humaneval` problems (whose answers' tests are run: `bench.humaneval`)."""
    names = list(categories) if categories else list(CATEGORIES)
    unknown = [c for c in names if c not in CATEGORIES and c != HUMANEVAL]
    if unknown:
        raise WorkloadError(
            f"unknown categories {', '.join(unknown)}; known: {', '.join(CATEGORIES)}, {HUMANEVAL}"
        )
    out: list[Prompt] = []
    for c in names:
        out.extend(humaneval.prompts() if c == HUMANEVAL else shipped([c]))
    return out


def interleaved(prompts: Sequence[Prompt]) -> list[Prompt]:
    """The prompts taken one category at a time in turn (the first of each category, then the
    second, ...), so that any run of them mixes the categories; `builtin` lists them category
    by category."""
    by: dict[str, list[Prompt]] = {}
    for p in prompts:
        by.setdefault(p.category, []).append(p)
    rows = list(by.values())
    return [r[i] for i in range(max(map(len, rows), default=0)) for r in rows if i < len(r)]


def render(tokenizer, turns: Sequence[str], replies: Sequence[str] = ()) -> list[int]:
    """Token ids of a chat: user turns interleaved with the assistant `replies` given for all
    but the last turn, ending with the assistant's cue."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": replies[i]})
    return tokenizer.render_chat(messages)
