"""`HeadsDrafter` (Medusa-style heads): small networks on the target's own final hidden state
propose the next tokens, with no second model and no second KV cache.

After the target predicted a token x from its hidden state h (`LM.hidden`: the state at the
last cached position), head i guesses the i-th token after x from h alone: a residual block
z_i = h + SiLU(W_i h + b_i), then an output layer over a **reduced vocabulary** (the `ids`: the
target tokens the heads can name, the most frequent ones of their training data), shared by all
heads. A proposal of k tokens runs the first k heads on one state, one matrix product per
layer; it costs a few percent of a target step, so the drafter is not `cheap`: the controller
decides first, and the heads run only in rounds it gives them.

Greedy: each head's argmax, with its unwarped softmax probability as confidence. Sampling: q_i
= `warp` of head i's logits over the reduced vocabulary (zero elsewhere), a token drawn from it
with the request's sampler; q_i is a function of the context alone, so rejection sampling
against it is exact. A chain, never a tree.

`Heads` is the network and its file (`save`/`load`, keyed by the target model it was trained
for: `heads_path`); training it is `specwise.distill`'s work. Torch is imported when heads are
built, never by importing this module.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, register
from specwise.sampling import Sampler, SamplingParams, warp

__all__ = [
    "FORMAT",
    "Heads",
    "HeadsDrafter",
    "check_target",
    "check_vocab",
    "draw",
    "heads_path",
    "load_state",
    "model_key",
    "save_state",
    "vocab_index",
]

FORMAT = 1  # the file's layout version


def model_key(path: str | Path) -> str:
    """What heads are kept under for a target: the catalog's sha256 where it is a catalog
    model (its name, or its pulled file), else the sha256 of a GGUF file's size and first and last MiB (a full hash
    of a 1 GB file takes seconds at every start), or of a folder's file fingerprint."""
    import hashlib

    from specwise.models import CATALOG, model_path

    if str(path) in CATALOG and not Path(path).exists():  # a catalog name: pulled or not
        return CATALOG[str(path)].sha256
    path = Path(path).resolve()
    if path.is_dir():  # a Hugging Face folder: its files' names, sizes and times
        from specwise.backends.base import file_fingerprint

        return hashlib.sha256(file_fingerprint(path).encode()).hexdigest()
    for entry in CATALOG.values():
        if model_path(entry.name).resolve() == path:
            return entry.sha256
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()


def heads_path(model: str | Path) -> Path:
    """Where the heads trained for `model` live: $SPECWISE_HOME/heads/<key>/."""
    from specwise.models import home

    return home() / "heads" / model_key(model)[:20]


class Heads:
    """Heads(hidden_size, n_heads, ids, vocab_size, unembedding=None, seed=0): the network.
    ids: the target ids of the reduced vocabulary (distinct, < vocab_size); unembedding:
    the target's output rows [len(ids), hidden_size] for them, the output layer's start (else
    random). The blocks start at zero, so every head starts as the target's own output layer
    restricted to `ids`. `module` is the torch module (for training); `logits` runs it."""

    def __init__(
        self,
        hidden_size: int,
        n_heads: int,
        ids: Sequence[int],
        vocab_size: int,
        unembedding: np.ndarray | None = None,
        seed: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        import torch

        ids = np.asarray(ids, dtype=np.int64)
        if n_heads < 1:
            raise ValueError(f"n_heads = {n_heads} is invalid; use an integer >= 1")
        check_vocab(ids, vocab_size, hidden_size, unembedding, "the heads'")
        self.hidden_size, self.n_heads, self.vocab_size = hidden_size, n_heads, vocab_size
        self.ids = ids
        self.meta = dict(meta or {})
        torch.manual_seed(seed)
        self.module = _module_class()(hidden_size, n_heads, len(ids))
        if unembedding is not None:
            with torch.no_grad():
                self.module.out.weight.copy_(torch.from_numpy(np.asarray(unembedding)))
        self._fast: Any = None  # the inference copy (`logits`), made on first use

    def logits(self, h: np.ndarray, n: int | None = None) -> np.ndarray:
        """[hidden_size] -> [n, len(ids)] float32: the logits over `ids` of the first n heads
        (all by default; the others' weights are not read). Runs on the int8 copy of the
        weights that `publish` made (at the first call, if none was): the products are
        memory-bound, and int8 reads a quarter of float32's bytes."""
        import torch

        if self._fast is None:
            self.publish()
        fast = self._fast  # one read: a swap meanwhile changes the next call's weights
        with torch.inference_mode():
            x = torch.from_numpy(np.asarray(h, dtype=np.float32))[None]  # [1, d]
            return fast(x, self.n_heads if n is None else n)[:, 0].numpy()

    def ready(self) -> None:
        """Make the int8 copy (`publish`) and run each head count once (the CPU library prepares its
        kernels at a shape's first product): that work belongs to loading, not to a request's
        first rounds."""
        self.publish()
        zero = np.zeros(self.hidden_size, dtype=np.float32)
        for n in range(1, self.n_heads + 1):
            self.logits(zero, n)

    def publish(self) -> None:
        """The weights changed (training): copy them into the int8 copy that `logits` runs
        (weights quantized per output row, activations per call), built aside and swapped in
        by one assignment, so a `logits` call running on another thread meanwhile reads the
        old weights or the new, never a mix."""
        self._fast = _int8_copy(self.module)

    def save(self, path: str | Path) -> None:
        """Write the heads to `path` (a .pt file), atomically."""
        import torch

        state = {
            "format": FORMAT,
            "hidden_size": self.hidden_size,
            "n_heads": self.n_heads,
            "vocab_size": self.vocab_size,
            "ids": torch.from_numpy(self.ids),
            "weights": self.module.state_dict(),
            "meta": self.meta,
        }
        save_state(path, state)

    @classmethod
    def load(cls, path: str | Path) -> Heads:
        """Read heads written by `save`, `ready` to run; ValueError naming the file where it
        is not one."""

        def build(state: dict) -> Heads:
            heads = cls(
                state["hidden_size"],
                state["n_heads"],
                state["ids"].numpy(),
                state["vocab_size"],
                meta=state.get("meta"),
            )
            heads.module.load_state_dict(state["weights"])
            heads.ready()
            return heads

        return load_state(path, FORMAT, "heads", build)


def check_vocab(
    ids: np.ndarray, vocab_size: int, hidden_size: int, unembedding: Any, whose: str
) -> None:
    """ValueError unless `ids` (a drafter network's reduced vocabulary, `whose`) are distinct
    target ids, at least one, and `unembedding` is None or their output rows."""
    if len(ids) == 0 or len(set(ids.tolist())) != len(ids):
        raise ValueError(f"{whose} vocabulary must be distinct target ids, at least one")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"{whose} vocabulary holds ids outside 0 .. {vocab_size - 1}")
    if unembedding is not None and unembedding.shape != (len(ids), hidden_size):
        raise ValueError(
            f"the unembedding has shape {unembedding.shape}, not {(len(ids), hidden_size)}"
        )


def vocab_index(ids: np.ndarray, vocab_size: int, missing: int = -1) -> np.ndarray:
    """The map from target ids [vocab_size] to their index in a reduced vocabulary `ids`,
    `missing` for every id outside it."""
    where = np.full(vocab_size, missing, dtype=np.int64)
    where[ids] = np.arange(len(ids))
    return where


def save_state(path: str | Path, state: dict) -> None:
    """Write a drafter network's state (tensors and plain values) to `path` (.pt), atomically."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    torch.save(state, tmp)
    tmp.replace(path)


def load_state(path: str | Path, fmt: int, what: str, build: Callable[[dict], Any]) -> Any:
    """`build(state)` of the state `save_state` wrote to `path` in layout `fmt`; a missing file
    is FileNotFoundError, any other failure one ValueError naming the file and `what` it is
    not."""
    import torch

    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        if state.get("format") != fmt:
            raise ValueError(f"format {state.get('format')!r}, this specwise reads {fmt}")
        return build(state)
    except FileNotFoundError:
        raise
    except Exception as exc:  # any unreadable file: one clear error
        raise ValueError(f"{path} holds no {what} specwise can read ({exc})") from None


def check_target(
    target: LM, hidden_size: int, vocab_size: int, drafter: str, trained: str, again: str
) -> None:
    """`bind` of a drafter on the target's hidden states: ValueError unless `target` keeps them
    at `hidden_size` wide over a vocabulary of `vocab_size`. trained: what the network is
    ("these heads were"); again: what to train for this model ("heads")."""
    got = getattr(target, "hidden_size", 0)
    if not got:
        raise ValueError(
            f"the {drafter} drafter reads the target's hidden states, and this target was "
            f"loaded without them (specwise loads it with them when --drafter names {drafter})"
        )
    if got != hidden_size:
        raise ValueError(
            f"{trained} trained on hidden states of width {hidden_size}; the target's are "
            f"{got} wide: train {again} for this model"
        )
    if target.vocab_size != vocab_size:
        raise ValueError(
            f"{trained} trained on a vocabulary of {vocab_size} tokens; the target's has "
            f"{target.vocab_size}: train {again} for this model"
        )


@functools.cache
def _module_class():
    """The torch module class, defined on first use (importing this module imports no torch)."""
    from torch import nn

    class HeadsModule(nn.Module):
        """Residual blocks (one Linear of all heads together) and the shared output layer."""

        def __init__(self, d: int, n_heads: int, n_ids: int) -> None:
            super().__init__()
            self.n_heads = n_heads
            self.blocks = nn.Linear(d, n_heads * d)
            nn.init.zeros_(self.blocks.weight)
            nn.init.zeros_(self.blocks.bias)
            self.out = nn.Linear(d, n_ids, bias=False)

        def forward(self, h, n: int | None = None):  # [..., d] -> [..., n, n_ids]
            n = self.n_heads if n is None else n
            d = h.shape[-1]
            w, b = self.blocks.weight[: n * d], self.blocks.bias[: n * d]
            z = nn.functional.linear(h, w, b).unflatten(-1, (n, d))
            return self.out(h.unsqueeze(-2) + nn.functional.silu(z))

    return HeadsModule


def _int8_copy(module):
    """The inference copy of a `HeadsModule`: one Linear per head's block (so that the first
    n heads read only their own rows) and the output layer, dynamically quantized to int8;
    called as fast(x [B, d], n) -> [n, B, N]."""
    import warnings

    import torch
    from torch import nn
    from torch.ao import quantization

    class Fast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = module.out.in_features
            self.blocks = nn.ModuleList()
            for i in range(module.n_heads):
                block = nn.Linear(d, d)
                block.weight.data = module.blocks.weight.data[i * d : (i + 1) * d].clone()
                block.bias.data = module.blocks.bias.data[i * d : (i + 1) * d].clone()
                self.blocks.append(block)
            self.out = nn.Linear(d, module.out.out_features, bias=False)
            self.out.weight.data = module.out.weight.data.clone()

        def forward(self, x, n: int):
            z = torch.stack([x + nn.functional.silu(b(x)) for b in self.blocks[:n]])
            return self.out(z)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's notice that it moves to torchao
        return quantization.quantize_dynamic(
            Fast().eval(),
            {nn.Linear: quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
        )


def draw(
    row: np.ndarray, ids: np.ndarray, vocab_size: int, params: SamplingParams, sampler: Sampler
) -> tuple[int, np.ndarray | None, float]:
    """One drafted token from logits `row` over the reduced vocabulary `ids`: (target id, q
    over the target's whole vocabulary [vocab_size] or None when greedy, confidence). Greedy:
    the argmax, its unwarped softmax probability as confidence; sampling: q = `warp` of the row
    (zero outside `ids`), the token drawn from it with the request's sampler, q(x) as
    confidence."""
    if params.greedy:
        x = int(np.argmax(row))
        return int(ids[x]), None, float(1.0 / np.exp(row - row[x]).sum())  # softmax at x
    q = warp(row, params)  # [N]
    x = sampler.categorical(q)
    full = np.zeros(vocab_size)
    full[ids] = q
    return int(ids[x]), full, float(q[x])


@register("heads")
class HeadsDrafter:
    """HeadsDrafter(heads, adapter=None): drafts with trained `Heads` on the hidden states of
    the target it is bound to (a target built with hidden states: `LM.hidden_size`); with an
    `adapter` (`specwise.adapt.Adapter`), with the heads it adapted for each request's tenant."""

    name = "heads"
    # Not cheap: a proposal costs a few percent of a target step (memory-bound products), so
    # the controller decides first and the heads run only in the rounds it gives them.
    cheap = False

    def __init__(self, heads: Heads, adapter: Any = None) -> None:
        self.heads = heads
        self.adapter = adapter
        self.max_tokens = heads.n_heads  # one token a head
        self.fingerprint = (
            f"heads:{heads.meta.get('key', 'unsaved')}:{heads.meta.get('trained', '')}"
        )
        self._target: LM | None = None

    def bind(self, target: LM) -> None:
        h = self.heads
        check_target(target, h.hidden_size, h.vocab_size, "heads", "these heads were", "heads")
        self._target = target

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        return None

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
        h = self._target.hidden(seq)
        if h is None:  # the target's last forward did not end where the context does
            return Draft([], None)
        heads = self.heads if self.adapter is None else self.adapter.net_for(seq)
        logits = heads.logits(h, min(k, heads.n_heads))  # [n, N]
        tokens: list[int] = []
        conf: list[float] = []
        qs: list[np.ndarray] = []
        for row in logits:
            x, q, c = draw(row, heads.ids, heads.vocab_size, params, sampler)
            tokens.append(x)
            conf.append(c)
            if q is not None:
                qs.append(q)
            if keep_going is not None and not keep_going(conf):
                break
        return Draft(tokens, np.stack(qs) if qs else None, conf)

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        return None

    def end(self, seq: int) -> None:
        return None

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return 0

    def measure_cost(self) -> tuple[float, float]:
        """ms per proposed token: every head on a random state (median of 20 after 3),
        divided by the heads' number; no catch-up cost. (Measured alone, the weights stay in
        the CPU's cache; in a round they are read from memory again: the controller learns
        that cost from the rounds, `Costs.observe_draft`.)"""
        rng = np.random.default_rng(0)
        h = rng.standard_normal(self.heads.hidden_size).astype(np.float32)
        times = []
        for i in range(23):
            t = time.perf_counter()
            self.heads.logits(h).argmax(axis=-1)
            if i >= 3:
                times.append(time.perf_counter() - t)
        return float(np.median(times)) * 1000.0 / self.heads.n_heads, 0.0
