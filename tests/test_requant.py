"""Derived quantizations (`backends.requant`): NAME@RECIPE names, the file made once and keyed
by its source's sha256, failures in one sentence with nothing left behind. That a requantized
draft keeps greedy decoding exact is `test_llama_cpp.test_greedy_speculative_equals_plain`."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specwise.backends import requant
from specwise.cli import main
from specwise.gguf_header import read_header


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_names_split_at_the_last_at_and_an_unknown_recipe_is_one_sentence():
    assert requant.split_name("qwen2.5-coder-0.5b-instruct") == (
        "qwen2.5-coder-0.5b-instruct",
        None,
    )
    assert requant.split_name("ollama:qwen2.5:0.5b@q4_0") == ("ollama:qwen2.5:0.5b", "q4_0")
    assert requant.split_name("/m/a@b/x.gguf@q5_0") == ("/m/a@b/x.gguf", "q5_0")
    with pytest.raises(
        ValueError,
        match=r"'q3_k' \(in 'm@q3_k'\) is not a requantization recipe; "
        r"use one of: q4_0, q5_0, iq4_nl",
    ):
        requant.split_name("m@q3_k")


def test_a_requantized_model_is_made_once_keyed_by_its_source(home, smollm2_path, monkeypatch):
    made = requant.derive(smollm2_path, "q4_0", label="smollm2")
    assert made.parent == home / "models" / "derived"
    assert read_header(made).file_type == "Q4_0"
    assert made.stat().st_size < smollm2_path.stat().st_size
    (manifest,) = requant.list_derived()
    assert manifest["recipe"] == "q4_0" and manifest["source_name"] == "smollm2"
    assert made.name.startswith(manifest["source_sha256"][:16])
    assert manifest["library"].split()[0] in requant.LIBRARIES
    assert not list(made.parent.glob("*.partial"))

    def no_child(*a, **kw):
        raise AssertionError("a file made already is not made again")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert requant.derive(smollm2_path, "q4_0") == made
    # the same bytes under another name share the file; other bytes get their own
    copy = home / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert requant.derived_path(copy, "q4_0") == made
    with copy.open("r+b") as f:
        f.seek(copy.stat().st_size - 1)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    assert requant.derived_path(copy, "q4_0") != made


def test_a_file_that_is_not_a_model_fails_in_one_sentence_and_leaves_nothing(home):
    bad = home / "notes.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_text("not a model")
    with pytest.raises(RuntimeError, match=r"requantizing notes.gguf to q4_0 failed \(ik_llama: "):
        requant.derive(bad, "q4_0")
    assert not list((home / "models" / "derived").iterdir())


def test_resolving_a_recipe_name_makes_the_file(home, smollm2_path):
    from specwise.backends import resolve_model

    got = resolve_model(f"{smollm2_path}@q5_0")
    assert got == requant.derived_path(smollm2_path, "q5_0") and got.is_file()
    with pytest.raises(ValueError, match="is not a requantization recipe"):
        resolve_model(f"{smollm2_path}@q2")


def test_cli_names_the_recipe_and_what_to_run(home, capsys):
    assert main(["models", "pull", "smollm2-135m-instruct@q9"]) == 2
    assert "'q9' (in 'smollm2-135m-instruct@q9') is not a requantization recipe" in (
        capsys.readouterr().err
    )


def test_where_ik_llamas_library_cannot_be_had_mainlines_quantizes(home, smollm2_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_IK_LIBRARY", "native")  # no native build in this home
    made = requant.derive(smollm2_path, "q4_0")
    assert read_header(made).file_type == "Q4_0"
    assert requant.list_derived()[0]["library"].startswith("llama_cpp ")


def test_best_is_the_copy_bench_drafts_kept_on_this_machine(home, smollm2_path, capsys):
    from specwise.backends import resolve_model

    with pytest.raises(ValueError, match=r"no draft chosen .* run `specwise bench drafts --draft"):
        resolve_model(f"{smollm2_path}@best")
    requant.remember_best(smollm2_path, "q4_0", "measured here")
    assert resolve_model(f"{smollm2_path}@best") == requant.derived_path(smollm2_path, "q4_0")
    requant.remember_best(smollm2_path, None, "the draft itself was best")
    assert resolve_model(f"{smollm2_path}@best") == smollm2_path
