"""`LlamaCppLM`: GGUF models on llama.cpp through llama-cpp-python's low-level API.

One llama context serves several sequences: each specwise sequence id is mapped to a llama
sequence slot on its first forward and freed by `release`. Each slot has its own KV stream
(`kv_unified = false`), so a sequence's cache cells, and therefore its logits, do not depend on
what other sequences did before or beside it: batched output equals solo output exactly.
`forward` puts every (sequence, tokens) pair of a batch into ONE `llama_decode` call (split only
where a call would exceed `n_batch` tokens), in slot order, and copies out just the logits rows
asked for. With one stream per slot, llama.cpp runs a call as passes over runs of consecutive
slots in which every sequence contributes the same number of tokens (`equal_passes`): out of
slot order, or with a free slot between two sequences, a batch of single tokens costs several
passes, and a call where one sequence brings 5 tokens and three bring 1 costs a pass of 4x1
plus a pass of 1x4, nearly twice the all-1 call (BENCHMARKS.md §4). So the batch is fed in slot
order, a new sequence takes the lowest free slot, and a release moves the sequence in the
highest slot down into the freed one. `truncate` removes the cache
cells past the kept length (`llama_memory_seq_rm`), so rollback costs no recomputation.
Tokenizer and chat template come from the GGUF file (`LlamaTokenizer`; the library's import,
log and build are `backends/llama_lib.py`'s). This module does no sampling.

The extra weight buffers (AMX, CPU repacking) are used unless the build has llama.cpp's AMX
kernels compiled in: those die with SIGILL on some machines that report AMX, so such a build is
loaded without extra buffers unless `extra_buffers=True` says otherwise.

Exact mode (`exact=True`): every slot gets a context of its own, so a sequence's logits depend
on its tokens alone, bit for bit, not on the other sequences; and a sequence's tokens go in
passes of at most the class's `exact_width` where every row is asked for, the widths whose rows
equal a one-token forward's (a prefill, `last_only`, is one call in every mode). Mainline
llama.cpp's multi-token kernels (the flash attention of 8 or more queries, attention without
flash attention, the repacked weights) round a row differently from a one-token forward
(BENCHMARKS.md §7), so its exact width is 1: verification costs a forward a token, exact by
construction, and speculation cannot pay. ik_llama leaves out the kernels that differ
(`IkLlamaLM`) and takes 16 tokens a pass (its matrix kernels take another path from 32
rows on; its probe checks the widths specwise uses).

Token trees (`LM.trees`, where the library's class says so: `_takes_trees`): a
tree's tokens go into the call with sets of llama sequence ids as the attention mask. Each leaf
of the tree gets a spare sequence id (above the slots), which the sequence's cache cells are
copied to (`llama_kv_cache_seq_cp` adds an id to a cell, copying no data); a token carries the
ids of the leaves below it, so it sees the cache and its ancestors only. `keep` gives the kept
path's cells the slot's id and removes the leaves' ids, which frees the other branches' cells
(and closes the gaps that leaves between the path's cells, `_close_gaps`).
That needs one cache that every sequence shares (ik_llama's): mainline's stream per slot
(`kv_unified = false`) keeps a token to one stream, so it takes no trees.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specwise.backends.base import (
    BackendInfo,
    HiddenLog,
    NoLayerStates,
    check_append,
    check_layers,
    check_path,
    check_rows,
    check_tree,
    check_truncate,
    file_fingerprint,
    one_pass_each,
    refuse_trees,
)
from specwise.backends.llama_lib import (
    LlamaTokenizer,
    build_has_amx,
    check_gguf,
    clear_errors,
    default_threads,
    last_errors,
    library,
    system_info,
)

__all__ = [
    "LlamaCppLM",
    "LlamaTokenizer",
    "build_has_amx",
    "equal_passes",
    "system_info",
]

TREE_LEAVES = 16  # most leaves of one tree (a token carries the ids of the leaves below it)


def _split_rows(rows: np.ndarray, entries: Sequence[int], blocks: list[list[np.ndarray]]) -> None:
    """Append each run of `rows` [n, ...] to the block list of its entry (`entries[i]`: the
    entry of row i; an entry's rows are consecutive)."""
    j = 0
    while j < len(entries):
        e, k = entries[j], j
        while k < len(entries) and entries[k] == e:
            k += 1
        blocks[e].append(rows[j:k])
        j = k


class LlamaCppLM:
    """LlamaCppLM(path, threads=None, context_length=4096, max_sequences=4, hidden=False).

    hidden=True: every forward also returns the final hidden state of the rows it computes
    logits for (`LM.hidden`), at no extra forward; off by default, since it costs a copy per
    call. hidden=(i, j, ...): the outputs of those layers at every token fed instead
    (`LM.hidden_layers`), where the library can read them (`_want_hidden`). The library-specific steps (which library, model and context parameters, how cache
    cells are removed and copied, how a call runs as passes, how hidden states are read) are
    the methods a subclass for another llama.cpp library overrides; the rest (slots, batches,
    logits rows, rollback) is shared."""

    _embeddings = False  # the contexts compute embeddings: every token is an output

    backend = "llama_cpp"
    exact_width = 1  # most tokens of a sequence per pass in exact mode (module docstring)

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        threads: int | None = None,
        context_length: int | None = 4096,
        max_sequences: int = 4,
        n_batch: int = 512,
        extra_buffers: bool | None = None,
        exact: bool = False,
        hidden: bool | Sequence[int] = False,
    ) -> None:
        path = Path(path)
        check_gguf(path)
        self.exact = exact
        self.trees = self._takes_trees()
        if threads is not None and threads < 1:
            raise ValueError(f"threads = {threads} is invalid; use an integer >= 1")
        if max_sequences < 1:
            raise ValueError(f"max_sequences = {max_sequences} is invalid; use an integer >= 1")
        self.threads = threads or default_threads()
        self.extra_buffers = extra_buffers
        self._lib = lib = self._library()
        clear_errors()
        self._model = lib.llama_model_load_from_file(str(path).encode(), self._model_params())
        if not self._model:
            why = last_errors() or "no reason given"
            raise ValueError(
                f"{self.backend} could not load {str(path)!r} (corrupted or truncated file?): {why}"
            )
        vocab = lib.llama_model_get_vocab(self._model)
        train_ctx = lib.llama_model_n_ctx_train(self._model)
        per_seq = min(context_length or train_ctx, train_ctx)
        cparams = lib.llama_context_default_params()
        shared = 1 if exact else max_sequences  # sequences per context
        cparams.n_ctx = per_seq * shared
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_batch, 512)
        cparams.n_seq_max = shared
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        self._context_params(cparams)
        self.hidden_layers = check_layers(hidden, lib.llama_model_n_layer(self._model))
        if hidden:
            self._want_hidden(cparams)
        self._ctxs: list = []
        for _ in range(max_sequences // shared):
            ctx = lib.llama_init_from_model(self._model, cparams)
            if not ctx:
                self.close()
                why = last_errors() or "out of memory?"
                raise ValueError(
                    f"{self.backend} could not create a context for {str(path)!r}: {why}"
                )
            self._ctxs.append(ctx)
        self.context_length = per_seq
        self.n_batch = n_batch
        self._n_ubatch = cparams.n_ubatch
        self.max_sequences = max_sequences
        self.tokenizer = LlamaTokenizer(lib, self._model, vocab)
        self.eos_token_ids = self.tokenizer.eos_token_ids
        self.vocab_size = self.tokenizer.n_tokens  # logits width in llama.cpp
        width = lib.llama_model_n_embd(self._model)
        self.hidden_size = width * max(1, len(self.hidden_layers)) if hidden else 0
        self._hidden: dict[int, HiddenLog] = {}  # seq -> the hidden states kept
        self.info = BackendInfo(
            self.backend,
            str(path),
            self.threads,
            file_fingerprint(path),
            exact=exact,
            library=self._library_id(),
        )
        self._batch = lib.llama_batch_init(n_batch, 0, 1 + TREE_LEAVES if self.trees else 1)
        self._slots: dict[int, int] = {}  # specwise seq -> llama seq slot
        self._free = list(range(max_sequences))  # a heap: the lowest free slot is taken first
        self._lengths: dict[int, int] = {}
        self._trees: dict[int, _Tree] = {}  # sequences holding a tree until `keep`
        self._gaps = False  # cells may have been freed below used ones (`_close_gaps`)
        self._spare = list(range(max_sequences, max_sequences + TREE_LEAVES * max_sequences))
        self.copy_ms = 0.0  # total time spent copying logits out of llama.cpp (for profiling)
        self._no_logits = False  # `read`: the call's logits are not computed, nor copied

    # -- what differs between llama.cpp libraries ---------------------------------------------
    def _library(self):
        return library()

    def _library_id(self) -> str:
        return f"llama-cpp-python {self._lib.__version__}"

    def _model_params(self):
        """Extra weight buffers unless the build carries AMX kernels (module docstring)."""
        mparams = self._lib.llama_model_default_params()
        if self.extra_buffers is None:
            self.extra_buffers = not build_has_amx()
        mparams.use_extra_bufts = self.extra_buffers
        return mparams

    def _context_params(self, cparams) -> None:
        cparams.kv_unified = False  # one KV stream per slot: see the module docstring
        cparams.no_perf = True

    def _takes_trees(self) -> bool:
        """Whether `forward` takes token trees (module docstring)."""
        return False

    def _want_hidden(self, cparams) -> None:
        """Make the contexts output hidden states: mainline's contexts that compute embeddings
        without pooling return the output layer's input beside the logits, in the same order;
        the outputs of other layers they do not return."""
        if self.hidden_layers:
            self.close()
            raise NoLayerStates(
                f"{self.backend} gives the final hidden state only, not the outputs of layers "
                f"{list(self.hidden_layers)}; use --backend ik_llama (or torch)"
            )
        cparams.embeddings = True
        cparams.pooling_type = self._lib.LLAMA_POOLING_TYPE_NONE
        self._embeddings = True

    def _logit_rows(self, ctx, at: Sequence[int]) -> np.ndarray:
        """The logits [len(at), V] of the last decode's tokens at batch indices `at` (those
        it asked rows for). A context that computes embeddings outputs every token, so its
        rows are looked up by index, not read from the start of the buffer."""
        if not self._embeddings:
            ptr = self._lib.llama_get_logits(ctx)
            return np.ctypeslib.as_array(ptr, shape=(len(at), self.vocab_size)).copy()
        get = self._lib.llama_get_logits_ith
        return np.stack([np.ctypeslib.as_array(get(ctx, i), shape=(self.vocab_size,)) for i in at])

    def _hidden_rows(self, ctx, at: Sequence[int]) -> np.ndarray:
        """The hidden states [len(at), hidden_size] of the last decode's tokens at batch
        indices `at` (every token is an output of a context that computes embeddings)."""
        get = self._lib.llama_get_embeddings_ith
        return np.stack([np.ctypeslib.as_array(get(ctx, i), shape=(self.hidden_size,)) for i in at])

    def _seq_rm(self, slot: int, p0: int, p1: int) -> bool:
        ctx, s = self._cell(slot)
        return self._lib.llama_memory_seq_rm(self._lib.llama_get_memory(ctx), s, p0, p1)

    def _seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Give the cells of llama sequence src in positions [p0, p1) the id dst too."""
        memory = self._lib.llama_get_memory(self._ctxs[0])
        self._lib.llama_memory_seq_cp(memory, src, dst, p0, p1)

    def _cell(self, slot: int) -> tuple[object, int]:
        """(the context holding slot, its llama sequence id there)."""
        return (self._ctxs[slot], 0) if self.exact else (self._ctxs[0], slot)

    # -- LM protocol -------------------------------------------------------------------------
    def _slot(self, seq: int) -> int:
        slot = self._slots.get(seq)
        if slot is None:
            if not self._free:
                raise RuntimeError(
                    f"all {self.max_sequences} sequence slots of this llama.cpp context are in "
                    f"use; release a sequence first or load with a larger max_sequences"
                )
            slot = self._slots[seq] = heapq.heappop(self._free)
        return slot

    def _plant(self, seq: int, slot: int, have: int, parents: Sequence[int]) -> _Tree:
        """Spare ids for a tree's leaves, with the cache of `slot` copied to each (module
        docstring): the positions and sequence ids of the tree's tokens."""
        n = len(parents)
        depth = check_tree(seq, n, parents)
        below: list[list[int]] = [[] for _ in range(n)]  # leaf ids below each token
        inner = set(parents)
        leaves = [j for j in range(n) if j not in inner]
        if len(leaves) > TREE_LEAVES or len(leaves) > len(self._spare):
            raise ValueError(
                f"the tree of sequence {seq} has {len(leaves)} leaves; at most "
                f"{min(TREE_LEAVES, len(self._spare))} fit"
            )
        ids = [self._spare.pop() for _ in leaves]
        for j, leaf in zip(leaves, ids, strict=True):
            self._seq_cp(slot, leaf)
            while j >= 0:
                below[j].append(leaf)
                j = parents[j]
        below[0].insert(0, slot)  # the first token is kept in every case
        return _Tree(have, list(parents), ids, [have + d for d in depth], below)

    def forward(
        self,
        batch: Sequence[tuple[int, Sequence[int]]],
        last_only: bool = False,
        rows: Sequence[int] | None = None,
        trees: Sequence[Sequence[int] | None] | None = None,
    ) -> list[np.ndarray]:
        check_rows(batch, rows, last_only)
        if not self.trees:
            refuse_trees(self.backend, trees)
        lib, b = self._lib, self._batch
        if self._gaps:
            self._close_gaps()
            self._gaps = False
        plan = []  # (slot, first position, tokens) per entry
        for seq, tokens in batch:
            have = self._lengths.get(seq, 0)
            if seq in self._trees:
                raise ValueError(f"sequence {seq} holds a tree; keep a path of it first")
            check_append(seq, have, len(tokens), self.context_length)
            plan.append((self._slot(seq), have, tokens))
        planted: dict[int, _Tree] = {}  # entry -> its tree
        try:
            for e, (seq, _) in enumerate(batch):
                if trees is not None and trees[e] is not None:
                    planted[e] = self._plant(seq, plan[e][0], plan[e][1], trees[e])
        except ValueError:
            for t in planted.values():
                self._uproot(t)
            raise
        order = sorted(range(len(plan)), key=lambda e: plan[e][0])  # by slot: see `passes`
        blocks: list[list[np.ndarray]] = [[] for _ in plan]  # per entry: blocks of logits rows
        hblocks: list[list[np.ndarray]] = [[] for _ in plan]  # and of hidden states (hidden=True)
        outputs: list[int] = []  # entry of each logits row of the pending call
        out_at: list[int] = []  # and that row's index in the call's batch
        fed: list[int] = []  # entry of each token of the pending call
        fill = 0
        ctx = None  # the context of the pending call
        every = bool(self.hidden_layers)  # a state for every token fed, not only for outputs

        def decode() -> None:
            nonlocal fill
            b.n_tokens = fill
            rc = lib.llama_decode(ctx, b)
            if rc != 0:
                why = "no room in the KV cache" if rc == 1 else "see the llama.cpp log"
                raise RuntimeError(f"llama_decode failed with code {rc} ({why})")
            t = time.perf_counter()
            if outputs and not self._no_logits:
                # Copy now: the next decode overwrites llama.cpp's buffer. [n_out, V]
                _split_rows(self._logit_rows(ctx, out_at), outputs, blocks)
            if self.hidden_size and (outputs or every):
                rows = fed if every else outputs
                at = list(range(len(fed))) if every else out_at
                _split_rows(self._hidden_rows(ctx, at), rows, hblocks)
            self.copy_ms += (time.perf_counter() - t) * 1000.0
            outputs.clear()
            out_at.clear()
            fed.clear()
            fill = 0

        try:
            for e in order:
                slot, start, tokens = plan[e]
                last = len(tokens) - 1
                kept = len(tokens) if rows is None else rows[e]
                here, s = self._cell(slot)
                if here is not ctx and fill:
                    decode()
                ctx = here
                width = self.exact_width if self.exact and not last_only else self.n_batch
                tree = planted.get(e)
                for i, t in enumerate(tokens):
                    if fill == width:
                        decode()
                    want = i == last if last_only else i < kept
                    b.token[fill] = t
                    if tree is None:
                        b.pos[fill] = start + i
                        b.n_seq_id[fill] = 1
                        b.seq_id[fill][0] = s
                    else:
                        b.pos[fill] = tree.positions[i]
                        b.n_seq_id[fill] = len(tree.ids[i])
                        for j, x in enumerate(tree.ids[i]):
                            b.seq_id[fill][j] = x
                    b.logits[fill] = want
                    if want:
                        outputs.append(e)
                        out_at.append(fill)
                    fed.append(e)
                    fill += 1
            decode()
        except RuntimeError:
            for t in planted.values():
                self._uproot(t)
            for seq, _ in batch:  # a failed call may leave cells behind: drop them
                self._seq_rm(self._slots[seq], self._lengths.get(seq, 0), -1)
                self._hidden.pop(seq, None)
            self._gaps = True
            raise
        for e, (seq, tokens) in enumerate(batch):
            start = self._lengths.get(seq, 0)
            self._lengths[seq] = start + len(tokens)
            if e in planted:
                self._trees[seq] = planted[e]
            if self.hidden_size:  # the rows' first position: the last token's, with last_only
                log = self._hidden.setdefault(seq, HiddenLog(self.hidden_size))
                first = start + len(tokens) - 1 if last_only and not every else start
                log.put(first, np.concatenate(hblocks[e]))
        if self._no_logits:
            return []
        return [r[0] if len(r) == 1 else np.concatenate(r) for r in blocks]

    def hidden(self, seq: int) -> np.ndarray | None:
        log = self._hidden.get(seq)
        if seq in self._trees or log is None:
            return None
        return log.at(self._lengths.get(seq, 0) - 1)

    def hiddens(self, seq: int, start: int) -> np.ndarray | None:
        log = self._hidden.get(seq)
        if seq in self._trees or log is None:
            return None
        return log.since(start, self._lengths.get(seq, 0))

    def _uproot(self, tree: _Tree) -> None:
        """Remove the leaves' ids from the cache (cells left with no id are free again)."""
        for leaf in tree.leaves:
            self._seq_rm(leaf, -1, -1)
            self._spare.append(leaf)

    def keep(self, seq: int, path: Sequence[int]) -> None:
        tree = self._trees.get(seq)
        if tree is None:
            raise ValueError(f"sequence {seq} holds no tree; keep follows a tree's forward")
        check_path(seq, tree.parents, path)
        del self._trees[seq]
        if len(path) > 1:  # the first token has the slot's id already
            self._seq_cp(
                tree.ids[path[-1]][0],
                self._cell(self._slots[seq])[1],
                tree.base + 1,
                tree.base + len(path),
            )
        self._uproot(tree)
        self._lengths[seq] = tree.base + len(path)
        if seq in self._hidden:  # the kept path's rows, in its positions
            self._hidden[seq].reorder(tree.base, path)
        self._gaps = self._gaps or len(self._slots) > 1 or list(path) != list(range(len(path)))

    def _close_gaps(self) -> None:
        """Move the used cells together, where the library needs its cache without free cells
        below used ones (ik_llama); `forward` calls it first when a rollback, release or kept
        path may have left some (`_gaps`)."""

    def passes(self, calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        if self.exact:
            return one_pass_each(calls, self.exact_width)
        free = iter(sorted(self._free))  # a new sequence would take the lowest free slot
        slots = [(self._slots[q] if q in self._slots else next(free, -1), n) for q, n in calls]
        return equal_passes(slots, self._n_ubatch)

    def length(self, seq: int) -> int:
        return self._lengths.get(seq, 0)

    def truncate(self, seq: int, n: int) -> None:
        have = self._lengths.get(seq, 0)
        tree = self._trees.get(seq)
        if tree is not None:  # a tree goes whole: keep the cache before it, at most
            check_truncate(seq, tree.base + 1, n)
            self._uproot(self._trees.pop(seq))
            have = self._lengths[seq] = tree.base + 1
        check_truncate(seq, have, n)
        if n == have:
            return
        if not self._seq_rm(self._slots[seq], n, -1):
            raise RuntimeError(f"llama.cpp could not remove cache cells {n}.. of sequence {seq}")
        self._lengths[seq] = n
        if seq in self._hidden:
            self._hidden[seq].cut(n)
        self._gaps = self._gaps or len(self._slots) > 1  # other sequences' cells may lie above

    def release(self, seq: int) -> None:
        tree = self._trees.pop(seq, None)
        if tree is not None:
            self._uproot(tree)
        slot = self._slots.pop(seq, None)
        self._lengths.pop(seq, None)
        self._hidden.pop(seq, None)
        if slot is not None:
            self._seq_rm(slot, -1, -1)
            heapq.heappush(self._free, slot)
            self._compact()
            self._gaps = self._gaps or bool(self._slots)

    def in_use(self) -> int:
        return len(self._slots)

    def _compact(self) -> None:
        """Keep the sequences in the lowest slots: a free slot below a used one costs every
        later batch one more pass, moving the highest sequence down costs one copy of its KV
        stream (llama.cpp copies it, cell for cell, before the next decode). In exact mode
        every slot is a context of its own: nothing to do."""
        while not self.exact and self._free and self._slots:
            seq, high = max(self._slots.items(), key=lambda item: item[1])
            low = self._free[0]
            if high < low:
                return
            self._seq_cp(high, low)
            self._seq_rm(high, -1, -1)
            heapq.heapreplace(self._free, high)
            self._slots[seq] = low

    def close(self) -> None:
        if getattr(self, "_batch", None):
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        for ctx in getattr(self, "_ctxs", ()):
            self._lib.llama_free(ctx)
        self._ctxs = []
        if getattr(self, "_model", None):
            self._lib.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn down ctypes
            self.close()


@dataclass
class _Tree:
    """A tree fed to a sequence, until `keep`: the cache length before it, each token's parent,
    the leaves' spare sequence ids, and each token's position and sequence ids (`_plant`)."""

    base: int
    parents: list[int]
    leaves: list[int]
    positions: list[int]
    ids: list[list[int]]


def equal_passes(slots: Sequence[tuple[int, int]], n_ubatch: int = 512) -> list[tuple[int, int]]:
    """How llama.cpp runs one call over (slot, tokens) pairs with a KV stream per slot (its
    sequential equal split): each pass takes the run of consecutive slots, from the lowest with
    tokens left, and from each of them as many tokens as the shortest has left (at most
    n_ubatch in all). Returns (sequences, tokens each) per pass. So four sequences with one
    token each cost one pass in slots 0-3 and four in slots 0, 2, 4, 6; and one sequence with
    more tokens than the rest costs a pass of its own."""
    left = dict(sorted((s, n) for s, n in slots if n > 0))
    out: list[tuple[int, int]] = []
    while left:
        run: list[int] = []
        for s in left:
            if run and s != run[-1] + 1:
                break
            run.append(s)
        c = min(min(left[s] for s in run), max(1, n_ubatch // len(run)))
        out.append((len(run), c))
        for s in run:
            left[s] -= c
            if not left[s]:
                del left[s]
    return out
