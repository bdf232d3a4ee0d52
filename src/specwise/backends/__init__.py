"""Model backends, one file each, all behind the `LM` protocol of `base`, and `load`, which picks
the backend for a model: a Hugging Face folder runs on torch; a .gguf file (or catalog name, or
an Ollama model `ollama:NAME[:TAG]`) on the llama.cpp library `choice` measured fastest on this
machine (`auto`), unless `backend` names one. Backend modules are imported only when used."""

from __future__ import annotations

import sys
from pathlib import Path

from specwise.backends.base import LM

__all__ = ["BACKENDS", "GGUF_BACKENDS", "load", "load_pair", "model_layers", "resolve_model"]

GGUF_BACKENDS = ("llama_cpp", "ik_llama")
BACKENDS = ("torch", *GGUF_BACKENDS)


def resolve_model(model: str | Path) -> Path:
    """A path for `model`: a path that exists, `ollama:NAME[:TAG]` (the file in Ollama's store,
    `stores.resolve_ollama`), or a catalog name (pulled if missing); any of them followed by
    `@RECIPE`: that model requantized (`specwise.backends.requant`, made on first use), or
    `@best`: the copy of it (or itself) that `specwise bench drafts` found best here."""
    if not Path(model).exists() and "@" in str(model):
        from specwise.backends.requant import requantized, split_name

        source, recipe = split_name(str(model))
        if recipe is not None:
            return requantized(resolve_model(source), recipe, source)
    if str(model).startswith("ollama:"):
        from specwise.stores import resolve_ollama

        return resolve_ollama(str(model)).path
    path = Path(model)
    if not path.exists():
        if "/" in str(model) or path.suffix == ".gguf":
            raise FileNotFoundError(f"model path {str(model)!r} does not exist")
        from specwise.models import resolve

        path = resolve(str(model))
    return path


def load_pair(
    target: str | Path,
    draft: str | Path | None = None,
    backend: str | None = None,
    threads: int | None = None,
    max_sequences: int = 4,
    exact: bool = False,
    hidden: bool | tuple[int, ...] = False,
) -> tuple[LM, LM | None]:
    """(target LM, draft LM or None). backend: one of BACKENDS, or "auto"/None: a folder runs
    on torch, a GGUF file on the backend measured best for the target on this machine, with
    flash attention on ik_llama where that measured faster (the draft, probed too, runs on the
    same one, or alone on llama_cpp where ik_llama cannot run it: the target keeps the cheap
    verification). max_sequences: sequences one llama.cpp context
    serves at once. exact: the target in exact mode (`LM.exact`): on torch, or a GGUF file on
    ik_llama once its probe found it exact on this machine, else on mainline llama.cpp a
    forward a token (`_exact_gguf`). hidden: the target keeps its hidden states (`LM.hidden`,
    for the heads drafter), or with layer indices those layers' outputs (`LM.hidden_layers`,
    for the eagle drafter)."""
    if backend is not None and backend not in (*BACKENDS, "auto"):
        raise ValueError(f"backend {backend!r} is unknown; use one of: auto, {', '.join(BACKENDS)}")
    paths = [p for p in (resolve_model(target), resolve_model(draft) if draft else None) if p]
    gguf = [p for p in paths if not p.is_dir()]
    kind, flash_pays = backend, True  # flash attention: where the probe allows (forced backend)
    if backend in (None, "auto") and gguf:
        from specwise.backends.choice import choose

        choice = choose(*gguf, threads=threads)
        kind, flash_pays = choice.backend, choice.flash_attn
    flash: dict[Path, bool] = {}
    kinds = ["torch" if p.is_dir() and backend in (None, "auto") else kind for p in paths]
    if kind == "ik_llama":
        from specwise.backends.ik_llama import probe, usable_flash_attn

        for i, p in enumerate(paths):
            if kinds[i] != "ik_llama" or p.is_dir():
                continue
            flash[p] = usable_flash_attn(p, batched=max_sequences > 1)
            if flash[p] is not None:
                flash[p] = flash[p] and flash_pays
                continue
            why = probe(p, False, max_sequences > 1)
            if i == 1:  # the draft alone: the target keeps the backend that verifies cheaply
                print(f"specwise: the draft model runs on llama_cpp: {why}", file=sys.stderr)
                kinds[1] = "llama_cpp"
                continue
            if backend == "ik_llama":
                raise ValueError(f"--backend ik_llama cannot run here: {why}")
            print(f"specwise: using llama_cpp instead of ik_llama: {why}", file=sys.stderr)
            kinds = ["llama_cpp" if k == "ik_llama" else k for k in kinds]
            break
    if exact and kinds[0] != "torch":
        kinds[0] = _exact_gguf(paths[0], backend, max_sequences)
    lms = [
        _open(
            p,
            k,
            threads,
            max_sequences,
            flash,
            exact=exact and i == 0,
            hidden=hidden if i == 0 else False,
        )
        for i, (p, k) in enumerate(zip(paths, kinds, strict=True))
    ]
    return lms[0], (lms[1] if draft else None)


def _exact_gguf(path: Path, backend: str | None, max_sequences: int) -> str:
    """The backend of an exact-mode GGUF target: ik_llama where it loads and its exact probe
    passes (speculation can pay there); mainline llama.cpp when asked for, or where ik_llama
    cannot run exactly (a forward a token: exact by construction, speculation cannot pay)."""
    from specwise.backends import ik_llama

    if backend == "llama_cpp":
        return "llama_cpp"
    why = ik_llama.UNAVAILABLE if not ik_llama.available() else None
    why = why or ik_llama.probe(path, False, max_sequences > 1, exact=True)
    if why is None:
        return "ik_llama"
    if backend == "ik_llama":
        raise ValueError(f"--exact cannot run {path.name} on ik_llama here: {why}")
    print(
        f"specwise: --exact runs on llama_cpp, a forward a token (speculation cannot pay "
        f"there), because ik_llama cannot here: {why}",
        file=sys.stderr,
    )
    return "llama_cpp"


def model_layers(path: Path) -> int:
    """The number of transformer layers of a model file (a GGUF file's `block_count`) or
    Hugging Face folder (`num_hidden_layers`), read without loading it; ValueError where it
    says none."""
    import json

    if path.is_dir():
        config = json.loads((path / "config.json").read_text())
        n = config.get("num_hidden_layers") or config.get("n_layer")
    else:
        from specwise.gguf_header import read_header

        meta = read_header(path).metadata
        n = meta.get(f"{meta.get('general.architecture')}.block_count")
    if not n:
        raise ValueError(f"{path} does not say how many layers its model has")
    return int(n)


def load(
    model: str | Path,
    backend: str | None = None,
    threads: int | None = None,
    max_sequences: int = 4,
    exact: bool = False,
    hidden: bool | tuple[int, ...] = False,
) -> LM:
    """An LM for `model` (a path or a catalog name), as `load_pair` loads a target."""
    return load_pair(model, None, backend, threads, max_sequences, exact, hidden)[0]


def _open(
    path: Path,
    backend: str,
    threads: int | None,
    max_sequences: int,
    flash: dict[Path, bool],
    exact: bool = False,
    hidden: bool | tuple[int, ...] = False,
) -> LM:
    if backend == "torch":
        from specwise.backends.torch_hf import TorchLM

        return TorchLM(path, exact=exact, hidden=hidden)
    if backend == "ik_llama":
        from specwise.backends.ik_llama import IkLlamaLM

        return IkLlamaLM(
            path,
            threads=threads,
            max_sequences=max_sequences,
            flash_attn=flash.get(path, False),
            exact=exact,
            hidden=hidden,
        )
    from specwise.backends.llama_cpp import LlamaCppLM

    return LlamaCppLM(
        path, threads=threads, max_sequences=max_sequences, exact=exact, hidden=hidden
    )
