"""The header of a GGUF file: what a model file says of itself — its name, architecture,
quantization, tokenizer, vocabulary size and parameter count — read from its key-value metadata
and its tensor table, with the `gguf` package's constants for what the numbers mean.

This is the one place specwise reads GGUF metadata to describe a model (`stores`, `models
list`, the Ollama API's /api/tags and /api/show). It reads the header only: the file is mapped
read-only and only the header's pages are touched; no tensor's data is read, nothing is loaded,
nothing is written. A file that is not GGUF, or ends inside its header, is a `HeaderError`: one
sentence naming the file.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUF_MAGIC, GGUFValueType, LlamaFileType

__all__ = ["GgufHeader", "HeaderError", "read_header"]

VERSIONS = (2, 3)  # GGUF versions with 64-bit counts (version 1 files predate 2023-08)
_SCALARS = {  # struct code of each fixed-size value type
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class HeaderError(ValueError):
    """A file's GGUF header cannot be read; the message names the file and why."""


@dataclass(frozen=True)
class GgufHeader:
    """What one GGUF file says of itself. `metadata` holds every scalar key (an array key
    as None, its contents unread but for the vocabulary's length)."""

    path: Path
    name: str  # general.name ("" where absent)
    architecture: str  # general.architecture: "llama", "qwen2", "gemma3", ...
    file_type: str  # general.file_type as llama.cpp names it: "Q4_K_M", "Q8_0", "F16"; "" absent
    tokenizer_model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece)
    tokenizer_pre: str  # tokenizer.ggml.pre: "qwen2", "smollm", "llama-bpe", ...; "" absent
    vocab_size: int  # tokens in tokenizer.ggml.tokens (0: no vocabulary in the file)
    parameters: int  # elements of every tensor in the tensor table
    context_length: int  # <architecture>.context_length (0 where absent)
    kind: str = "model"  # general.type: "model", or "mmproj" / "adapter" (not a language model)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def tokenizer(self) -> str:
        """The tokenizer as a key two files share when they share a tokenizer: its kind, its
        pre-tokenizer and its size, e.g. "gpt2/qwen2/151936" (check_same_vocab's test is the
        tokens' text as well; files with equal keys almost always pass it)."""
        return f"{self.tokenizer_model}/{self.tokenizer_pre or 'default'}/{self.vocab_size}"

    @property
    def tokenizer_family(self) -> str:
        """The tokenizer for people: "qwen2, 151936 tokens"."""
        family = self.tokenizer_pre or self.tokenizer_model or "?"
        return f"{family}, {self.vocab_size} tokens" if self.vocab_size else family

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama shows it: "135M", "1.5B"."""
        n = self.parameters
        if n >= 1e9:
            return f"{n / 1e9:.1f}B"
        return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"

    @property
    def is_language_model(self) -> bool:
        """A model that generates text (not a vision projector, adapter or encoder alone)."""
        return self.kind == "model" and self.architecture != "clip" and self.vocab_size > 0


class _Cursor:
    """Reads values one after another from the mapped file; struct.error past its end."""

    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf, self.order, self.pos = buf, order, 0

    def take(self, code: str) -> Any:
        (v,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return v

    def string(self) -> str:
        n = self.take("Q")
        self._need(n)
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        unpack, buf, code = struct.unpack_from, self.buf, self.order + "Q"
        for _ in range(count):
            (n,) = unpack(code, buf, self.pos)
            self.pos += 8 + n
        self._need(0)

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise struct.error("past the end")

    def value(self, kind: int) -> Any:
        """A key's value: a scalar or string; an array is skipped and read as its length."""
        kind = GGUFValueType(kind)
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == GGUFValueType.STRING:
            return self.string()
        item, count = GGUFValueType(self.take("I")), self.take("Q")
        if count > len(self.buf) - self.pos:  # at least a byte an item: a garbled count
            raise struct.error("array longer than the file")
        if item in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item])
            self._need(0)
        elif item == GGUFValueType.STRING:
            self.skip_strings(count)
        else:
            for _ in range(count):
                self.value(item)
        return _Array(count)


@dataclass(frozen=True)
class _Array:
    length: int


def read_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path` (HeaderError when it is not one)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size < 24:
            raise HeaderError(
                f"{path} has {size} bytes; it is not a GGUF model file (those start with 'GGUF')"
            )
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf)
    except OSError as exc:
        raise HeaderError(f"{path} cannot be read: {exc.strerror or exc}") from None


def _parse(path: Path, buf: mmap.mmap) -> GgufHeader:
    magic = bytes(buf[:4])
    if struct.unpack("<I", magic)[0] != GGUF_MAGIC:
        raise HeaderError(
            f"{path} is not a GGUF file (it starts with {magic!r}; a GGUF file starts with b'GGUF')"
        )
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    cur = _Cursor(buf, order)
    cur.pos = 4
    version = cur.take("I")
    if version not in VERSIONS:
        raise HeaderError(
            f"{path} is a GGUF file of version {version}; specwise reads versions "
            f"{' and '.join(map(str, VERSIONS))}"
        )
    try:
        n_tensors, n_keys = cur.take("Q"), cur.take("Q")
        meta: dict[str, Any] = {}
        for _ in range(n_keys):
            key = cur.string()
            meta[key] = cur.value(cur.take("I"))
        parameters = 0
        for _ in range(n_tensors):
            cur.string()  # the tensor's name
            dims = [cur.take("Q") for _ in range(cur.take("I"))]
            cur.take("I"), cur.take("Q")  # its type and offset: its data is not read
            parameters += math.prod(dims)
    except (struct.error, ValueError, OverflowError):  # ValueError: an unknown value type
        raise HeaderError(
            f"{path} ends or breaks inside its GGUF header (at byte {cur.pos:,} of "
            f"{len(buf):,}): the file is truncated or damaged"
        ) from None
    tokens = meta.get("tokenizer.ggml.tokens")
    arch = _text(meta.get("general.architecture"))
    return GgufHeader(
        path=path,
        name=_text(meta.get("general.name")),
        architecture=arch,
        file_type=_file_type(meta.get("general.file_type")),
        tokenizer_model=_text(meta.get("tokenizer.ggml.model")),
        tokenizer_pre=_text(meta.get("tokenizer.ggml.pre")),
        vocab_size=tokens.length if isinstance(tokens, _Array) else 0,
        parameters=parameters,
        context_length=_int(meta.get(f"{arch}.context_length")),
        kind=_text(meta.get("general.type")) or "model",
        metadata={k: (None if isinstance(v, _Array) else v) for k, v in meta.items()},
    )


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _file_type(v: Any) -> str:
    """general.file_type's number as llama.cpp names it ("Q4_K_M"), "" where absent."""
    if not isinstance(v, int) or isinstance(v, bool):
        return ""
    try:
        return LlamaFileType(v).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {v}"
