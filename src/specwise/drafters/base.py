"""The Drafter protocol, the Draft record, and the registry that builds drafters by name.

A drafter proposes up to k tokens for one sequence. Its invariants:

- q (`Draft.probs`) is warped by `sampling.warp` with the request's SamplingParams; a drafter
  that picks by argmax, or copies tokens (n-gram), returns `probs=None` (a point mass);
- all randomness comes from the request's `Sampler`, passed to `propose`;
- a drafter with a cache holds only committed tokens in it: after `commit`, its cache is a
  prefix of the committed tokens (it catches up on the rest at the next `propose`);
- a tree draft (`Draft.parents`: several continuations sharing prefixes) is offered only to a
  target that takes trees (`LM.trees`), is a point mass, and lists a parent before its
  children, so that every prefix of it is a tree.

Drafters never import the engine; the engine calls them only through this protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from specwise.acceptance import positions
from specwise.backends.base import LM, Reserved
from specwise.sampling import Sampler, SamplingParams

__all__ = [
    "DRAFTERS",
    "DRAFT_MODEL",
    "READS_STATES",
    "Draft",
    "Drafter",
    "KeepGoing",
    "make_drafter",
    "make_drafters",
    "measure_cheap",
    "register",
]


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [k'] with k' <= k (a drafter may propose fewer, even none)
    probs: np.ndarray | None  # [k', V] q warped with the request's params; None = point mass
    # [k'] the drafter's own probability of each token it proposed (its confidence), if it has
    # one: q(x) when sampling, the unwarped softmax probability of the argmax when greedy; in a
    # tree, given that its parent was accepted.
    confidence: list[float] | None = None
    # [k'] a tree: the index of each token's parent (-1: it follows the context); None: a chain
    parents: list[int] | None = None

    def scores(self) -> list[float | None]:
        """The confidence of each token, None where the drafter gives none."""
        return list(self.confidence) if self.confidence is not None else [None] * len(self.tokens)

    def prefix(self, n: int) -> Draft:
        """The first n tokens of the draft (with their q rows, confidences and parents: None
        where they make a chain)."""
        parents = None if self.parents is None else _tree_or_chain(self.parents[:n])
        if n >= len(self.tokens) and parents == self.parents:
            return self
        return Draft(
            self.tokens[:n],
            None if self.probs is None else self.probs[:n],
            None if self.confidence is None else self.confidence[:n],
            parents,
        )

    def chain(self) -> Draft:
        """The longest prefix of the draft that is a chain, as a chain."""
        if self.parents is None:
            return self
        n = next((i for i, q in enumerate(self.parents) if q != i - 1), len(self.tokens))
        return self.prefix(n)  # chain-shaped: its parents are None

    def shape(self) -> list[int]:
        """Each token's parent (-1: it follows the context), for a chain too."""
        return list(range(-1, len(self.tokens) - 1)) if self.parents is None else self.parents

    def depth(self) -> int:
        """Tokens on the draft's longest path (its length, for a chain)."""
        return max(positions(self.parents, len(self.tokens)), default=-1) + 1


def _tree_or_chain(parents: list[int]) -> list[int] | None:
    """A draft's parents, or None where they make a chain."""
    return None if all(q == i - 1 for i, q in enumerate(parents)) else parents


KeepGoing = Callable[
    [Sequence[float]], bool
]  # (the confidences of a draft path so far, each given the token before it) -> draft beneath?


@runtime_checkable
class Drafter(Protocol):
    name: str
    # True when proposing costs little beside a forward (the controller asks first, then keeps
    # the best prefix; an offer that is not free it asks only while it pays: `Controller.asks`);
    # False when each token costs a forward (the controller decides first).
    cheap: bool
    fingerprint: str  # identifies what the drafter runs (keys cached cost measurements)
    # Optional: the most tokens one proposal can hold (a drafter without it has no limit of
    # its own); the controller plans no longer drafts.
    max_tokens: int | None

    def bind(self, target: LM) -> None:
        """Check that this drafter can serve `target` (raise ValueError if not)."""
        ...

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        """A request starts on sequence `seq`. `tenant` names whose request it is (the
        server's API key, hashed): a drafter that learns across requests never drafts for one
        tenant from another's text."""
        ...

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        """Up to k tokens to follow `context` (the prompt and every committed token).
        A drafter that drafts one token at a time asks `keep_going` after each one (with the
        confidences drafted so far) and stops when it says no; one that drafts a tree asks it
        of a node (with the confidences along its path) before drafting its children."""
        ...

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        """The target kept `accepted` draft tokens, then emitted `emitted` in total."""
        ...

    def end(self, seq: int) -> None: ...

    def lag(self, seq: int, context: Sequence[int]) -> int:
        """Context tokens the drafter must process before it can draft (0 when in step)."""
        ...

    def measure_cost(self) -> tuple[float, float]:
        """Measured now, for the controller's cost model: (ms per proposed token, ms per
        context token caught up)."""
        ...


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


DRAFT_MODEL = ("model", "model-text", "cascade")  # the drafters that run a draft model (its LM)
READS_STATES = ("heads", "eagle")  # the drafters that read the target's hidden states


def make_drafters(
    names: Sequence[str], lm: LM | None = None, options: dict[str, dict] | None = None
) -> list[Drafter]:
    """The named drafters of one engine: those of DRAFT_MODEL run `lm` (model-text and cascade
    share the model drafter's caches when it is named too; cascade is guided by the cheap
    drafters named), the others take their `options`."""
    options = options or {}
    out = {n: make_drafter(n, **options.get(n, {})) for n in names if n not in DRAFT_MODEL}
    if "model" in names:
        out["model"] = make_drafter("model", lm=lm)
    shared = {"model": out["model"]} if "model" in out else {"lm": lm}
    if "model-text" in names:
        out["model-text"] = make_drafter("model-text", **shared)
    if "cascade" in names:
        guides = [d for d in out.values() if d.cheap]
        out["cascade"] = make_drafter("cascade", **shared, guides=guides)
    return [out[n] for n in names]


def measure_cheap(drafter: Drafter) -> tuple[float, float]:
    """`measure_cost` for a drafter that copies from text (cheap): ms per proposed token over
    20 proposals of 8 tokens on a 1,500-token context of a small alphabet (many matches), the
    context indexed first; no catch-up cost."""
    rng = np.random.default_rng(0)
    context = [int(t) for t in rng.integers(0, 50, size=2000)]
    seq, greedy = Reserved.DRAFTER_COST, SamplingParams()
    drafter.begin(seq, context[:1499])
    drafter.propose(seq, context[:1499], 8, greedy, None)  # type: ignore[arg-type]
    t = time.perf_counter()
    for i in range(20):
        drafter.propose(seq, context[: 1500 + i], 8, greedy, None)  # type: ignore[arg-type]
    drafter.end(seq)
    return (time.perf_counter() - t) * 1000.0 / (20 * 8), 0.0
