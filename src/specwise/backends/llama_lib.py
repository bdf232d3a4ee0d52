"""Mainline llama.cpp's library as llama-cpp-python binds it: imported once, its backend
initialised and its log routed (`library`; any llama.cpp library's log, ik_llama's too:
`route_log`, read back by `last_errors` for error messages), what the build carries
(`system_info`, `build_has_amx`), the threads it runs by default (`default_threads`) and where
a process that decodes on another thread loads and measures its models (`on_own_thread`), the
check that a file is GGUF (`check_gguf`), and `LlamaTokenizer`, the Tokenizer protocol over a
GGUF model's vocabulary and chat template through llama.cpp's vocabulary API (ik_llama's models
use it as well).

What this is not: an LM (`backends/llama_cpp.py` holds the contexts, sequences and forwards);
it loads no model and keeps no state but the library and the last log lines.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = [
    "LlamaTokenizer",
    "build_has_amx",
    "check_gguf",
    "clear_errors",
    "default_threads",
    "last_errors",
    "library",
    "on_own_thread",
    "route_log",
    "system_info",
]

T = TypeVar("T")
_lib = None
_log_lock = threading.Lock()
_last_errors: list[str] = []
_callbacks: list = []


def route_log(lib, callback_type) -> None:
    """Send a llama.cpp library's log to `_last_errors` (warnings and errors, for error
    messages) instead of stderr. `callback_type`: the library's ctypes log callback type."""

    @callback_type
    def on_log(level, text, user_data):
        if level in (3, 4) and text:  # GGML_LOG_LEVEL_WARN, _ERROR
            with _log_lock:
                _last_errors.append(text.decode("utf-8", "replace").strip())
                del _last_errors[:-20]

    _callbacks.append(on_log)  # ctypes must keep the callback alive
    lib.llama_log_set(on_log, ctypes.c_void_p(0))


def last_errors() -> str:
    with _log_lock:
        return "; ".join(_last_errors[-3:])


def clear_errors() -> None:
    """Forget the log lines kept so far (before a load whose failure `last_errors` explains)."""
    with _log_lock:
        _last_errors.clear()


def library():
    """Import llama_cpp once, initialise the backend and route its log."""
    global _lib
    if _lib is None:
        try:
            import llama_cpp as lib
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "the llama.cpp backend needs llama-cpp-python; install it with `make install`"
            ) from exc
        route_log(lib, lib.llama_log_callback)
        lib.llama_backend_init()
        _lib = lib
    return _lib


def system_info() -> str:
    return library().llama_print_system_info().decode()


def build_has_amx() -> bool:
    """True when the llama.cpp build carries its AMX kernels."""
    return "AMX_INT8 = 1" in system_info()


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def on_own_thread(fn: Callable[[], T]) -> T:
    """fn() run on a thread of its own, which ends with it; what it returns or raises. The
    llama.cpp libraries compute on OpenMP, whose runtime keeps a pool of worker threads for
    every thread that has run a forward, and spins them less once the pools together hold more
    threads than the machine has cores: a process whose main thread ran forwards (loading,
    probing, calibration) and that then decodes on another thread ran every step ~1.5x slower
    (2-core Zen 5: 36.8 against 24.6 ms; `specwise serve`'s scheduler). A pool ends with its
    thread, so a server loads and measures its models through this, and decodes on one thread."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="specwise-load", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"model file {str(path)!r} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{str(path)!r} is not a GGUF file (it does not start with 'GGUF')")


class LlamaTokenizer:
    """The Tokenizer protocol over a GGUF model's vocabulary and chat template."""

    def __init__(self, lib, model, vocab) -> None:
        self._lib, self._vocab = lib, vocab
        self.n_tokens = lib.llama_vocab_n_tokens(vocab)
        self.eos_token_ids = frozenset(
            i for i in range(self.n_tokens) if lib.llama_vocab_is_eog(vocab, i)
        )
        tmpl = lib.llama_model_chat_template(model, None)
        self.chat_template = tmpl.decode("utf-8") if tmpl else None
        self._bos = self._piece(lib.llama_vocab_bos(vocab))
        self._eos = self._piece(lib.llama_vocab_eos(vocab))

    def _piece(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        return self.token_text(token_id)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (self._lib.llama_token * n_max)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            n_max = -n
            buf = (self._lib.llama_token * n_max)()
            n = self._lib.llama_tokenize(
                self._vocab, data, len(data), buf, n_max, add_special, True
            )
        return list(buf[:n])

    def decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        arr = (self._lib.llama_token * len(ids))(*ids)
        size = 16 * len(ids) + 64
        buf = ctypes.create_string_buffer(size)
        n = self._lib.llama_detokenize(self._vocab, arr, len(ids), buf, size, False, False)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_detokenize(self._vocab, arr, len(ids), buf, size, False, False)
        return buf.raw[:n].decode("utf-8", "replace")

    def render_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if not self.chat_template:
            raise ValueError("this GGUF file has no chat template; drop --chat")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(f"the chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=True,
            bos_token=self._bos,
            eos_token=self._eos,
        )
        return self.encode(text, add_special=False)

    def token_text(self, token_id: int) -> str:
        raw = self._lib.llama_vocab_get_text(self._vocab, token_id)
        return raw.decode("utf-8", "surrogateescape") if raw else ""
