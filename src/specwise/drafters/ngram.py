"""`NgramDrafter`: prompt lookup. Match the last n tokens of the context against earlier text
(prompt and output) and propose what followed the most recent match, longest n first.

Drafts are point masses (`probs=None`): the tokens are copied, not sampled. Each token's
confidence is the match length n scaled to (0, 1) — n / (max_ngram + 1) — a score, not a
probability: the controller calibrates it against observed acceptance. The index is updated
incrementally, so a propose costs O(n + k) however long the context is. Needs no model and no
tokenizer; it learns nothing across requests.

`NgramIndex` is the lookup itself, shared with the eagle layer, which reads each position's
continuation (`NgramIndex.after`, `continuations`) as an input beside the token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, measure_cheap, register
from specwise.sampling import Sampler, SamplingParams

__all__ = ["NgramDrafter", "NgramIndex", "continuations"]


class NgramIndex:
    """NgramIndex(max_n=4, min_n=1): the n-grams (min_n <= n <= max_n) of a growing token
    sequence, each mapped to the position right after its most recent occurrence. `push`
    appends a token; `match` and `after` find the longest, most recent earlier occurrence of
    the sequence's suffix (with `after`, of the sequence followed by a path of draft tokens)."""

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(
                f"n-gram sizes min_ngram={min_n}, max_ngram={max_n} are invalid; "
                f"need 1 <= min_ngram <= max_ngram"
            )
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        # for each n: n-gram -> position right after its most recent occurrence
        self.last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def push(self, token: int) -> None:
        """Append one token (the n-grams ending just before it gain it as their follower)."""
        toks = self.tokens
        toks.append(int(token))
        i = len(toks) - 1
        for n in range(self.min_n, min(self.max_n, i) + 1):
            self.last[n][tuple(toks[i - n : i])] = i

    def extend(self, context: Sequence[int]) -> None:
        """Push the tokens of `context` past those already pushed (`context` extends them)."""
        for x in context[len(self.tokens) :]:
            self.push(x)

    def match(self) -> tuple[int, int]:
        """(n, start) of the longest, most recent earlier occurrence of the sequence's last n
        tokens, start the position after it; (0, -1) where there is none."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks) - 1), self.min_n - 1, -1):
            start = self.last[n].get(tuple(toks[len(toks) - n :]))
            if start is not None:
                return n, start
        return 0, -1

    def after(self, path: Sequence[int] = ()) -> tuple[int, int]:
        """(token, n): what followed the longest, most recent earlier occurrence of the last
        n tokens of the sequence followed by `path` (occurrences that run into `path`
        included), as if `path` had been pushed; (-1, 0) where there is none."""
        if not path:
            n, start = self.match()
            return (self.tokens[start], n) if n else (-1, 0)
        toks = self.tokens
        # Occurrences that end at the last pushed token or later have their follower in
        # `path`; they start at most max_n tokens before the path.
        seq = toks[max(0, len(toks) - self.max_n) :] + list(path)
        q, first = len(seq) - 1, len(seq) - len(path) - 1  # the last; the earliest such end
        for n in range(min(self.max_n, len(toks) + len(path) - 1), self.min_n - 1, -1):
            suffix = seq[q - n + 1 :]
            for e in range(q - 1, max(first, n - 1) - 1, -1):
                if seq[e - n + 1 : e + 1] == suffix:
                    return seq[e + 1], n
            start = self.last[n].get(tuple(suffix))
            if start is not None:
                return toks[start], n
        return -1, 0


def continuations(tokens: Sequence[int], max_n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """For each position q of `tokens`: what followed the longest (n <= max_n), most recent
    earlier occurrence of tokens[q - n + 1 .. q], and n: arrays ([len], int64, -1 where none;
    [len], int8, 0 where none), as `NgramIndex.after` gives them one token at a time."""
    ix = NgramIndex(max_n)
    nxt = np.full(len(tokens), -1, dtype=np.int64)
    size = np.zeros(len(tokens), dtype=np.int8)
    for q, x in enumerate(tokens):
        ix.push(x)
        n, start = ix.match()
        if n:
            nxt[q], size[q] = ix.tokens[start], n
    return nxt, size


@register("ngram")
class NgramDrafter:
    name = "ngram"
    cheap = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        NgramIndex(max_ngram, min_ngram)  # sizes it cannot index are refused here, in one sentence
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.fingerprint = f"ngram:{min_ngram}-{max_ngram}"
        self._seqs: dict[int, NgramIndex] = {}

    def bind(self, target: LM) -> None:
        return None

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._seqs[seq] = NgramIndex(self.max_ngram, self.min_ngram)

    def match(self, seq: int, context: Sequence[int]) -> tuple[int, int]:
        """(n, start) of the longest, most recent earlier match of the context's suffix;
        (0, -1) when there is none."""
        ix = self._seqs.get(seq)
        if ix is None or len(context) < len(ix.tokens):  # contexts only grow within a request
            ix = self._seqs[seq] = NgramIndex(self.max_ngram, self.min_ngram)
        ix.extend(context)
        return ix.match()

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
