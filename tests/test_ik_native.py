"""ik_llama.cpp built for this CPU (`ik_native`): where its build goes, that specwise loads it
instead of the wheel's library only where `compare` measured it faster, and keys every verdict
by it, and that `build` installs only a library that loads. The build itself runs on a small
CMake project of the test's own (the real one takes minutes: `make native`); where this
machine has a real native build measured faster, every ik_llama test runs on it."""

from __future__ import annotations

import io
import platform
from pathlib import Path

import pytest

from specwise.backends import ik_api, ik_llama, ik_native
from specwise.costs import cache_key
from specwise.machine import cpu_key, machine

CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(fake_ik C)
add_library(ggml SHARED ggml.c)
add_library(llama SHARED llama.c)
target_link_libraries(llama ggml)
"""


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    return tmp_path


def fake_sdist(monkeypatch, calls: list[str]) -> None:
    """`_download` gives a CMake project whose `llama` target makes libllama.so and
    libggml.so, as the vendored ik_llama.cpp does (but loads as no ik_llama.cpp library)."""

    def download(work: Path, log) -> Path:
        calls.append("download")
        src = work / "src"
        src.mkdir()
        (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
        (src / "ggml.c").write_text("int ggml_fake(void) { return 1; }\n")
        (src / "llama.c").write_text(
            "int ggml_fake(void);\nint llama_fake(void) { return ggml_fake(); }\n"
        )
        return src

    monkeypatch.setattr(ik_native, "_download", download)


def test_the_makefiles_llama_cpp_build_is_keyed_by_this_cpu():
    """make's stamp and the pip cache of its -march=native llama.cpp wheel name this CPU's key
    (read by running machine.py alone, before anything is installed): on another CPU, make
    installs again, and never takes the other CPU's wheel from pip's cache."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).parents[1]
    alone = subprocess.run([sys.executable, "-S", "src/specwise/machine.py"], cwd=root,
                           capture_output=True, text=True, check=True)
    assert alone.stdout.strip() == cpu_key()
    show = "show: ; @echo $(STAMP) $(NATIVE_PIP_CACHE)"
    got = subprocess.run(["make", "-s", "--eval", show, "show"], cwd=root, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got[0].endswith(f".specwise-installed-{cpu_key()}") and got[1].endswith(cpu_key())


def test_the_build_folder_is_keyed_by_this_cpu(home):
    folder = ik_native.install_dir()
    assert folder.parent == home / "engines" / "ik_llama"
    assert folder.name == f"{ik_api.WHEEL_VERSION}-{cpu_key()}"
    assert cpu_key() in machine()  # measurements are keyed by the CPU, not its name alone
    assert ik_native.find() is None
    args = ik_native.cmake_args()
    assert "-DGGML_NATIVE=ON" in args and "-DCMAKE_INSTALL_RPATH=$ORIGIN" in args
    if platform.machine() == "x86_64":
        assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in args


def _fake_libraries(home, monkeypatch) -> Path:
    """A fake wheel's library and a fake native build (files only); the wheel's path."""
    monkeypatch.setattr(ik_api, "_wheel_dir", lambda: home / "wheel")
    (home / "wheel" / "lib").mkdir(parents=True)
    wheel = home / "wheel" / "lib" / "libllama.so"
    wheel.write_bytes(b"wheel")
    return wheel


def _curves(plain: float, four: float) -> dict[int, float]:
    return {1: plain, 2: plain * 1.2, 4: four, 8: four * 1.6, 16: four * 3}


def test_a_native_build_measured_faster_is_loaded_and_keys_its_own_verdicts(home, monkeypatch):
    wheel = _fake_libraries(home, monkeypatch)
    wheel_id = ik_api.library_id()
    assert ik_api.library_path() == wheel
    elsewhere = ik_native.install_dir().parent / f"{ik_api.WHEEL_VERSION}-x86_64-0123456789ab"
    elsewhere.mkdir(parents=True)  # a build for another CPU is never taken
    for name in ik_native.LIBRARIES:
        (elsewhere / name).write_bytes(b"other cpu")
    assert ik_api.library_path() == wheel
    ik_native.install_dir().mkdir(parents=True)
    (ik_native.install_dir() / "libllama.so").write_bytes(b"native")
    assert ik_native.find() is None  # half a build is no build
    (ik_native.install_dir() / "libggml.so").write_bytes(b"native")
    native = ik_native.install_dir() / "libllama.so"
    assert ik_native.find() == native
    assert ik_api.library_path() == wheel  # built, not yet measured: the wheel's
    curves = {"wheel": _curves(30.0, 60.0), "native": _curves(30.0, 45.0)}
    out = io.StringIO()
    said = ik_native.compare(home / "m.gguf", measure=lambda w, t: curves[w], stream=out)
    assert said["library"] == "native" and "cheaper verification" in said["reason"]
    assert ik_native.verdict() == said and "native" in out.getvalue()
    assert ik_api.library_path() == native
    assert ik_api.library_id() != wheel_id  # so probes, choices and costs are measured again
    model = home / "m.gguf"
    model.write_bytes(b"gguf")
    native_key = ik_llama._probe_key(model, True, False, False)
    monkeypatch.setenv(ik_api.LIBRARY_ENV, "wheel")  # forced
    assert ik_api.library_path() == wheel
    assert ik_llama._probe_key(model, True, False, False) != native_key


def test_a_native_build_measured_slower_or_failing_is_not_loaded(home, monkeypatch):
    wheel = _fake_libraries(home, monkeypatch)
    ik_native.install_dir().mkdir(parents=True)
    for name in ik_native.LIBRARIES:
        (ik_native.install_dir() / name).write_bytes(b"native")
    slower = {"wheel": _curves(30.0, 60.0), "native": _curves(33.0, 45.0)}
    quiet = io.StringIO()
    said = ik_native.compare(home / "m.gguf", measure=lambda w, t: slower[w], stream=quiet)
    assert said["library"] == "wheel" and "faster in every round" in said["reason"]
    assert ik_api.library_path() == wheel
    # the plain steps swap places between rounds (the machine drifts): tied, verification decides
    drift = iter([30.0, 33.0, 34.0, 31.0, 30.0, 29.0])
    said = ik_native.compare(
        home / "m.gguf",
        rounds=3,
        measure=lambda w, t: _curves(next(drift), 60.0 if w == "wheel" else 45.0),
        stream=quiet,
    )
    assert said["library"] == "native"
    assert "plain steps tied: native/wheel 0.97-1.10 over 3 rounds" in said["reason"]
    monkeypatch.setenv(ik_api.LIBRARY_ENV, "native")  # forced: loaded all the same
    assert ik_api.library_path() == ik_native.install_dir() / "libllama.so"
    monkeypatch.delenv(ik_api.LIBRARY_ENV)

    def crashes(which, target):
        if which == "native":
            raise ik_native.BuildError("measuring the native library failed: SIGILL")
        return slower["wheel"]

    calls = []
    said = ik_native.compare(
        home / "m.gguf", measure=lambda w, t: calls.append(w) or crashes(w, t), stream=quiet
    )
    assert said["library"] == "wheel" and "SIGILL" in said["reason"]
    assert calls == ["wheel", "native"] + ["wheel"] * (ik_native.ROUNDS - 1)  # not run again
    with pytest.raises(ik_native.BuildError, match="neither library ran"):
        ik_native.compare(home / "m.gguf", measure=lambda w, t: crashes("native", t), stream=quiet)


def test_compare_measures_each_library_in_its_own_child(home, monkeypatch, gemma_path):
    """The real path on a small model (the one ik_llama's tests run): a copy of the wheel's
    library installed as the native build, each measured in child processes that load the
    library they are told to."""
    if not ik_llama.available():
        pytest.skip("the ik-llama-cpp-python wheel is not installed here")
    monkeypatch.delenv(ik_api.LIBRARY_ENV, raising=False)
    wheel = ik_api._wheel_dir() / "lib"
    # the wheel's libllama.so finds its libggml in $ORIGIN/../../ik_llama_cpp_python.libs
    libs = ik_api._wheel_dir().parent / "ik_llama_cpp_python.libs"
    if not libs.is_dir():
        pytest.skip(f"the wheel's libllama.so is not laid out as this test expects ({libs})")
    if ik_llama.usable_flash_attn(gemma_path, batched=False) is None:
        pytest.skip("the wheel's ik_llama.cpp cannot run the model on this CPU (its probe)")
    (home / "engines").mkdir()
    (home / "engines" / libs.name).symlink_to(libs)
    ik_native.install_dir().mkdir(parents=True)
    for name in ik_native.LIBRARIES:
        (ik_native.install_dir() / name).write_bytes((wheel / name).read_bytes())
    said = ik_native.compare(gemma_path, rounds=1, stream=io.StringIO())
    assert said["library"] in ("wheel", "native") and said["model"] == gemma_path.name
    assert set(said["curves"]) == {"wheel", "native"}
    for curve in said["curves"].values():
        assert set(curve) == set(ik_native.SIZES) and all(ms > 0 for ms in curve.values())
    assert ik_native.verdict() == said
    assert ik_native.main(["frobnicate"]) == 2


def test_the_cost_calibration_is_keyed_by_the_library():
    from dataclasses import replace

    from toy import ToyLM

    lm = ToyLM()
    key = cache_key(lm, [])
    lm.info = replace(lm.info, library="another build")
    assert cache_key(lm, []) != key


def test_build_installs_only_a_library_that_loads(home, monkeypatch):
    """The fake library builds but is no ik_llama.cpp library: nothing is installed and the
    error names it. Once it passes the check, it is installed and found, and built once."""
    calls: list[str] = []
    fake_sdist(monkeypatch, calls)
    out = io.StringIO()
    with pytest.raises(ik_native.BuildError, match="does not load here"):
        ik_native.build(stream=out, jobs=1)
    folder = ik_native.install_dir()
    assert not folder.exists() and ik_native.find() is None
    assert [p.name for p in folder.parent.iterdir()] == [f"{folder.name}.build.log"]
    monkeypatch.setattr(ik_native, "_check", lambda library, log: calls.append("check"))
    path = ik_native.build(stream=out, jobs=1)
    assert path == folder / "libllama.so" == ik_native.find()
    assert sorted(p.name for p in folder.iterdir()) == sorted(ik_native.LIBRARIES)
    assert ik_native.build(stream=out) == path  # built already: nothing more
    assert calls == ["download", "download", "check"]
    assert "already built" in out.getvalue()


def test_a_failed_compile_says_where_its_log_is(home, monkeypatch):
    def download(work: Path, log) -> Path:
        src = work / "src"
        src.mkdir()
        (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
        (src / "ggml.c").write_text("this is not C\n")
        (src / "llama.c").write_text("int llama_fake(void) { return 0; }\n")
        return src

    monkeypatch.setattr(ik_native, "_download", download)
    with pytest.raises(ik_native.BuildError, match=r"cmake --build failed .*build\.log"):
        ik_native.build(stream=io.StringIO(), jobs=1)
    assert ik_native.find() is None


def test_bench_backend_names_the_ik_library_it_measured():
    from specwise.bench.gguf import format_comparison

    curve = {1: 30.0, 4: 50.0}
    result = {
        "ik_library": "/wheel/lib/libllama.so",
        "ik_native": False,
        "curves": {"ik_llama+fa": curve, "ik_llama": curve, "llama_cpp": curve},
        "reason": "ik_llama (fastest plain step)",
        "plain": {
            "chat": {
                "tokens_per_s": {"ik_llama+fa": 30.0, "ik_llama": 33.0, "llama_cpp": 20.0},
                "ratio": {"ik_llama+fa": 1.5, "ik_llama": 1.65},
                "same_tokens": True,
            }
        },
        "plain_ratio_median": {"ik_llama+fa": 1.5, "ik_llama": 1.65},
        "plain_ratio_total": {"ik_llama+fa": 1.5, "ik_llama": 1.65},
        "runs": 1,
    }
    assert "libllama.so (the wheel's build; `make native` builds" in format_comparison(result)[0]
    native = format_comparison(result | {"ik_native": True})[0]
    assert native.endswith("(this CPU's native build)")
    why = "native (plain steps tied; cheaper verification)"
    native = format_comparison(result | {"ik_native": True, "ik_native_verdict": why})[0]
    assert native.endswith(f"(this CPU's native build, measured faster: {why})")
    slower = format_comparison(result | {"ik_native_verdict": "wheel (fastest plain step)"})[0]
    assert "native build measured slower: wheel (fastest plain step)" in slower
    table = "\n".join(format_comparison(result))
    assert "ik_llama+fa" in table and "1.650" in table  # every candidate, flash attention apart


def test_a_forced_library_that_cannot_be_had_is_a_usage_error(home, monkeypatch):
    """Not "ik_llama.cpp is missing": `--backend auto` must not quietly measure, choose and
    cache mainline because of a typo in $SPECWISE_IK_LIBRARY."""
    from specwise.backends import choice as backend_choice
    from specwise.cli import main

    _fake_libraries(home, monkeypatch)
    model = home / "m.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setenv(ik_api.LIBRARY_ENV, "fastest")
    for call in (ik_api.library_path, ik_llama.available, lambda: backend_choice.choose(model)):
        with pytest.raises(ValueError, match="'fastest' is invalid; use wheel or native"):
            call()
    monkeypatch.setenv(ik_api.LIBRARY_ENV, "native")  # none built
    with pytest.raises(ValueError, match="`make native` has built no library for this CPU"):
        ik_llama.probe(model)
    assert not (home / "backends").exists() and not (home / "probes").exists()
    monkeypatch.setenv(ik_api.LIBRARY_ENV, "Native")
    assert main(["generate", "--target", str(model), "hi"]) == 2  # one sentence, no traceback
