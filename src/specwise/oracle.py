"""Slow, obviously correct reference code that the tests hold the fast paths against.

`plain_decode` is autoregressive decoding with no engine, no drafter and no rollback: one token
in, one token out, drawing from the request's sampler exactly as plain decoding must. It is not
used to serve requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specwise.backends.base import LM, Reserved
from specwise.sampling import Sampler, SamplingParams, warp

__all__ = ["plain_decode"]


def plain_decode(target: LM, prompt: Sequence[int], params: SamplingParams) -> list[int]:
    """Emitted ids (prompt excluded) until EOS or max_tokens; stop strings are not checked."""
    sampler = Sampler(params.seed)
    out: list[int] = []
    feed = list(prompt)
    try:
        while len(out) < params.max_tokens:
            row = target.forward([(Reserved.ORACLE, feed)], last_only=True)[0][-1]  # [V]
            t = int(np.argmax(row)) if params.greedy else sampler.categorical(warp(row, params))
            out.append(t)
            if t in target.eos_token_ids:
                break
            feed = [t]
    finally:
        target.release(Reserved.ORACLE)
    return out
