"""`NgramDrafter`: prompt lookup. Match the last n tokens of the context against earlier text
(prompt and output) and propose what followed the most recent match, longest n first.

Drafts are point masses (`probs=None`): the tokens are copied, not sampled. Each token's
confidence is the match length n scaled to (0, 1) — n / (max_ngram + 1) — a score, not a
probability: the controller calibrates it against observed acceptance. The index is updated
incrementally, so a propose costs O(n + k) however long the context is. Needs no model and no
tokenizer; it learns nothing across requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, measure_cheap, register
from specwise.sampling import Sampler, SamplingParams

__all__ = ["NgramDrafter"]


@dataclass
class _Index:
    tokens: list[int] = field(default_factory=list)
    # for each n: n-gram -> position right after its most recent occurrence
    last: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    indexed: int = 0  # positions < indexed have their n-grams recorded


@register("ngram")
class NgramDrafter:
    name = "ngram"
    cheap = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"n-gram sizes min_ngram={min_ngram}, max_ngram={max_ngram} are invalid; "
                f"need 1 <= min_ngram <= max_ngram"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.fingerprint = f"ngram:{min_ngram}-{max_ngram}"
        self._seqs: dict[int, _Index] = {}

    def bind(self, target: LM) -> None:
        return None

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._seqs[seq] = _Index()

    def _update(self, ix: _Index, context: Sequence[int]) -> None:
        ix.tokens.extend(context[len(ix.tokens) :])
        toks = ix.tokens
        # Position i (1 <= i < len) records the n-grams that end just before it; the context's
        # own suffix has no follower yet and is not recorded.
        for i in range(max(ix.indexed, 1), len(toks)):
            for n in range(self.min_ngram, min(self.max_ngram, i) + 1):
                ix.last.setdefault(n, {})[tuple(toks[i - n : i])] = i
        ix.indexed = max(ix.indexed, len(toks))

    def match(self, seq: int, context: Sequence[int]) -> tuple[int, int]:
        """(n, start) of the longest, most recent earlier match of the context's suffix;
        (0, -1) when there is none."""
        ix = self._seqs.setdefault(seq, _Index())
        if len(context) < len(ix.tokens):  # contexts only grow within a request; else restart
            ix = self._seqs[seq] = _Index()
        self._update(ix, context)
        toks = ix.tokens
        for n in range(min(self.max_ngram, len(toks) - 1), self.min_ngram - 1, -1):
            start = ix.last.get(n, {}).get(tuple(toks[len(toks) - n :]))
            if start is not None:
                return n, start
        return 0, -1

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        if k <= 0:
            return Draft([], None)
        n, start = self.match(seq, context)
        if n == 0:
            return Draft([], None)
        toks = self._seqs[seq].tokens
        out = list(toks[start : start + k])
        return Draft(out, None, [n / (self.max_ngram + 1)] * len(out))

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        return None

    def end(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return 0

    def measure_cost(self) -> tuple[float, float]:
        return measure_cheap(self)
