"""Sampling parameters, the one warping function, the request's random source, and the
log-probabilities reported with emitted tokens (`token_logprobs`).

`warp` turns logits into the probabilities that both the target (p) and every drafter (q) use;
it is the ONLY warping code in specwise, so p and q can never be warped differently.

The order of the warpers is the Hugging Face / vLLM convention:

1. temperature: logits / T (T = 0 means greedy: a one-hot at the first argmax);
2. top-k: keep every token whose logit is >= the k-th largest (ties at the k-th are all kept);
3. top-p: keep the smallest set of most likely tokens whose mass reaches top_p (mass measured on
   the distribution left by top-k; ties broken by token id, lower first);
4. min-p: keep tokens whose probability is >= min_p x the largest probability;

then renormalise. Reported log-probabilities are the model's own (a log-softmax of its logits,
before any warper), whatever the request samples with. This module does not decide which token
is emitted (that is `verify`) and holds no model code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LazyRows", "Sampler", "SamplingParams", "TokenLogprob", "token_logprobs", "warp"]

MAX_LOGPROBS = 20  # most likely alternatives a token may report (OpenAI's top_logprobs limit)

# top-p first looks for its nucleus among this many most likely tokens; see `_top_p_mask`.
TOP_P_CANDIDATES = 1024


def _fail(field: str, value: object, valid: str) -> None:
    raise ValueError(f"SamplingParams.{field} = {value!r} is invalid; it must be {valid}.")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. Validated on construction: a bad value raises ValueError
    naming the field and its valid range."""

    temperature: float = 0.0  # 0 → greedy
    top_k: int = 0  # 0 → off
    top_p: float = 1.0  # 1 → off
    min_p: float = 0.0  # 0 → off
    seed: int | None = None  # None → fresh entropy
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None → none; n → each token's and its n most likely others'

    def __post_init__(self) -> None:
        def real(field: str, lo: float, hi: float, valid: str) -> None:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                _fail(field, v, valid)
            if not lo <= v <= hi:
                _fail(field, v, valid)
            object.__setattr__(self, field, float(v))

        def integer(field: str, lo: int, hi: int | None, valid: str) -> None:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                _fail(field, v, valid)
            if v < lo or (hi is not None and v > hi):
                _fail(field, v, valid)
            object.__setattr__(self, field, int(v))

        real("temperature", 0.0, 100.0, "a number from 0 (greedy) to 100")
        integer("top_k", 0, None, "an integer >= 0 (0 turns top-k off)")
        real("top_p", 0.0, 1.0, "a number in (0, 1] (1 turns top-p off)")
        if self.top_p == 0.0:
            _fail("top_p", self.top_p, "a number in (0, 1] (1 turns top-p off)")
        real("min_p", 0.0, 1.0, "a number in [0, 1] (0 turns min-p off)")
        if self.seed is not None:
            integer("seed", 0, 2**63 - 1, "None or an integer in [0, 2**63 - 1]")
        integer("max_tokens", 1, None, "an integer >= 1")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
            _fail("stop", self.stop, "a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))
        if self.logprobs is not None:
            integer("logprobs", 0, MAX_LOGPROBS, f"None or an integer in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _softmax(z: np.ndarray) -> np.ndarray:
    """[..., V] -> [..., V] float64; -inf entries get probability 0."""
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """[V] -> [V] bool: the smallest most-likely set with mass >= top_p (ties: lower id first).

    Sorting 150k probabilities costs milliseconds, so the nucleus is first looked for among the
    TOP_P_CANDIDATES largest; the full sort runs only when that set cannot decide it exactly.
    """
    v = probs.shape[-1]
    m = min(TOP_P_CANDIDATES, v)
    if m < v:
        cand = np.argpartition(-probs, m - 1)[:m]
        order = cand[np.lexsort((cand, -probs[cand]))]
        cum = np.cumsum(probs[order])
        n = int(np.searchsorted(cum, top_p, side="left")) + 1
        # Exact only if the boundary value is strictly above every token left outside.
        if n < m and probs[order[n - 1]] > probs[order[-1]]:
            mask = np.zeros(v, dtype=bool)
            mask[order[:n]] = True
            return mask
    order = np.lexsort((np.arange(v), -probs))
    cum = np.cumsum(probs[order])
    n = min(int(np.searchsorted(cum, top_p, side="left")) + 1, v)
    mask = np.zeros(v, dtype=bool)
    mask[order[:n]] = True
    return mask


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[V] or [n, V] logits -> probabilities of the same shape (float64, rows sum to 1).

    The same function warps p (target) and q (draft)."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 2:
        return np.stack([warp(row, params) for row in z]) if len(z) else z.copy()
    if params.greedy:
        out = np.zeros_like(z)
        out[int(np.argmax(z))] = 1.0
        return out
    with np.errstate(over="ignore"):  # <= 0 first, so a tiny temperature gives -inf, never +inf
        z = (z - z.max()) / params.temperature
    if 0 < params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    probs = _softmax(z)
    if params.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, params.top_p), probs, 0.0)
        probs /= probs.sum()
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the model, and the most likely tokens at its
    position with theirs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """logits [n, V] and the n tokens emitted from those rows -> each token's log-probability
    under log_softmax(row) and the `top` most likely tokens of its row (ties: lower id first)."""
    out = []
    for row, t in zip(np.asarray(logits, dtype=np.float64), tokens, strict=True):
        z = row - row.max()
        lp = z - np.log(np.exp(z).sum())
        best: list[int] = []
        top = min(top, len(lp))
        if top:
            near = np.flatnonzero(lp >= np.partition(lp, -top)[-top])  # the top, ties included
            best = sorted(near.tolist(), key=lambda i: (-lp[i], i))[:top]
        out.append(TokenLogprob(int(t), float(lp[t]), tuple((int(i), float(lp[i])) for i in best)))
    return out


class LazyRows:
    """Row i of warp(logits, params), computed on first use: a verifier usually needs only
    the rows up to the rejection position, and each row of a 150k vocabulary costs time."""

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self._logits = logits  # [n, V]
        self._params = params
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> np.ndarray:
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = warp(self._logits[i], self._params)
        return row


class Sampler:
    """The request's own random source. Every random decision in a request goes through one
    of these two methods, so tests can substitute an enumerating sampler and compute exact
    output distributions."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def state(self) -> dict:
        """The random state now, for `set_state` (a round that failed draws nothing)."""
        return self._rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    def bernoulli(self, prob: float) -> bool:
        """True with probability `prob`; draws nothing when the outcome is certain."""
        if prob >= 1.0:
            return True
        if prob <= 0.0:
            return False
        return bool(self._rng.random() < prob)

    def categorical(self, probs: np.ndarray) -> int:
        """One index drawn with weights `probs` [V] (need not be normalised; zeros never drawn)."""
        cdf = np.cumsum(probs)
        u = self._rng.random() * cdf[-1]
        i = int(np.searchsorted(cdf, u, side="right"))
        # u < cdf[-1] always, but rounding can land past the end: take the last positive entry.
        if i >= len(cdf):
            i = int(np.flatnonzero(np.asarray(probs) > 0)[-1])
        return i
