"""ik_llama.cpp built for this CPU (`ik_native`): where its build goes, that specwise prefers it to
the wheel's library and keys every verdict by it, and that `build` installs only a library that
loads. The build itself runs on a small CMake project of the test's own (the real one takes
minutes: `make native`); where this machine has a real native build, every ik_llama test runs on
it, since `ik_api.library_path` prefers it."""

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


def test_a_native_build_is_preferred_and_keys_its_own_verdicts(home, monkeypatch):
    monkeypatch.setattr(ik_api, "_wheel_dir", lambda: home / "wheel")
    (home / "wheel" / "lib").mkdir(parents=True)
    (home / "wheel" / "lib" / "libllama.so").write_bytes(b"wheel")
    wheel_id = ik_api.library_id()
    assert ik_api.library_path() == home / "wheel" / "lib" / "libllama.so"
    elsewhere = ik_native.install_dir().parent / f"{ik_api.WHEEL_VERSION}-x86_64-0123456789ab"
    elsewhere.mkdir(parents=True)  # a build for another CPU is never taken
    for name in ik_native.LIBRARIES:
        (elsewhere / name).write_bytes(b"other cpu")
    assert ik_api.library_path() == home / "wheel" / "lib" / "libllama.so"
    ik_native.install_dir().mkdir(parents=True)
    (ik_native.install_dir() / "libllama.so").write_bytes(b"native")
    assert ik_native.find() is None  # half a build is no build
    (ik_native.install_dir() / "libggml.so").write_bytes(b"native")
    assert ik_api.library_path() == ik_native.install_dir() / "libllama.so"
    assert ik_api.library_id() != wheel_id  # so probes, choices and costs are measured again
    model = home / "m.gguf"
    model.write_bytes(b"gguf")
    native_key = ik_llama._probe_key(model, True, False, False)
    monkeypatch.setattr(ik_native, "find", lambda: None)
    assert ik_llama._probe_key(model, True, False, False) != native_key


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
        "curves": {"llama_cpp": curve, "ik_llama": curve},
        "reason": "ik_llama (fastest plain step)",
        "plain": {},
        "plain_ratio_median": 1.0,
        "plain_ratio_total": 1.0,
        "runs": 0,
    }
    assert "libllama.so (the wheel's build; `make native` builds" in format_comparison(result)[0]
    native = format_comparison(result | {"ik_native": True})[0]
    assert native.endswith("(this CPU's native build)")
