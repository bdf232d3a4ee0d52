"""The GGUF models a user already has: Ollama's store, LM Studio's folders and the Hugging Face
hub's cache, each model described from its file's header (`gguf_header`: name, size,
quantization, tokenizer) and given a draft to try (`suggest_draft`); and `resolve_ollama`, which
turns `ollama:NAME[:TAG]` into the file Ollama keeps that model in (what `--target` and
`--draft` run).

Where it looks: Ollama's models folder is `$OLLAMA_MODELS`, else `~/.ollama/models` and the
system service's `/usr/share/ollama/.ollama/models`; a model is a manifest
`manifests-v2/<host>/<namespace>/<model>/<tag>` (current releases; often a link to a manifest
blob), else `manifests/<host>/...` (older ones), whose model layer names a blob
`blobs/sha256-<hex>`; a manifest list holds one child manifest per runner, of which the GGUF
one is read. LM Studio keeps `<publisher>/<model>/*.gguf` under `~/.lmstudio/models` or
`~/.cache/lm-studio/models`; the hub's cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`, with files under `models--<org>--<name>/snapshots/<revision>/`.

It reads only: nothing is copied, moved or written, and no model is loaded. A store that is
missing or malformed is one sentence naming the path or the variable and what would be valid:
a `StoreError` for a model asked for by name, a line of `Store.problems` in a listing (which
goes on past it).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specwise.gguf_header import GgufHeader, HeaderError, read_header

__all__ = ["Found", "Store", "StoreError", "discover", "resolve_ollama", "suggest_draft"]

PREFIX = "ollama:"
SYSTEM_OLLAMA = Path("/usr/share/ollama/.ollama/models")  # the Linux service's store
PUBLIC_HOSTS = ("registry.ollama.ai", "ollama.com")  # manifests/ names the first, -v2 the second
MODEL_LAYER = "application/vnd.ollama.image.model"
DRAFT_LAYER = "application/vnd.ollama.image.draft"
MANIFEST_LIST = "application/vnd.ollama.manifest.list.v2+json"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's split files: the first is run


class StoreError(ValueError):
    """A model store, or a model in one, cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Found:
    """One GGUF model on this machine."""

    store: str  # "ollama", "lm-studio" or "hf-cache"
    name: str  # as its store names it: "llama3.2:1b", "publisher/model/file.gguf"
    ref: str  # what --target and --draft take for it: "ollama:llama3.2:1b", or its path
    path: Path  # the GGUF file (an Ollama blob has no .gguf suffix)
    size: int  # bytes, every part of a split file
    header: GgufHeader
    draft: Path | None = None  # the draft model its Ollama manifest names, if any
    modified: float = 0.0  # when its store last wrote it (seconds since the epoch)


@dataclass(frozen=True)
class Store:
    kind: str  # as Found.store
    root: Path
    models: tuple[Found, ...]
    problems: tuple[str, ...]  # one sentence each: a model that could not be read, and why


@dataclass(frozen=True)
class Advice:
    """The draft to try with a model: `flags` to add to its command line, and why."""

    flags: str
    why: str


# -- where the stores are -------------------------------------------------------------------------
def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def ollama_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """Ollama's models folders, in the order Ollama's own lookups would find them:
    $OLLAMA_MODELS alone where it is set (StoreError unless it is a folder)."""
    given = _env(env).get("OLLAMA_MODELS")
    if given:
        root = Path(given).expanduser()
        if not _present(root):
            raise StoreError(
                f"OLLAMA_MODELS={given!r} is not a folder; set it to Ollama's models folder "
                f"(the one holding manifests/ and blobs/), or unset it for ~/.ollama/models"
            )
        return [root]
    return [p for p in (Path.home() / ".ollama" / "models", SYSTEM_OLLAMA) if _present(p)]


def lm_studio_roots() -> list[Path]:
    home = Path.home()
    return [
        p
        for p in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models")
        if _present(p)
    ]


def _present(folder: Path) -> bool:
    """Whether `folder` is there: a folder, or a path this user may not look into (which its
    store then reports as unreadable)."""
    try:
        return folder.is_dir()
    except OSError:  # PermissionError: a store another user (Ollama's service) keeps
        return True


def hf_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub's cache folder, as huggingface_hub finds it."""
    env = _env(env)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "huggingface" / "hub"


def discover(env: Mapping[str, str] | None = None) -> tuple[list[Store], list[str]]:
    """Every store found here with the models it holds, and a sentence for each store asked
    for that is not there (OLLAMA_MODELS naming no folder). Folders that do not exist by
    default are not stores: they are left out silently."""
    stores, missing = [], []
    try:
        stores += [_ollama_store(root) for root in ollama_roots(env)]
    except StoreError as exc:
        missing.append(str(exc))
    stores += [_file_store("lm-studio", root, root.rglob("*.gguf")) for root in lm_studio_roots()]
    hub = hf_cache_root(env)
    if _present(hub):
        stores.append(_file_store("hf-cache", hub, hub.glob("models--*/snapshots/*/**/*.gguf")))
    return stores, missing


# -- LM Studio and the hub's cache: GGUF files in folders ------------------------------------------
def _file_store(kind: str, root: Path, files: Iterable[Path]) -> Store:
    models, problems, seen = [], [], set()
    try:
        paths = sorted(
            p for p in files if not any(s.startswith(".") for s in p.relative_to(root).parts)
        )
    except OSError as exc:
        return _broken(kind, root, f"{root} cannot be read: {exc.strerror or exc}")
    for path in paths:
        split = _SPLIT.search(path.name)
        if split and split.group(1) != "00001":
            continue  # a later part of a split file: counted with its first
        try:
            real = path.resolve(strict=True)
        except OSError:
            continue  # a link to a blob not downloaded (yet): no model
        if real in seen:
            continue  # one blob under two snapshots
        seen.add(real)
        try:
            header = read_header(real)
        except HeaderError as exc:
            problems.append(str(exc))
            continue
        if not header.is_language_model:
            continue  # a vision projector or an adapter: nothing to run alone
        size = sum(p.stat().st_size for p in _parts(path)) if split else real.stat().st_size
        models.append(
            Found(
                kind,
                _file_name(kind, root, path),
                str(path),
                path,
                size,
                header,
                modified=real.stat().st_mtime,
            )
        )
    return Store(kind, root, tuple(models), tuple(problems))


def _broken(kind: str, root: Path, sentence: str) -> Store:
    """A store none of whose models can be read, and why."""
    return Store(kind, root, (), (sentence,))


def _parts(first: Path) -> list[Path]:
    stem = _SPLIT.sub("", first.name)
    return sorted(first.parent.glob(f"{glob.escape(stem)}-?????-of-?????.gguf"))


def _file_name(kind: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).parts
    if kind == "hf-cache":  # models--org--name/snapshots/<rev>/file -> org/name/file
        repo = rel[0].removeprefix("models--").replace("--", "/")
        return "/".join([repo, *rel[3:]])
    return "/".join(rel)


# -- Ollama ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def public(self) -> bool:
        return self.host.lower() in PUBLIC_HOSTS

    @property
    def display(self) -> str:
        """The shortest name Ollama shows: model:tag, namespace/model:tag or the whole."""
        if not self.public:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        prefix = "" if self.namespace == "library" else f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"

    def key(self) -> tuple[str, ...]:
        host = PUBLIC_HOSTS[0] if self.public else self.host.lower()
        return (host, self.namespace.lower(), self.model.lower(), self.tag.lower())

    def manifests(self, root: Path) -> list[Path]:
        """Where this name's manifest can be: manifests-v2 first, then the older manifests."""
        v2_host = PUBLIC_HOSTS[1] if self.public else self.host.replace(":", "%3A")
        old_hosts = PUBLIC_HOSTS if self.public else (self.host,)
        rest = (self.namespace, self.model, self.tag)
        paths = [root / "manifests-v2" / v2_host / Path(*rest)]
        return paths + [root / "manifests" / h / Path(*rest) for h in old_hosts]


def parse_name(ref: str) -> OllamaName:
    """`[ollama:][host/][namespace/]model[:tag]` -> OllamaName (library and latest by default)."""
    text = ref.removeprefix(PREFIX)
    head, _, last = text.rpartition("/")
    model, _, tag = last.partition(":")
    parts = [*head.split("/"), model] if head else [model]
    host, namespace = PUBLIC_HOSTS[0], "library"
    if len(parts) == 2:
        namespace = parts[0]
    elif len(parts) == 3:
        host, namespace = parts[0], parts[1]
    names = [namespace, parts[-1], tag or "latest"]
    if (
        len(parts) > 3
        or not all(_PART.match(p) for p in names)
        or not _PART.match(host.replace(":", ""))
    ):
        raise StoreError(
            f"{PREFIX}{text} is not an Ollama model name; use {PREFIX}NAME[:TAG], e.g. "
            f"{PREFIX}llama3.2:1b or {PREFIX}namespace/model:tag (as `ollama list` shows them)"
        )
    return OllamaName(host, namespace, parts[-1], tag or "latest")


def resolve_ollama(ref: str, env: Mapping[str, str] | None = None) -> Found:
    """The model `ollama:NAME[:TAG]` names, from the first Ollama store holding it."""
    name = parse_name(ref)
    roots = ollama_roots(env)
    if not roots:
        raise StoreError(
            f"{PREFIX}{name.display}: there is no Ollama store here (OLLAMA_MODELS is unset and "
            f"neither ~/.ollama/models nor {SYSTEM_OLLAMA} is a folder); set OLLAMA_MODELS to "
            f"Ollama's models folder"
        )
    for root in roots:
        path = next((p for p in name.manifests(root) if os.path.lexists(p)), None)
        if path is not None:
            return _ollama_model(root, path, name)
    listed = [_ollama_store(root) for root in roots]
    held = sorted({m.name for st in listed for m in st.models})
    unread = [st.problems[0] for st in listed if not st.models and st.problems]
    raise StoreError(
        f"{PREFIX}{name.display} is not in the Ollama store at "
        f"{', '.join(map(str, roots))}; it holds {', '.join(held) or 'no model'} "
        f"(`ollama pull {name.display}` fetches it)" + (f"; {unread[0]}" if unread else "")
    )


def _ollama_store(root: Path) -> Store:
    try:
        tops = [root / d for d in ("manifests-v2", "manifests") if (root / d).is_dir()]
        for top in tops:  # glob would skip a folder it may not read, silently
            if not os.access(top, os.R_OK | os.X_OK):
                raise PermissionError(f"{top}: permission denied")
        entries = [(top, p) for top in tops for p in sorted(top.glob("*/*/*/*"))]
    except OSError as exc:
        return _broken(
            "ollama",
            root,
            f"{root} cannot be read ({exc}); run as a user who can read it (Ollama's service "
            f"keeps its store for its own user), or set OLLAMA_MODELS to a store you can read",
        )
    if not tops:
        return _broken(
            "ollama",
            root,
            f"{root} holds no manifests-v2/ or manifests/ folder, so it is not an Ollama models "
            f"folder (OLLAMA_MODELS should name the one holding manifests/ and blobs/)",
        )
    models, problems, seen = [], [], set()
    for top, path in entries:
        host, namespace, model, tag = path.relative_to(top).parts
        if path.is_dir() or tag.startswith("."):
            continue
        name = OllamaName(host.replace("%3A", ":"), namespace, model, tag)
        if name.key() in seen:
            continue  # a model in manifests-v2 keeps an older manifest as a downgrade anchor
        seen.add(name.key())
        try:
            models.append(_ollama_model(root, path, name))
        except StoreError as exc:
            problems.append(str(exc))
    return Store("ollama", root, tuple(models), tuple(problems))


def _ollama_model(root: Path, manifest: Path, name: OllamaName) -> Found:
    who = f"{PREFIX}{name.display}"
    data = _runnable(root, _read_json(manifest, f"the manifest of {who}", name), who, name)
    model = _layer(data, MODEL_LAYER)
    if model is None:
        kinds = sorted({str(x.get("mediaType", "?")) for x in data["layers"]})
        raise StoreError(
            f"{who} has no GGUF model layer (its layers: {', '.join(kinds) or 'none'}): its "
            f"weights are in another format, and specwise runs GGUF files"
        )
    path = _blob(root, model, who, name)
    try:
        header = read_header(path)
    except HeaderError as exc:
        raise StoreError(f"{who}: {exc}") from None
    draft = _layer(data, DRAFT_LAYER)
    return Found(
        "ollama",
        name.display,
        f"{PREFIX}{name.display}",
        path,
        path.stat().st_size,
        header,
        draft=None if draft is None else _blob(root, draft, who, name),
        modified=manifest.lstat().st_mtime,
    )


def _runnable(root: Path, data: dict, who: str, name: OllamaName) -> dict:
    """The manifest with the layers to run: itself, or a manifest list's GGUF child."""
    if data.get("mediaType") != MANIFEST_LIST:
        if not isinstance(data.get("layers"), list):
            raise StoreError(
                f"the manifest of {who} has no 'layers' list, so it is not an Ollama manifest; "
                f"`ollama pull {name.display}` writes it again"
            )
        return data
    children = data.get("manifests")
    if not isinstance(children, list) or not all(isinstance(c, dict) for c in children):
        raise StoreError(f"the manifest list of {who} has no 'manifests' list of objects")
    for child in sorted(children, key=lambda c: str(c.get("format", "")).lower() != "gguf"):
        if not isinstance(child.get("layers"), list) and "digest" in child:  # a reference
            child = _read_json(_blob(root, child, who, name), f"a manifest {who} lists", name)
        if isinstance(child.get("layers"), list) and _layer(child, MODEL_LAYER) is not None:
            return child
    raise StoreError(f"the manifest list of {who} holds no manifest with a GGUF model layer")


def _read_json(path: Path, what: str, name: OllamaName) -> dict:
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise StoreError(f"{what} ({path}) cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StoreError(
            f"{what} ({path}) is not valid JSON ({exc}); `ollama pull {name.display}` writes "
            f"it again"
        ) from None
    if not isinstance(data, dict):
        raise StoreError(f"{what} ({path}) is JSON but not an object, so not an Ollama manifest")
    return data


def _layer(manifest: dict, media_type: str) -> dict | None:
    return next(
        (
            x
            for x in manifest.get("layers") or []
            if isinstance(x, dict) and x.get("mediaType") == media_type
        ),
        None,
    )


def _blob(root: Path, layer: dict, who: str, name: OllamaName) -> Path:
    digest = str(layer.get("digest", ""))
    match = _DIGEST.match(digest)
    if match is None:
        raise StoreError(
            f"the manifest of {who} names the blob {digest!r}, which is not a digest "
            f"'sha256:<64 hex digits>'"
        )
    path = root / "blobs" / f"sha256-{match.group(1).lower()}"
    if not path.is_file():
        raise StoreError(
            f"the blob {path.name} of {who} is missing from {root / 'blobs'}; "
            f"`ollama pull {name.display}` fetches it again"
        )
    return path


# -- a draft for each ----------------------------------------------------------------------------
def suggest_draft(model: Found, others: Sequence[Found]) -> Advice:
    """The draft to try with `model`: the draft its Ollama manifest names; else the smallest
    model of its tokenizer (GgufHeader.tokenizer) at most half its size, on disk first (any
    store, or a pulled catalog model), then in the catalog (pulled on first use); else the
    n-gram and suffix drafters, which need no model (the default with --k auto)."""
    if model.draft is not None:
        return Advice(f"--draft {model.draft}", "the draft its Ollama manifest names")
    from specwise import models

    tok, half = model.header.tokenizer, model.size / 2
    # (size, what --draft takes, where it is) of each candidate
    disk = [
        (f.size, f.ref, f.store) for f in others if f.header.tokenizer == tok and f.size <= half
    ]
    listed = [
        (e.size, e.name, "catalog")
        for e in models.CATALOG.values()
        if e.gguf_tokenizer == tok and e.size and e.size <= half
    ]
    disk += [c for c in listed if models.is_pulled(c[1])]
    if disk:
        size, ref, where = min(disk)
        return Advice(
            f"--draft {ref}",
            f"the smallest model with its tokenizer here ({where}, {size / 2**20:.0f} MiB)",
        )
    if listed:
        size, ref, _ = min(listed)
        return Advice(
            f"--draft {ref}",
            f"the catalog's smallest model with its tokenizer "
            f"({size / 2**20:.0f} MiB, pulled on first use)",
        )
    return Advice(
        "--drafter ngram,suffix",
        "no smaller model with its tokenizer here or in the "
        "catalog, and these drafters need none (the default with --k auto)",
    )
