"""Model backends, one file each, all behind the `LM` protocol of `base`, and `load`, which picks
the backend for a model: a .gguf file (or catalog name) runs on llama.cpp, a Hugging Face folder
on torch, unless `backend` says otherwise. Backend modules are imported only when used."""

from __future__ import annotations

from pathlib import Path

from specwise.backends.base import LM

__all__ = ["BACKENDS", "load"]

BACKENDS = ("torch", "llama_cpp")


def load(
    model: str | Path,
    backend: str | None = None,
    threads: int | None = None,
    max_sequences: int = 4,
) -> LM:
    """An LM for `model`: a path, or a catalog name (see `specwise models list`).
    max_sequences: sequences one llama.cpp context serves at once."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is unknown; use one of: {', '.join(BACKENDS)}")
    path = Path(model)
    if not path.exists():
        if "/" in str(model) or path.suffix == ".gguf":
            raise FileNotFoundError(f"model path {str(model)!r} does not exist")
        from specwise.models import resolve

        path = resolve(str(model))
    if backend is None:
        backend = "torch" if path.is_dir() else "llama_cpp"
    if backend == "torch":
        from specwise.backends.torch_hf import TorchLM

        return TorchLM(path)
    from specwise.backends.llama_cpp import LlamaCppLM

    return LlamaCppLM(path, threads=threads, max_sequences=max_sequences)
