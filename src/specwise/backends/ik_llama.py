"""`IkLlamaLM`: GGUF models on ik_llama.cpp, the library the `ik-llama-cpp-python` wheel ships
(or this CPU's native build of the same source, `ik_native`, where `make native` made one),
through specwise's own ctypes declarations (`ik_api`), and `probe`, which says whether that
library runs on this CPU.

It is `LlamaCppLM` with another library underneath; what differs:
- run-time repacking of the weights (`repack_tensors`) is on: it is what makes a forward of
  several tokens cost little more than one on a CPU (BENCHMARKS.md §0); flash attention is on
  where asked for (`flash_attn`: `load_pair` asks where the probe allows it, in contexts of one
  sequence, and `backends.choice` measured it no slower here), and a context with it takes no
  trees (`_takes_trees`);
- the KV cache is one pool of cells that every sequence shares, so a call of any shape runs as
  one pass per `n_ubatch` tokens (`passes`) and slot order does not matter (no compaction),
  and a forward takes token trees (`LM.trees`); after every rollback or release the used
  cells are moved together (`_close_gaps`: the library's attention misses cells above a gap);
- a context that computes embeddings returns no logits here, so hidden states (`hidden=True`,
  or the outputs of named layers) are copied out of the graph as it runs (`_HiddenTap`), which
  also lets `read` stop a forward after its final norm.

The wheel's library is a prebuilt AVX2 binary: on a CPU it cannot run on, it dies (SIGILL, or an
assertion that aborts the process) rather than raise, and a wrong kernel computes garbage
without a sign. So before a model first runs on it on a machine, `probe` runs the forwards
specwise makes in a child process and checks their logits, and caches the verdict by machine,
library, model and setting. This module decides no backend; `specwise.backends.load_pair` and
`specwise.backends.choice` do.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specwise.backends import ik_api
from specwise.backends.base import file_fingerprint, one_pass_each
from specwise.backends.llama_cpp import LlamaCppLM
from specwise.backends.llama_lib import route_log

__all__ = ["UNAVAILABLE", "IkLlamaLM", "available", "probe", "usable_flash_attn"]

UNAVAILABLE = (
    "the ik-llama-cpp-python wheel is not installed (it exists for x86-64 Linux, CPython 3.11)"
)
_lib = None
PROBE_TIMEOUT_S = 600
PROBE_VERSION = 3  # part of a verdict's key: a probe that checks more asks again
AGREE = 0.99  # least row correlation of logits that must agree (measured: >= 0.997 when right)
_PROBE_OK = "specwise-ik-probe-ok"
EXACT_WIDTH = 16  # exact mode's most tokens a pass: the matrix kernels change path from 32 rows
FINAL = "result_norm"  # the graph's final hidden state: the output layer's input
FINAL_B = FINAL.encode()


def _ik():
    """Load the library once (`ik_api.library_path`: this CPU's native build, else the
    wheel's), initialise it and route its log."""
    global _lib
    if _lib is None:
        lib = ik_api.open_library()
        route_log(lib, ik_api.log_callback)
        lib.llama_backend_init()
        _lib = lib
    return _lib


def available() -> bool:
    """Whether an ik_llama.cpp library is installed (not whether it runs here: see `probe`)."""
    try:
        ik_api.library_path()
    except ik_api.IkLibraryError:
        return False
    return True


class IkLlamaLM(LlamaCppLM):
    """IkLlamaLM(path, threads=None, context_length=4096, max_sequences=4, flash_attn=False,
    repack=True, exact=False). Flash attention is off unless asked for: turn it on where
    `usable_flash_attn` says it runs (`specwise.backends.load_pair` does). exact=True: a
    context per sequence, no repacking, no flash attention (`LlamaCppLM`'s exact mode); check
    it with `probe(..., exact=True)` before trusting it on a machine."""

    backend = "ik_llama"
    exact_width = EXACT_WIDTH

    def __init__(
        self, path, *, flash_attn: bool = False, repack: bool = True, exact: bool = False, **kw
    ) -> None:
        # Exact mode: repacked weights are multiplied by other kernels for one row than for
        # several, and flash attention's kernel differs with the number of queries.
        self.flash_attn, self.repack = flash_attn and not exact, repack and not exact
        super().__init__(path, exact=exact, **kw)

    def _library(self):
        return _ik()

    def _library_id(self) -> str:
        # flash attention changes every cost on this library: it is part of what runs
        return ik_api.library_id() + (" flash-attn" if self.flash_attn else "")

    def _model_params(self):
        mparams = self._lib.llama_model_default_params()
        mparams.repack_tensors = self.repack
        mparams.flash_attn = self.flash_attn
        return mparams

    def _context_params(self, cparams) -> None:
        cparams.flash_attn = self.flash_attn

    def _want_hidden(self, cparams) -> None:
        names = [f"l_out-{i}" for i in self.hidden_layers] or [FINAL]
        self._tap = _HiddenTap(
            ik_api.open_ggml(self._lib), self._lib.llama_model_n_embd(self._model), names
        )
        cparams.cb_eval = ctypes.cast(self._tap.callback, ctypes.c_void_p).value

    def _hidden_rows(self, ctx, at: Sequence[int]) -> np.ndarray:
        rows = self._tap.take()  # the tap's rows are the call's outputs (or all tokens) in order
        if rows.shape[0] != len(at):
            raise RuntimeError(
                f"ik_llama computed hidden states for {rows.shape[0]} rows of a call that asked "
                f"for {len(at)}"
            )
        return rows

    def forward(self, *args, **kwargs) -> list[np.ndarray]:
        """`LM.forward`; with layer states, a Ctrl-C during it is raised when it ends
        (`interrupts_after`)."""
        if not self.hidden_layers:
            return super().forward(*args, **kwargs)
        with interrupts_after():
            return super().forward(*args, **kwargs)

    def read(self, seq: int, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`LM.read`: every token is an output row, so that the final norm runs over all of
        them, and the graph stops there (`_HiddenTap.final`): the output layer, 15% of a
        forward's work here, and the copy of its logits are skipped."""
        if not self.hidden_layers:
            raise ValueError("read needs an ik_llama target built with hidden layers")
        start = self.length(seq)
        self._tap.final, self._no_logits = [], True
        try:
            self.forward([(seq, tokens)])
            final = self._tap.final
        finally:
            self._tap.final, self._no_logits = None, False
        states = self.hiddens(seq, start)
        if states is None or len(states) != len(tokens):
            raise RuntimeError(f"ik_llama kept no layer states of sequence {seq}'s tokens")
        return states, np.concatenate(final)

    def _seq_rm(self, slot: int, p0: int, p1: int) -> bool:
        return self._lib.llama_kv_cache_seq_rm(*self._cell(slot), p0, p1)

    def _takes_trees(self) -> bool:
        """Trees need one cache that every sequence shares (`LlamaCppLM`'s docstring): not in
        exact mode (a context per sequence). Nor with flash attention: its kernel computes a
        tree's rows from the wrong cells where the tree's cells straddle a multiple of 128
        (a root and three children at cells 127-130: logits 9-17 apart from the same paths as
        chains, both libraries; tests/test_llama_cpp.py), so drafts there go as chains."""
        return not self.exact and not self.flash_attn

    def _close_gaps(self) -> None:
        """Move the used cells together (llama.cpp's defragmentation: 0.4 ms without gaps, 1-2
        ms with, once per call at most). The wheel sizes a call's attention by
        `llama_kv_cache_cell_max(cache, pad)`, which looks only at the last cell of each block
        of `pad` cells (32; 256 with flash attention): a free cell there, below used cells of the next block, cuts those
        off, and every token of the call then attends without them (measured: logits
        correlated 0.56-0.77 with the right ones). Rollbacks of sequences that share the cache,
        and a tree's kept path other than its first branch, leave such free cells. A context
        of its own per sequence (exact mode) frees cells only at the top: nothing to do."""
        if not self.exact:
            self._lib.llama_kv_cache_defrag(self._ctxs[0])
            self._lib.llama_kv_cache_update(self._ctxs[0])

    def _seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._lib.llama_kv_cache_seq_cp(self._ctxs[0], src, dst, p0, p1)

    def _compact(self) -> None:
        """Nothing to do: one shared cache, so a free slot costs no pass."""

    def passes(self, calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """One pass per n_ubatch tokens, whatever the call's shape: (sequences, tokens each)
        where every sequence brings the same number, else (1, tokens in the pass), which
        the cost model prices as that many tokens of one sequence."""
        if self.exact:
            return one_pass_each(calls, self.exact_width)
        counts = [n for _, n in calls if n > 0]
        total = sum(counts)
        if len(counts) > 1 and len(set(counts)) == 1 and total <= self._n_ubatch:
            return [(len(counts), counts[0])]
        return [
            (1, min(self._n_ubatch, total - start)) for start in range(0, total, self._n_ubatch)
        ]


@contextlib.contextmanager
def interrupts_after():
    """Hold a Ctrl-C (SIGINT) that arrives in the block and raise it as it ends. The layer-state
    tap runs Python inside the library's forward, hundreds of times a call, so that is where a
    Ctrl-C mostly lands; raised there, ctypes prints and drops it and the forward goes on
    without a layer's rows. Off the main thread (where no signal handler runs) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if held and callable(before):
        before(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt


class _HiddenTap:
    """Copies the tensors `names` out of each graph the library computes (the final hidden
    state `result_norm`, the output layer's input, one row per output; or layer outputs
    `l_out-i`, one row per token), through its scheduler's eval callback, which is asked about
    every node (~850 a forward of a 1.5B model: well under a millisecond) and computes the
    graph up to the node wanted next. While `final` is a list (`IkLlamaLM.read`), it also
    copies `result_norm` into it and stops the graph there: nothing after it is computed. A
    callback must not raise into C; an error is kept and raised by `take` (and a Ctrl-C is
    held until the forward ends: `interrupts_after`)."""

    def __init__(self, ggml, width: int, names: Sequence[str]) -> None:
        self._ggml, self.width = ggml, width
        self._names = [n.encode() for n in names]
        self._rows: dict[bytes, list[np.ndarray]] = {n: [] for n in self._names}
        self.final: list[np.ndarray] | None = None
        self._error: str | None = None
        self.callback = ik_api.eval_callback(self._on_tensor)

    def _on_tensor(self, tensor, ask: bool, _user) -> bool:
        try:
            name = self._ggml.ggml_get_name(tensor)
            if ask:
                return name in self._rows or (self.final is not None and name == FINAL_B)
            size = self._ggml.ggml_nbytes(tensor)
            if size % (4 * self.width):
                raise ValueError(f"{name!r} holds {size} bytes, not rows of {self.width} floats")
            rows = np.empty((size // (4 * self.width), self.width), dtype=np.float32)
            self._ggml.ggml_backend_tensor_get(tensor, rows.ctypes.data, 0, size)
            if name in self._rows:
                self._rows[name].append(rows)
            if self.final is not None and name == FINAL_B:
                self.final.append(rows)
                return False  # stop the graph: the logits are not wanted
        except Exception as exc:  # reported by take()
            self._error = self._error or f"{type(exc).__name__}: {exc}"
        return True  # False would stop the graph

    def take(self) -> np.ndarray:
        """The rows captured since the last take, in order, the tensors side by side
        [rows, len(names) * width]."""
        got = [self._rows[n] for n in self._names]
        self._rows = {n: [] for n in self._names}
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"reading ik_llama's hidden states failed: {error}")
        parts = [np.concatenate(r) if r else np.empty((0, self.width), np.float32) for r in got]
        if len({len(p) for p in parts}) > 1:
            raise RuntimeError(f"ik_llama computed {[len(p) for p in parts]} rows of {self._names}")
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def _probe_key(model: Path, flash_attn: bool, batched: bool, exact: bool) -> str:
    import hashlib

    from specwise.machine import machine

    parts = [machine(), ik_api.library_id(), f"probe {PROBE_VERSION}", file_fingerprint(model)]
    parts.append(f"fa={flash_attn}:{batched}" + (":exact" if exact else ""))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def probe(
    model: str | os.PathLike, flash_attn: bool = True, batched: bool = False, exact: bool = False
) -> str | None:
    """None when ik_llama.cpp runs `model` on this machine with these settings, else why not
    (one sentence). batched: also calls over several sequences at once (a context with
    max_sequences > 1). exact: in exact mode, where logits must agree bit for bit. The first
    answer for a machine, library, model and settings comes from a child process (seconds,
    once); later ones from $SPECWISE_HOME/probes."""
    from specwise.models import home, save_json

    model = Path(model)
    try:
        key = _probe_key(model, flash_attn, batched, exact)
    except ik_api.IkLibraryError as exc:
        return str(exc)
    path = home() / "probes" / f"{key}.json"
    try:
        return json.loads(path.read_text())["problem"]
    except (OSError, ValueError, KeyError):
        pass
    print(
        f"specwise: checking that ik_llama.cpp runs {model.name} correctly on this CPU "
        f"({'several sequences' if batched else 'one sequence'}, flash attention "
        f"{'on' if flash_attn else 'off'}{', exact mode' if exact else ''}; once)...",
        file=sys.stderr,
    )
    problem = _probe_child(model, flash_attn, batched, exact)
    save_json(path, {"problem": problem, "model": str(model)})
    return problem


def usable_flash_attn(model: str | os.PathLike, batched: bool) -> bool | None:
    """Whether to turn flash attention on for `model` in a context of one sequence (batched
    False) or several: True where the probe passes with it, False where it passes without,
    None where ik_llama.cpp cannot run `model` here at all. With several sequences flash
    attention is never used: the wheel's kernel aborts (GGML_ASSERT(S > 0)) on a query row
    that sees no cell in its thread's share of a cache that other sequences share, and a
    probe that passed did not keep the test suite's calls from hitting it."""
    if not batched and probe(model, True, False) is None:
        return True
    return False if probe(model, False, batched) is None else None


def _probe_child(model: Path, flash_attn: bool, batched: bool, exact: bool) -> str | None:
    cmd = [sys.executable, "-m", "specwise.backends.ik_llama", str(model)]
    cmd += [] if flash_attn else ["--no-flash-attn"]
    cmd += ["--batched"] if batched else []
    cmd += ["--exact"] if exact else []
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the ik_llama.cpp probe of {model.name} did not finish in {PROBE_TIMEOUT_S} s"
    return _verdict(res.returncode, res.stdout, res.stderr, model.name)


def _verdict(returncode: int, stdout: str, stderr: str, model: str = "the model") -> str | None:
    """None for a child that printed the marker and exited 0, else what happened (the
    library's failed assertion, where it printed one)."""
    if returncode == 0 and _PROBE_OK in stdout:
        return None
    how = f"died of signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
    lines = stderr.strip().splitlines()
    said = next((ln for ln in lines if "ASSERT" in ln or "error" in ln.lower()), None)
    tail = (said or " ".join(lines[-2:])).strip()[-300:]
    return f"the ik_llama.cpp library {how} running {model} on this CPU ({tail or 'no output'})"


def _agree(many, one) -> float:
    """The lowest correlation between matching logits rows of two [n, V] arrays."""
    return min(float(np.corrcoef(a, b)[0, 1]) for a, b in zip(many, one, strict=True))


def _probe_main(argv: Sequence[str]) -> int:
    """The child's side of `probe`: the forwards specwise makes, then a marker line. Surviving
    is not enough, since a wrong kernel computes garbage without a crash (measured with this
    wheel: forwards of 32 tokens or more of a Q4_1 model), so the logits are checked too:
    - one sequence: after a long prefill (several ubatches), a forward of n tokens must give
      the logits of n one-token forwards (every row correlated >= AGREE), for n = 4, 16, 40;
      then a second request after the first was released;
    - batched, besides: a sequence's logits must not depend on another sequence in the cache,
      alone or in the same call;
    - exact (`--exact`, in exact mode): every one of those rows must agree bit for bit (a
      forward of 40 tokens runs in passes of EXACT_WIDTH there).
    Exit code 3 and one line on stderr where logits disagree."""
    path, flash_attn, batched = argv[0], "--no-flash-attn" not in argv, "--batched" in argv
    exact = "--exact" in argv
    lm = IkLlamaLM(
        path,
        context_length=2048,
        max_sequences=2 if batched else 1,
        flash_attn=flash_attn,
        exact=exact,
    )
    hi = min(lm.vocab_size, 5000)
    prompt = [10 + (i * 7919) % (hi - 10) for i in range(1100)]
    lm.forward([(0, prompt)], last_only=True)
    lm.truncate(0, 600)
    one = np.stack([lm.forward([(0, [t])])[0][0] for t in prompt[600:640]])  # [40, V]
    checks = {}
    for n in (4, 16, 40):
        lm.truncate(0, 600)
        checks[f"a forward of {n} tokens"] = (lm.forward([(0, prompt[600 : 600 + n])])[0], one[:n])
    lm.release(0)
    lm.forward([(1, prompt[:300])], last_only=True)
    solo = lm.forward([(1, prompt[300:304])])[0]  # [4, V], the only sequence in the cache
    lm.release(1)
    if batched:
        lm.forward([(0, prompt[::-1][:500])], last_only=True)  # slot 0 holds another sequence
        lm.forward([(1, prompt[:300])], last_only=True)
        checks["a sequence beside another"] = (lm.forward([(1, prompt[300:304])])[0], solo)
        lm.truncate(1, 300)
        both = lm.forward([(0, [5, 6]), (1, prompt[300:304])])
        checks["a sequence in one call with another"] = (both[1], solo)
    lm.close()
    for what, (got, want) in checks.items():
        if exact and not np.array_equal(got, want):
            bad = int(np.sum(np.any(got != want, axis=-1)))
            print(
                f"error: exact mode is not exact here: {what} differ in {bad} of {len(got)} "
                f"logits rows from one-token forwards or from the sequence alone",
                file=sys.stderr,
            )
            return 3
        low = _agree(got, want)
        if not low >= AGREE:
            print(
                f"error: wrong logits: {what} disagree with one-token forwards or with the "
                f"sequence alone (row correlation {low:.3f}, need {AGREE})",
                file=sys.stderr,
            )
            return 3
    print(_PROBE_OK, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
