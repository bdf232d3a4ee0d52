"""`EagleDrafter` (EAGLE-3-style): one transformer layer over three of the target's own layers
(`drafters.eagle_layer.Layer`) drafts a tree of tokens, with no second model, only the layer's
small cache of keys and values; and where a layer is found (`find`: trained here, or shipped
with the package, `shipped_path`/`ship`) and its data lives (`data_path`, `bench_path`).

What it reads: the states of a low, a middle and a high layer (`layers_for`), at every
committed position, with each token's copy (what the n-gram drafter would propose after it:
an `NgramIndex` of the request's context, and for draft tokens of their path). In a round it
first reads the positions committed since it last ran (the target keeps them from the
prompt's last position on, `LM.hiddens`), then grows the best k-token tree from the last
(`eagle_layer.propose_tree`); the controller takes a prefix of it.
Its cache holds committed positions only (the draft tokens' keys live for one proposal), so a
rejected draft leaves nothing to undo. Greedy and sampled requests draft the same way; q is
a point mass, so greedy matching and sample-and-match stay exact.

Training the layer is `specwise.eagle_training`'s work, adapting it to served traffic
`specwise.adapt`'s (a request drafts to its end with the weights its first proposal found: its
cache was filled by them). Torch is imported when a layer is built, never by importing this
module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, register
from specwise.drafters.eagle_layer import BEAM, COPY_N, Cache, Layer, propose_tree
from specwise.drafters.heads import heads_path, model_key
from specwise.drafters.ngram import NgramIndex
from specwise.sampling import Sampler, SamplingParams

__all__ = [
    "COPY_N",
    "FILE",
    "Cache",
    "EagleDrafter",
    "Layer",
    "bench_path",
    "data_path",
    "find",
    "layers_for",
    "propose_tree",
    "rebuild_command",
    "ship",
    "shipped_path",
]

WINDOW = 2048  # most committed positions the cache reads of a prompt
FILE = "eagle.pt"  # a trained layer's file name, here (`heads_path`) and shipped


def layers_for(n_layers: int) -> tuple[int, int, int]:
    """The target layers whose outputs the layer reads: a low, a middle and a high one (as
    EAGLE-3: the second, the middle, the third from the top)."""
    return (1, n_layers // 2 - 1, n_layers - 3)


def shipped_path(model: str | Path) -> Path:
    """Where specwise ships a trained layer for `model`: `specwise/trained/<its key>/` in the
    package (the key: the catalog's sha256 of the GGUF file, `heads.model_key`), beside its
    training manifest (`manifest.json`)."""
    from importlib import resources

    return Path(str(resources.files("specwise"))) / "trained" / model_key(model) / FILE


def find(model: str | Path) -> Path | None:
    """The layer to draft with for `model`: one trained on this machine (`heads_path`), else
    the one shipped for it, else None."""
    for path in (heads_path(model) / FILE, shipped_path(model)):
        if path.is_file():
            return path
    return None


def data_path(model: str | Path, layers: Sequence[int]) -> Path:
    """Where the layer's training data for `model`, read at `layers`, lives (`teacher`)."""
    return heads_path(model) / ("data-" + "-".join(map(str, layers)))


def bench_path(model: str | Path, layers: Sequence[int]) -> Path:
    """Where the target's answers to the bench's prompts, read at `layers`, live: what a layer
    is scored on for the categories, apart from the training data (`teacher.bench_answers`)."""
    return heads_path(model) / ("bench-" + "-".join(map(str, layers)))


def rebuild_command(record: dict) -> str:
    """The command that rebuilds a layer from its training record: `make eagle-layer`, making
    the data to as many positions as it was trained with, and training the layer shipped
    before it further where it was (its record has a `history`)."""
    kinds = (record.get("data") or {}).get("kinds") or {}
    total = sum(int(k.get("positions", 0)) for k in kinds.values())
    command = "make eagle-layer" + (f" EAGLE_POSITIONS={total}" if total else "")
    return command + (" EAGLE_FROM=shipped" if record.get("history") else "")


def ship(trained: Path, model: str | Path) -> Path:
    """Copy the layer file `trained` (with its training record beside it, `<name>.json`) to
    where specwise ships a layer for `model` (`shipped_path`), with `manifest.json`: that
    record, the file's sha256 and the command that rebuilds it (`rebuild_command`). Returns
    the shipped file."""
    import hashlib
    import json
    import shutil

    out = shipped_path(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = trained.with_suffix(".json")
    manifest = json.loads(record.read_text()) if record.is_file() else {}
    digest = hashlib.sha256(trained.read_bytes()).hexdigest()
    manifest.update(file=FILE, file_sha256=digest, rebuild=rebuild_command(manifest))
    part = out.with_suffix(".partial")
    shutil.copyfile(trained, part)
    part.replace(out)
    (out.parent / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


@dataclass
class _Seq:
    read: int  # the next position whose state the layer has not read
    layer: Layer  # the trained layer, or the request's tenant's adapted copy
    cache: Cache
    index: NgramIndex = field(default_factory=lambda: NgramIndex(COPY_N))
    copies: list[tuple[int, int]] = field(default_factory=list)  # each context token's copy

    def catch_up(self, context: Sequence[int]) -> None:
        """Index the context's new tokens, each with its copy (`NgramIndex.after`)."""
        for x in context[len(self.index.tokens) :]:
            self.index.push(x)
            self.copies.append(self.index.after())


@register("eagle")
class EagleDrafter:
    """EagleDrafter(layer, adapter=None, beam=BEAM): drafts trees with a trained `Layer` on
    the layer states of the target it is bound to (a target built with `layer.layers`:
    `LM.hidden_layers`); with an `adapter` (`specwise.adapt.Adapter`), with the copy it
    adapted for the request's tenant, as published when the request's first proposal is made.
    """

    name = "eagle"
    # Cheap: its tree is offered before the controller decides, which takes the best prefix
    # of it by its confidences (module docstring). The offer costs a share of a target step
    # (its read and a layer call a level: 3.1 ms a median offer among the target's threads
    # against a 28 ms step on Zen 4, which the controller learns: `CostModel.offer_ms`), so it
    # asks for it only while it drafts or pays, and to probe (`Controller.asks`), and the layer
    # grows a level only where a plan could pay for it (`Controller.offer_stopper`, its
    # `keep_going`).
    cheap = True
    max_tokens = None

    def __init__(self, layer: Layer, adapter: Any = None, beam: int = BEAM) -> None:
        if beam < 1:
            raise ValueError(f"beam = {beam} is invalid; use an integer >= 1")
        self.layer = layer
        self.adapter = adapter
        self.beam = beam
        self.fingerprint = (
            f"eagle:{layer.meta.get('key', 'unsaved')}:{layer.meta.get('trained', '')}:{beam}"
        )
        self._target: LM | None = None
        self._trees = False
        self._seqs: dict[int, _Seq] = {}

    def bind(self, target: LM) -> None:
        x = self.layer
        have = tuple(getattr(target, "hidden_layers", ()))
        if have != x.layers or target.hidden_size != x.state_size:
            raise ValueError(
                f"the eagle drafter reads the target's layers {list(x.layers)} "
                f"({x.state_size} wide); this target was loaded with "
                f"{list(have) if have else 'no layer states'} (specwise loads them when "
                f"--drafter names eagle)"
            )
        if target.vocab_size != x.vocab_size:
            raise ValueError(
                f"this layer was trained on a vocabulary of {x.vocab_size} tokens; the "
                f"target's has {target.vocab_size}: train a layer for this model"
            )
        self._target = target
        self._trees = bool(target.trees)

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._seqs.pop(seq, None)  # begun at its first proposal

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
        if s is None or len(context) < len(s.index.tokens):  # contexts only grow in a request
            layer = self.layer if self.adapter is None else self.adapter.net_for(seq)
            s = self._seqs[seq] = _Seq(0, layer, layer.new_cache())
        s.catch_up(context)
        cached = len(context) - 1  # the target holds every committed token but the last
        start = max(s.read, cached - WINDOW) if s.cache.n == 0 else s.read
        states = self._target.hiddens(seq, start) if start < cached else None
        if states is None or len(states) == 0:  # nothing new, or not kept: no draft
            return Draft([], None)
        first = cached - len(states)
        if first != s.read and s.cache.n:  # positions lost: start again after them
            s.cache = s.layer.new_cache()
        copies = list(zip(*s.copies[first + 1 : cached + 1], strict=True))
        root = s.layer.read(s.cache, states, context[first + 1 : cached + 1], copies)
        s.read = cached
        tree = propose_tree(s.layer, s.cache, root, k, self.beam if self._trees else 1,
                            s.index.after, keep_going)
        chain = all(q == i - 1 for i, q in enumerate(tree.parents))
        return Draft(tree.tokens, None, tree.confidence, None if chain else tree.parents)

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        return None

    def end(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return 0  # cheap: its catch-up is part of its proposal's cost

    def measure_cost(self) -> tuple[float, float]:
        """(ms per proposed token: a 15-token tree after one position read past 256, over 15;
        ms per further position read), medians of 12 after 3."""
        rng = np.random.default_rng(0)
        x = self.layer
        h = rng.standard_normal((257 + 8, x.state_size)).astype(np.float32)
        tree_ms, more = [], []
        beam = self.beam if self._trees or self._target is None else 1
        for i in range(15):
            cache = x.new_cache()
            x.read(cache, h[:256], [0] * 256)
            t = time.perf_counter()
            propose_tree(x, cache, x.read(cache, h[256:257], [0]), 15, beam)
            t1 = time.perf_counter()
            x.read(cache, h[257:], [0] * 8)
            if i >= 3:
                tree_ms.append(t1 - t)
                more.append(time.perf_counter() - t1)
        per = float(np.median(tree_ms)) * 1000.0 / 15
        return per, max(0.0, float(np.median(more)) * 1000.0 / 8)
