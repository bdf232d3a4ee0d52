"""The ik_llama.cpp backend's own parts: the ctypes layouts against the wheel's llama.h, the
probe and the fallback when the library cannot run, its passes, and the backend choice. The
LM contract and greedy equality run on it in test_llama_cpp.py, beside mainline's."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from specwise.backends import choice as backend_choice
from specwise.backends import ik_api, ik_llama, load_pair
from specwise.backends.curves import TRIES, CostCurve

needs_ik = pytest.mark.skipif(not ik_llama.available(), reason=ik_llama.UNAVAILABLE)


def _ctype_name(struct: type[ctypes.Structure]) -> str:
    return "struct llama_batch" if struct is ik_api.llama_batch else f"struct {struct.__name__}"


@needs_ik
def test_struct_layouts_match_the_wheels_header(tmp_path):
    """Every declared field's offset, and each struct's size, as the C compiler reads llama.h."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read llama.h with")
    header = ik_api.header_path()
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "llama.h"', "int main(void) {"]
    want = []
    for struct in ik_api.STRUCTS:
        name = _ctype_name(struct)
        lines.append(f'printf("%zu\\n", sizeof({name}));')
        want.append((f"sizeof {name}", ctypes.sizeof(struct)))
        for field, _ in struct._fields_:
            lines.append(f'printf("%zu\\n", offsetof({name}, {field}));')
            want.append((f"{name}.{field}", getattr(struct, field).offset))
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(header.parent), str(src), "-o", str(exe)], check=True)
    got = [
        int(x)
        for x in subprocess.run(
            [str(exe)], capture_output=True, text=True, check=True
        ).stdout.split()
    ]
    wrong = [f"{what}: C {g}, ctypes {w}" for (what, w), g in zip(want, got, strict=True) if g != w]
    assert not wrong, wrong


@needs_ik
def test_a_shifted_field_is_caught(tmp_path, monkeypatch):
    """A declaration with one field too wide (every later offset shifted, the struct larger, so
    the library writes inside it) reads the library's defaults wrong and is refused."""

    class Shifted(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_uint64 if name == "n_batch" else kind)
            for name, kind in ik_api.llama_context_params._fields_
        ]

    lib = ik_api.open_library()
    fn = ctypes.CDLL(str(lib.path)).llama_context_default_params
    fn.restype = Shifted
    monkeypatch.setattr(lib, "llama_context_default_params", lambda: fn())
    with pytest.raises(ik_api.IkLibraryError, match="read wrong"):
        ik_api._check_defaults(lib)


def test_a_missing_library_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(ik_api, "find", lambda: None)  # no native build here either
    monkeypatch.setattr(ik_api.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ik_api.IkLibraryError, match=r"needs the ik-llama-cpp-python==0\.1\.5"):
        ik_api.library_path()


@needs_ik
def test_a_library_that_dies_in_the_probe_falls_back_to_llama_cpp(
    smollm2_path, monkeypatch, tmp_path, capsys
):
    """The probe's child is killed by a signal (as a CPU without the wheel's instructions
    would kill it): `auto` loads mainline llama.cpp and says why, once."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    calls = []

    def dying_child(model, flash_attn, batched, exact):
        calls.append(flash_attn)
        return ik_llama._verdict(-4, "", "Illegal instruction")

    monkeypatch.setattr(ik_llama, "_probe_child", dying_child)
    target, draft = load_pair(smollm2_path, smollm2_path, backend="auto", max_sequences=1)
    assert target.info.backend == draft.info.backend == "llama_cpp"
    err = capsys.readouterr().err
    assert "died of signal 4" in err and err.count("specwise: backend") == 1
    assert calls == [True, False]  # with flash attention, then without
    again, _ = load_pair(smollm2_path, None, backend="auto", max_sequences=1)
    assert again.info.backend == "llama_cpp" and calls == [True, False]  # remembered


@needs_ik
def test_a_draft_ik_llama_cannot_run_runs_on_llama_cpp_beside_an_ik_target(
    gemma_path, smollm2_path, monkeypatch, capsys
):
    """The target keeps the backend that verifies cheaply; only the draft falls back (the
    two libraries in one process), and the pair drafts (here across tokenizers)."""
    from specwise import Engine, SamplingParams
    from specwise.drafters import ModelDrafter

    monkeypatch.setattr(
        ik_llama, "usable_flash_attn", lambda p, batched: None if p == smollm2_path else False
    )
    monkeypatch.setattr(ik_llama, "probe", lambda p, *a, **k: "wrong logits (as here)")
    target, draft = load_pair(gemma_path, smollm2_path, backend="ik_llama", max_sequences=1)
    assert (target.info.backend, draft.info.backend) == ("ik_llama", "llama_cpp")
    assert "the draft model runs on llama_cpp: wrong logits (as here)" in capsys.readouterr().err
    res = Engine(target, ModelDrafter(draft), k=3).generate(
        target.tokenizer.encode("One, two, three,"), SamplingParams(max_tokens=12)
    )
    assert res.summary.emitted == 12 and res.summary.proposed > 0


@needs_ik
def test_the_probe_passes_here_and_is_remembered(gemma_path, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    assert ik_llama.probe(gemma_path) is None
    monkeypatch.setattr(ik_llama, "_probe_child", lambda *a: pytest.fail("probed twice"))
    assert ik_llama.probe(gemma_path) is None


def test_the_probe_tells_wrong_logits_from_right_ones():
    ok = ik_llama._PROBE_OK
    assert ik_llama._verdict(0, ok, "") is None
    assert "signal 4" in ik_llama._verdict(-4, "", "x\ny")
    said = ik_llama._verdict(3, "", "log\nerror: wrong logits: a forward of 40 tokens ...\n")
    assert "exited with code 3" in said and "wrong logits" in said
    assert "GGML_ASSERT(S > 0)" in ik_llama._verdict(
        -6, "", "a\nf.h:1: GGML_ASSERT(S > 0) failed\n#1 x"
    )


@needs_ik
def test_ik_and_mainline_compute_the_same_model_alike(gemma_path):
    """Two libraries, one file: their logits agree row by row (the probe checks ik against
    itself; this checks it against mainline, forwards of 1 to 40 tokens)."""
    import numpy as np

    from specwise.backends.llama_cpp import LlamaCppLM

    ik = ik_llama.IkLlamaLM(gemma_path, context_length=256, max_sequences=1)
    main = LlamaCppLM(gemma_path, context_length=256, max_sequences=1)
    ids = main.tokenizer.encode("def merge(a, b):\n    out = []\n" * 4)[:40]
    assert ik.tokenizer.encode("def merge(a, b):\n    out = []\n" * 4)[:40] == ids
    for n in (1, 4, 40):
        a, b = ik.forward([(0, ids[:n])])[0], main.forward([(0, ids[:n])])[0]
        ik.release(0)
        main.release(0)
        corr = [float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b, strict=True)]
        assert min(corr) > 0.98, (n, min(corr))
        top2 = np.sort(b, axis=-1)[:, -2:]
        parted = a.argmax(-1) != b.argmax(-1)  # only at near-ties of mainline's logits
        assert (top2[parted, 1] - top2[parted, 0] < 0.5).all()
    ik.close()
    main.close()


@needs_ik
def test_a_forced_ik_backend_that_cannot_run_is_one_clear_error(
    smollm2_path, monkeypatch, tmp_path
):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(ik_llama, "_probe_child", lambda *a: "it died")
    with pytest.raises(ValueError, match="--backend ik_llama cannot run here: it died"):
        load_pair(smollm2_path, backend="ik_llama")


@needs_ik
def test_one_shared_cache_runs_any_call_as_one_pass(smollm2_path):
    lm = ik_llama.IkLlamaLM(smollm2_path, context_length=64, max_sequences=4, n_batch=512)
    assert lm.passes([(0, 1), (5, 1), (9, 1)]) == [(3, 1)]
    assert lm.passes([(0, 3), (5, 3)]) == [(2, 3)]
    assert lm.passes([(0, 5), (5, 1), (9, 1)]) == [(1, 7)]
    assert lm.passes([(0, 600)]) == [(1, 512), (1, 88)]
    assert lm.passes([]) == []
    lm.close()


def test_the_choice_takes_the_faster_plain_step_and_breaks_ties_by_verification():
    flat = CostCurve({1: 100.0, 2: 110.0, 4: 130.0, 8: 180.0, 16: 300.0})
    steep = CostCurve({1: 90.0, 2: 170.0, 4: 300.0, 8: 700.0, 16: 900.0})
    # steep's plain step is 10% faster: where nothing pays it wins, so it is chosen
    assert backend_choice.decide({"ik_llama": flat, "llama_cpp": steep})[0] == "llama_cpp"
    tie = CostCurve({n: v * 99.0 / 90.0 for n, v in steep.ms.items()})  # plain 1% faster
    assert backend_choice.decide({"ik_llama": flat, "llama_cpp": tie})[0] == "ik_llama"
    assert backend_choice.spec_goodput(flat, 0.0) == pytest.approx(1 / 100.0)
    # where verification is free the longest proposal is best: 8 tokens, E = Σ_{i<=8} 0.9^i
    free = CostCurve({1: 100.0, 16: 100.0})
    e8 = sum(0.9**i for i in range(9))
    assert backend_choice.spec_goodput(free, 0.9) == pytest.approx(e8 / 100.0)


@needs_ik
def test_ik_serves_one_sequence_per_context_where_its_batched_probe_fails(
    smollm2_path, monkeypatch, tmp_path, capsys
):
    """Measured on the wheel's library: a second sequence in the shared cache gets wrong
    logits (the batched probe compares). Then `auto` runs several sequences on llama_cpp and
    one on ik_llama, and a forced ik_llama with several refuses."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(
        ik_llama,
        "_probe_child",
        lambda model, fa, batched, exact: "logits differ" if batched else None,
    )
    flat = CostCurve({1: 50.0, 4: 60.0, 16: 200.0})
    steep = CostCurve({1: 70.0, 4: 240.0, 16: 700.0})
    curves = {"ik_llama+fa": flat, "ik_llama": steep, "llama_cpp": steep}
    monkeypatch.setattr(backend_choice, "measure_backends", lambda *a, **k: curves)
    one, _ = load_pair(smollm2_path, backend="auto", max_sequences=1)
    assert one.info.backend == "ik_llama" and one.flash_attn
    several, _ = load_pair(smollm2_path, backend="auto", max_sequences=4)
    assert several.info.backend == "llama_cpp"
    assert "using llama_cpp instead of ik_llama: logits differ" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--backend ik_llama cannot run here: logits differ"):
        load_pair(smollm2_path, backend="ik_llama", max_sequences=4)


@needs_ik
def test_flash_attention_is_used_where_it_measured_faster_only(
    gemma_path, monkeypatch, tmp_path, capsys
):
    """The choice measures ik_llama with and without flash attention: where it is slower, a
    one-sequence context runs without it (and so takes token trees)."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(ik_llama, "_probe_child", lambda *a: None)
    fast, slow = CostCurve({1: 40.0, 4: 60.0, 16: 200.0}), CostCurve({1: 48.0, 4: 70.0})
    curves = {"ik_llama+fa": slow, "ik_llama": fast, "llama_cpp": slow}
    monkeypatch.setattr(backend_choice, "measure_backends", lambda *a, **k: curves)
    lm, _ = load_pair(gemma_path, backend="auto", max_sequences=1)
    assert lm.info.backend == "ik_llama" and not lm.flash_attn and lm.trees
    assert "backend ik_llama (fastest plain step; ik_llama+fa: plain step 48.0 ms" in (
        capsys.readouterr().err
    )
    forced, _ = load_pair(gemma_path, backend="ik_llama", max_sequences=1)
    assert forced.flash_attn  # a forced backend: flash attention where the probe allows it


def test_a_backend_verdict_from_curves_that_contradict_themselves_is_never_kept(
    tmp_path, monkeypatch
):
    """As for the controller's costs (`costs.calibrated`): measured again, and where every
    try contradicts itself, used for this run only."""
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(ik_llama, "usable_flash_attn", lambda m, batched: True)

    class Closed:
        def close(self):
            pass

    monkeypatch.setattr(backend_choice, "open_backends", lambda *a: {"x": Closed()})
    busy = CostCurve({1: 94.9, 2: 186.5, 5: 411.9, 6: 169.7})
    ik, main = CostCurve({1: 30.0, 4: 50.0}), CostCurve({1: 31.0, 4: 90.0})
    tries = iter([{"ik_llama": busy, "llama_cpp": main}, {"ik_llama": ik, "llama_cpp": main}])
    monkeypatch.setattr(backend_choice, "measure_backends", lambda lms: next(tries))
    assert backend_choice.choose(model).backend == "ik_llama"  # the second, consistent try
    kept = list((tmp_path / "backends").iterdir())
    assert len(kept) == 1 and '"94.9' not in kept[0].read_text()
    kept[0].unlink()
    tries = iter([{"ik_llama": ik, "llama_cpp": busy}] * TRIES)
    backend_choice.choose(model)  # used once...
    assert not list((tmp_path / "backends").iterdir())  # ...and not kept
