"""The Drafter protocol, the Draft record, and the registry that builds drafters by name.

A drafter proposes up to k tokens for one sequence. Its invariants:

- q (`Draft.probs`) is warped by `sampling.warp` with the request's SamplingParams; a drafter
  that picks by argmax, or copies tokens (n-gram), returns `probs=None` (a point mass);
- all randomness comes from the request's `Sampler`, passed to `propose`;
- a drafter with a cache holds only committed tokens in it: after `commit`, its cache is a
  prefix of the committed tokens (it catches up on the rest at the next `propose`).

Drafters never import the engine; the engine calls them only through this protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from specwise.backends.base import LM
from specwise.sampling import Sampler, SamplingParams

__all__ = ["DRAFTERS", "Draft", "Drafter", "make_drafter", "register"]


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [k'] with k' <= k (a drafter may propose fewer, even none)
    probs: np.ndarray | None  # [k', V] q warped with the request's params; None = point mass


@runtime_checkable
class Drafter(Protocol):
    name: str

    def bind(self, target: LM) -> None:
        """Check that this drafter can serve `target` (raise ValueError if not)."""
        ...

    def begin(self, seq: int, prompt: Sequence[int]) -> None: ...

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
    ) -> Draft:
        """Up to k tokens to follow `context` (the prompt and every committed token)."""
        ...

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        """The target kept `accepted` draft tokens, then emitted `emitted` in total."""
        ...

    def end(self, seq: int) -> None: ...


DRAFTERS: dict[str, Callable[..., Drafter]] = {}


def register(name: str) -> Callable[[Callable[..., Drafter]], Callable[..., Drafter]]:
    def deco(factory: Callable[..., Drafter]) -> Callable[..., Drafter]:
        DRAFTERS[name] = factory
        return factory

    return deco


def make_drafter(name: str, **options: Any) -> Drafter:
    """Build the drafter registered under `name` (e.g. "ngram", or "model" with lm=...)."""
    factory = DRAFTERS.get(name)
    if factory is None:
        raise ValueError(f"unknown drafter {name!r}; known drafters: {', '.join(sorted(DRAFTERS))}")
    return factory(**options)
