"""`NativeTap`: an eval callback for ik_llama's scheduler that answers its asks in C.

The scheduler asks the callback about every node of a forward (~850 for a 1.5B model) whether
it wants that node's data. A ctypes callback answers each ask in Python, taking the GIL each
time: alone in a process that is free, but beside other Python threads (the server's event
loop and scheduler) ~850 GIL hand-overs a forward made `specwise serve`'s plain decoding
~1.5x slower on a 2-core Zen 5 with the eagle layer's states kept (BENCHMARKS.md, the eagle
layer). This callback, compiled from the C below with the system's C compiler on first use
(cached under $SPECWISE_HOME/engines, keyed by the source and the compiler), compares the node's
name with the names wanted and calls the Python callback only for those, once computed. Where
no compiler is found or the build fails, `NativeTap.build` returns None and the caller answers
in Python.

It reads no tensor itself and keeps no state but the names wanted (`want`).
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["NAMES", "NativeTap"]

NAMES = 8  # most names one tap wants at once
_SOURCE = r"""
#include <stdbool.h>
#include <string.h>

typedef const char *(*name_fn)(const void *);
typedef bool (*take_fn)(void *, bool, void *);

struct tap {
    name_fn name;   /* ggml_get_name */
    take_fn take;   /* called for a wanted node once computed */
    int n;          /* names wanted */
    char names[8][64];
};

bool specwise_tap(void *tensor, bool ask, void *user) {
    struct tap *tap = (struct tap *) user;
    const char *name = tap->name(tensor);
    bool wanted = false;
    for (int i = 0; i < tap->n && !wanted; i++) {
        wanted = strncmp(name, tap->names[i], 64) == 0;
    }
    if (ask) {
        return wanted;
    }
    return wanted ? tap->take(tensor, ask, user) : true;
}
"""


class _Tap(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("take", ctypes.c_void_p),
        ("n", ctypes.c_int),
        ("names", (ctypes.c_char * 64) * NAMES),
    ]


def _library() -> ctypes.CDLL | None:
    """The compiled callback's library, built on first use; None where it cannot be built."""
    from specwise.models import home

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        key = hashlib.sha256((_SOURCE + version.stdout).encode()).hexdigest()[:16]
        out = home() / "engines" / f"tap-{key}.so"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            src = out.with_suffix(".c")
            src.write_text(_SOURCE)
            part = out.with_suffix(".partial")
            cmd = [cc, "-O2", "-shared", "-fPIC", "-o", str(part), str(src)]
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
            part.replace(out)
        return ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError):
        return None


class NativeTap:
    """NativeTap(lib, get_name, take): the compiled callback over ggml's `get_name` (a ctypes
    function of libggml) calling `take` (a ctypes eval callback) for the nodes `want` names.
    `callback` and `user_data` are the two addresses a context's parameters take."""

    def __init__(self, lib: ctypes.CDLL, get_name, take) -> None:
        self._lib, self._take = lib, take  # kept alive while the context may call them
        self._tap = _Tap()
        self._tap.name = ctypes.cast(get_name, ctypes.c_void_p).value
        self._tap.take = ctypes.cast(take, ctypes.c_void_p).value
        self.callback = ctypes.cast(lib.specwise_tap, ctypes.c_void_p).value
        self.user_data = ctypes.addressof(self._tap)

    @classmethod
    def build(cls, get_name, take) -> NativeTap | None:
        """A tap where the callback compiles (or was compiled) here, else None."""
        lib = _library()
        return None if lib is None else cls(lib, get_name, take)

    def want(self, names: Sequence[bytes]) -> None:
        """The node names whose data `take` gets from now on (at most NAMES, each < 64 bytes)."""
        if len(names) > NAMES or any(len(n) >= 64 for n in names):
            raise ValueError(f"a tap wants at most {NAMES} names of under 64 bytes: {names}")
        for i, n in enumerate(names):
            self._tap.names[i].value = n
        self._tap.n = len(names)
