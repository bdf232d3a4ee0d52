"""`metadata`: the key-value header of a GGUF file, read in milliseconds.

A GGUF file opens with its metadata: keys and typed values (numbers, strings, arrays), then the
tensors' descriptions. The `gguf` package parses all of it, the tokenizer's 150k-entry arrays
included, which takes seconds to tens of seconds on these CPUs; this reads the scalars and
strings and skips each array by its length (an array's value here is its number of items).
It reads no tensor and loads no model.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["metadata"]

MAGIC = b"GGUF"
# value type -> struct format of one item (GGUF's enum order); 8 string, 9 array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _unpack(f: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise EOFError
    return struct.unpack("<" + fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _unpack(f, "Q")
    raw = f.read(n)
    if len(raw) != n:
        raise EOFError
    return raw.decode("utf-8", "replace")


def _skip_array(f: BinaryIO) -> int:
    kind, n = _unpack(f, "I"), _unpack(f, "Q")
    if kind in _SCALARS:
        f.seek(n * struct.calcsize("<" + _SCALARS[kind]), 1)
    elif kind == _STRING:
        for _ in range(n):
            f.seek(_unpack(f, "Q"), 1)
    else:
        raise ValueError(f"an array of type {kind}")
    return n


def metadata(path: str | Path) -> dict[str, object]:
    """The header of the GGUF file at `path`: key -> number, bool or string (an array: its
    length). ValueError naming the file where it is not a GGUF file or is cut short."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(4) != MAGIC:
                raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
            version = _unpack(f, "I")
            if version < 2:
                raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
            _unpack(f, "Q")  # tensors
            count = _unpack(f, "Q")
            out: dict[str, object] = {}
            for _ in range(count):
                key = _string(f)
                kind = _unpack(f, "I")
                if kind in _SCALARS:
                    out[key] = _unpack(f, _SCALARS[kind])
                elif kind == _STRING:
                    out[key] = _string(f)
                elif kind == _ARRAY:
                    out[key] = _skip_array(f)
                else:
                    raise ValueError(f"{path}: metadata {key!r} has an unknown type {kind}")
            return out
    except (EOFError, struct.error):
        raise ValueError(f"{path} is cut short: its GGUF header ends early") from None
