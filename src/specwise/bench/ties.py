"""Near-ties in served answers: a greedy answer against the same request's answer alone
(`alone_check`), both as the OpenAI API's log-probability entries, and whether every answer
that parted from its answer alone did so at a near-tie (`near_ties`), as `bench.runner` judges
its own divergences (`NEAR_TIE_FACTOR`, the bench's one measure of near). A soak
(`bench.soak.run_soak`) and a fault (`bench.faults.unknown_fields`) judge their answers by it.
Arithmetic on entries only: it sends no request.
"""

from __future__ import annotations

import math

__all__ = ["NEAR_TIE_FACTOR", "alone_check", "near_ties"]

NEAR_TIE_FACTOR = 2.0  # near-tie: a top-2 gap below this many times the measured noise


def _gap(entry: dict) -> float:
    """The top-2 gap of a token's position (logits differ as log-probabilities do)."""
    top = entry["top_logprobs"]
    return top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else math.inf


def alone_check(alone: list[dict], got: list[dict]) -> dict:
    """A greedy answer against the same request's answer alone, both as log-probability entries
    ({token, logprob, top_logprobs} with the top 2): {"match": True}, or where they part and
    alone's top-2 gap there; with `noise`, the largest change of a top-2 gap between the two at
    the positions before (what the server's numerics moved; `near_ties` judges by it)."""
    n = min(len(alone), len(got))
    part = next((i for i in range(n) if alone[i]["token"] != got[i]["token"]), n)
    noise = max((abs(_gap(alone[i]) - _gap(got[i])) for i in range(part)), default=0.0)
    noise = 0.0 if math.isinf(noise) or math.isnan(noise) else noise
    if part == n and len(alone) == len(got):
        return {"match": True, "noise": noise}
    gap = _gap(alone[part]) if part < len(alone) else math.nan
    return {"match": False, "position": part, "top2_gap": gap, "noise": noise}


def near_ties(checks: list[dict], factor: float) -> dict:
    """The soak's greedy answers against their answers alone: how many matched, and whether
    every divergence was at a near-tie: a top-2 gap within `factor` x the largest noise
    seen over all answers (as `bench.runner` judges its own divergences)."""
    noise = max((c["noise"] for c in checks), default=0.0)
    parted = [c for c in checks if not c["match"]]
    ties = [c for c in parted if c["top2_gap"] <= factor * noise]
    return {
        "factor": factor,
        "answers": len(checks),
        "matched": len(checks) - len(parted),
        "diverged": len(parted),
        "at_near_ties": len(ties),
        "noise": noise,
        "gaps": sorted(c["top2_gap"] for c in parted),
    }
