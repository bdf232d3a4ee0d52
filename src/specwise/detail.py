"""What one round saw, token by token, for the trace inspector (`specwise inspect`, `/ui`).

- `origins`: where each emitted token came from: "accepted" (a draft token the target kept),
  "recovered" (drawn at a rejection), "bonus" (drawn after a fully kept draft) or "plain" (a
  round that drafted nothing). It needs only the round's record, so every trace has it.
- `round_detail`: the draft, and at each emitted token's position the target's p and the
  draft's q of the emitted and of the proposed token, the top of p and the top-2 logit gap.
  p is what the rule used (`warp` with the round's parameters); for a greedy request, whose rule
  takes the argmax of a one-hot p, it is shown as softmax(logits) instead (`p_kind`). A draft
  without q (a point mass) has q = 1 for its token and 0 for any other.

It costs a softmax and a partial sort of a vocabulary row per emitted token, so the engine
computes it only for requests that ask (`Request.inspect`). Pure functions over arrays: no
model, no timing, no decoding decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specwise.backends.base import Tokenizer
from specwise.detok import pieces
from specwise.sampling import SamplingParams, warp

__all__ = ["ORIGINS", "TOP", "origins", "round_detail", "sampling_of"]

ORIGINS = ("accepted", "recovered", "bonus", "plain")
TOP = 5  # most likely tokens of p shown at each position


def origins(proposed: int, accepted: int, bonus: bool, emitted: int) -> list[str]:
    """The origin of each of a round's `emitted` tokens (a cut round keeps its first ones)."""
    out = ["accepted"] * min(accepted, emitted)
    if emitted > accepted:
        out.append("plain" if proposed == 0 else "bonus" if bonus else "recovered")
    return out


def sampling_of(params: SamplingParams) -> dict[str, float]:
    """The sampling parameters that shape p (what a step may change between rounds)."""
    return {
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
    }


def _softmax(row: np.ndarray) -> np.ndarray:
    z = np.asarray(row, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def round_detail(
    draft: Sequence[int],
    q: np.ndarray | None,
    parents: Sequence[int] | None,
    path: Sequence[int],
    tokens: Sequence[int],
    logits: np.ndarray,
    rows: Sequence[int],
    params: SamplingParams,
    tokenizer: Tokenizer | None = None,
    before: Sequence[int] = (),
) -> dict[str, Any]:
    """One round's detail.

    draft: the proposed tokens (q [len(draft), V] their draft distributions, None: point
    masses; parents: a tree's, None: a chain); path: a tree's kept nodes (empty for a chain);
    tokens: what the round emitted, token i from row rows[i] of `logits` [k+1, V];
    tokenizer/before: to give pieces of text (before: the context preceding the round)."""
    greedy = params.greedy
    if tokenizer is None:
        drafted = None
    elif parents is None:
        drafted = pieces(tokenizer, draft, before)
    else:  # a tree's tokens are not one text: each on its own
        drafted = [tokenizer.decode([int(x)]) for x in draft]
    positions = []
    for i, (t, row) in enumerate(zip(tokens, rows, strict=True)):
        z = np.asarray(logits[row], dtype=np.float64)
        p = _softmax(z) if greedy else warp(z, params)
        # The draft node proposed at this position: a chain's i-th token; along a tree's
        # kept path its node (at the rejection, a tree has several candidates: none named).
        if parents is None:
            j = i if i < len(draft) else None
        else:
            j = path[i] if i < len(path) else None
        proposed = None if j is None else int(draft[j])
        q_row = None if q is None or j is None else q[j]
        top = np.argpartition(p, -TOP)[-TOP:] if len(p) > TOP else np.arange(len(p))
        top = sorted(top.tolist(), key=lambda x: (-p[x], x))
        two = np.partition(z, -2)[-2:] if len(z) > 1 else np.array([z[0], z[0]])
        positions.append(
            {
                "token": int(t),
                "proposed": proposed,
                "proposed_piece": None if drafted is None or j is None else drafted[j],
                "p": float(p[t]),
                "q": _q(q_row, proposed, int(t)),
                "p_proposed": None if proposed is None else float(p[proposed]),
                "q_proposed": None if proposed is None else _q(q_row, proposed, proposed),
                "gap": float(abs(two[1] - two[0])),
                "top": [[int(x), _piece(tokenizer, x), float(p[x])] for x in top],
            }
        )
    return {
        "draft": [int(x) for x in draft],
        "draft_pieces": drafted,
        "parents": None if parents is None else [int(x) for x in parents],
        "tokens": [int(x) for x in tokens],
        "pieces": None if tokenizer is None else pieces(tokenizer, tokens, before),
        "p_kind": "softmax" if greedy else "warped",
        "params": sampling_of(params),
        "positions": positions,
    }


def _q(q_row: np.ndarray | None, proposed: int | None, x: int) -> float | None:
    """The draft's q(x) at a position that proposed `proposed` (None: nothing proposed there);
    a point-mass draft has q = 1 at its token and 0 elsewhere."""
    if proposed is None:
        return None
    return float(q_row[x]) if q_row is not None else float(x == proposed)


def _piece(tokenizer: Tokenizer | None, token: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([token])
