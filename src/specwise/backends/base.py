"""The LM and Tokenizer protocols every backend implements, and the draft/target vocabulary check.

An LM is a model plus its KV cache for several sequences at once. Its cache invariant: after
`forward(seq, tokens)` the cache of `seq` holds every token fed so far; `truncate(seq, n)` keeps
the first n (rollback is setting a length).

Token trees (an LM whose `trees` is True): `forward` may feed an entry's tokens as a tree,
`parents[j]` the index of token j's parent among them (-1 for the first token, which follows the
cache; a parent comes before its children). Each token then sees the cache and its own
ancestors only, at position cache length + its depth, so its logits are those of its path fed
as a chain, all in one call. Until `keep(seq, path)` chooses the path that stays (or `truncate`
drops the tree), the sequence holds the whole tree and takes no other forward.

Hidden states (an LM whose `hidden_size` is not 0, built to give them): every forward also
keeps the final hidden state (the output layer's input) of each row it returns logits for, and
`hidden(seq)` gives the one at the sequence's last cached position, the state from which the
target predicted the token after it: after a round's rollback, the state that predicted the
round's last emitted token. `hiddens(seq, start)` gives those of the cached positions from
`start` on, or from the first one it keeps after it: a backend keeps the states of consecutive
positions up to the last cached one, from the first row of the forward that began them (a
prefill asked for its last row only: that row's position).

Layer states (an LM built with `hidden=(i, j, ...)`, layer indices; its `hidden_layers`): the
state of a position is then the outputs of those layers there, side by side
([len(layers) * width]), kept for every token fed, a prefill's too, and `read(seq, tokens)`
feeds tokens computing no logits at all, returning their layer states and their final hidden
states (teacher forcing: the layers of a drafter's data, and what the target predicted there).
This module holds no model code.
"""

from __future__ import annotations

import hashlib
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "LM",
    "BackendInfo",
    "HiddenLog",
    "NoLayerStates",
    "Reserved",
    "Tokenizer",
    "check_append",
    "check_layers",
    "check_same_vocab",
    "check_tree",
    "check_truncate",
    "file_fingerprint",
    "new_sequence",
    "one_pass_each",
    "refuse_trees",
]


@dataclass(frozen=True)
class BackendInfo:
    backend: str  # "torch", "llama_cpp" or "ik_llama"
    model: str  # where the weights came from (path, catalog name or "in-memory")
    threads: int | None
    fingerprint: str  # identifies the weights; keys cached measurements
    exact: bool = False  # logits depend on a sequence's tokens alone, bit for bit (`LM.exact`)
    library: str = ""  # identifies the library that computes, where one backend has several


class Reserved:
    """The sequence ids specwise's own checks use on an LM; `new_sequence` never hands them out
    (they are negative)."""

    ORACLE = -1  # plain decoding for reference (`specwise.oracle`)
    CALIBRATION = -2  # the cost curve (`specwise.costs`)
    DRAFTER_COST = -3  # a cheap drafter's cost (`specwise.drafters.base.measure_cheap`)
    CHECK = -4  # the bench's equivalence checks (`specwise.bench.runner`)


_next_ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def new_sequence(lm: LM) -> int:
    """A sequence id for `lm` that nothing else holds: ids count up from 0 per LM, so several
    engines on one target never share a sequence."""
    ids = _next_ids.get(lm)
    if ids is None:
        ids = _next_ids[lm] = itertools.count()
    return next(ids)


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]
    n_tokens: int  # real tokens (ids >= n_tokens, if any, are unused padding of the logits)

    def encode(self, text: str, add_special: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...  # special tokens are left out
    def render_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...  # the vocabulary entry, for comparisons


@runtime_checkable
class LM(Protocol):
    vocab_size: int  # width of a logits row
    context_length: int  # tokens one sequence's cache can hold
    eos_token_ids: frozenset[int]
    tokenizer: Tokenizer | None
    info: BackendInfo
    exact: bool  # a row's logits do not depend on the call's shape or other sequences, bit for bit
    trees: bool  # forward takes token trees (module docstring)
    hidden_size: int  # width of a hidden state; 0: this LM gives none (module docstring)
    hidden_layers: tuple[int, ...]  # the layers whose outputs a state holds; (): the final state

    def forward(
        self,
        batch: Sequence[tuple[int, Sequence[int]]],
        last_only: bool = False,
        rows: Sequence[int] | None = None,
        trees: Sequence[Sequence[int] | None] | None = None,
    ) -> list[np.ndarray]:
        """One call, many sequences: append each (seq, tokens) to seq's cache and return its
        logits [len(tokens), V] float32, or [1, V] (the last position) with last_only, or
        [rows[i], V] (its first rows[i] positions, 1 <= rows[i] <= len(tokens)) for entry i
        with rows: the positions after those are fed, and a backend that can skips their
        logits (on llama.cpp the output layer runs only for rows asked for). trees[i]: None
        (a chain) or the parents of entry i's tokens (a tree: module docstring; only where
        `trees` is True)."""
        ...

    def keep(self, seq: int, path: Sequence[int]) -> None:
        """After a forward that fed `seq` a tree: keep the cache before it and the tree's tokens
        at `path` (indices into the tree, a chain from its first token down), drop the rest."""
        ...

    def passes(self, calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """How one `forward` over these (seq, number of tokens) pairs would run: (sequences,
        tokens each) for every pass of the model it makes, for pricing a call before making it."""
        ...

    def hidden(self, seq: int) -> np.ndarray | None:
        """The final hidden state [hidden_size] at seq's last cached position, where the
        latest forward that fed seq returned that position's logits; else None."""
        ...

    def hiddens(self, seq: int, start: int) -> np.ndarray | None:
        """The final hidden states [n, hidden_size] at seq's cached positions length - n ..
        length - 1, from `start` or from the first one kept after it (module docstring); None
        where the last one is not kept."""
        ...

    def read(self, seq: int, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Teacher forcing, on an LM with `hidden_layers`: append `tokens` to seq's cache,
        computing no logits, and return their layer states [n, hidden_size] and their final
        hidden states [n, width] (the output layer's input: what the model predicted there)."""
        ...

    def length(self, seq: int) -> int: ...
    def truncate(self, seq: int, n: int) -> None: ...
    def release(self, seq: int) -> None: ...
    def in_use(self) -> int: ...  # sequences holding cache now (0 once all are released)


class NoLayerStates(ValueError):
    """The backend cannot give the outputs of the layers asked for (`LM.hidden_layers`), only
    its final hidden state, if that."""


def check_layers(hidden: bool | Sequence[int], n_layers: int) -> tuple[int, ...]:
    """The layer indices of `hidden` (an LM's argument: True or False for the final state
    or none, or the indices of the layers whose outputs a state holds), checked against the
    model's `n_layers`: ValueError naming the value where one is out of range or repeated."""
    if isinstance(hidden, bool):
        return ()
    layers = tuple(int(i) for i in hidden)
    if not layers or len(set(layers)) != len(layers) or not all(0 <= i < n_layers for i in layers):
        raise ValueError(
            f"hidden layers {list(layers)} are invalid; name distinct layers 0..{n_layers - 1}"
        )
    return layers


class HiddenLog:
    """The final hidden states a backend kept of one sequence, at consecutive positions
    first .. first + n - 1. `put` writes a forward's rows at their positions (rows that do not
    follow on from those kept start the log again); `cut` drops positions from a length on;
    `reorder` keeps a fed tree's path (`LM.keep`)."""

    def __init__(self, width: int) -> None:
        self.first, self.n = 0, 0
        self._rows = np.empty((0, width), dtype=np.float32)

    def put(self, start: int, rows: np.ndarray) -> None:
        if not self.first <= start <= self.first + self.n:
            self.first, self.n = start, 0
        i = start - self.first
        end = i + len(rows)
        if end > len(self._rows):  # room for twice as many: appending costs O(1) a row
            grown = np.empty((max(end, 2 * len(self._rows)), self._rows.shape[1]), np.float32)
            grown[: self.n] = self._rows[: self.n]
            self._rows = grown
        self._rows[i:end] = rows
        self.n = end

    def cut(self, length: int) -> None:
        self.n = max(0, min(self.n, length - self.first))

    def reorder(self, base: int, path: Sequence[int]) -> None:
        """The rows of a tree fed at `base` (one per token, in the tree's order): keep those of
        `path`, at positions base .. base + len(path) - 1."""
        i = base - self.first
        if i < 0 or i + max(path) >= self.n:
            self.n = 0
            return
        self._rows[i : i + len(path)] = self._rows[[i + j for j in path]]
        self.n = i + len(path)

    def since(self, start: int, length: int) -> np.ndarray | None:
        """The rows of positions start .. length - 1, or from the first one kept after start (a
        copy); None where position length - 1 is not kept."""
        if not self.first < length <= self.first + self.n:
            return None
        return self._rows[max(0, start - self.first) : length - self.first].copy()

    def at(self, position: int) -> np.ndarray | None:
        """The row of one position (a copy), None where it is not kept."""
        got = self.since(position, position + 1)
        return None if got is None else got[-1]


def one_pass_each(calls: Sequence[tuple[int, int]], width: int) -> list[tuple[int, int]]:
    """How a call over (sequence, tokens) pairs runs when each sequence is fed on its own, at
    most `width` tokens at a time (exact mode): one pass per sequence and per `width` tokens."""
    return [(1, min(width, n - i)) for _, n in calls for i in range(0, n, width)]


def check_rows(
    batch: Sequence[tuple[int, Sequence[int]]], rows: Sequence[int] | None, last_only: bool
) -> None:
    """Raise ValueError unless `rows` (for `LM.forward`) asks each entry for 1..len(tokens)."""
    if rows is None:
        return
    if last_only:
        raise ValueError("forward takes last_only or rows, not both")
    if len(rows) != len(batch):
        raise ValueError(f"forward got {len(rows)} row counts for {len(batch)} entries")
    for (seq, tokens), n in zip(batch, rows, strict=True):
        if not 1 <= n <= len(tokens):
            raise ValueError(
                f"forward asked for {n} logits rows of sequence {seq}, which brings "
                f"{len(tokens)} tokens; ask for 1 .. {len(tokens)}"
            )


def check_tree(seq: int, n: int, parents: Sequence[int] | None) -> list[int]:
    """The depth of each of n tokens fed as a tree (`LM.forward`), or ValueError unless
    `parents` is such a tree: one parent per token, the first token's -1, every other's an
    earlier token."""
    if parents is None or len(parents) != n:
        raise ValueError(f"the tree of sequence {seq} has {n} tokens and needs {n} parents")
    depth: list[int] = []
    for j, q in enumerate(parents):
        if (j == 0) != (q == -1) or not -1 <= q < j:
            raise ValueError(
                f"token {j} of sequence {seq}'s tree has parent {q}; the first token's is -1, "
                f"every other's an earlier token"
            )
        depth.append(0 if j == 0 else depth[q] + 1)
    return depth


def refuse_trees(backend: str, trees: Sequence[Sequence[int] | None] | None) -> None:
    """For an LM whose `trees` is False: raise ValueError if a forward brings a tree."""
    if trees is not None and any(t is not None for t in trees):
        raise ValueError(f"{backend} takes no token trees here; feed chains")


def check_path(seq: int, parents: Sequence[int], path: Sequence[int]) -> None:
    """Raise ValueError unless `path` is a chain of the tree from its first token down."""
    ok = bool(path) and path[0] == 0
    pairs = itertools.pairwise(path)
    ok = ok and all(0 <= j < len(parents) and parents[j] == i for i, j in pairs)
    if not ok:
        raise ValueError(
            f"keep({seq}, {list(path)}) is no path of the tree it holds from its first token down"
        )


def check_append(seq: int, have: int, n: int, context_length: int) -> None:
    """Raise ValueError unless n > 0 more tokens fit in seq's cache (holding `have`)."""
    if n == 0:
        raise ValueError(f"forward got no tokens for sequence {seq}")
    if have + n > context_length:
        raise ValueError(
            f"sequence {seq} would hold {have + n} tokens; the context holds {context_length}"
        )


def check_truncate(seq: int, have: int, n: int) -> None:
    """Raise ValueError unless keeping the first n of `have` cached tokens makes sense."""
    if not 0 <= n <= have:
        raise ValueError(f"cannot truncate sequence {seq} to {n}: it holds {have} tokens")


def file_fingerprint(path: Path) -> str:
    """Cheap identity of a file, or of the files in a folder: names, sizes and modification
    times (keys cached measurements; a changed file is measured again)."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def vocab_digest(tok: Tokenizer) -> str:
    """A hash of every vocabulary entry, in id order."""
    h = hashlib.sha256()
    for i in range(tok.n_tokens):
        h.update(tok.token_text(i).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def check_same_vocab(target: LM, draft: LM) -> str | None:
    """Raise ValueError unless draft and target share one tokenizer; return a note when they
    differ only in unused padding ids at the end of the logits (allowed), else None."""
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    t_n = t_tok.n_tokens if t_tok else target.vocab_size
    d_n = d_tok.n_tokens if d_tok else draft.vocab_size
    if t_n != d_n:
        raise ValueError(
            f"the draft model's vocabulary ({d_n} tokens, logits width {draft.vocab_size}) differs "
            f"from the target's ({t_n} tokens, logits width {target.vocab_size}); a draft model "
            f"must use the target's tokenizer (for n-gram drafting use --drafter ngram)"
        )
    if t_tok is not None and d_tok is not None and vocab_digest(t_tok) != vocab_digest(d_tok):
        first = next(i for i in range(t_n) if t_tok.token_text(i) != d_tok.token_text(i))
        raise ValueError(
            f"the draft and target tokenizers differ (token id {first} is "
            f"{d_tok.token_text(first)!r} in the draft, {t_tok.token_text(first)!r} in the target); "
            f"a draft model must use the target's tokenizer"
        )
    if draft.vocab_size != target.vocab_size:
        return (
            f"vocab sizes differ only in unused padding ids (target logits {target.vocab_size}, "
            f"draft logits {draft.vocab_size}, {t_n} real tokens in both): allowed"
        )
    return None


def fit_width(logits: np.ndarray, width: int) -> np.ndarray:
    """[..., V'] -> [..., width]: drop padding columns, or pad with -inf (never drawn)."""
    v = logits.shape[-1]
    if v == width:
        return logits
    if v > width:
        return logits[..., :width]
    pad = np.full((*logits.shape[:-1], width - v), -np.inf, dtype=logits.dtype)
    return np.concatenate([logits, pad], axis=-1)


def eos_ids(*sources: Any) -> frozenset[int]:
    """Collect EOS ids from ints, lists of ints and Nones."""
    out: set[int] = set()
    for s in sources:
        if s is None:
            continue
        if isinstance(s, int | np.integer):
            out.add(int(s))
        else:
            out.update(int(x) for x in s if x is not None)
    return frozenset(out)
