"""Acceptance rules: given a draft and the target's distributions, which tokens are emitted.

Words, said once (DESIGN.md §4): p is the target distribution and q the draft distribution,
both warped by `sampling.warp` with the same SamplingParams. A round proposes k draft tokens
x_1..x_k; the target scores k+1 positions, so p has k+1 rows. The rule keeps the longest
prefix it accepts (the *accepted* tokens) and then emits exactly one more token: the
*recovered* token at the rejection position, or the *bonus* token sampled from p after the
last draft token when all k were accepted.

Lossless rules (the output has exactly the target's distribution):

- `greedy_match`: temperature 0; accept while the draft equals the target's argmax.
- `rejection_sample`: Leviathan et al. 2023 / Chen et al. 2023. Accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); on rejection emit a token from norm(max(p_i − q_i, 0)).
  A point-mass draft (q = None) is q_i = one-hot(x_i).
- `sample_and_match`: draw y_i ~ p_i at each position and accept while y_i == x_i; the first
  y_i that differs is the recovered token. Needs no q, at the price of a lower acceptance
  rate than `rejection_sample` whenever q is not a point mass.

Tree drafts (several point-mass continuations sharing prefixes; `parents[i]` is node i's parent,
-1 for the root, which is the last emitted token; p row 0 follows the root, row i + 1 node i):

- `tree_greedy_match`: from the root, follow the child equal to the target's argmax; the
  first argmax that is no child is the recovered token (the bonus, at a leaf).
- `tree_sample_and_match`: the same with y ~ p at each node (SpecInfer's multi-candidate
  sample-and-match for deterministic candidates): every emitted token is a draw from the
  target's distribution after the tokens before it, so the output is exactly the target's.

Every rule is a pure function of arrays and a `Sampler` (the only source of randomness), so
tests can enumerate every random outcome and compute the exact output distribution.
This module imports no backend and knows nothing about caches or the round loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "Verdict",
    "acceptance_probability",
    "greedy_match",
    "rejection_sample",
    "residual",
    "sample_and_match",
    "tree_greedy_match",
    "tree_sample_and_match",
]


class _Random(Protocol):
    def bernoulli(self, prob: float) -> bool: ...
    def categorical(self, probs: np.ndarray) -> int: ...


class _Rows(Protocol):  # an [n, V] array or a LazyRows
    def __getitem__(self, i: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Verdict:
    """What a rule decided for one round."""

    accepted: int  # draft tokens kept (a prefix of the draft; a path from the root in a tree)
    tokens: list[int]  # emitted: the accepted draft tokens, then one recovered or bonus token
    bonus: bool  # True: the last token is the bonus (all k accepted); False: recovered
    path: tuple[int, ...] = ()  # a tree draft's accepted nodes, root first (empty for a chain)

    @property
    def rejection_position(self) -> int | None:
        """Index of the first rejected draft token, or None when every draft token was kept."""
        return None if self.bonus else self.accepted


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x) / q(x)): the chance that draft token x, drawn from q, is accepted."""
    if p_x >= q_x:
        return 1.0
    return p_x / q_x


def residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """[V] norm(max(p − q, 0)), the distribution of the recovered token after rejecting x.

    q = None is a point mass on x. If rounding leaves no mass (p and q equal up to float error,
    where rejection itself has probability ~0), falls back to p."""
    if q is None:
        r = p.copy()
        r[x] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total <= 0.0:
        return p
    return r / total


def greedy_match(draft: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """draft [k], target_argmax [k+1]: accept while draft[i] == target_argmax[i]."""
    k = len(draft)
    for i in range(k):
        if draft[i] != target_argmax[i]:
            return Verdict(i, [*draft[:i], int(target_argmax[i])], bonus=False)
    return Verdict(k, [*draft, int(target_argmax[k])], bonus=True)


def rejection_sample(draft: Sequence[int], q: _Rows | None, p: _Rows, sampler: _Random) -> Verdict:
    """draft [k], q [k, V] or None (point mass), p [k+1, V]: lossless speculative sampling."""
    k = len(draft)
    for i in range(k):
        x = int(draft[i])
        p_i = p[i]
        q_i = None if q is None else q[i]
        q_x = 1.0 if q_i is None else float(q_i[x])
        if q_x <= 0.0:
            raise ValueError(f"draft token {x} at position {i} has q = 0: it was not drawn from q")
        if sampler.bernoulli(acceptance_probability(float(p_i[x]), q_x)):
            continue
        recovered = sampler.categorical(residual(p_i, q_i, x))
        return Verdict(i, [*map(int, draft[:i]), recovered], bonus=False)
    return Verdict(k, [*map(int, draft), sampler.categorical(p[k])], bonus=True)


def sample_and_match(draft: Sequence[int], p: _Rows, sampler: _Random) -> Verdict:
    """draft [k], p [k+1, V]: draw from p at each position, accept while it equals the draft."""
    k = len(draft)
    for i in range(k):
        y = sampler.categorical(p[i])
        if y != draft[i]:
            return Verdict(i, [*map(int, draft[:i]), y], bonus=False)
    return Verdict(k, [*map(int, draft), sampler.categorical(p[k])], bonus=True)


def _tree_walk(tokens: Sequence[int], parents: Sequence[int], pick) -> Verdict:
    """Walk a tree draft from the root: `pick(row)` gives the token after the node whose p row
    is `row`; follow the child that equals it, stop at the first that none does."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, parent) in enumerate(zip(tokens, parents, strict=True)):
        if not -1 <= parent < i:
            raise ValueError(f"tree node {i} has parent {parent}; a parent comes before its child")
        if int(t) in children.setdefault(parent, {}):
            raise ValueError(f"tree node {i} repeats its sibling's token {int(t)}")
        children[parent][int(t)] = i
    node, path = -1, []
    while True:
        y = pick(node + 1)
        nxt = children.get(node, {}).get(y)
        if nxt is None:
            leaf = node not in children
            return Verdict(len(path), [*(int(tokens[i]) for i in path), y], leaf, tuple(path))
        node = nxt
        path.append(nxt)


def tree_greedy_match(
    tokens: Sequence[int], parents: Sequence[int], target_argmax: Sequence[int]
) -> Verdict:
    """tokens, parents [n], target_argmax [n+1]: follow the argmax through the tree."""
    return _tree_walk(tokens, parents, lambda row: int(target_argmax[row]))


def tree_sample_and_match(
    tokens: Sequence[int], parents: Sequence[int], p: _Rows, sampler: _Random
) -> Verdict:
    """tokens, parents [n], p [n+1, V]: draw y ~ p at each node, follow the child equal to y."""
    return _tree_walk(tokens, parents, lambda row: int(sampler.categorical(p[row])))
