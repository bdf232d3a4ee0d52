"""Test helpers: a numpy LM, a tokenizer over a list of pieces, tiny random transformers models,
and an enumerating sampler that turns any function of a Sampler into its exact output
distribution."""

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


class ToyTokenizer:
    """The Tokenizer protocol over a list of pieces: "<...>" pieces are special (decoded to
    nothing, parsed when written in a text), the rest are text; encoding takes the longest
    piece at each point (every text must be made of pieces). `bos`: the piece a context opens
    with when `add_special`."""

    def __init__(self, pieces: Sequence[str], bos: str | None = None) -> None:
        self.pieces = list(pieces)
        self.n_tokens = len(pieces)
        self.eos_token_ids = frozenset()
        self._id = {}
        for i, piece in enumerate(pieces):
            self._id.setdefault(piece, i)
        self._bos = None if bos is None else self._id[bos]

    def _special(self, i: int) -> bool:
        return self.pieces[i].startswith("<") and self.pieces[i].endswith(">")

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        out = [self._bos] if add_special and self._bos is not None else []
        i = 0
        while i < len(text):
            best = max((p for p in self._id if text.startswith(p, i)), key=len, default=None)
            if best is None:
                raise ValueError(f"no piece for {text[i:]!r}")
            out.append(self._id[best])
            i += len(best)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids if not self._special(i))

    def render_chat(self, messages):
        return self.encode("".join(m["content"] for m in messages))

    def token_text(self, token_id: int) -> str:
        return self.pieces[token_id]


class ToyLM:
    """A real LM (the protocol, with caches and rollback) whose next-token logits are a fixed
    random function of the last two tokens: fast enough for thousands of seeded runs. With
    hidden=True its hidden state at a position is the one-hot code of those two tokens
    (hidden_size vocab**2), all that its next logits depend on; with hidden=(i, j, ...)
    (layer states) it is that code once per layer, the i-th scaled by i + 1, and `read` gives
    the code as the final state (`unembedding()` its output rows)."""

    def __init__(
        self,
        vocab: int = 12,
        seed: int = 0,
        scale: float = 2.0,
        context_length: int = 256,
        eos: Sequence[int] = (),
        delay_ms: tuple[float, float] = (0.0, 0.0),
        hidden: bool | tuple[int, ...] = False,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.hidden_layers = () if isinstance(hidden, bool) else tuple(hidden)
        self.hidden_size = vocab * vocab * max(1, len(self.hidden_layers)) if hidden else 0
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

    def hidden(self, seq):
        cache = self.caches.get(seq, [])
        if not self.hidden_size or not cache or seq in self.pending:
            return None
        a = cache[-2] if len(cache) > 1 else 0
        out = np.zeros(self.hidden_size, dtype=np.float32)
        out[a * self.vocab_size + cache[-1]] = 1.0
        return out

    def hiddens(self, seq, start):
        cache = self.caches.get(seq, [])
        if not self.hidden_size or seq in self.pending or not 0 <= start <= len(cache):
            return None
        code = self._codes(cache, start)
        if not self.hidden_layers:
            return code
        return np.concatenate([code * (i + 1) for i in self.hidden_layers], axis=1)

    def _codes(self, cache, start):  # [len(cache) - start, vocab**2]: the one-hot codes
        out = np.zeros((len(cache) - start, self.vocab_size**2), dtype=np.float32)
        for i, p in enumerate(range(start, len(cache))):
            a = cache[p - 1] if p > 0 else 0
            out[i, a * self.vocab_size + cache[p]] = 1.0
        return out

    def read(self, seq, tokens):
        start = self.length(seq)
        self.forward([(seq, tokens)])
        return self.hiddens(seq, start), self._codes(self.caches[seq], start)

    def unembedding(self):
        """The output rows [vocab, vocab**2]: logits = final state @ rows.T."""
        v = self.vocab_size
        return np.ascontiguousarray(self.table.reshape(v * v, v).T)

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


# A target's and a draft's pieces for drafting across tokenizers: "a", "b", "c", "ab" and both
# specials are shared; "ba", "cc" are the target's alone, "bc", "ca" the draft's alone.
CROSS_TARGET = ["<s>", "a", "b", "c", "ab", "ba", "cc", "<|im|>"]
CROSS_DRAFT = ["<s>", "<|im|>", "c", "bc", "a", "ca", "b", "ab"]


def cross_pair(seed: int = 1) -> tuple[ToyLM, ToyLM]:
    """(target, draft) ToyLMs with the tokenizers of CROSS_TARGET and CROSS_DRAFT."""
    target = ToyLM(vocab=len(CROSS_TARGET), seed=seed, scale=1.5)
    target.tokenizer = ToyTokenizer(CROSS_TARGET)
    draft = ToyLM(vocab=len(CROSS_DRAFT), seed=seed + 10, scale=1.5)
    draft.tokenizer = ToyTokenizer(CROSS_DRAFT, bos="<s>")
    return target, draft


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

    def state(self) -> int:  # the engine keeps it to rewind a failed round
        return len(self.taken)

    def set_state(self, state: int) -> None:
        if state != len(self.taken):
            raise RuntimeError("a scripted sampler cannot rewind choices it made")

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
