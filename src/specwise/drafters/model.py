"""`ModelDrafter`: a small LM proposes k tokens one at a time.

Greedy requests take the draft model's argmax (a point-mass draft); sampled requests draw each
token from q = warp(draft logits, the request's params) with the request's sampler and return
q, so the lossless rule can use it. The draft cache is rolled back to the accepted prefix in
`commit`; when all k tokens were accepted the last one is fed at the next `propose` (one call
of two tokens instead of two calls of one).

A draft model with another tokenizer than the target's (found in `bind`) drafts on the tokens
both vocabularies share (`VocabMap`, TLI): its logits outside them are -inf before the argmax
or the warp, the token it picks is mapped to the target's id, and q is spread over the
target's ids (one-to-one), so the same lossless rules verify it. It reads its context in its
own tokens: the prompt and each committed run of target tokens re-tokenized (`translate`),
its own accepted tokens as they were.

`TextDrafter` (`model-text`) is the other way to draft across tokenizers (Universal Assisted
Generation): the draft model takes its own argmax over its whole vocabulary, and the text of
its tokens is re-tokenized by the target's tokenizer (`VocabMap.back`) into a point-mass
draft, verified like an n-gram draft (exact, greedy or sampled; it pays where the draft's text
matches the target's greedy choice). It shares the `ModelDrafter`'s state and caches (one
draft model, one cache a sequence), so the controller can pick either, round by round.
This module does not verify anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specwise.backends.base import LM, check_same_vocab, fit_width
from specwise.backends.curves import measure_curve
from specwise.drafters.base import Draft, KeepGoing, register
from specwise.sampling import Sampler, SamplingParams, warp
from specwise.vocab_map import VocabMap

__all__ = ["ModelDrafter", "TextDrafter"]

MIN_SHARED = 0.1  # the part of its vocabulary a draft model must share with the target's


@register("model")
class ModelDrafter:
    name = "model"
    cheap = False

    def __init__(self, lm: LM) -> None:
        self.lm = lm
        self.width = lm.vocab_size  # the target's logits width, set by bind
        self.note: str | None = None  # what bind noticed about the vocabularies
        self.vocab: VocabMap | None = None  # set by bind when the tokenizers differ
        self._ids: dict[int, list[int]] = {}  # seq -> the draft's tokens for context[:_done]
        self._done: dict[int, int] = {}  # seq -> target tokens the draft's tokens stand for
        self._base: dict[int, tuple[int, int]] = {}  # seq -> (_done, len(_ids)) at propose
        self._drafted: dict[int, list[int]] = {}  # seq -> the last draft, in draft ids
        self._retokenized: dict[int, list[int]] = {}  # seq -> a text draft, in target ids
        # the latest propose's timed forwards: (tokens, ms) of each one-token step and each
        # forward of a guess (all rows), for the cascade's pricing of its guesses
        self.timed: list[tuple[int, float]] = []
        info = lm.info
        self.fingerprint = f"model:{info.backend}:{info.fingerprint}:{info.threads}"

    def bind(self, target: LM) -> None:
        if self.lm is target:
            raise ValueError(
                "the draft model must be its own LM instance, not the target's (each keeps its "
                "own caches); load the model a second time"
            )
        self.width = target.vocab_size
        try:
            self.note = check_same_vocab(target, self.lm)
            return
        except ValueError:
            if target.tokenizer is None or self.lm.tokenizer is None:
                raise
        vocab = VocabMap.for_pair(target.tokenizer, self.lm.tokenizer)
        n = self.lm.tokenizer.n_tokens
        if vocab.shared < MIN_SHARED * n:
            raise ValueError(
                f"the draft model shares {vocab.shared} of its {n} tokens with the target's "
                f"vocabulary (at least {MIN_SHARED:.0%} are needed to draft); pick another "
                f"draft model"
            )
        self.vocab = vocab
        self.note = (
            f"the draft model has another tokenizer: it drafts on the {self.vocab.shared} "
            f"tokens both vocabularies share ({target.tokenizer.n_tokens} in the target's)"
        )

    def _sync(self, seq: int, context: Sequence[int]) -> list[int]:
        """The draft's tokens for the whole context (the new target tokens translated)."""
        done = self._done.get(seq)
        if self.vocab is None:
            ids = self._ids.setdefault(seq, [])
            ids.extend(context[len(ids) :])
        elif done is None:
            ids = self._ids[seq] = self.vocab.translate(context, first=True)
        else:
            ids = self._ids[seq]
            ids.extend(self.vocab.translate(context[done:]))
        self._done[seq] = len(context)
        return ids

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        if seq in self._done:  # begun already (by the TextDrafter sharing these caches)
            return
        ids = self._sync(seq, prompt)
        if len(ids) > self.lm.context_length:
            raise ValueError(
                f"the prompt has {len(ids)} tokens for the draft model; its context holds "
                f"{self.lm.context_length}"
            )
        if len(ids) > 1:
            self.lm.forward([(seq, ids[:-1])], last_only=True)

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
        guess: Sequence[int] = (),
    ) -> Draft:
        """`Drafter.propose`; guess: tokens the draft model is expected to pick (`_propose`)."""
        return self._propose(seq, context, k, params, sampler, keep_going, False, guess)

    def _propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None,
        text: bool,
        guess: Sequence[int] = (),
    ) -> Draft:
        """Up to k tokens: the draft's own (text=False), or (text=True, another tokenizer) the
        argmax over its whole vocabulary, up to a special token, its text re-tokenized.
        guess (same tokenizer only): tokens the draft is expected to pick, fed with the catch-up
        in one forward; while it picks them, its next rows are already computed (the cascade).
        The tokens picked, and the randomness used, are those of drafting without a guess."""
        ids = self._sync(seq, context)
        self._base[seq] = (len(context), len(ids))
        self._drafted[seq] = drafted = []
        self._retokenized.pop(seq, None)
        k = min(k, self.lm.context_length - len(ids))
        if k <= 0:
            return Draft([], None)
        if self.lm.length(seq) >= len(ids):  # a failed round left drafts behind: drop
            self.lm.truncate(seq, len(ids) - 1)  # them, and feed the last token again
        feed = list(ids[self.lm.length(seq) :])  # catch up: at least the last token
        vocab = self.vocab
        guess = list(guess[: k - 1]) if vocab is None and not text else []
        # rows[j]: the draft's logits after the context and guess[:j], valid while the tokens
        # picked are the guess's (the cache holds the guess until a pick departs from it)
        self.timed = []
        rows: list[np.ndarray] | np.ndarray = []
        if guess:
            t = time.perf_counter()
            rows = self.lm.forward([(seq, feed + guess)])[0][len(feed) - 1 :]
            self.timed.append((len(feed) + len(guess), (time.perf_counter() - t) * 1000.0))
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        conf: list[float] = []
        for i in range(k):
            if i < len(rows):
                row = rows[i]
            else:
                t = time.perf_counter()
                row = self.lm.forward([(seq, feed)], last_only=True)[0][-1]
                if len(feed) == 1:
                    self.timed.append((1, (time.perf_counter() - t) * 1000.0))
            if text:
                logits = row[: len(vocab.to_target)]  # the draft's tokens (no padding ids)
            else:
                logits = fit_width(row, self.width) if vocab is None else vocab.restrict(row)
            if params.greedy or text:
                x = int(np.argmax(logits))
                conf.append(float(1.0 / np.exp(logits - logits[x]).sum()))  # softmax at x
            else:
                q = warp(logits, params)  # [V] (the draft's V when the vocabularies differ)
                x = sampler.categorical(q)
                qs.append(q if vocab is None else vocab.spread(q, self.width))
                conf.append(float(q[x]))
            if text and vocab.special(x):  # the text ends: the target's own special, or none
                if vocab.to_target[x] >= 0:
                    drafted.append(x)
                break
            drafted.append(x)
            tokens.append(x if vocab is None else int(vocab.to_target[x]))
            if i < len(guess) and x != guess[i]:  # the guess ends here: drop its rest
                self.lm.truncate(seq, len(ids) + i)
                rows = rows[: i + 1]
            if i + 1 == k or (keep_going is not None and not keep_going(conf)):
                break
            feed = [x]
        if self.lm.length(seq) > len(ids) + len(drafted):  # guessed tokens never drafted
            self.lm.truncate(seq, len(ids) + len(drafted))
        if text:
            self._retokenized[seq] = tokens = vocab.back(drafted)[:k]
            return Draft(tokens, None)
        return Draft(tokens, np.stack(qs) if qs else None, conf)

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        if seq not in self._base:
            return
        done, n_ids = self._base.pop(seq)
        ids = self._ids[seq]
        del ids[n_ids:]
        drafted = self._drafted.pop(seq, [])
        retokenized = self._retokenized.pop(seq, None)
        if retokenized is None:
            ids.extend(drafted[:accepted])
        else:  # the accepted target tokens, in the draft's tokens
            ids.extend(self.vocab.translate(retokenized[:accepted]))
        self._done[seq] = done + accepted
        # the cache keeps the drafted tokens as far as they are the committed ones
        same = next(
            (i for i, (a, b) in enumerate(zip(drafted, ids[n_ids:], strict=False)) if a != b),
            min(len(drafted), len(ids) - n_ids),
        )
        if self.lm.length(seq) > n_ids + same:
            self.lm.truncate(seq, n_ids + same)

    def end(self, seq: int) -> None:
        for state in (self._ids, self._done, self._base, self._drafted, self._retokenized):
            state.pop(seq, None)
        self.lm.release(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        behind = len(context) - self._done.get(seq, 0)  # target tokens not translated yet
        return max(0, len(self._ids.get(seq, ())) + behind - 1 - self.lm.length(seq))

    def measure_cost(self) -> tuple[float, float]:
        curve = measure_curve(self.lm, sizes=[1, 64], repeats=3)
        return curve.ms[1], curve.ms[64] / 64


@register("model-text")
class TextDrafter:
    """A draft model with another tokenizer than the target's, drafting text (module
    docstring). Give it the `ModelDrafter` of the draft model to share its caches with (both
    in one engine), or the draft's LM for a drafter of its own."""

    name = "model-text"
    cheap = False

    def __init__(self, lm: LM | None = None, model: ModelDrafter | None = None) -> None:
        if (lm is None) == (model is None):
            raise ValueError("a model-text drafter needs the draft model's LM or its ModelDrafter")
        self.model = model if model is not None else ModelDrafter(lm)  # type: ignore[arg-type]
        self._shared = model is not None
        self.note: str | None = None
        self.fingerprint = self.model.fingerprint  # it runs the same model, at the same cost

    def bind(self, target: LM) -> None:
        if self.model.vocab is None or self.model.width != target.vocab_size:
            self.model.bind(target)
        if self.model.vocab is None:
            raise ValueError(
                "the model-text drafter drafts for a target with another tokenizer; this draft "
                "model shares the target's, so use the model drafter"
            )
        said = "it drafts the draft model's argmax text, re-tokenized by the target's tokenizer"
        self.note = said if self._shared else f"{self.model.note}; {said}"

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self.model.begin(seq, prompt, tenant)

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        return self.model._propose(seq, context, k, params, sampler, keep_going, text=True)

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        self.model.commit(seq, accepted, emitted)

    def end(self, seq: int) -> None:
        self.model.end(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return self.model.lag(seq, context)

    def measure_cost(self) -> tuple[float, float]:
        return self.model.measure_cost()
