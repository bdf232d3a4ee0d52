"""The n-gram index (`drafters.ngram.NgramIndex`, `continuations`), against the definition
written out by brute force over every short sequence of a three-token alphabet."""

import itertools

import pytest

from specwise.drafters.ngram import NgramDrafter, NgramIndex, continuations


def _brute(seq: list[int], max_n: int = 4, min_n: int = 1) -> tuple[int, int]:
    """What followed the longest, most recent earlier occurrence of seq's last n tokens."""
    q = len(seq) - 1
    for n in range(min(max_n, q), min_n - 1, -1):
        for e in range(q - 1, n - 2, -1):
            if seq[e - n + 1 : e + 1] == seq[q - n + 1 :]:
                return seq[e + 1], n
    return -1, 0


def test_after_and_continuations_follow_the_definition_on_every_short_sequence():
    for length in range(1, 8):
        for seq in map(list, itertools.product(range(3), repeat=length)):
            for cut in range(1, length + 1):  # pushed, then the rest as a draft path
                ix = NgramIndex()
                ix.extend(seq[:cut])
                assert ix.after(seq[cut:]) == _brute(seq), (seq, cut)
            nxt, size = continuations(seq)
            assert list(zip(nxt.tolist(), size.tolist(), strict=True)) == [
                _brute(seq[: q + 1]) for q in range(length)
            ]


def test_min_and_max_n_bound_the_match():
    ix = NgramIndex(max_n=2, min_n=2)
    seq = [5, 6, 7, 5, 6, 9, 5, 6]
    ix.extend(seq)
    assert ix.match() == (2, 5) and ix.after() == (9, 2)
    ix.extend([*seq, 9, 7])  # 7 alone occurred, but a 1-gram is below min_n
    assert ix.after() == (-1, 0)
    with pytest.raises(ValueError, match="min_ngram=3, max_ngram=2"):
        NgramIndex(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="min_ngram=0"):
        NgramDrafter(min_ngram=0)
