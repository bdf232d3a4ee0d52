"""The trace inspector's JSON views of requests and rounds (what `/ui/api` answers).

A request is shown as a `row` (one line of a list: its state and figures) or a `view` (its text
split into rounds: every round's record, the tokens it emitted, their pieces of text and
origins, and the round's detail where it was recorded). The same views serve a running server
(`inspector`) and saved traces and bench runs (`saved`), so the page knows one format. Views
only: no HTTP, no engine, no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specwise.detail import origins

__all__ = ["divergence", "request_row", "request_view", "round_view", "split"]


def split(rounds: Sequence[dict], tokens: Sequence[Any] | None) -> list[list[Any] | None]:
    """`tokens` (a request's emitted ids, or their pieces) cut into each round's share."""
    out: list[list[Any] | None] = []
    at = 0
    for r in rounds:
        n = r["emitted"]
        out.append(None if tokens is None or at + n > len(tokens) else list(tokens[at : at + n]))
        at += n
    return out


def round_view(
    r: dict, tokens: list[int] | None, pieces: list[str] | None, detail: dict | None
) -> dict[str, Any]:
    """One round: its record, what it emitted, each token's origin, and its detail if any."""
    out = {k: v for k, v in r.items() if k != "detail"}
    if detail is not None:
        tokens, pieces = detail["tokens"], detail["pieces"] or pieces
    out["tokens"] = tokens or []
    out["pieces"] = pieces
    out["origins"] = origins(r["proposed"], r["accepted"], r["bonus"], r["emitted"])
    out["detail"] = detail
    return out


def _figures(rounds: Sequence[dict]) -> dict[str, Any]:
    emitted = sum(r["emitted"] for r in rounds)
    proposed = sum(r["proposed"] for r in rounds)
    accepted = sum(r["accepted"] for r in rounds)
    ms = sum(r["draft_ms"] + r["verify_ms"] + r["overhead_ms"] for r in rounds)
    return {
        "rounds": len(rounds),
        "emitted": emitted,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted_length": emitted / len(rounds) if rounds else None,
        "tokens_per_s": emitted / ms * 1000.0 if ms > 0 else None,
    }


def request_row(
    rid: str,
    label: str,
    state: str,
    rounds: Sequence[dict],
    source: str,
    config: str | None = None,
    category: str | None = None,
    prompt_id: str | None = None,
) -> dict[str, Any]:
    """One line of a list of requests: its state and figures so far."""
    return {
        "id": rid,
        "label": label,
        "state": state,
        **_figures(rounds),
        "source": source,
        "config": config,
        "category": category,
        "prompt_id": prompt_id,
    }


def request_view(
    rid: str,
    label: str,
    state: str,
    rounds: Sequence[dict],
    tokens: Sequence[int] | None,
    pieces: Sequence[str] | None,
    details: Sequence[dict | None] = (),
    **extra: Any,
) -> dict[str, Any]:
    """A request's text, round by round. `details` (one per round, or none) take precedence
    over `tokens`/`pieces` for the rounds they cover. `extra`: prompt, text, finish_reason,
    summary, check."""
    toks, texts = split(rounds, tokens), split(rounds, pieces)
    details = list(details) + [None] * (len(rounds) - len(details))
    views = [
        round_view(r, t, s, d)
        for r, t, s, d in zip(rounds, toks, texts, details[: len(rounds)], strict=True)
    ]
    base = {"prompt": None, "text": None, "finish_reason": None, "summary": None, "check": None}
    return {"id": rid, "label": label, "state": state, **base, **extra, "rounds": views}


def divergence(a: Sequence[int], b: Sequence[int], gaps: Sequence[float] | None = None) -> dict:
    """Where two outputs part: the first differing token index (None: equal), and the top-2
    logit gap there when known (`gaps`: along `a`)."""
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if n is None and len(a) != len(b):
        n = min(len(a), len(b))
    gap = gaps[n] if gaps is not None and n is not None and n < len(gaps) else None
    return {"position": n, "gap": gap, "near_tie": None}
