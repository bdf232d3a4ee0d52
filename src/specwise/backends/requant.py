"""Derived quantizations: a smaller copy of a GGUF model, its weight matrices requantized to a
cheaper type by the llama.cpp library's own `llama_model_quantize`, for a draft model that costs
less a token (`NAME@RECIPE`, e.g. `qwen2.5-coder-0.5b-instruct@q4_0`).

A draft model's one-token step streams its weights from memory, so fewer bytes a weight make it
cheaper; what it may lose is acceptance, which `specwise bench` measures beside the source's.
Requantizing changes nothing of the target's distribution (every draft is verified).

A derived file lives in `$SPECWISE_HOME/models/derived`, named by the source file's sha256 and
the recipe (`<sha256[:16]>-<recipe>.gguf`, with a `.json` manifest of what made it), so a
source that changes gets a new file and two names of one file share one. It is written by a
child process (`python -m specwise.backends.requant`: a prebuilt library that dies on this CPU takes
only the child with it) into a `.partial` file renamed into place when complete. The child
uses ik_llama.cpp's library where it loads, else mainline's (llama-cpp-python); both write the
standard GGUF types of `RECIPES`. This module loads no model and runs no forward.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BEST",
    "RECIPES",
    "Recipe",
    "best",
    "derive",
    "derived_path",
    "list_derived",
    "remember_best",
    "requantized",
    "split_name",
]

# ggml's type ids (ggml.h, the same in both libraries) and llama_ftype's (llama.h)
GGML_Q4_0, GGML_Q5_0, GGML_IQ4_NL = 2, 6, 20
TIMEOUT_S = 900
LIBRARIES = ("ik_llama", "llama_cpp")


@dataclass(frozen=True)
class Recipe:
    name: str
    ftype: int  # llama_ftype: the type of the weight matrices
    output_type: int  # ggml_type of the output matrix (the largest single one in small models)
    description: str


RECIPES = {
    r.name: r
    for r in (
        Recipe("q4_0", 2, GGML_Q4_0, "every weight matrix Q4_0, the output layer too"),
        Recipe("q5_0", 8, GGML_Q4_0, "weight matrices Q5_0, the output layer Q4_0"),
        Recipe("iq4_nl", 25, GGML_IQ4_NL, "every weight matrix IQ4_NL, the output layer too"),
    )
}


BEST = "best"  # NAME@best: the copy `specwise bench drafts` found best on this machine


def split_name(model: str) -> tuple[str, str | None]:
    """(source, recipe) of `NAME@RECIPE` (or NAME@best); (model, None) for a name without
    one. Raises ValueError for an unknown recipe."""
    source, at, recipe = model.rpartition("@")
    if not at or not source:
        return model, None
    if recipe not in RECIPES and recipe != BEST:
        raise ValueError(
            f"{recipe!r} (in {model!r}) is not a requantization recipe; use one of: "
            f"{', '.join(RECIPES)}, or {BEST} (e.g. {source}@q4_0)"
        )
    return source, recipe


def _choice_path(source: Path, sha256: str | None = None) -> Path:
    from specwise.machine import machine
    from specwise.models import home

    sha256 = sha256 or _source_sha256(source)
    key = hashlib.sha256(f"{machine()}|{sha256}".encode()).hexdigest()[:20]
    return home() / "models" / "derived" / "chosen" / f"{key}.json"


def remember_best(source: Path, recipe: str | None, why: str) -> None:
    """Keep what `bench drafts` found best for `source` on this machine (None: the source
    itself), for `NAME@best`."""
    from specwise.models import save_json

    save_json(_choice_path(source), {"recipe": recipe, "why": why}, indent=1)


def best(source: Path, label: str) -> str | None:
    """The recipe `bench drafts` found best for `source` on this machine (None: the source
    itself); ValueError, saying what to run, where it has not measured it here."""
    try:
        data = json.loads(_choice_path(source).read_text())
        recipe = data["recipe"]
    except (OSError, ValueError, KeyError):
        raise ValueError(
            f"{label}@{BEST}: no draft chosen for {label} on this machine yet; run `specwise "
            f"bench drafts --draft {label}` once (it measures its copies and keeps the best)"
        ) from None
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"{label}@{BEST}: the kept choice names no recipe ({recipe!r})")
    return recipe


def _source_sha256(source: Path) -> str:
    """The source's sha256: the catalog's, for a catalog file verified in place, else read
    (once a process for a file of this size and time: resolving NAME@best, its copy's path and
    the copy each ask)."""
    from specwise.models import CATALOG, _stamp, is_pulled, model_path

    for entry in CATALOG.values():
        if model_path(entry.name) == source and is_pulled(entry.name):
            return entry.sha256
    return _read_sha256(str(source), _stamp(source))


@functools.lru_cache(maxsize=64)
def _read_sha256(path: str, stamp: str) -> str:
    from specwise.models import _sha256_file

    return _sha256_file(Path(path), f"sha256 {Path(path).name}")


def derived_path(source: Path, recipe: str, sha256: str | None = None) -> Path:
    """Where `source` (of this sha256, read where not given) requantized by `recipe` lives,
    whether it exists yet or not."""
    from specwise.models import home

    sha256 = sha256 or _source_sha256(source)
    return home() / "models" / "derived" / f"{sha256[:16]}-{recipe}.gguf"


def derive(source: Path, recipe: str, label: str | None = None) -> Path:
    """The file of `source` requantized by `recipe`: made now (a few seconds to a minute, in a
    child process) where it is not on disk yet. label: how to name the source to people."""
    from specwise.models import save_json

    if recipe not in RECIPES:
        raise ValueError(
            f"{recipe!r} is not a requantization recipe; use one of: {', '.join(RECIPES)}"
        )
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"the model to requantize, {str(source)!r}, is not a file")
    sha256 = _source_sha256(source)
    dest = derived_path(source, recipe, sha256)
    manifest = dest.with_suffix(".json")
    if dest.is_file() and manifest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    name = label or source.name
    print(f"specwise: requantizing {name} to {recipe} (once)...", file=sys.stderr)
    t = time.perf_counter()
    errors = []
    for library in LIBRARIES:  # ik_llama's where it runs here, else mainline's
        cmd = [
            sys.executable,
            "-m",
            "specwise.backends.requant",
            str(source),
            str(partial),
            recipe,
            library,
        ]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            errors.append(f"{library}: it took over {TIMEOUT_S} s")
            continue
        said = res.stdout.strip().splitlines()
        if res.returncode == 0 and partial.is_file() and said:
            used = said[-1]
            break
        lines = (res.stdout + res.stderr).strip().splitlines() or [f"exit status {res.returncode}"]
        errors.append(
            f"{library}: "
            + (f"died of signal {-res.returncode}" if res.returncode < 0 else lines[-1])
        )
    else:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"requantizing {name} to {recipe} failed ({'; '.join(errors)})")
    os.replace(partial, dest)
    save_json(
        manifest,
        {
            "source": str(source),
            "source_name": name,
            "source_sha256": sha256,
            "recipe": recipe,
            "description": RECIPES[recipe].description,
            "library": used,
            "bytes": dest.stat().st_size,
            "seconds": round(time.perf_counter() - t, 1),
        },
        indent=1,
    )
    mib = dest.stat().st_size / 2**20
    print(
        f"specwise: {name}@{recipe}: {mib:.0f} MiB (from {source.stat().st_size / 2**20:.0f} "
        f"MiB) in {dest}",
        file=sys.stderr,
    )
    return dest


def requantized(source: Path, recipe: str, label: str, make: bool = True) -> Path:
    """The file of `source`@`recipe` (@best: the one `best` names, maybe `source` itself):
    made where missing (make), else FileNotFoundError saying how to make it."""
    if recipe == BEST:
        chosen = best(source, label)
        if chosen is None:
            return source
        recipe = chosen
    if make:
        return derive(source, recipe, label=label)
    path = derived_path(source, recipe)
    if not path.is_file():
        raise FileNotFoundError(
            f"{label}@{recipe} is not made yet; run: specwise models pull {label}@{recipe}"
        )
    return path


def list_derived() -> list[dict]:
    """The manifests of the derived files on disk (each with its `path`)."""
    from specwise.models import home

    out = []
    for manifest in sorted((home() / "models" / "derived").glob("*.json")):
        gguf = manifest.with_suffix(".gguf")
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if gguf.is_file():
            out.append({**data, "path": str(gguf)})
    return out


# -- the child ----------------------------------------------------------------------------
def _quantize(library: str, source: str, dest: str, recipe: Recipe) -> str:
    """Quantize with `library`'s llama_model_quantize (both name it and its parameters alike);
    return what ran."""
    if library == "ik_llama":
        from specwise.backends import ik_api

        lib = ik_api.open_library()
        used = f"ik_llama {ik_api.library_id()}"
    else:
        import llama_cpp as lib

        used = f"llama_cpp {lib.__version__}"
    lib.llama_backend_init()
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.output_tensor_type = recipe.ftype, recipe.output_type
    params.allow_requantize, params.nthread = True, os.cpu_count() or 1
    if lib.llama_model_quantize(source.encode(), dest.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"{library}'s llama_model_quantize returned an error")
    return used


def _main(argv: list[str]) -> int:
    """The child: quantize argv = [source, dest, recipe, library]; print what it used last."""
    source, dest, recipe, library = argv
    print(_quantize(library, source, dest, RECIPES[recipe]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
