"""`CascadeDrafter` (`cascade`): the draft model guided by the cheap drafters.

Staged / cascade speculative decoding: a cheap drafter's guess of what the draft model will
pick is checked by the draft model in the same forward as its catch-up, so a right guess saves
the draft model one-token steps. The draft is the draft model's own (what `ModelDrafter`
drafts without a guess: the same tokens, q and random draws, on an LM that computes a row
alike in a forward of one token or of several; llama.cpp's kernels may round them apart, which
can move a near-tie of the draft's), and it is verified like any draft, with the same lossless
rules; only the drafting cost differs, and the controller learns it under this drafter's name,
round by round, beside the model drafter's.

A guessed token is not free: its row costs the draft model's forward some more (the output
layer runs for it), which on a CPU where a forward of several tokens is compute-bound is a good
part of a one-token step. So the cascade guesses the i-th token only while what it expects to
save pays for it: h_i · c_1 > b, with h_i the rate at which the draft model picked the guides'
first i tokens (learnt every round from what it drafted, guessed or not: a guess that is not fed
is still checked against the draft), c_1 its one-token step and b what one more row adds to a
forward, both timed on the draft model's own forwards (`ModelDrafter.timed`); before any
forward of a guess was timed, every guessed token is fed. This module verifies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwise.backends.base import LM
from specwise.backends.curves import blend
from specwise.drafters.base import Draft, Drafter, KeepGoing, register
from specwise.drafters.model import ModelDrafter
from specwise.drafters.ngram import NgramDrafter
from specwise.sampling import Sampler, SamplingParams

__all__ = ["CascadeDrafter"]


@register("cascade")
class CascadeDrafter:
    """The draft model, guided by the cheap drafters (Staged / Cascade Speculative Decoding):
    the longest chain the guides offer is fed to the draft model with its catch-up in one
    forward, and wherever the draft model picks what a guide guessed, its next row is already
    there; where it departs, it drafts on token by token. Its draft is the `ModelDrafter`'s
    (the same tokens and q, from the same random draws): only what drafting costs differs,
    which the controller learns round by round under this drafter's own name. Give it the
    `ModelDrafter` to share the draft model's caches with (both in one engine) and the
    engine's cheap drafters as guides; without guides it guides itself with an n-gram
    drafter of its own."""

    name = "cascade"
    cheap = False

    def __init__(
        self,
        lm: LM | None = None,
        model: ModelDrafter | None = None,
        guides: Sequence[Drafter] = (),
    ) -> None:
        if (lm is None) == (model is None):
            raise ValueError("a cascade drafter needs the draft model's LM or its ModelDrafter")
        self.model = model if model is not None else ModelDrafter(lm)  # type: ignore[arg-type]
        self._own = not guides  # guides of its own get the lifecycle calls from it
        self.guides = list(guides) or [NgramDrafter()]
        self.note: str | None = None
        self.fingerprint = f"cascade:{self.model.fingerprint}"
        # ms: "step", c_1, the draft model's one-token step; "row", b, what one more row adds
        # to a forward of a guess
        self.ms: dict[str, float] = {}
        self.hits: dict[int, float] = {}  # i-1 -> h_i over requests; a request's start here
        self._hits: dict[int, dict[int, float]] = {}  # seq -> h_i of its own rounds

    def bind(self, target: LM) -> None:
        if self.model.width != target.vocab_size or self.model.note is None:
            self.model.bind(target)
        if self.model.vocab is not None:
            raise ValueError(
                "the cascade drafter needs a draft model with the target's tokenizer (the "
                "guides' tokens are the target's); use the model or model-text drafter"
            )
        for g in self.guides if self._own else ():
            g.bind(target)
        self.note = self.model.note

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._hits[seq] = dict(self.hits)
        self.model.begin(seq, prompt, tenant)
        for g in self.guides if self._own else ():
            g.begin(seq, prompt, tenant)

    def guess(self, seq: int, context: Sequence[int], k: int, params: SamplingParams) -> list[int]:
        """The longest chain the guides offer for this context (at most k tokens)."""
        best: list[int] = []
        for g in self.guides:
            offer = g.propose(seq, context, k, params, None)  # type: ignore[arg-type]
            chain = offer.chain().tokens
            if len(chain) > len(best):
                best = list(chain)
        return best

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        offer = self.guess(seq, context, k - 1, params)
        draft = self.model.propose(
            seq, context, k, params, sampler, keep_going, offer[: self.worth(seq, len(offer))]
        )
        self._learn(seq, offer, draft.tokens)
        return draft

    def worth(self, seq: int, n: int) -> int:
        """How many of a guess of n tokens to feed (the module docstring's rule)."""
        if "row" not in self.ms:
            return n
        hits = self._hits.get(seq, self.hits)
        g = 0
        while g < n and hits.get(g, 1.0) * self.ms["step"] > self.ms["row"]:
            g += 1
        return g

    def _learn(self, seq: int, offer: Sequence[int], drafted: Sequence[int]) -> None:
        """h_i from this round's draft (fed or not), c_1 and b from its timed forwards."""
        mine = self._hits.setdefault(seq, dict(self.hits))
        for i in range(min(len(offer), len(drafted))):
            hit = float(all(offer[j] == drafted[j] for j in range(i + 1)))
            blend(mine, i, hit)
            blend(self.hits, i, hit)
        for n, ms in sorted(self.model.timed):  # the steps first: a row is priced against one
            if n == 1:
                blend(self.ms, "step", ms)
            elif "step" in self.ms:
                blend(self.ms, "row", max(0.0, (ms - self.ms["step"]) / (n - 1)))

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        self.model.commit(seq, accepted, emitted)
        for g in self.guides if self._own else ():
            g.commit(seq, accepted, emitted)

    def end(self, seq: int) -> None:
        self._hits.pop(seq, None)
        self.model.end(seq)
        for g in self.guides if self._own else ():
            g.end(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return self.model.lag(seq, context)

    def measure_cost(self) -> tuple[float, float]:
        return self.model.measure_cost()  # with no guess right: the model's; rounds teach more
