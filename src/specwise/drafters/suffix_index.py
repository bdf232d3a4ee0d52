"""Suffix indexes over token text: where the context's suffix occurred before, and what followed.

Two indexes answer the same question — the longest suffix of the context (up to MAX_MATCH
tokens) that occurred earlier, and the positions where it ended:

- `LiveIndex`, over one request's prompt and output: the tokens alone (4 bytes each), matched
  at each `find` against every earlier position at once;
- `SuffixIndex`, over earlier documents (whole requests: prompt and output), in immutable
  segments. A segment is the documents' tokens, each document after a separator, and the
  positions of its tokens sorted by the text read *backwards* from them (to MAX_MATCH tokens):
  a context suffix read backwards is then a prefix query, which narrows one token at a time
  by binary search. A new document is a segment of its own; the newest segments are merged
  like a binary counter (large merges on a background thread), so there are O(log n) small
  segments and one per `segment_tokens` beyond. A segment costs 8 bytes per token (text +
  order); past its budget the index drops its least recently used segment.

`tree` turns occurrences into a proposal: their continuations as a tree, grown best first, with
each token's share of the occurrences that reached it as its confidence; `chain` is the tree
of one branch, the most frequent continuation. This module knows no
drafter, engine or model.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_MATCH", "LiveIndex", "Occurrences", "SuffixIndex", "chain", "tree"]

MAX_MATCH = 12  # longest context suffix looked up, in tokens
SEP = -1  # between documents; never a token, so no match runs across two documents
MAX_OCCURRENCES = 64  # occurrences weighed per proposal (the most recent ones)
SYNC_MERGE_TOKENS = 1 << 18  # larger merges run on a background thread
_BYTES_PER_TOKEN = 8  # a segment's text and order
_SCAN = 64  # ranges this small are narrowed by one vectorised search


@dataclass
class Occurrences:
    """Where a context suffix of `length` tokens occurred: in `text`, the positions of its last
    token (so text[end + 1] is what followed)."""

    length: int
    text: np.ndarray  # int32 [n]
    ends: np.ndarray  # int64 positions in text


def chain(found: Sequence[Occurrences], k: int) -> tuple[list[int], list[float]]:
    """`tree` with one branch: the most frequent continuation, up to k tokens, and each
    token's confidence."""
    tokens, _, conf = tree(found, k, 1)
    return tokens, conf


def tree(
    found: Sequence[Occurrences], k: int, branches: int = 1
) -> tuple[list[int], list[int], list[float]]:
    """The continuations of the occurrences as a tree of up to k tokens: (tokens, parents
    (-1: after the context), confidence of each token). A token's confidence is the share
    c / n of the n occurrences that reached its parent which continued with it, times
    m / (m + 2) with m the tokens matched so far (a long match is a better predictor): a score
    in (0, 1) that the controller calibrates. Each token gets up to `branches` children, the
    most frequent first (ties: the most recent occurrence; occurrences are listed oldest
    first), and the tree grows best first by the product of the confidences on a token's
    path, so every prefix of the tokens is a tree, and the best of its size by that score.
    With one branch it is a chain: the most frequent continuation, token by token."""
    if not found or k <= 0:
        return [], [], []
    tokens: list[int] = []
    parents: list[int] = []
    conf: list[float] = []
    order = itertools.count()  # among equal scores, the better-ranked sibling first
    alive = [(o.text, int(e) + 1) for o in found for e in o.ends]
    frontier: list = []  # (-path score, rank, parent, token, its occurrences, matched, conf)

    def offer(parent: int, alive: list, m: int, score: float) -> None:
        nxt = [(text, p, int(text[p])) for text, p in alive if p < len(text) and text[p] != SEP]
        counts = Counter(t for _, _, t in nxt)
        recent = {t: i for i, (_, _, t) in enumerate(nxt)}
        ranked = sorted(counts, key=lambda t: (counts[t], recent[t]), reverse=True)
        for t in ranked[:branches]:
            c = counts[t] / len(alive) * (m / (m + 2))
            follow = [(text, p + 1) for text, p, x in nxt if x == t]
            heapq.heappush(frontier, (-score * c, next(order), parent, t, follow, m + 1, c))

    offer(-1, alive, found[0].length, 1.0)
    while frontier and len(tokens) < k:
        neg, _, parent, t, follow, m, c = heapq.heappop(frontier)
        tokens.append(t)
        parents.append(parent)
        conf.append(c)
        offer(len(tokens) - 1, follow, m, -neg)
    return tokens, parents, conf


class LiveIndex:
    """One request's tokens as they arrive. Nothing is indexed per token: `find` compares the
    context's last tokens with every earlier position at once (numpy), which costs
    microseconds for a request's length and nothing when a long prompt arrives."""

    def __init__(self) -> None:
        self._text = np.empty(256, np.int32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        """The tokens seen so far (a view)."""
        return self._text[: self._n]

    def extend(self, context: Sequence[int]) -> None:
        """Take the tokens of `context` past those already seen (a context only grows)."""
        start, end = self._n, len(context)
        if end <= start:
            return
        if end > len(self._text):
            grown = np.empty(max(2 * len(self._text), end), np.int32)
            grown[:start] = self._text[:start]
            self._text = grown
        self._text[start:end] = context[start:end]
        self._n = end

    def find(self, context: Sequence[int]) -> Occurrences | None:
        """The longest suffix of `context` (which must be what was seen) that occurred
        before its last position (up to MAX_MATCH tokens), and where (the most recent
        MAX_OCCURRENCES)."""
        self.extend(context)
        text, last = self._text, self._n - 1
        if last < 1:
            return None
        ends = np.flatnonzero(text[:last] == text[last])  # where its last token occurred
        if not len(ends):
            return None
        length = 1
        while length < MAX_MATCH:  # keep the positions where the match goes one further back
            ok = ends >= length
            ok[ok] = text[ends[ok] - length] == text[last - length]
            if not ok.any():
                break
            ends, length = ends[ok], length + 1
        return Occurrences(length, text[: last + 1], ends[-MAX_OCCURRENCES:].astype(np.int64))


def _backward_order(text: np.ndarray) -> np.ndarray:
    """Positions of `text`, sorted by the tokens read backwards from each (to MAX_MATCH tokens;
    ties by position), keeping only positions of a token that is followed by one."""
    n = len(text)
    rev = text[::-1].astype(np.int64)
    rank = rev - SEP  # >= 0
    h = 1
    while h < min(MAX_MATCH, n):  # prefix doubling: rank by 2h tokens from ranks by h
        nxt = np.zeros(n, np.int64)
        nxt[: n - h] = rank[h:] + 1
        key = rank * (int(nxt.max()) + 1) + nxt
        _, rank = np.unique(key, return_inverse=True)
        rank = rank.reshape(-1).astype(np.int64)
        h *= 2
    order = np.argsort(rank, kind="stable")  # positions in rev, i.e. n - 1 - position in text
    ends = (n - 1 - order).astype(np.int32 if n < 1 << 31 else np.int64)
    follow = np.zeros(n, bool)
    follow[:-1] = (text[:-1] != SEP) & (text[1:] != SEP)
    return ends[follow[ends]]


@dataclass(eq=False)  # compared by identity
class _Segment:
    text: np.ndarray  # int32: SEP doc SEP doc ... SEP
    order: np.ndarray  # int32 positions, sorted backwards (see _backward_order)
    starts: np.ndarray  # int64 [docs] position of each document's first token
    docs: list[int]  # document ids, in text order
    used: float = 0.0  # when a draft last came from it, or it was built (monotonic)

    @classmethod
    def build(cls, docs: Sequence[tuple[int, np.ndarray]]) -> _Segment:
        parts, starts, pos = [np.array([SEP], np.int32)], [], 1
        for _, toks in docs:
            starts.append(pos)
            parts += [toks.astype(np.int32), np.array([SEP], np.int32)]
            pos += len(toks) + 1
        text = np.concatenate(parts)
        order = _backward_order(text)
        return cls(
            text, order, np.asarray(starts, np.int64), [d for d, _ in docs], time.monotonic()
        )

    @property
    def nbytes(self) -> int:
        return self.text.nbytes + self.order.nbytes + self.starts.nbytes

    def doc_tokens(self) -> list[tuple[int, np.ndarray]]:
        ends = [*(self.starts[1:] - 1), len(self.text) - 1]
        return [(d, self.text[s:e]) for d, s, e in zip(self.docs, self.starts, ends, strict=True)]

    def find(self, context: Sequence[int]) -> Occurrences | None:
        """The longest suffix of `context` (to MAX_MATCH tokens) that occurs here, narrowing
        the sorted positions one token (read backwards) at a time."""
        text, order = self.text, self.order
        lo, hi, m = 0, len(order), 0
        while m < min(MAX_MATCH, len(context)):
            c = int(context[-1 - m])
            if hi - lo <= _SCAN:
                col = text[order[lo:hi] - m]
                a = lo + int(np.searchsorted(col, c, "left"))
                b = lo + int(np.searchsorted(col, c, "right"))
            else:
                key = _Column(text, order, m)
                a = bisect.bisect_left(key, c, lo, hi)
                b = bisect.bisect_right(key, c, a, hi)
            if a == b:
                break
            lo, hi, m = a, b, m + 1
        if m == 0:
            return None
        ends = order[lo:hi]
        if len(ends) > MAX_OCCURRENCES:  # the most recent ones
            ends = np.partition(ends, len(ends) - MAX_OCCURRENCES)[-MAX_OCCURRENCES:]
        return Occurrences(m, text, np.sort(ends))


class _Column:
    """The m-th token read backwards from each sorted position, as a sequence for `bisect`."""

    def __init__(self, text: np.ndarray, order: np.ndarray, m: int) -> None:
        self.text, self.order, self.m = text, order, m

    def __getitem__(self, i: int) -> int:
        return int(self.text[self.order[i] - self.m])

    def __len__(self) -> int:
        return len(self.order)


class SuffixIndex:
    """Earlier documents, searchable by context suffix, within `budget_bytes`.

    Segments are merged like a binary counter up to `segment_tokens` (an eighth of the budget,
    within 1K..4M tokens): merges of up to SYNC_MERGE_TOKENS are done at once, larger ones on a
    background thread while lookups go on over the segments being merged. Past the budget the
    least recently used segment is dropped (a segment is used when it is built or drafted
    from): whole segments, so that no drop rebuilds anything."""

    def __init__(self, budget_bytes: int = 256 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.segment_tokens = min(max(budget_bytes // (8 * _BYTES_PER_TOKEN), 1 << 10), 1 << 22)
        self._segments: list[_Segment] = []
        self._lock = threading.Lock()
        self._busy: tuple[_Segment, ...] = ()  # the segments a background merge is reading
        self._next = 0  # the next document id

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._segments)

    @property
    def documents(self) -> int:
        return sum(len(s.docs) for s in self._segments)

    def add(self, tokens: Sequence[int]) -> None:
        """Index one more document (a request's prompt and output)."""
        self._add_many([np.asarray(tokens, np.int32)])

    def _add_many(self, documents: Sequence[np.ndarray]) -> None:
        """Index documents, oldest first, in segments of up to `segment_tokens`."""
        batch: list[tuple[int, np.ndarray]] = []
        size = 0
        built: list[_Segment] = []
        for toks in documents:
            if len(toks) < 2 or _BYTES_PER_TOKEN * len(toks) > self.budget_bytes:
                continue
            doc, self._next = self._next, self._next + 1
            if batch and size + len(toks) > self.segment_tokens:
                built.append(_Segment.build(batch))
                batch, size = [], 0
            batch.append((doc, toks))
            size += len(toks) + 1
        if batch:
            built.append(_Segment.build(batch))
        with self._lock:
            self._segments = [*self._segments, *built]
            self._fit()
        self._merge()

    def _pair(self) -> tuple[_Segment, _Segment] | None:
        """The two newest segments if they are due to merge (the newer at least half the older,
        together within `segment_tokens`, neither in a background merge)."""
        segs = self._segments
        if len(segs) < 2:
            return None
        old, new = segs[-2], segs[-1]
        if 2 * len(new.text) < len(old.text) or len(old.text) + len(new.text) > self.segment_tokens:
            return None
        if old in self._busy or new in self._busy:
            return None
        return old, new

    def _merge(self) -> None:
        while True:
            with self._lock:
                pair = self._pair()
                if pair is None:
                    return
                if len(pair[0].text) + len(pair[1].text) > SYNC_MERGE_TOKENS:
                    if not self._busy:
                        self._busy = pair
                        threading.Thread(target=self._merge_behind, daemon=True).start()
                    return
            self._swap(pair, _Segment.build(pair[0].doc_tokens() + pair[1].doc_tokens()))

    def _merge_behind(self) -> None:
        old, new = self._busy
        try:
            merged = _Segment.build(old.doc_tokens() + new.doc_tokens())
        finally:
            with self._lock:
                self._busy = ()
        self._swap((old, new), merged)
        self._merge()

    def _swap(self, pair: tuple[_Segment, _Segment], merged: _Segment) -> None:
        """Put `merged` in place of `pair`, if both are still there (a drop may have come
        first: then the merge is thrown away)."""
        with self._lock:
            segs = self._segments
            at = next((i for i, s in enumerate(segs) if s is pair[0]), None)
            if at is None or at + 1 >= len(segs) or segs[at + 1] is not pair[1]:
                return
            merged.used = max(pair[0].used, pair[1].used)
            self._segments = [*segs[:at], merged, *segs[at + 2 :]]

    def _fit(self) -> None:
        """Drop least recently used segments (not the newest) while over the budget; under
        the lock."""
        while self.nbytes > self.budget_bytes and len(self._segments) > 1:
            self.drop_oldest()

    def oldest(self) -> float:
        """When the least recently used segment was last used (inf when there is none)."""
        return min((s.used for s in self._segments), default=float("inf"))

    def drop_oldest(self) -> int:
        """Drop the least recently used segment; return the bytes freed."""
        if not self._segments:
            return 0
        victim = min(self._segments, key=lambda s: s.used)
        self._segments = [s for s in self._segments if s is not victim]
        return victim.nbytes

    def find(self, context: Sequence[int]) -> list[Occurrences]:
        """The occurrences of the longest context suffix found in any segment (several
        segments when they match it equally long), oldest segment first."""
        found = [o for s in self._segments if (o := s.find(context)) is not None]
        if not found:
            return []
        m = max(o.length for o in found)
        return [o for o in found if o.length == m]

    def touch(self, found: Sequence[Occurrences]) -> None:
        """Mark the segments of these occurrences as used now."""
        now = time.monotonic()
        texts = {id(o.text) for o in found}
        for s in self._segments:
            if id(s.text) in texts:
                s.used = now

    def snapshot(self) -> list[_Segment]:
        """The index as it is now (segments are immutable, so this is cheap), for `restore`."""
        return list(self._segments)

    def restore(self, state: list[_Segment]) -> None:
        with self._lock:
            self._segments = list(state)

    # -- persistence -------------------------------------------------------------------------
    def dump(self) -> tuple[np.ndarray, np.ndarray]:
        """Every document, least recently used segment first: (tokens concatenated, lengths)."""
        docs = [d for s in sorted(self._segments, key=lambda s: s.used) for _, d in s.doc_tokens()]
        tokens = np.concatenate(docs) if docs else np.zeros(0, np.int32)
        return tokens, np.asarray([len(t) for t in docs], np.int64)

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Add documents as `dump` lists them (oldest first)."""
        bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._add_many([tokens[a:b] for a, b in itertools.pairwise(bounds)])
