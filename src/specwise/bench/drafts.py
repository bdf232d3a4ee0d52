"""`specwise bench drafts`: draft models side by side for one target — the pair's draft and its
requantized copies (`backends.requant`) — by what each costs a token here and how often its
greedy choice is the target's, and the speed of model drafting both predict.

1. The target's plain greedy answers to the prompts are recorded (`replay.record`).
2. Each draft reads every prompt and answer (teacher forcing, one forward of the answer): at
   each answer position, is its argmax the target's next token? That is greedy acceptance α
   at the first draft position, and since a draft that agrees keeps the target's context, the
   run of agreements from a position is the number of draft tokens a chain of k would have
   accepted there, E_k (at most k).
3. Cost curves of the target and every draft, interleaved (`curves.measure_curves`).
4. The prediction for `--drafter model --k k`: a round drafts k tokens one forward each and
   verifies k + 1, so its goodput is (E_k + 1) / (k c_draft(1) + c_target(k + 1)), over plain
   decoding's 1 / c_target(1); the best k of 1..MAX_K. A prediction from measured parts, not
   a timing of rounds: `specwise bench --draft NAME@RECIPE` times them.

Greedy only. It measures; it changes no cached choice or calibration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specwise.backends.base import LM
from specwise.backends.curves import measure_curves
from specwise.bench.replay import Recording

__all__ = ["DraftRow", "agreement", "compare", "expected_accepted", "save", "table"]

MAX_K = 8
SEQ = 0


@dataclass
class DraftRow:
    name: str
    mib: float
    ms_per_token: float  # a one-token forward
    ms_4: float  # a forward of 4 tokens
    alpha: float  # greedy agreement with the target over every answer position
    alpha_by_category: dict[str, float]
    expected: list[float]  # E_k, k = 0..MAX_K (E_0 = 0)
    best_k: int
    predicted: float  # goodput of model drafting at best_k over plain decoding's


def agreement(draft: LM, rec: Recording) -> np.ndarray:
    """1 where the draft's argmax after rec.prompt + output[:i] is output[i], else 0."""
    draft.release(SEQ)
    try:
        if len(rec.prompt) > 1:
            draft.forward([(SEQ, rec.prompt[:-1])], last_only=True)
        fed = [rec.prompt[-1], *rec.output[:-1]]
        rows = draft.forward([(SEQ, fed)])[0]
    finally:
        draft.release(SEQ)
    return (rows.argmax(-1) == np.asarray(rec.output)).astype(np.int8)


def expected_accepted(runs: Sequence[np.ndarray], k: int) -> float:
    """Mean over answer positions of the draft tokens a chain of k would keep there."""
    kept = []
    for a in runs:
        n = len(a)
        streak = np.zeros(n + 1, int)  # streak[i]: agreements in a row from position i
        for i in range(n - 1, -1, -1):
            streak[i] = streak[i + 1] + 1 if a[i] else 0
        kept += [min(k, int(s)) for s in streak[:n]]
    return float(np.mean(kept)) if kept else 0.0


def compare(
    target: LM,
    drafts: dict[str, LM],
    recordings: Sequence[Recording],
    sizes_mib: dict[str, float],
    progress: Callable[[int], None] | None = None,
) -> tuple[list[DraftRow], dict[int, float]]:
    """Each draft's row (module docstring), in the order given, and the target's cost curve
    (ms of a forward of n tokens) measured beside them."""
    runs: dict[str, list[tuple[str, np.ndarray]]] = {n: [] for n in drafts}
    for rec in recordings:
        for name, lm in drafts.items():
            runs[name].append((rec.category, agreement(lm, rec)))
        if progress:
            progress(1)
    curves = measure_curves({"target": target, **drafts}, range(1, MAX_K + 2), repeats=5)
    t = curves["target"]
    out = []
    for name in drafts:
        arrays = [a for _, a in runs[name]]
        cats: dict[str, list[np.ndarray]] = {}
        for cat, a in runs[name]:
            cats.setdefault(cat, []).append(a)
        e = [expected_accepted(arrays, k) for k in range(MAX_K + 1)]
        c = curves[name]
        gain = [(e[k] + 1) / (k * c(1) + t(k + 1)) * t(1) for k in range(MAX_K + 1)]
        best = max(range(1, MAX_K + 1), key=gain.__getitem__)
        out.append(
            DraftRow(
                name,
                sizes_mib[name],
                c(1),
                c(4),
                float(np.mean(np.concatenate(arrays))) if arrays else 0.0,
                {k: float(np.mean(np.concatenate(v))) for k, v in cats.items()},
                e,
                best,
                gain[best],
            )
        )
    return out, t.ms


def table(rows: Sequence[DraftRow], target_ms: float) -> list[str]:
    """The comparison as markdown lines."""
    cats = list(rows[0].alpha_by_category) if rows else []
    head = ["draft", "MiB", "ms a token", "x target step", "ms for 4", "α"]
    head += [f"α {c}" for c in cats] + ["E accepted at k=3", "best k", "model k predicted"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.name,
            f"{r.mib:.0f}",
            f"{r.ms_per_token:.1f}",
            f"{r.ms_per_token / target_ms:.2f}",
            f"{r.ms_4:.1f}",
            f"{r.alpha:.3f}",
            *[f"{r.alpha_by_category[c]:.2f}" for c in cats],
            f"{r.expected[3]:.2f}",
            str(r.best_k),
            f"{r.predicted:.2f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def save(out: Path, rows: Sequence[DraftRow], meta: dict, lines: Sequence[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafts.json").write_text(
        json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=1)
    )
    (out / "report.md").write_text("\n".join(lines) + "\n")
