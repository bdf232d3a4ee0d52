"""`--backend auto` for GGUF models: which llama.cpp library, and on ik_llama.cpp whether with
flash attention, runs a model pair fastest on this machine, measured here, once, and remembered.

The candidates are ik_llama.cpp (`IkLlamaLM`, where its probe says it runs here) with flash
attention (where its probe allows it) and without, and mainline llama.cpp (`LlamaCppLM`):
`CANDIDATES`. Flash attention is measured, not assumed: on one CPU it makes a forward of
several tokens cheaper, on another (Zen 4, BENCHMARKS.md) it makes the plain step dearer. Each
loads the target and measures its cost curve (a forward of n tokens, n = 1..MAX_K + 1, on a
sequence holding `curves.CALIBRATION_CONTEXT` tokens, medians of repeats, each size measured on
every candidate in turn; the one-token forward PLAIN_REPEATS times more). The choice:

- the plain step (n = 1) decides: it is what every round costs where no draft pays, so a
  backend with a slower plain step would make some workloads slower than the other's plain
  decoding;
- where the two plain steps are within PLAIN_TIE of each other, the speculation each enables
  decides: the best expected goodput max_m E_α(m) / cost(1 + m), E_α(m) = Σ_{i<=m} α^i, at
  α = SPEC_ALPHA (a typical n-gram acceptance).

The verdict, both curves and the reason are cached in $SPECWISE_HOME/backends, keyed by
machine, model files, threads, library and METHOD (curves measured while something else had
the CPU, not `CostCurve.trusted`, are measured again, `curves.until_trusted`, and a verdict
from such curves is used once and never cached); `specwise bench backend` shows them. A forced
`--backend` never comes here. This module runs no round and sets no controller cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specwise.backends.base import LM
from specwise.backends.curves import CostCurve, measure_curves, until_trusted
from specwise.machine import machine

__all__ = ["Choice", "choose", "decide", "measure_backends", "open_backends", "spec_goodput"]

REPEATS = 3
PLAIN_REPEATS = 24  # one-token forwards more: the plain step decides, and is noisy
PLAIN_TIE = 0.02  # plain steps this close are a tie, broken by what speculation gains
SPEC_ALPHA = 0.7
MAX_K = 8
SIZES = range(1, MAX_K + 2)  # what `decide` reads: a plain step and verifications up to MAX_K
METHOD = 4  # how choices are measured; one cached by another method is measured again
# candidate -> (backend, flash attention)
CANDIDATES = {
    "ik_llama+fa": ("ik_llama", True),
    "ik_llama": ("ik_llama", False),
    "llama_cpp": ("llama_cpp", False),
}


@dataclass(frozen=True)
class Choice:
    backend: str  # "ik_llama" or "llama_cpp"
    reason: str  # one sentence for people
    curves: dict[str, dict[int, float]] = field(default_factory=dict)  # candidate -> n -> ms
    flash_attn: bool = False  # on ik_llama, for contexts of one sequence


def spec_goodput(curve: CostCurve, alpha: float, max_k: int = MAX_K) -> float:
    """Tokens per ms of the best proposal length for drafts accepted with probability alpha
    at every position (a free drafter): max_m E_α(m) / cost(1 + m)."""
    return max(sum(alpha**i for i in range(m + 1)) / curve(1 + m) for m in range(max_k + 1))


def decide(curves: dict[str, CostCurve]) -> tuple[str, str]:
    """(candidate, reason) from measured curves, by the rule of the module docstring."""
    plain = {b: c(1) for b, c in curves.items()}
    fastest = min(plain, key=plain.get)
    tied = [b for b in curves if plain[b] <= plain[fastest] * (1 + PLAIN_TIE)]
    best = max(tied, key=lambda b: spec_goodput(curves[b], SPEC_ALPHA))
    parts = [
        f"{b}: plain step {plain[b]:.1f} ms, 4 tokens {c(4) / c(1):.2f}x, 8 tokens "
        f"{c(8) / c(1):.2f}x"
        for b, c in curves.items()
    ]
    why = "fastest plain step" if len(tied) == 1 else "plain steps tied; cheaper verification"
    return best, f"{best} ({why}; {'; '.join(parts)})"


def _key(target: Path, threads: int | None) -> str:
    from specwise.backends import ik_api
    from specwise.backends.base import file_fingerprint

    try:
        lib_id = ik_api.library_id()
    except ik_api.IkLibraryError:
        lib_id = "no-ik"
    parts = [machine(), file_fingerprint(target), str(threads), lib_id, f"method {METHOD}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def choose(
    target: str | os.PathLike, draft: str | os.PathLike | None = None, threads: int | None = None
) -> Choice:
    """The GGUF backend for this model pair on this machine (measured on first use)."""
    from specwise.backends.ik_llama import probe, usable_flash_attn
    from specwise.models import home, save_json

    target = Path(target)
    path = home() / "backends" / f"{_key(target, threads)}.json"
    try:
        data = json.loads(path.read_text())
        data["curves"] = {b: {int(n): v for n, v in c.items()} for b, c in data["curves"].items()}
        return Choice(**data)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    flash = {m: usable_flash_attn(m, batched=False) for m in (target, draft) if m is not None}
    if None in flash.values():
        problem = probe(next(m for m, fa in flash.items() if fa is None), False)
        choice = Choice("llama_cpp", f"llama_cpp (ik_llama.cpp cannot be used here: {problem})")
    else:
        print(
            "specwise: measuring the llama.cpp backends (ik_llama.cpp with and without flash "
            "attention, mainline) once for this model and machine "
            "(a few minutes, once)...",
            file=sys.stderr,
        )
        lms = open_backends(target, threads, flash[target])
        try:
            curves, trusted = until_trusted(
                lambda: measure_backends(lms), lambda got: got.values()
            )
        finally:
            for lm in lms.values():
                lm.close()
        best, reason = decide(curves)
        backend, flash_attn = CANDIDATES[best]
        choice = Choice(backend, reason, {b: c.ms for b, c in curves.items()}, flash_attn)
        if not trusted:
            print(
                f"specwise: backend {choice.reason} (for this run only; not kept)", file=sys.stderr
            )
            return choice
    save_json(path, asdict(choice), indent=1)
    print(f"specwise: backend {choice.reason}", file=sys.stderr)
    return choice


def open_backends(target: Path, threads: int | None, flash_attn: bool) -> dict[str, LM]:
    """`target` on each candidate (`CANDIDATES`; flash_attn False: the probe refuses it, so
    ik_llama runs without only), one sequence slot each (the caller closes them)."""
    from specwise.backends.ik_llama import IkLlamaLM
    from specwise.backends.llama_cpp import LlamaCppLM

    lms: dict[str, LM] = {}
    kw = dict(threads=threads, context_length=2048, max_sequences=1)
    for name, (backend, flash) in CANDIDATES.items():
        if backend == "llama_cpp":
            lms[name] = LlamaCppLM(target, **kw)
        elif flash_attn or not flash:
            lms[name] = IkLlamaLM(target, flash_attn=flash, **kw)
    return lms


def measure_backends(lms: dict[str, LM], repeats: int = REPEATS) -> dict[str, CostCurve]:
    """Each backend's cost curve, their forwards interleaved (`curves.measure_curves`), the plain
    step from PLAIN_REPEATS more."""
    return measure_curves(lms, SIZES, repeats, plain_repeats=PLAIN_REPEATS)
