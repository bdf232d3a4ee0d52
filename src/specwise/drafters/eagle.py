"""`EagleDrafter` (EAGLE-style): one transformer layer over the target's own hidden states
drafts the next token, with no second model, only the layer's small cache of keys and values.

At every generated position t the layer reads the target's final hidden state h_t (`LM.hiddens`)
and the token x_{t+1} that followed it (the one h_t predicted), attends causally over the
positions before it in the same answer (from the prompt's last position on), and predicts the
target's distribution one token further, that of x_{t+2}: z = Layer([h_t; e(x_{t+1})]), logits
= Out(h_t + Back(z)) over a **reduced vocabulary** (the `ids`, as for the heads). A Medusa head
(`drafters.heads`) sees h_t alone; the layer also sees how the answer got there. It drafts one
token a round (a chain of one), the depth it was trained for.

In a round the drafter first reads the states of the positions committed since it last ran
(all of them: the target keeps them, `LM.hiddens`, from the prompt's last position on, where a
request's first call to it starts), then drafts; its cache holds committed positions only, so
a rejected draft leaves nothing to undo. Greedy and sampling as for the heads
(`heads.draw`): q is a function of the context alone, so rejection sampling against it is exact.

`Layer` is the network and its file (`save`/`load`, next to the heads: `heads_path`); training it
is `specwise.distill`'s work, adapting it to served traffic `specwise.adapt`'s (a request drafts
to its end with the weights its first proposal found: its cache was filled by them). Torch is
imported when a layer is built, never by importing this module.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, register
from specwise.drafters.heads import (
    check_target,
    check_vocab,
    draw,
    heads_path,
    load_state,
    save_state,
    vocab_index,
)
from specwise.sampling import Sampler, SamplingParams

__all__ = ["FORMAT", "EagleDrafter", "Layer"]

FORMAT = 1  # the file's layout version
ATTENTION_HEADS = 8


def layers_for(n_layers: int) -> tuple[int, int, int]:
    """The target layers whose outputs the layer reads: a low, a middle and a high one (as
    EAGLE-3: the second, the middle, the third from the top)."""
    return (1, n_layers // 2 - 1, n_layers - 3)


def data_path(model: str | Path, layers: Sequence[int]) -> Path:
    """Where the layer's training data for `model`, read at `layers`, lives (`teacher`)."""
    return heads_path(model) / ("data-" + "-".join(map(str, layers)))


class Layer:
    """Layer(hidden_size, ids, vocab_size, width=512, unembedding=None, seed=0): the network.
    ids: the target ids of the reduced vocabulary (distinct, < vocab_size); width: the layer's
    own width; unembedding: the target's output rows [len(ids), hidden_size] for them, the
    output layer's start (else random; the token embeddings start as half of them). The way
    back from the layer starts at zero, so the network starts as the target's own output layer
    restricted to `ids`. `module` is the torch module (for training); `step` runs it."""

    def __init__(
        self,
        hidden_size: int,
        ids: Sequence[int],
        vocab_size: int,
        width: int = 512,
        unembedding: np.ndarray | None = None,
        seed: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        import torch

        ids = np.asarray(ids, dtype=np.int64)
        if width < ATTENTION_HEADS or width % ATTENTION_HEADS:
            raise ValueError(f"width = {width} is invalid; use a multiple of {ATTENTION_HEADS}")
        check_vocab(ids, vocab_size, hidden_size, unembedding, "the layer's")
        self.hidden_size, self.vocab_size, self.width = hidden_size, vocab_size, width
        self.ids = ids
        self.meta = dict(meta or {})
        self._where = vocab_index(ids, vocab_size, missing=len(ids))  # the last: any other id
        torch.manual_seed(seed)
        self.module = _module_class()(hidden_size, width, len(ids))
        if unembedding is not None:
            with torch.no_grad():
                rows = torch.from_numpy(np.asarray(unembedding, dtype=np.float32))
                self.module.out.weight.copy_(rows)
                self.module.emb.weight[: len(ids)].copy_(rows * 0.5)
        self._fast: Any = None  # the inference copy (`step`), made on first use

    def index(self, tokens: Sequence[int]) -> np.ndarray:
        """Target ids -> the layer's token indices (len(ids) for an id outside the vocabulary
        or unknown, -1)."""
        t = np.asarray(tokens, dtype=np.int64)
        inside = (t >= 0) & (t < self.vocab_size)
        return np.where(inside, self._where[t.clip(0, self.vocab_size - 1)], len(self.ids))

    def step(self, cache: Cache, hidden: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """Read n positions more (their states [n, hidden_size] and the tokens that followed
        them) into `cache`, and return the logits over `ids` [len(ids)] predicted at the last
        one. Runs the int8 copy of the weights the cache was begun with (`new_cache`), so
        weights published later (training) serve the caches begun after them."""
        import torch

        with torch.inference_mode():
            h = torch.from_numpy(np.asarray(hidden, dtype=np.float32))
            t = torch.from_numpy(self.index(tokens))
            return cache.net.step(h, t, cache).numpy()

    def new_cache(self) -> Cache:
        """An empty cache for one sequence, bound to the int8 copy published now."""
        import torch

        if self._fast is None:
            self.publish()
        return Cache(self._fast, torch.zeros(0, self.width), torch.zeros(0, self.width))

    def publish(self) -> None:
        """The weights changed (training): copy them into the int8 copy that `step` runs
        (each Linear's weights quantized per output row, activations per call)."""
        self._fast = _int8_copy(self.module)

    def ready(self) -> None:
        """Make the int8 copy and run it once on 1 and on 2 positions (the CPU library prepares
        its kernels at a shape's first product)."""
        self.publish()
        cache = self.new_cache()
        self.step(cache, np.zeros((1, self.hidden_size), np.float32), [0])
        self.step(cache, np.zeros((2, self.hidden_size), np.float32), [0, 0])

    def save(self, path: str | Path) -> None:
        """Write the layer to `path` (a .pt file), atomically."""
        import torch

        state = {
            "format": FORMAT,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "width": self.width,
            "ids": torch.from_numpy(self.ids),
            "weights": self.module.state_dict(),
            "meta": self.meta,
        }
        save_state(path, state)

    @classmethod
    def load(cls, path: str | Path) -> Layer:
        """Read a layer written by `save`, `ready` to run; ValueError naming the file where it
        is not one."""

        def build(state: dict) -> Layer:
            layer = cls(
                state["hidden_size"],
                state["ids"].numpy(),
                state["vocab_size"],
                width=state["width"],
                meta=state.get("meta"),
            )
            layer.module.load_state_dict(state["weights"])
            layer.ready()
            return layer

        return load_state(path, FORMAT, "drafting layer", build)


@dataclass
class Cache:
    """The layer's keys and values for one sequence: buffers [capacity, width] (torch tensors)
    whose first n rows are filled, by `net` (the int8 copy of the weights that runs them)."""

    net: Any
    keys: Any
    values: Any
    n: int = 0

    def extend(self, k, v):
        """Append rows k, v [m, width] (the buffers grow by doubling, so a round copies nothing
        already cached); returns the filled keys and values."""
        end = self.n + len(k)
        if end > len(self.keys):
            size = max(end, 2 * len(self.keys), 64)
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = old.new_empty(size, old.shape[1])
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        self.keys[self.n : end] = k
        self.values[self.n : end] = v
        self.n = end
        return self.keys[:end], self.values[:end]


@functools.cache
def _module_class():
    """The torch module class, defined on first use (importing this module imports no torch)."""
    import torch
    from torch import nn

    class LayerModule(nn.Module):
        """Input projection of [h; e(x)], one pre-norm attention block and MLP, the way back
        to the target's width, and the output layer over the reduced vocabulary."""

        def __init__(self, d: int, width: int, n_ids: int) -> None:
            super().__init__()
            self.emb = nn.Embedding(n_ids + 1, d)
            with torch.no_grad():
                self.emb.weight[n_ids].zero_()
            self.inp = nn.Linear(2 * d, width)
            self.norm1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.norm2 = nn.LayerNorm(width)
            self.up = nn.Linear(width, 2 * width)
            self.down = nn.Linear(2 * width, width)
            self.back = nn.Linear(width, d)
            nn.init.zeros_(self.back.weight)
            nn.init.zeros_(self.back.bias)
            self.out = nn.Linear(d, n_ids, bias=False)

        def block(self, h, t, extend):
            """[..., n, d] states and [..., n] token indices -> the features h + Back(z)
            [..., n, d]; extend(k, v) adds the rows' keys and values to those before them and
            returns them all [..., P + n, width]."""
            x = self.inp(torch.cat([h, self.emb(t)], dim=-1))
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            keys, values = extend(k, v)
            n, total = x.shape[-2], keys.shape[-2]
            # row i sees the past and new positions up to i (one row: all of them)
            mask = None if n == 1 else torch.ones(n, total, dtype=torch.bool).tril(total - n)

            def split(a):  # [..., L, width] -> [..., heads, L, width / heads]
                return a.unflatten(-1, (ATTENTION_HEADS, -1)).transpose(-3, -2)

            att = nn.functional.scaled_dot_product_attention(
                split(q), split(keys), split(values), attn_mask=mask
            )
            x = x + self.proj(att.transpose(-3, -2).flatten(-2))
            x = x + self.down(nn.functional.gelu(self.up(self.norm2(x))))
            return h + self.back(x)

        def forward(self, h, t):  # training: [B, L, d], [B, L] -> logits [B, L, n_ids]
            return self.out(self.block(h, t, lambda k, v: (k, v)))

        def step(self, h, t, cache):  # inference: [n, d], [n] after `cache` -> logits at the last
            return self.out(self.block(h, t, cache.extend)[-1:])[0]

    return LayerModule


def _int8_copy(module):
    """The inference copy of a `LayerModule`: its Linear layers dynamically quantized to int8."""
    import copy
    import warnings

    import torch
    from torch import nn
    from torch.ao import quantization

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's notice that it moves to torchao
        return quantization.quantize_dynamic(
            copy.deepcopy(module).eval(),
            {nn.Linear: quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
        )


@dataclass
class _Seq:
    read: int  # the next position whose state the layer has not read
    layer: Layer  # the trained layer, or the request's tenant's adapted copy
    cache: Cache


@register("eagle")
class EagleDrafter:
    """EagleDrafter(layer, adapter=None): drafts one token a round with a trained `Layer` on the
    hidden states of the target it is bound to (a target built with hidden states:
    `LM.hidden_size`); with an `adapter` (`specwise.adapt.Adapter`), with the copy it adapted
    for the request's tenant, as published when the request's first proposal is made."""

    name = "eagle"
    # Not cheap: a proposal costs a few percent of a target step (memory-bound products), so
    # the controller decides first and the layer runs only in the rounds it gives it.
    cheap = False
    max_tokens = 1  # the depth it was trained for

    def __init__(self, layer: Layer, adapter: Any = None) -> None:
        self.layer = layer
        self.adapter = adapter
        self.fingerprint = (
            f"eagle:{layer.meta.get('key', 'unsaved')}:{layer.meta.get('trained', '')}"
        )
        self._target: LM | None = None
        self._seqs: dict[int, _Seq] = {}

    def bind(self, target: LM) -> None:
        x = self.layer
        check_target(target, x.hidden_size, x.vocab_size, "eagle", "this layer was", "a layer")
        self._target = target

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._seqs.pop(seq, None)  # begun at its first proposal (k=auto begins it lazily)

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        if k <= 0 or self._target is None:
            return Draft([], None)
        s = self._seqs.get(seq)
        if s is None:
            layer = self.layer if self.adapter is None else self.adapter.net_for(seq)
            s = self._seqs[seq] = _Seq(0, layer, layer.new_cache())
        cached = len(context) - 1  # the target holds every committed token but the last
        states = self._target.hiddens(seq, s.read) if s.read < cached else None
        if states is None or len(states) == 0:  # nothing new, or not kept: no draft
            return Draft([], None)
        first = cached - len(states)
        if first != s.read and s.cache.n:  # positions lost: start again after them
            s.cache = s.layer.new_cache()
        logits = s.layer.step(s.cache, states, context[first + 1 : cached + 1])
        s.read = cached
        x, q, c = draw(logits, s.layer.ids, s.layer.vocab_size, params, sampler)
        return Draft([x], None if q is None else q[None], [c])

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        return None

    def end(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        """Positions to read before drafting beyond the one a round reads anyway; 0 for a
        request not begun yet (its first proposal reads the answer so far: a few positions
        where k=auto picks it early)."""
        s = self._seqs.get(seq)
        return 0 if s is None else max(0, len(context) - 2 - s.read)

    def measure_cost(self) -> tuple[float, float]:
        """(ms per proposed token: one position read after 256, ms per further position read
        in the same call), medians of 20 after 3."""
        rng = np.random.default_rng(0)
        h = rng.standard_normal((257 + 8, self.layer.hidden_size)).astype(np.float32)
        one, more = [], []
        for i in range(23):
            cache = self.layer.new_cache()
            self.layer.step(cache, h[:256], [0] * 256)
            t = time.perf_counter()
            self.layer.step(cache, h[256:257], [0])
            t1 = time.perf_counter()
            self.layer.step(cache, h[257:], [0] * 8)
            if i >= 3:
                one.append(t1 - t)
                more.append(time.perf_counter() - t1)
        per = float(np.median(one)) * 1000.0
        return per, max(0.0, (float(np.median(more)) * 1000.0 - per) / 7)
