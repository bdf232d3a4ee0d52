"""The eagle drafter's network (`Layer`) and how it drafts a tree (`propose_tree`): one
transformer layer over three of the target's own layers, its cache of keys and values for one
sequence's committed positions (`Cache`), and its file (`save`/`load`). The drafter that runs
it in the engine's rounds, and the rules of what the layer reads, are `drafters.eagle`'s.

The network. At every position t of the context it reads the target's states s_t
there, the outputs of a low, a middle and a high layer side by side (`eagle.layers_for`, read
by a target built with them: `LM.hidden_layers`), the token x_{t+1} that followed, and that
token's **copy** (c, n): what followed the longest, most recent earlier occurrence of the
context's last n <= `COPY_N` tokens x_{t+2-n..t+1} (`drafters.ngram.NgramIndex`; n = 0: none):

    f_t = Fuse(s_t)                       each layer's state RMS-normalised, then one projection
    u_t = In([norm(f_t); norm(E(x_{t+1})); norm(E(c) + N(n))])
    a_t = Block(u_t | u_{<=t})            pre-norm causal attention and MLP (width `width`)
    ŝ_t = top(s_t) + Back(a_t)            a state in the target's space: its top layer's, corrected
    logits = Out(norm(ŝ_t)) + Gate(a_t)_n at c   over a **reduced vocabulary** (`ids`)
    slot = logsumexp(logits) + Slot(a_t)_n        one more column: c, where `ids` lack it

predicting x_{t+2}. The copy is what the n-gram drafter would propose; the layer learns when
to trust it (Gate: a logit added to the copied token, by n, from the feature). Without it the
layer copied no better than it guessed: on the bench's answers (318k positions trained on) its
α1 was 0.331 where a bigram's copy was right and 0.321 elsewhere, while "the copy where a
2-gram or longer matches, else the layer" scored 0.513 against its 0.324. The **copy slot**
(a pointer, as pointer-generator networks) names a copy the vocabulary lacks: on the bench's
answers the target's token was outside the 4,101 most frequent at 20% of the positions, and
was the copy at 40% of those (identifiers, names, words of the prompt's language); Slot(a)_n
is the log-odds of the copy against every named token together (measured on 391k positions:
right at 0.947 of the positions whose token is the unnamed copy; bench α1 0.460 -> 0.545). A
node drafted from the slot carries its copy's target id.

Out and its norm start as the target's own output rows for `ids` and its final norm, and Back
at zero, so the layer starts as the target's reading of its top layer (its guess at x_{t+1})
and learns the correction in the target's space: measured on 70k positions, α1 on the bench's
answers 0.21 against 0.18 with Out at the layer's width. E starts from the target's own token
embeddings (`projected`). To draft further it runs on its own output, as it was trained to
(training-time test, `specwise.eagle_training`): at draft depth j >= 1 the feature it reads in
place of f is the feature a of its parent draft token, with that token's embedding, the state
it corrects is its parent's ŝ, and it attends to the committed positions and to the draft
tokens on its path.

The draft (a dynamic tree, as EAGLE-2). The root is the last emitted token; the layer's first
step over the new committed positions gives the depth-1 distribution. At each depth the
`beam` nodes of the newest level with the highest cumulative probability (the product of the
layer's probabilities along the path) are expanded, each with its `beam` most likely
children, in one call of the layer (each node reading its copy: that of the context followed
by its path, `NgramIndex.after`); after `depth` levels every node is ranked by its
cumulative probability and the draft is the best k of them, a parent before its children
(its cumulative probability is at least theirs). So the draft's first m tokens are the best
m-token tree (a node below `FLOOR`, or one whose children no plan could pay for by the
controller's rule, `keep_going`, gets no children, so an unsure layer spends little; and
no level is drafted once the k-th best node is at least as likely as any child could be, so
a short draft costs only its levels: a 1-token draft is the root's alone): the
controller, which takes a prefix of an offer, sizes the tree from the
layer's calibrated confidences (each token's probability given its parent) as it prices every
drafter. The tree is a point mass, verified by the exact tree rules; on a target that takes no
trees (`LM.trees` False) the draft is the best chain (beam 1).

`module` is the torch module (training: `specwise.eagle_training`); drafting runs its int8
copy. Torch is imported when a layer is built, never by importing this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specwise.drafters.heads import check_vocab, load_state, save_state, vocab_index

__all__ = [
    "ATTENTION_HEADS", "BEAM", "COPY_N", "DEPTH", "FLOOR", "FORMAT", "UNNAMED", "Cache", "Layer",
    "Tree", "propose_tree", "restored", "stored",
]

FORMAT = 5  # the file's layout (1: over the final state alone; 2: Out at the layer's width;
# 3: no copy input; 4: no copy slot)
COPY_N = 4  # the longest n-gram whose continuation the layer reads (the n-gram drafter's)
ATTENTION_HEADS = 8
BEAM = 3  # nodes expanded a level, and children of each
DEPTH = 4  # draft levels (the depth it was trained to)
# A node whose cumulative probability is below FLOOR gets no children: each would add at most
# FLOOR expected tokens, less than one more verified token costs on any backend measured here
# (ik_llama's cheapest, ~0.15 of a step on Zen 2-5), so the controller would cut it anyway.
FLOOR = 0.02
FEATURE_EPS = 1e-6  # the epsilon of each target layer's state's RMS normalisation (Fuse)
UNNAMED = -1e4  # the copy slot's logit where the copy is named or none (finite: a zero weight
# times it in the training loss stays zero)


class Layer:
    """Layer(hidden_size, layers, ids, vocab_size, width=768, depth=DEPTH, seed=0,
    unembedding=None, final_norm=None, embedding=None): the network. hidden_size: the target's
    width; layers: the target layers it reads (states of len(layers) * hidden_size); ids: the
    target ids of the reduced vocabulary (distinct, < vocab_size); depth: the draft depth it is
    trained to; unembedding [len(ids), hidden_size] and final_norm [hidden_size]: the target's
    output rows for `ids` and its final norm's weights, where Out and its norm start (else at
    random and at one); embedding [len(ids), hidden_size]: the target's token embeddings for
    `ids`, where E starts (`projected`; else at random). `module` is the torch module
    (training); `read` and `expand` run its int8 copy (drafting)."""

    def __init__(
        self,
        hidden_size: int,
        layers: Sequence[int],
        ids: Sequence[int],
        vocab_size: int,
        width: int = 768,
        depth: int = DEPTH,
        seed: int = 0,
        meta: dict[str, Any] | None = None,
        unembedding: np.ndarray | None = None,
        final_norm: np.ndarray | None = None,
        embedding: np.ndarray | None = None,
    ) -> None:
        import torch

        ids = np.asarray(ids, dtype=np.int64)
        if width < ATTENTION_HEADS or width % ATTENTION_HEADS:
            raise ValueError(f"width = {width} is invalid; use a multiple of {ATTENTION_HEADS}")
        if depth < 1:
            raise ValueError(f"depth = {depth} is invalid; use an integer >= 1")
        check_vocab(ids, vocab_size, hidden_size, unembedding, "the layer's")
        if embedding is not None and np.shape(embedding) != (len(ids), hidden_size):
            raise ValueError(
                f"embedding has shape {np.shape(embedding)}, not {(len(ids), hidden_size)}"
            )
        if final_norm is not None and np.shape(final_norm) != (hidden_size,):
            raise ValueError(
                f"final_norm has shape {np.shape(final_norm)}; the target's width is {hidden_size}"
            )
        self.hidden_size, self.vocab_size, self.width = hidden_size, vocab_size, width
        self.layers = tuple(int(i) for i in layers)
        self.state_size = hidden_size * len(self.layers)
        self.depth = depth
        self.ids = ids
        self.meta = dict(meta or {})
        self._where = vocab_index(ids, vocab_size, missing=len(ids))  # the last: any other id
        torch.manual_seed(seed)
        self.module = _module_class()(len(self.layers), hidden_size, width, len(ids))
        with torch.no_grad():
            if unembedding is not None:
                self.module.out.weight.copy_(torch.from_numpy(np.asarray(unembedding)))
            if final_norm is not None:
                self.module.norm3.weight.copy_(torch.from_numpy(np.asarray(final_norm)))
            if embedding is not None:
                self.module.emb.weight[: len(ids)] = torch.from_numpy(projected(embedding, width))
        self.start = "random" if embedding is None else "embedding"  # where E started
        self._fast: Any = None  # the inference copy, made on first use

    def index(self, tokens: Sequence[int]) -> np.ndarray:
        """Target ids -> the layer's token indices (len(ids) for an id outside the vocabulary
        or unknown, -1)."""
        t = np.asarray(tokens, dtype=np.int64)
        inside = (t >= 0) & (t < self.vocab_size)
        return np.where(inside, self._where[t.clip(0, self.vocab_size - 1)], len(self.ids))

    def new_cache(self) -> Cache:
        """An empty cache for one sequence, bound to the int8 copy published now."""
        import torch

        if self._fast is None:
            self.publish()
        heads, d = ATTENTION_HEADS, self.width // ATTENTION_HEADS
        return Cache(self._fast, torch.zeros(heads, 0, d), torch.zeros(heads, 0, d))

    def read(self, cache: Cache, states: np.ndarray, tokens: Sequence[int],
             copies: tuple[Sequence[int], Sequence[int]] | None = None):
        """Read m committed positions more into `cache` (their states [m, state_size], the
        tokens that followed them [m] and those tokens' copies: target ids (-1: none) and
        match lengths [m] each, `ngram.continuations`; None: none); returns the tree's root:
        the last one's feature a [width], its predicted state [hidden_size] and its logits
        over `ids` and the copy slot [len(ids) + 1] (torch tensors): the depth-1
        distribution."""
        import torch

        with torch.inference_mode():
            s = torch.from_numpy(np.asarray(states, dtype=np.float32))
            t = torch.from_numpy(self.index(tokens))
            c, n = self.copy_inputs(copies, len(t))
            return cache.net.read(s, t, c, n, cache)

    def columns(self, labels, copies, sizes) -> np.ndarray:
        """Target ids `labels` [n] or [n, K] at n positions -> the layer's output columns: a
        named id's index, len(ids) (the copy slot) for the position's copy where `ids` lack
        it (its target id `copies` [n], -1: none, and match length `sizes` [n]), else -1."""
        lab = np.asarray(labels, dtype=np.int64)
        cp = np.asarray(copies, dtype=np.int64)
        col = self.index(lab)
        unnamed = (np.asarray(sizes) > 0) & (cp >= 0) & (self.index(cp) == len(self.ids))
        extra = unnamed[:, None] & (lab.reshape(len(cp), -1) == cp[:, None])
        slot = np.where(extra.reshape(lab.shape), len(self.ids), -1)
        return np.where(col < len(self.ids), col, slot)

    def tokens(self, columns, copies) -> np.ndarray:
        """The layer's output columns [n] and each position's copy (target ids [n]) -> the
        target ids they name (the copy slot names the copy)."""
        col = np.asarray(columns, dtype=np.int64)
        named = self.ids[col.clip(max=len(self.ids) - 1)]
        return np.where(col < len(self.ids), named, np.asarray(copies, dtype=np.int64))

    def copy_inputs(self, copies, m: int):
        """(target ids, match lengths) of m copies (None: none) -> torch (indices, lengths)."""
        import torch

        if copies is None:
            return (torch.full((m,), len(self.ids), dtype=torch.long),
                    torch.zeros(m, dtype=torch.long))
        ids, sizes = (np.asarray(x, dtype=np.int64) for x in copies)
        return torch.from_numpy(self.index(ids)), torch.from_numpy(sizes)

    def publish(self) -> None:
        """The weights changed (training): copy them into the int8 copy that drafting runs
        (each Linear's weights quantized per output row, activations per call)."""
        self._fast = _int8_copy(self.module)

    def ready(self) -> None:
        """Make the int8 copy and run it once at the shapes drafting uses (the CPU library
        prepares its kernels at a shape's first product)."""
        self.publish()
        cache = self.new_cache()
        z = np.zeros((2, self.state_size), np.float32)
        self.read(cache, z[:1], [0])
        propose_tree(self, cache, self.read(cache, z, [0, 0]), 8, BEAM)

    def save(self, path: str | Path) -> None:
        """Write the layer to `path` (a .pt file), atomically, its weights `stored`."""
        import torch

        state = {
            "format": FORMAT,
            "hidden_size": self.hidden_size,
            "layers": list(self.layers),
            "vocab_size": self.vocab_size,
            "width": self.width,
            "depth": self.depth,
            "ids": torch.from_numpy(self.ids),
            "weights": stored(self.module.state_dict()),
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
                state["layers"],
                state["ids"].numpy(),
                state["vocab_size"],
                width=state["width"],
                depth=state["depth"],
                meta=state.get("meta"),
            )
            layer.module.load_state_dict(restored(state["weights"]))
            layer.ready()
            return layer

        return load_state(path, FORMAT, "drafting layer", build)


def stored(weights: dict) -> dict:
    """A module's weights as a layer file keeps them: each matrix as int8 per row with its
    row's scale (float16: the largest magnitude over 127), as drafting's int8 copy quantizes a
    Linear's; vectors as float16. Half of float16's bytes (a shipped layer is in git), with
    the same α on the bench's answers (BENCHMARKS.md, the eagle layer)."""
    import torch

    out: dict = {}
    for name, w in weights.items():
        if w.dim() == 2:
            scale = (w.float().abs().amax(dim=1, keepdim=True) / 127).half()
            step = torch.where(scale > 0, scale.float(), 1.0)  # a row of zeros stays zeros
            out[name] = {"int8": (w.float() / step).round().clamp(-127, 127).char(),
                         "scale": scale}
        else:
            out[name] = w.half()
    return out


def restored(weights: dict) -> dict:
    """`stored`'s weights (or a float tensor per name, as older files hold them) in float32."""
    return {name: w["int8"].float() * w["scale"].float() if isinstance(w, dict) else w.float()
            for name, w in weights.items()}


def projected(embedding: np.ndarray, width: int) -> np.ndarray:
    """The target's token embeddings [n, hidden_size] -> where the layer's embedding E starts
    [n, width] float32: their coordinates along their `width` leading principal directions
    (uncentred; zeros past the rank), each row scaled to a root mean square of 0.02, E's
    random start's. So tokens the target embeds alike start alike: measured on 125k positions
    (one epoch), α1 on the bench's answers 0.237 against 0.217 from a random start."""
    e = np.asarray(embedding, dtype=np.float64)
    _, _, vt = np.linalg.svd(e, full_matrices=False)
    p = np.zeros((len(e), width))
    m = min(width, len(vt))
    p[:, :m] = e @ vt[:m].T
    rms = np.sqrt((p**2).mean(-1, keepdims=True))
    return (0.02 * p / np.maximum(rms, 1e-12)).astype(np.float32)


@dataclass
class Cache:
    """The layer's keys and values for one sequence's committed positions: buffers [heads,
    capacity, width / heads] (torch tensors; head-major, so that attention multiplies them in
    place) whose first n positions are filled, by `net` (the int8 copy of the weights that runs
    them)."""

    net: Any
    keys: Any
    values: Any
    n: int = 0

    def extend(self, k, v):
        """Append positions k, v [m, heads, d] (the buffers grow by doubling, so a round copies
        nothing already cached); returns the filled keys and values (`filled`)."""
        end = self.n + len(k)
        if end > self.keys.shape[1]:
            size = max(end, 2 * self.keys.shape[1], 64)
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = old.new_empty(old.shape[0], size, old.shape[2])
                grown[:, : self.n] = old[:, : self.n]
                setattr(self, name, grown)
        self.keys[:, self.n : end] = k.transpose(0, 1)
        self.values[:, self.n : end] = v.transpose(0, 1)
        self.n = end
        return self.filled()

    def filled(self):
        """The filled keys and values [heads, n, d] (views)."""
        return self.keys[:, : self.n], self.values[:, : self.n]


def attend(q, k0, v0, mask0, chain_k=None, chain_v=None):
    """Attention of queries q [..., N, H, d] over keys and values k0, v0 [..., P, H, d] (where
    `mask0` [N, P] allows, None: all) and, for each query, its own chain of keys and values
    chain_k, chain_v [..., N, j, H, d] (its ancestors' and its own: training-time test's
    diagonal); returns [..., N, H * d]."""
    import torch

    scale = q.shape[-1] ** -0.5
    s0 = torch.einsum("...nhd,...phd->...hnp", q, k0) * scale
    if mask0 is not None:
        s0 = s0.masked_fill(~mask0, float("-inf"))
    if chain_k is None or chain_k.shape[-3] == 0:
        p = torch.softmax(s0, dim=-1)
        out = torch.einsum("...hnp,...phd->...nhd", p, v0)
    else:
        sc = torch.einsum("...nhd,...njhd->...hnj", q, chain_k) * scale
        p = torch.softmax(torch.cat([s0, sc], dim=-1), dim=-1)
        p0, pc = p[..., : s0.shape[-1]], p[..., s0.shape[-1] :]
        out = torch.einsum("...hnp,...phd->...nhd", p0, v0)
        out = out + torch.einsum("...hnj,...njhd->...nhd", pc, chain_v)
    return out.flatten(-2)


def attend_cached(q, keys, values, chain_k=None, chain_v=None):
    """`attend` of drafting: queries q [N, H, d] over a `Cache`'s filled keys and values,
    head-major [H, P, d] (multiplied in place, no copy of them), all allowed, and each query's
    chain chain_k, chain_v [N, j, H, d] (None: none); returns [N, H * d]."""
    import torch

    scale = q.shape[-1] ** -0.5
    s0 = torch.matmul(q.transpose(0, 1), keys.transpose(1, 2)) * scale  # [H, N, P]
    if chain_k is None:
        out = torch.matmul(torch.softmax(s0, dim=-1), values)
    else:
        sc = torch.einsum("nhd,njhd->hnj", q, chain_k) * scale
        p = torch.softmax(torch.cat([s0, sc], dim=-1), dim=-1)
        out = torch.matmul(p[..., : s0.shape[-1]], values)
        out = out + torch.einsum("hnj,njhd->hnd", p[..., s0.shape[-1] :], chain_v)
    return out.transpose(0, 1).flatten(-2)


@functools.cache
def _module_class():
    """The torch module class, defined on first use (importing this module imports no torch)."""
    import torch
    from torch import nn

    class LayerModule(nn.Module):
        """Fuse, the token embedding, the input projection, one pre-norm attention block with
        its MLP, and the output layer over the reduced vocabulary (module docstring)."""

        def __init__(self, parts: int, d: int, width: int, n_ids: int) -> None:
            super().__init__()
            self.parts, self.d, self.width = parts, d, width
            self.fuse = nn.Linear(parts * d, width, bias=False)
            self.emb = nn.Embedding(n_ids + 1, width)
            with torch.no_grad():
                self.emb.weight.normal_(0.0, 0.02)
                self.emb.weight[n_ids].zero_()
            self.norm_f = nn.RMSNorm(width)
            self.norm_e = nn.RMSNorm(width)
            self.copy_n = nn.Embedding(COPY_N + 1, width)  # N: the copy's match length
            with torch.no_grad():
                self.copy_n.weight.normal_(0.0, 0.02)
            self.norm_c = nn.RMSNorm(width)
            self.inp = nn.Linear(3 * width, width, bias=False)
            self.norm1 = nn.RMSNorm(width)
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.proj = nn.Linear(width, width, bias=False)
            self.norm2 = nn.RMSNorm(width)
            self.up = nn.Linear(width, 2 * width, bias=False)
            self.down = nn.Linear(2 * width, width, bias=False)
            self.back = nn.Linear(width, d, bias=False)  # into the target's state space
            with torch.no_grad():
                self.back.weight.zero_()
            self.norm3 = nn.RMSNorm(d)
            self.out = nn.Linear(d, n_ids, bias=False)
            self.gate = nn.Linear(width, COPY_N + 1)  # the copied token's logit, by n
            self.slot = nn.Linear(width, COPY_N + 1)  # an unnamed copy's log-odds, by n
            with torch.no_grad():
                for lin in (self.gate, self.slot):
                    lin.weight.zero_()
                    lin.bias.zero_()

        # -- the pieces ----------------------------------------------------------------------
        def features(self, s):  # [..., parts * d] -> [..., width]
            s = s.unflatten(-1, (self.parts, self.d))
            s = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + FEATURE_EPS)
            return self.fuse(s.flatten(-2))

        def inputs(self, f, t, c, n):
            """Features [..., w], token indices t [...], their copies' indices c [...] and match
            lengths n [...] -> u [..., w]."""
            copied = self.norm_c(self.emb(c) + self.copy_n(n))
            return self.inp(torch.cat([self.norm_f(f), self.norm_e(self.emb(t)), copied], dim=-1))

        def qkv_of(self, u):  # u [..., w] -> q, k, v [..., H, w / H]
            q, k, v = self.qkv(self.norm1(u)).chunk(3, dim=-1)
            return (x.unflatten(-1, (ATTENTION_HEADS, -1)) for x in (q, k, v))

        def finish(self, u, att):  # the block's output, the feature a [..., w]
            x = u + self.proj(att)
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

        def top(self, s):  # [..., parts * d] -> the top layer's state [..., d]
            return s[..., (self.parts - 1) * self.d :]

        def predict(self, a, base, c, n):
            """Feature a [..., w], the state it corrects, base [..., d], and the copy (c, n)
            [...] -> (logits [..., n_ids + 1], the predicted state base + Back(a) [..., d]):
            the copied token's logit gains Gate(a)_n where the copy is one the layer names;
            column n_ids (the copy slot) is a copy it does not name, at log-odds Slot(a)_n
            against all the named tokens together (`UNNAMED` where the copy is named or none)."""
            state = base + self.back(a)
            logits = self.out(self.norm3(state))
            v = logits.shape[-1]
            named = (c < v) & (n > 0)
            bonus = self.gate(a).gather(-1, n[..., None]) * named[..., None].to(logits.dtype)
            logits = logits.scatter_add(-1, c.clamp(max=v - 1)[..., None], bonus.to(logits.dtype))
            odds = self.slot(a).gather(-1, n[..., None]).to(logits.dtype)
            slot = torch.logsumexp(logits, dim=-1, keepdim=True) + odds
            unnamed = ((c >= v) & (n > 0))[..., None]
            slot = torch.where(unnamed, slot, torch.full_like(slot, UNNAMED))
            return torch.cat([logits, slot], dim=-1), state

        # -- training ------------------------------------------------------------------------
        def unroll(self, s, t, c, n, depth: int, states: bool = False):
            """Training-time test over answers: states s [B, L, S], token indices
            t [B, L + depth - 1] (t[:, i] follows position i; then the tokens after them) and
            their copies c, n (indices and match lengths, as t); returns the logits
            [B, L, n_ids + 1] of each draft depth 1..depth (depth j at position i predicts the
            token after t[:, i + j - 1]), and with `states` also each depth's predicted state
            ŝ [B, L, d] (depth j at i: the target's top state at i + j, as it would be)."""
            L = s.shape[1]
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            f = self.features(s)
            u = self.inputs(f, t[:, :L], c[:, :L], n[:, :L])
            q, k0, v0 = self.qkv_of(u)
            a = self.finish(u, attend(q, k0, v0, causal))
            logits, state = self.predict(a, self.top(s), c[:, :L], n[:, :L])
            out, predicted = [logits], [state]
            chain_k, chain_v = [], []
            for j in range(1, depth):
                cj, nj = c[:, j : j + L], n[:, j : j + L]
                u = self.inputs(a, t[:, j : j + L], cj, nj)
                q, k, v = self.qkv_of(u)
                chain_k.append(k)
                chain_v.append(v)
                ck, cv = torch.stack(chain_k, dim=-3), torch.stack(chain_v, dim=-3)
                a = self.finish(u, attend(q, k0, v0, causal, ck, cv))
                logits, state = self.predict(a, state, cj, nj)
                out.append(logits)
                predicted.append(state)
            return (out, predicted) if states else out

        def forward(self, s, t, c, n):  # depth 1: [B, L, S], [B, L] x 3 -> logits [B, L, n_ids + 1]
            return self.unroll(s, t, c, n, 1)[0]

        # -- drafting ------------------------------------------------------------------------
        def read(self, s, t, c, n, cache):
            """Committed positions [m, S], their tokens and copies [m] x 3 after `cache` ->
            (feature, predicted state, logits) at the last."""
            u = self.inputs(self.features(s), t, c, n)
            q, k, v = self.qkv_of(u)
            keys, values = cache.extend(k, v)  # a position's key is of its inputs alone
            a = self.finish(u[-1:], attend_cached(q[-1:], keys, values))  # the last sees all
            logits, state = self.predict(a, self.top(s[-1:]), c[-1:], n[-1:])
            return a[0], state[0], logits[0]

        def expand(self, f, base, t, c, n, cache, chain_k, chain_v):
            """Draft nodes: parents' features f [m, w] and predicted states base [m, d], their
            tokens and copies t, c, n [m], the keys and values of their ancestors [m, j, H, dh]
            -> (features, predicted states, logits, k, v) of the nodes."""
            u = self.inputs(f, t, c, n)
            q, k, v = self.qkv_of(u)
            ck = torch.cat([chain_k, k[:, None]], dim=1)
            cv = torch.cat([chain_v, v[:, None]], dim=1)
            a = self.finish(u, attend_cached(q, *cache.filled(), ck, cv))
            logits, state = self.predict(a, base, c, n)
            return a, state, logits, ck, cv

    return LayerModule


def _int8_copy(module):
    """The inference copy of a `LayerModule` (`Int8Copy`)."""
    return _int8_class()(module)


@functools.cache
def _int8_class():
    """The class of the inference copy, defined on first use (importing this module imports no
    torch)."""
    import copy
    import warnings

    import torch
    from torch import nn
    from torch.ao import quantization
    from torch.nn.functional import gelu, linear, rms_norm

    class Int8Copy:
        """What drafting runs: the module's `read` and `expand`, computed as the module computes
        them, its Linear layers dynamically quantized to int8 (weights per output row,
        activations per call) but Gate and Slot (COPY_N + 1 outputs each), kept in float as one
        product (an int8 call's fixed cost, ~20 us, is four times their float product's,
        measured on Zen 4); and in fewer torch calls than the module's pieces make, each costing
        ~10 us beside its arithmetic here: every norm one `rms_norm`, the token embedding's norm
        taken once for every token, the copy's logit and slot set per row in place."""

        def __init__(self, module) -> None:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao.quantization's notice of its move
                q = quantization.quantize_dynamic(
                    copy.deepcopy(module).eval(),
                    {nn.Linear: quantization.per_channel_dynamic_qconfig},
                    dtype=torch.qint8,
                )
                self.parts, self.d, self.width = module.parts, module.d, module.width
                for name in ("fuse", "inp", "qkv", "proj", "up", "down", "back", "out"):
                    setattr(self, name, getattr(q, name))
                self.emb = module.emb.weight.detach().clone()
                self.emb_normed = module.norm_e(module.emb.weight).detach().clone()
                self.copy_n = module.copy_n.weight.detach().clone()
                self.norms = {
                    name: (getattr(module, name).weight.detach().clone(), getattr(module, name).eps)
                    for name in ("norm_f", "norm_c", "norm1", "norm2", "norm3")
                }
                self.gate_slot = (torch.cat([module.gate.weight, module.slot.weight]).detach(),
                                  torch.cat([module.gate.bias, module.slot.bias]).detach())

        def _norm(self, x, name: str):
            weight, eps = self.norms[name]
            return rms_norm(x, (x.shape[-1],), weight, eps)

        def _u(self, f, t, c, n):  # `inputs`
            copied = self._norm(self.emb[c] + self.copy_n[n], "norm_c")
            return self.inp(torch.cat([self._norm(f, "norm_f"), self.emb_normed[t], copied], -1))

        def _qkv(self, u):  # `qkv_of`: q, k, v [m, heads, width / heads]
            return self.qkv(self._norm(u, "norm1")).view(len(u), 3, ATTENTION_HEADS, -1).unbind(1)

        def _finish(self, u, att):
            x = u + self.proj(att)
            return x + self.down(gelu(self.up(self._norm(x, "norm2"))))

        def _predict(self, a, base, c, n):
            """`LayerModule.predict`, its copy's logit and slot set row by row (m is a few)."""
            state = base + self.back(a)
            logits = self.out(self._norm(state, "norm3"))
            v, m = logits.shape[-1], len(a)
            extra = linear(a, *self.gate_slot).tolist()  # [m, 2 (COPY_N + 1)]
            slot = torch.full((m, 1), UNNAMED)
            for r, (copied, size) in enumerate(zip(c.tolist(), n.tolist(), strict=True)):
                if size > 0 and copied < v:
                    logits[r, copied] += extra[r][size]
                elif size > 0:
                    slot[r, 0] = torch.logsumexp(logits[r], 0) + extra[r][COPY_N + 1 + size]
            return torch.cat([logits, slot], dim=-1), state

        def read(self, s, t, c, n, cache):
            """`LayerModule.read`."""
            m = len(s)
            each = rms_norm(s.view(m, self.parts, self.d), (self.d,), None, FEATURE_EPS)
            f = self.fuse(each.view(m, -1))
            u = self._u(f, t, c, n)
            q, k, v = self._qkv(u)
            keys, values = cache.extend(k, v)
            a = self._finish(u[-1:], attend_cached(q[-1:], keys, values))
            logits, state = self._predict(a, s[-1:, (self.parts - 1) * self.d :], c[-1:], n[-1:])
            return a[0], state[0], logits[0]

        def expand(self, f, base, t, c, n, cache, chain_k, chain_v):
            """`LayerModule.expand`."""
            u = self._u(f, t, c, n)
            q, k, v = self._qkv(u)
            ck = torch.cat([chain_k, k[:, None]], dim=1)
            cv = torch.cat([chain_v, v[:, None]], dim=1)
            a = self._finish(u, attend_cached(q, *cache.filled(), ck, cv))
            logits, state = self._predict(a, base, c, n)
            return a, state, logits, ck, cv

    return Int8Copy


@dataclass
class Tree:
    """A drafted tree, best first: target ids, parents (-1: the root), each token's
    probability given its parent (the layer's confidence) and cumulative probability."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    cumulative: list[float] = field(default_factory=list)


def propose_tree(
    layer: Layer, cache: Cache, root, k: int, beam: int,
    follow: Callable[[list[int]], tuple[int, int]] | None = None,
    keep_going: Callable[[Sequence[float]], bool] | None = None,
) -> Tree:
    """The best k-token tree (module docstring) grown from `root` (`Layer.read`'s feature [w],
    predicted state [d] and depth-1 logits [len(ids) + 1], torch), expanding `beam` nodes a
    level with `beam` children each, for `layer.depth` levels; beam 1: the best chain.
    `follow`: a draft path (target ids from the root's child down; [] for the root) -> its
    copy (target id, n), as `NgramIndex.after` gives it over the committed context (None: no
    copies, so the copy slot names nothing). `keep_going`: a node's path (the confidences from
    the root's child down to it) -> whether it may have children (`drafters.base.KeepGoing`;
    the controller's: whether any plan could pay for them); a level none may grow is not
    drafted."""
    import torch

    net = cache.net
    heads, d = ATTENTION_HEADS, layer.width // ATTENTION_HEADS
    slot = len(layer.ids)
    # every node: (parent node or -1, column, target id, confidence, cumulative, level)
    nodes: list[tuple[int, int, int, float, float, int]] = []
    feature, state, logits = root

    def add(parent: int, probs, copy: int, level: int) -> None:
        """The `beam` most likely children of `parent` (the copy slot names `copy`)."""
        top = torch.topk(probs, min(beam, len(probs)))
        above = 1.0 if parent < 0 else nodes[parent][4]
        for c, x in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            tok = int(layer.ids[x]) if x < slot else copy
            if tok >= 0:  # the slot of a node with no copy names nothing
                nodes.append((parent, x, tok, c, above * c, level))

    with torch.inference_mode():
        add(-1, torch.softmax(logits, dim=-1), follow([])[0] if follow else -1, 1)
        level = list(range(len(nodes)))
        feats = feature[None].expand(len(level), -1)
        states = state[None].expand(len(level), -1)
        chain_k = torch.zeros(len(level), 0, heads, d)
        chain_v = torch.zeros(len(level), 0, heads, d)
        parent_row = list(range(len(level)))  # each level node's row in feats / chains
        for depth in range(2, layer.depth + 1):
            best = [i for i in sorted(level, key=lambda i: -nodes[i][4])[:beam]
                    if nodes[i][4] >= FLOOR
                    and (keep_going is None or keep_going(_along(nodes, i, 3)))]
            if not best or (len(nodes) >= k and _kth(nodes, k) >= nodes[best[0]][4]):
                break  # no node worth a child, or no child could enter the best k
            rows = [parent_row[level.index(i)] for i in best]
            toks = torch.tensor([nodes[i][1] for i in best])
            copies = None if follow is None else list(zip(
                *(follow(_along(nodes, i, 2)) for i in best), strict=True))
            c, n = layer.copy_inputs(copies, len(best))
            a, st, lg, ck, cv = net.expand(
                feats[rows], states[rows], toks, c, n, cache, chain_k[rows], chain_v[rows]
            )
            p = torch.softmax(lg, dim=-1)
            first = len(nodes)
            for r, i in enumerate(best):
                add(i, p[r], -1 if copies is None else copies[0][r], depth)
            level = list(range(first, len(nodes)))
            parent_row = [best.index(nodes[j][0]) for j in level]
            feats, states, chain_k, chain_v = a, st, ck, cv
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i][4], nodes[i][5], i))[:k]
    place = {n: j for j, n in enumerate(order)}
    tree = Tree()
    for n in order:
        parent, _, tok, c, cum, _ = nodes[n]
        tree.tokens.append(tok)
        tree.parents.append(-1 if parent < 0 else place[parent])
        tree.confidence.append(float(c))
        tree.cumulative.append(float(cum))
    return tree


def _along(nodes: Sequence[tuple[int, int, int, float, float, int]], i: int, field: int) -> list:
    """A field of every node from the root's child down to node i (2: target ids, 3:
    confidences)."""
    out = []
    while i >= 0:
        out.append(nodes[i][field])
        i = nodes[i][0]
    return out[::-1]


def _kth(nodes: Sequence[tuple[int, int, int, float, float, int]], k: int) -> float:
    """The k-th highest cumulative probability among the tree's nodes (k <= len(nodes))."""
    return sorted((n[4] for n in nodes), reverse=True)[k - 1]
