"""`VocabMap`: the tokens of two vocabularies that stand for the same text, for drafting with a
model whose tokenizer is not the target's (token-level intersection, TLI: Timor et al., ICML
2025), and the translation of a target's tokens into the draft's.

What a token stands for: its *text*, what it adds when decoded after a fixed anchor token (so
a leading space is kept whatever a tokenizer does to a first token); a special token, which
decodes to nothing, stands for its vocabulary entry (`<|im_start|>` in both ChatML
vocabularies is one token). Tokens whose text is empty or not whole UTF-8 characters (byte
pieces) are not shared. Where one vocabulary has several tokens of one text, its lowest id
stands for it, so the map is one-to-one. That is what makes a draft restricted to the shared
tokens exact to verify: the probability that the draft proposes target token y is the q of the
one draft token mapped to y (`spread`); a map with two draft tokens on one target token would
misstate it (the distribution tests show it). The draft's context need not be the target's
tokens mapped one by one: `translate` re-tokenizes text runs with the draft's tokenizer (which
drafts better), and exactness never depends on how the draft read its context.

Built once per pair of vocabularies (a decode a token) and cached in $SPECWISE_HOME/vocab-maps,
keyed by both vocabularies' digests. This module does not draft or verify.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specwise.backends.base import Tokenizer, vocab_digest

__all__ = ["VocabMap", "token_keys"]

log = logging.getLogger(__name__)

SPECIAL = "\0special\0"  # prefixes a special token's key: never equal to a text's
ANCHOR = "a"  # the text of the anchor token: one ASCII letter, a token in every vocabulary


class _Text:
    """A tokenizer's text of token runs, decoded after the anchor token."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.anchor = tok.encode(ANCHOR, add_special=False)[:1]
        self.skip = len(tok.decode(self.anchor))

    def __call__(self, ids: Sequence[int]) -> str:
        return self.tok.decode([*self.anchor, *ids])[self.skip :]


def token_keys(tok: Tokenizer) -> list[str | None]:
    """What each token id stands for (its text, or SPECIAL + its entry), None where it stands
    for nothing another vocabulary could share."""
    text = _Text(tok)
    keys: list[str | None] = []
    for i in range(tok.n_tokens):
        piece = text([i])
        if piece:
            keys.append(None if "\ufffd" in piece else piece)
        else:
            entry = tok.token_text(i)
            keys.append(SPECIAL + entry if entry else None)
    return keys


class VocabMap:
    """draft id -> target id for the shared tokens (`to_target`, -1 where not shared), and the
    inverse (`to_draft`). Build with `for_pair`."""

    def __init__(self, to_target: np.ndarray, target_tokens: int) -> None:
        to_target = np.asarray(to_target, dtype=np.int64)
        shared = to_target[to_target >= 0]
        if len(np.unique(shared)) != len(shared):
            raise ValueError("a vocabulary map must be one-to-one: two draft tokens on one target")
        if len(shared) and shared.max() >= target_tokens:
            raise ValueError(f"a vocabulary map names target id {shared.max()} >= {target_tokens}")
        self.to_target = to_target
        self.to_draft = np.full(target_tokens, -1, dtype=np.int64)
        self.draft_ids = np.flatnonzero(to_target >= 0)  # the shared tokens, in draft ids
        self.to_draft[to_target[self.draft_ids]] = self.draft_ids
        self._mask: np.ndarray | None = None  # [draft width] 0 where shared, -inf elsewhere
        self._text: tuple[_Text, _Text] | None = None  # (target's, draft's), for `translate`
        self._bos: list[int] = []

    @property
    def shared(self) -> int:
        return len(self.draft_ids)

    @classmethod
    def between(cls, target_keys: list[str | None], draft_keys: list[str | None]) -> VocabMap:
        """The map of the tokens whose keys are equal (the lowest id of each key)."""
        first: dict[str, int] = {}
        for i, key in enumerate(target_keys):
            if key is not None:
                first.setdefault(key, i)
        to_target = np.full(len(draft_keys), -1, dtype=np.int64)
        seen: set[str] = set()
        for i, key in enumerate(draft_keys):
            if key is not None and key in first and key not in seen:
                seen.add(key)
                to_target[i] = first[key]
        return cls(to_target, len(target_keys))

    @classmethod
    def for_pair(cls, target: Tokenizer, draft: Tokenizer, home: Path | None = None) -> VocabMap:
        """The map between two tokenizers, from the cache when it has it (`home`: the cache's
        root, $SPECWISE_HOME by default), ready to `translate`."""
        if home is None:
            from specwise.models import home as specwise_home

            home = specwise_home()
        path = home / "vocab-maps" / f"{vocab_digest(target)[:16]}-{vocab_digest(draft)[:16]}.npy"
        vmap = None
        if path.is_file():
            try:
                vmap = cls(np.load(path), target.n_tokens)
            except (OSError, ValueError) as exc:  # unreadable or corrupt: build it again
                log.warning("rebuilding the vocabulary map %s: %s", path, exc)
        if vmap is None:
            vmap = cls.between(token_keys(target), token_keys(draft))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vmap.to_target)
            tmp.replace(path)
        vmap._text = (_Text(target), _Text(draft))
        vmap._bos = draft.encode("", add_special=True)
        return vmap

    def restrict(self, logits: np.ndarray) -> np.ndarray:
        """[V_draft] draft logits with every token not shared at -inf (never drawn)."""
        if self._mask is None or len(self._mask) != logits.shape[-1]:
            self._mask = np.full(logits.shape[-1], -np.inf, dtype=np.float32)
            self._mask[self.draft_ids[self.draft_ids < logits.shape[-1]]] = 0.0
        return logits + self._mask

    def spread(self, q: np.ndarray, width: int) -> np.ndarray:
        """[V_draft] a distribution over shared draft tokens -> [width] the same over the
        target's ids (one-to-one, so each target token gets its one draft token's mass)."""
        out = np.zeros(width, dtype=np.float64)
        ids = self.draft_ids[self.draft_ids < len(q)]
        out[self.to_target[ids]] = q[ids]
        return out

    def translate(self, target_ids: Sequence[int], first: bool = False) -> list[int]:
        """The draft's tokens for a run of the target's: each text run re-tokenized by the
        draft's tokenizer, each special token mapped (dropped where the draft has none);
        `first`: the run opens the context (the draft's BOS, if it wants one, comes first)."""
        assert self._text is not None, "translate needs the tokenizers: build with for_pair"
        t_text, d_text = self._text
        return (list(self._bos) if first else []) + _retokenize(
            target_ids, t_text, d_text.tok, self.to_draft
        )

    def back(self, draft_ids: Sequence[int]) -> list[int]:
        """The target's tokens for a run of the draft's (what `translate` does the other way):
        text runs re-tokenized by the target's tokenizer, special tokens mapped; a character
        the run ends in the middle of is left out."""
        assert self._text is not None, "back needs the tokenizers: build with for_pair"
        t_text, d_text = self._text
        return _retokenize(draft_ids, d_text, t_text.tok, self.to_target, whole=True)

    def special(self, draft_id: int) -> bool:
        """Whether a draft token is special (it decodes to no text)."""
        assert self._text is not None, "special needs the tokenizers: build with for_pair"
        return not self._text[1]([draft_id])


def _retokenize(
    ids: Sequence[int], text: _Text, to: Tokenizer, mapped: np.ndarray, whole: bool = False
) -> list[int]:
    """`ids` in the other tokenizer `to`: each run of text tokens decoded (`text`) and encoded
    again, each special token mapped by `mapped` (dropped at -1); `whole`: the last run's text
    loses a character it ends in the middle of."""
    out: list[int] = []
    run: list[int] = []

    def flush(last: bool = False) -> None:
        if run:
            piece = text(run)
            if last and whole:
                piece = piece.rstrip("\ufffd")
            out.extend(to.encode(piece, add_special=False))
            run.clear()

    for t in ids:
        if text([t]):
            run.append(t)
        else:  # special (or nothing)
            flush()
            if mapped[t] >= 0:
                out.append(int(mapped[t]))
    flush(last=True)
    return out
