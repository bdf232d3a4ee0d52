"""`ModelDrafter`: a small LM with the target's tokenizer proposes k tokens one at a time.

Greedy requests take the draft model's argmax (a point-mass draft); sampled requests draw each
token from q = warp(draft logits, the request's params) with the request's sampler and return
q, so the lossless rule can use it. The draft cache is rolled back to the accepted prefix in
`commit`; when all k tokens were accepted the last one is fed at the next `propose` (one call
of two tokens instead of two calls of one). This module does not verify anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specwise.backends.base import LM, check_same_vocab, fit_width
from specwise.drafters.base import Draft, KeepGoing, register
from specwise.sampling import Sampler, SamplingParams, warp

__all__ = ["ModelDrafter"]


@register("model")
class ModelDrafter:
    name = "model"
    cheap = False

    def __init__(self, lm: LM) -> None:
        self.lm = lm
        self.width = lm.vocab_size  # the target's logits width, set by bind
        self.note: str | None = None  # what bind noticed about the vocabularies
        self._base: dict[int, int] = {}  # seq -> len(context) at the last propose
        info = lm.info
        self.fingerprint = f"model:{info.backend}:{info.fingerprint}:{info.threads}"

    def bind(self, target: LM) -> None:
        if self.lm is target:
            raise ValueError(
                "the draft model must be its own LM instance, not the target's (each keeps its "
                "own caches); load the model a second time"
            )
        self.note = check_same_vocab(target, self.lm)
        self.width = target.vocab_size

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        if len(prompt) > self.lm.context_length:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the draft model's context holds "
                f"{self.lm.context_length}"
            )
        if len(prompt) > 1:
            self.lm.forward([(seq, prompt[:-1])], last_only=True)

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        self._base[seq] = len(context)
        room = self.lm.context_length - len(context)
        k = min(k, room)
        if k <= 0:
            return Draft([], None)
        if self.lm.length(seq) >= len(context):  # a failed round left drafts behind: drop
            self.lm.truncate(seq, len(context) - 1)  # them, and feed the last token again
        feed = list(context[self.lm.length(seq) :])  # catch up: at least the last token
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        conf: list[float] = []
        for i in range(k):
            logits = fit_width(self.lm.forward([(seq, feed)], last_only=True)[0][-1], self.width)
            if params.greedy:
                x = int(np.argmax(logits))
                conf.append(float(1.0 / np.exp(logits - logits[x]).sum()))  # softmax at x
            else:
                q = warp(logits, params)  # [V]
                x = sampler.categorical(q)
                qs.append(q)
                conf.append(float(q[x]))
            tokens.append(x)
            if i + 1 == k or (keep_going is not None and not keep_going(i + 1, conf[-1])):
                break
            feed = [x]
        return Draft(tokens, np.stack(qs) if qs else None, conf)

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        keep = self._base.pop(seq, self.lm.length(seq)) + accepted
        if self.lm.length(seq) > keep:
            self.lm.truncate(seq, keep)

    def end(self, seq: int) -> None:
        self._base.pop(seq, None)
        self.lm.release(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return max(0, len(context) - 1 - self.lm.length(seq))

    def measure_cost(self) -> tuple[float, float]:
        from specwise.costs import measure_curve

        curve = measure_curve(self.lm, sizes=[1, 64], repeats=3)
        return curve.ms[1], curve.ms[64] / 64
