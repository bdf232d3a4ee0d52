"""The models users already have: GGUF headers read without loading a tensor, Ollama's store
(manifests-v2 and manifests, manifest lists, draft layers), LM Studio's folders and the Hugging
Face cache found and described, a draft suggested for each, `--target ollama:NAME` resolved,
and every missing or malformed store one sentence, never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from specwise import models, stores
from specwise.cli import main
from specwise.gguf_header import HeaderError, read_header
from specwise.stores import StoreError, discover, resolve_ollama, suggest_draft

LIST = "application/vnd.ollama.manifest.list.v2+json"


def write_gguf(path: Path, name="tiny", pre="smollm", vocab=8, params=(16, 8), ftype=3, **kw):
    """A GGUF file of a few hundred bytes with the keys a model file has (and one tensor of
    `params` elements, so that its parameter count is theirs)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), kw.get("arch", "llama"))
    w.add_name(name)
    w.add_file_type(ftype)
    w.add_context_length(kw.get("context", 2048))
    if "kind" in kw:
        w.add_type(kw["kind"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", np.zeros(params, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def put_blob(root: Path, data: bytes) -> str:
    """Store `data` as a blob of the Ollama store at `root`; its digest."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def link_blob(root: Path, model: Path, digest: str) -> str:
    """A blob of the store that is `model`'s file (hard-linked: nothing copied), under its
    (known) digest."""
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{digest.removeprefix('sha256:')}"
    if not blob.exists():
        try:
            os.link(model, blob)
        except OSError:  # another file system
            blob.symlink_to(model)
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


def manifest(model: str, draft: str | None = None) -> dict:
    layers = [{"mediaType": "application/vnd.ollama.image.model", "digest": model, "size": 1}]
    if draft:
        layers.append({"mediaType": "application/vnd.ollama.image.draft", "digest": draft})
    layers.append({"mediaType": "application/vnd.ollama.image.template", "digest": model})
    return {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"digest": model},
        "layers": layers,
    }


def put_manifest(root: Path, rel: str, data: dict | str, link: bool = False) -> Path:
    """A manifest at manifests*/<rel>: written there, or (link) a link to a manifest blob, as
    current Ollama releases keep them."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    if link:
        blob = root / "blobs" / f"sha256-{put_blob(root, text.encode()).split(':')[1]}"
        path.symlink_to(os.path.relpath(blob, path.parent))
    else:
        path.write_text(text)
    return path


def gguf_blob(root: Path, tmp: Path, name: str, **kw) -> str:
    return put_blob(root, write_gguf(tmp / f"{name}.gguf", name=name, **kw).read_bytes())


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home: no store anywhere but those a test makes."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in (
        "OLLAMA_MODELS",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "specwise"))
    monkeypatch.setattr(stores, "SYSTEM_OLLAMA", tmp_path / "no-system-store")
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def store(home, tmp_path, monkeypatch):
    """An Ollama store at OLLAMA_MODELS: a 1B-looking model (manifests-v2, a link to its
    manifest blob), a small one of the same tokenizer in the older manifests/, one with a
    draft layer, one of another tokenizer in a user's namespace, a manifest list, and a
    malformed manifest."""
    root = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    big = gguf_blob(root, tmp_path, "big", params=(4096, 64))
    small = gguf_blob(root, tmp_path, "small", params=(64, 16))
    other = gguf_blob(root, tmp_path, "other", pre="qwen2", params=(4096, 16))
    put_manifest(root, "manifests-v2/ollama.com/library/big/1b", manifest(big), link=True)
    put_manifest(root, "manifests/registry.ollama.ai/library/big/1b", "{stale}")  # anchor
    put_manifest(root, "manifests/registry.ollama.ai/library/small/latest", manifest(small))
    put_manifest(root, "manifests-v2/ollama.com/library/paired/latest", manifest(big, small))
    put_manifest(root, "manifests-v2/ollama.com/someone/other/q4", manifest(other))
    child = put_blob(root, json.dumps(manifest(small)).encode())
    put_manifest(
        root,
        "manifests-v2/ollama.com/library/listed/latest",
        {
            "schemaVersion": 2,
            "mediaType": LIST,
            "manifests": [
                {
                    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "digest": child,
                    "runner": "ollama",
                    "format": "gguf",
                }
            ],
        },
    )
    put_manifest(root, "manifests-v2/ollama.com/library/broken/latest", "{not json")
    return root


def test_a_header_is_read_without_its_tensors(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", name="Tiny", vocab=10, params=(12, 5), ftype=15)
    h = read_header(path)
    assert (h.name, h.architecture, h.file_type) == ("Tiny", "llama", "Q4_K_M")
    assert (h.tokenizer_model, h.tokenizer_pre, h.vocab_size) == ("gpt2", "smollm", 10)
    assert h.tokenizer == "gpt2/smollm/10" and h.tokenizer_family == "smollm, 10 tokens"
    assert h.parameters == 60 and h.context_length == 2048 and h.is_language_model
    assert h.metadata["general.name"] == "Tiny" and h.metadata["tokenizer.ggml.tokens"] is None
    projector = read_header(write_gguf(tmp_path / "p.gguf", kind="mmproj"))
    assert not projector.is_language_model


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "0 bytes"),
        (b"PK\x03\x04" + bytes(40), "is not a GGUF file (it starts with b'PK"),
        (b"GGUF" + (9).to_bytes(4, "little") + bytes(40), "version 9"),
    ],
)
def test_a_file_that_is_not_gguf_is_one_sentence(tmp_path, content, says):
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    with pytest.raises(HeaderError, match=says.replace("(", r"\(")) as err:
        read_header(path)
    assert str(path) in str(err.value)


def test_a_truncated_header_is_one_sentence(tmp_path):
    data = write_gguf(tmp_path / "m.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:100])
    with pytest.raises(HeaderError, match="truncated or damaged"):
        read_header(cut)


def test_the_catalog_names_its_files_tokenizers(smollm2_path):
    assert (
        read_header(smollm2_path).tokenizer
        == models.CATALOG["smollm2-135m-instruct"].gguf_tokenizer
    )
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"):
        if models.is_pulled(name):  # the others where they are here
            assert (
                read_header(models.model_path(name)).tokenizer
                == models.CATALOG[name].gguf_tokenizer
            )


def test_the_ollama_store_lists_its_models_and_their_problems(store):
    found, missing = discover()
    assert missing == []
    (st,) = found
    names = {m.name: m for m in st.models}
    assert set(names) == {
        "big:1b",
        "small:latest",
        "paired:latest",
        "someone/other:q4",
        "listed:latest",
    }
    assert names["big:1b"].ref == "ollama:big:1b" and names["big:1b"].header.name == "big"
    assert names["listed:latest"].header.name == "small"  # the list's GGUF child
    assert names["paired:latest"].draft is not None
    (problem,) = st.problems  # the v2 big:1b hid its stale older manifest; broken is one line
    assert "broken:latest" in problem and "not valid JSON" in problem
    assert "ollama pull broken:latest" in problem


def test_ollama_names_resolve_to_their_blobs(store):
    big = resolve_ollama("ollama:big:1b")
    assert big.path.parent == store / "blobs" and big.path.name.startswith("sha256-")
    assert resolve_ollama("ollama:small").name == "small:latest"  # the default tag
    assert resolve_ollama("ollama:library/small:latest").path == resolve_ollama("ollama:small").path
    assert resolve_ollama("ollama:someone/other:q4").header.tokenizer_pre == "qwen2"
    assert resolve_ollama("ollama:registry.ollama.ai/library/big:1b").path == big.path


@pytest.mark.parametrize(
    "ref, says",
    [
        ("ollama:nope", "ollama:nope:latest is not in the Ollama store at"),
        ("ollama:broken", "is not valid JSON"),
        ("ollama:a/b/c/d", "is not an Ollama model name; use ollama:NAME[:TAG]"),
        ("ollama:", "is not an Ollama model name"),
    ],
)
def test_a_bad_ollama_name_or_manifest_is_one_sentence(store, ref, says):
    with pytest.raises(StoreError, match=says.replace("[", r"\[")):
        resolve_ollama(ref)


def test_malformed_stores_each_say_what_is_wrong(home, tmp_path, monkeypatch):
    root = tmp_path / "o"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    model = gguf_blob(root, tmp_path, "m")
    put_manifest(root, "manifests/registry.ollama.ai/library/nolayers/latest", {"a": 1})
    put_manifest(
        root, "manifests/registry.ollama.ai/library/gone/latest", manifest("sha256:" + "0" * 64)
    )
    put_manifest(root, "manifests/registry.ollama.ai/library/baddigest/latest", manifest("md5:x"))
    text = put_blob(root, b"not a model at all, just text")
    put_manifest(root, "manifests/registry.ollama.ai/library/text/latest", manifest(text))
    put_manifest(
        root,
        "manifests/registry.ollama.ai/library/tensors/latest",
        {"layers": [{"mediaType": "application/vnd.ollama.image.tensor", "digest": model}]},
    )
    says = {
        "nolayers": "has no 'layers' list",
        "gone": "is missing from",
        "baddigest": "which is not a digest",
        "text": "is not a GGUF file",
        "tensors": "has no GGUF model layer",
    }
    for name, what in says.items():
        with pytest.raises(StoreError, match=what):
            resolve_ollama(f"ollama:{name}")
    (st,), _ = discover()
    assert st.models == () and len(st.problems) == len(says)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    with pytest.raises(StoreError, match=r"OLLAMA_MODELS='.*nowhere' is not a folder"):
        resolve_ollama("ollama:m")
    assert "is not a folder" in discover()[1][0]
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    (st,), _ = discover()
    assert "holds no manifests-v2/ or manifests/ folder" in st.problems[0]
    monkeypatch.delenv("OLLAMA_MODELS")
    with pytest.raises(StoreError, match="there is no Ollama store here"):
        resolve_ollama("ollama:m")


def test_a_store_this_user_may_not_read_is_one_sentence(store, monkeypatch):
    monkeypatch.setattr(stores.os, "access", lambda path, mode: False)
    (st,), _ = discover()
    assert st.models == () and "cannot be read" in st.problems[0]
    with pytest.raises(StoreError, match=r"it holds no model.*cannot be read"):
        resolve_ollama("ollama:nope")


def test_the_services_store_kept_from_this_user_is_one_sentence(home, monkeypatch):
    monkeypatch.setattr(stores, "SYSTEM_OLLAMA", system := home / "system")
    is_dir = Path.is_dir

    def denied(path):
        if path == system or system in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return is_dir(path)

    monkeypatch.setattr(Path, "is_dir", denied)
    (st,), _ = discover()
    assert st.root == system and "Permission denied" in st.problems[0]


def test_lm_studio_and_the_hf_cache_are_found(home, tmp_path, monkeypatch):
    write_gguf(home / ".lmstudio/models/pub/Model-GGUF/model-Q4_K_M.gguf", name="lms")
    write_gguf(home / ".lmstudio/models/pub/Model-GGUF/mmproj-f16.gguf", kind="mmproj")
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    blob = write_gguf(hub / "models--org--repo/blobs/abc", name="hf")
    for rev in ("r1", "r2"):  # one blob under two snapshots: one model
        snap = hub / f"models--org--repo/snapshots/{rev}/m.gguf"
        snap.parent.mkdir(parents=True)
        snap.symlink_to(blob)
    missing = hub / "models--org--repo/snapshots/r2/partial.gguf"
    missing.symlink_to(hub / "models--org--repo/blobs/never")  # a download not finished
    for i in (1, 2):
        write_gguf(hub / f"models--org--big/snapshots/r/big-0000{i}-of-00002.gguf", name="split")
    found, _ = discover()
    by_kind = {st.kind: st for st in found}
    (lms,) = by_kind["lm-studio"].models
    assert lms.name == "pub/Model-GGUF/model-Q4_K_M.gguf" and lms.ref == str(lms.path)
    hf = {m.name: m for m in by_kind["hf-cache"].models}
    assert set(hf) == {"org/repo/m.gguf", "org/big/big-00001-of-00002.gguf"}
    split = hf["org/big/big-00001-of-00002.gguf"]
    assert split.size == 2 * split.path.stat().st_size


def test_a_draft_is_suggested_for_each_model(store, monkeypatch):
    (st,), _ = discover()
    found = {m.name: m for m in st.models}
    every = list(found.values())
    big = suggest_draft(found["big:1b"], every)
    assert big.flags in ("--draft ollama:small:latest", "--draft ollama:listed:latest")
    assert "here (ollama" in big.why
    paired = suggest_draft(found["paired:latest"], every)
    assert paired.flags.startswith("--draft ") and "manifest names" in paired.why
    assert suggest_draft(found["small:latest"], every).flags == "--drafter ngram,suffix"
    assert suggest_draft(found["someone/other:q4"], every).flags == "--drafter ngram,suffix"
    entry = models.ModelEntry(
        "cat-tiny", "t.gguf", "0" * 64, 10, "draft", "x", "", gguf_tokenizer="gpt2/qwen2/8"
    )
    monkeypatch.setitem(models.CATALOG, "cat-tiny", entry)
    advice = suggest_draft(found["someone/other:q4"], every)
    assert advice.flags == "--draft cat-tiny" and "pulled on first use" in advice.why


def test_models_list_and_path_show_the_store(store, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "pair qwen-coder (default)" in out  # the catalog as before
    assert f"ollama ({store}): 5 models" in out
    assert "--target ollama:big:1b" in out and "tokenizer smollm, 8 tokens" in out
    assert "! the manifest of ollama:broken:latest" in out
    assert "lm-studio: none found" in out and "hf-cache: none found" in out
    assert main(["models", "path", "ollama:small"]) == 0
    assert capsys.readouterr().out.strip().startswith(str(store / "blobs" / "sha256-"))
    assert main(["models", "path", "ollama:broken"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("specwise: error: the manifest of ollama:broken") and "Traceback" not in err
    )


def test_a_bad_ollama_target_is_one_sentence_before_any_model_loads(store, capsys):
    for target in ("ollama:nope", "ollama:broken"):
        assert main(["generate", "--target", target, "--k", "0", "hi"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and target.split(":")[1] in err


def test_generate_runs_an_ollama_model_in_place(smollm2_path, home, tmp_path, monkeypatch, capsys):
    """The smallest real model as an Ollama blob (a link: nothing copied), as target and draft."""
    root = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    digest = link_blob(root, smollm2_path, models.CATALOG["smollm2-135m-instruct"].sha256)
    put_manifest(root, "manifests-v2/ollama.com/library/smol/135m", manifest(digest), link=True)
    before = sorted(p.name for p in (root / "blobs").iterdir())
    args = ["generate", "--target", "ollama:smol:135m", "--draft", "ollama:smol:135m"]
    args += ["--backend", "llama_cpp", "--drafter", "model", "--k", "2", "--max-tokens", "8"]
    assert main([*args, "--json", "The capital of France is"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["emitted"] == 8 and out["summary"]["proposed"] > 0
    assert sorted(p.name for p in (root / "blobs").iterdir()) == before  # nothing written
