"""Test helpers: a numpy LM, tiny random transformers models, and an enumerating sampler that
turns any function of a Sampler into its exact output distribution."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from specwise.backends.base import BackendInfo, check_path, check_tree

# The summary keys `specwise generate --json` promises (issue: core), used by several tests.
SUMMARY_KEYS = {
    "ttft_ms",
    "continuation_tokens_per_s",
    "total_ms",
    "emitted",
    "rounds",
    "proposed",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "alpha_per_position",
    "acceptance_per_position",
    "goodput_tokens_per_ms",
    "draft_ms",
    "verify_ms",
    "overhead_ms",
    "peak_rss_mb",
}


class ToyLM:
    """A real LM (the protocol, with caches and rollback) whose next-token logits are a fixed
    random function of the last two tokens: fast enough for thousands of seeded runs."""

    def __init__(
        self,
        vocab: int = 12,
        seed: int = 0,
        scale: float = 2.0,
        context_length: int = 256,
        eos: Sequence[int] = (),
        delay_ms: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        rng = np.random.default_rng(seed)
        self.delay_ms = delay_ms  # (per call, per token): makes costs realistic for timing tests
        self.table = (rng.standard_normal((vocab, vocab, vocab)) * scale).astype(np.float32)
        self.vocab_size = vocab
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos)
        self.tokenizer = None
        self.info = BackendInfo("toy", f"toy-{seed}", 1, f"toy-{seed}")
        self.exact = True  # every row is a function of its own prefix
        self.trees = True
        self.caches: dict[int, list[int]] = {}
        self.pending: dict[int, tuple[int, list[int], list[int]]] = {}  # seq -> a tree fed
        self.calls = 0

    def next_logits(self, prefix: Sequence[int]) -> np.ndarray:
        a = prefix[-2] if len(prefix) > 1 else 0
        return self.table[a, prefix[-1]]

    def forward(self, batch, last_only=False, rows=None, trees=None):
        self.calls += 1
        if any(self.delay_ms):
            n = sum(len(t) for _, t in batch)
            time.sleep((self.delay_ms[0] + self.delay_ms[1] * n) / 1000.0)
        out = []
        for e, (seq, tokens) in enumerate(batch):
            assert seq not in self.pending, "keep a path of the tree first"
            cache = self.caches.setdefault(seq, [])
            assert len(cache) + len(tokens) <= self.context_length
            parents = None if trees is None else trees[e]
            if parents is not None:  # each token sees the cache and its own ancestors
                check_tree(seq, len(tokens), parents)
                paths: list[list[int]] = []
                for j, t in enumerate(tokens):
                    paths.append([*(paths[parents[j]] if j else cache), int(t)])
                self.pending[seq] = (len(cache), list(tokens), list(parents))
                cache.extend(int(t) for t in tokens)
                out.append(np.stack([self.next_logits(p) for p in paths]))
                continue
            logits = []
            for t in tokens:
                cache.append(int(t))
                logits.append(self.next_logits(cache))
            out.append(np.stack(logits[-1:] if last_only else logits))
        return out if rows is None else [x[:n] for x, n in zip(out, rows, strict=True)]

    def keep(self, seq, path):
        base, tokens, parents = self.pending.pop(seq)
        check_path(seq, parents, path)
        self.caches[seq][base:] = [tokens[j] for j in path]

    def passes(self, calls):
        return [(1, sum(n for _, n in calls))]  # its delay depends on the total tokens only

    def length(self, seq):
        return len(self.caches.get(seq, []))

    def truncate(self, seq, n):
        if seq in self.pending:  # a tree goes whole
            base = self.pending.pop(seq)[0]
            assert n <= base + 1
        assert 0 <= n <= self.length(seq)
        del self.caches[seq][n:]

    def release(self, seq):
        self.caches.pop(seq, None)
        self.pending.pop(seq, None)

    def in_use(self):
        return len(self.caches)


def tiny_llama(
    vocab: int = 16,
    seed: int = 0,
    layers: int = 2,
    sharpen: float = 1.0,
    context: int = 128,
    eos: int | None = None,
):
    """A random-weight LlamaForCausalLM small enough to run in milliseconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model.eval()


class StubDrafter:
    """The Drafter protocol's bookkeeping as no-ops, for a test drafter that defines `propose`
    (and overrides whatever else it needs)."""

    name, cheap, fingerprint = "stub", True, "stub"

    def bind(self, target):
        pass

    def begin(self, seq, prompt, tenant=None):
        pass

    def commit(self, seq, accepted, emitted):
        pass

    def end(self, seq):
        pass

    def lag(self, seq, context):
        return 0

    def measure_cost(self):
        return 0.0, 0.0


class _Scripted:
    """A Sampler that replays fixed choices, then takes the first option and records branches."""

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)
        self.taken: list[int] = []
        self.options: list[list[tuple[object, float]]] = []
        self.prob = 1.0

    def _choose(self, options: list[tuple[object, float]]):
        d = len(self.taken)
        i = self.script[d] if d < len(self.script) else 0
        self.options.append(options)
        self.taken.append(i)
        value, p = options[i]
        self.prob *= p
        return value

    def bernoulli(self, prob: float) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        return self._choose([(v, p) for v, p in ((True, prob), (False, 1.0 - prob)) if p > 0])

    def categorical(self, probs: np.ndarray) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        total = probs.sum()
        return self._choose([(i, float(probs[i] / total)) for i in np.flatnonzero(probs > 0)])


def enumerate_outcomes(fn: Callable[[object], Hashable]) -> dict[Hashable, float]:
    """The exact distribution of fn(sampler) over every sequence of random choices."""
    dist: dict[Hashable, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        s = _Scripted(script)
        out = fn(s)
        dist[out] += s.prob
        for d in range(len(script), len(s.taken)):
            for alt in range(1, len(s.options[d])):
                stack.append([*s.taken[:d], alt])
    return dict(dist)
