"""What the measuring scripts share: their model options and a model with sequences prefilled."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from specwise.backends import load

__all__ = ["PREFIX", "prefilled"]

PREFIX = 200  # tokens prefilled in each sequence


def prefilled(doc: str, sequences: int, option: str, default: int):
    """(args, lm, rng): the command line parsed (--model, --backend and `option`, an integer),
    the model loaded with room for `sequences`, each prefilled with PREFIX random tokens."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="catalog name or file")
    p.add_argument("--backend", default="auto")
    p.add_argument(option, type=int, default=default)
    a = p.parse_args()
    lm = load(a.model, a.backend, max_sequences=sequences + 2)
    rng = np.random.default_rng(0)
    for q in range(sequences):
        lm.forward([(q, [int(t) for t in rng.integers(10, 1000, size=PREFIX)])], last_only=True)
    return a, lm, rng


if __name__ == "__main__":
    sys.exit("a helper of the scripts in this folder, not a script")
