"""The GGUF backends side by side (`specwise bench backend`, first part): mainline llama.cpp and
ik_llama.cpp load the same target file and are measured interleaved in one process:

1. their cost curves (a forward of n = 1..16 tokens, medians of repeats that alternate between
   the backends), as ms and as multiples of *mainline's* one-token forward, and the backend
   that `--backend auto` picks from them (`specwise.backends.choice.decide`);
2. plain greedy decoding on each, one prompt per shipped category, the backends taking turns
   (who goes first alternates), tokens/s and the ratio to mainline, and whether their greedy
   tokens agree (two libraries round differently, so a near-tie may go either way).

It measures; it changes no cached choice or calibration.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from statistics import median

from specwise.backends import ik_api
from specwise.backends.choice import decide, measure_backends, open_backends
from specwise.engine import Engine
from specwise.sampling import SamplingParams

__all__ = ["compare_backends", "format_comparison"]


def compare_backends(
    target: Path, threads: int | None, max_tokens: int, repeats: int, flash_attn: bool = True
) -> dict:
    from specwise.bench.session import pick
    from specwise.bench.workloads import builtin, render

    lms = open_backends(target, threads, flash_attn)
    params = SamplingParams(max_tokens=max_tokens)
    rows = []
    try:
        curves = measure_backends(lms, repeats=repeats)
        engines = {b: Engine(lm) for b, lm in lms.items()}
        for b, eng in engines.items():  # warm-up
            eng.generate(lms[b].tokenizer.encode("def f(x):"), SamplingParams(max_tokens=8))
        prompts = pick(builtin(), 1)
        for rep in range(repeats):
            for i, p in enumerate(prompts):
                ids = render(lms["llama_cpp"].tokenizer, p.turns[:1])
                order = list(engines) if (rep + i) % 2 == 0 else list(reversed(engines))
                row = {"category": p.category, "repeat": rep}
                for b in order:
                    t = time.perf_counter()
                    res = engines[b].generate(ids, params)
                    row[b] = len(res.tokens) / (time.perf_counter() - t)
                    row[f"{b}_tokens"] = res.tokens
                row["same_tokens"] = row["llama_cpp_tokens"] == row["ik_llama_tokens"]
                del row["llama_cpp_tokens"], row["ik_llama_tokens"]
                rows.append(row)
                print(f"  plain {p.category} {rep + 1}/{repeats}", file=sys.stderr)
    finally:
        for lm in lms.values():
            lm.close()
    choice, reason = decide(curves)
    library = str(ik_api.library_path())
    by_cat = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        rs = [r for r in rows if r["category"] == cat]
        by_cat[cat] = {
            "llama_cpp_tokens_per_s": median(r["llama_cpp"] for r in rs),
            "ik_llama_tokens_per_s": median(r["ik_llama"] for r in rs),
            "ratio": median(r["ik_llama"] / r["llama_cpp"] for r in rs),
            "same_tokens": all(r["same_tokens"] for r in rs),
        }
    return {
        "ik_library": library,
        "ik_native": ik_api.find() == Path(library),
        "ik_native_verdict": (ik_api.verdict() or {}).get("reason"),
        "curves": {b: c.ms for b, c in curves.items()},
        "choice": choice,
        "reason": reason,
        "plain": by_cat,
        "plain_ratio_median": median(r["ik_llama"] / r["llama_cpp"] for r in rows),
        "plain_ratio_total": sum(r["ik_llama"] for r in rows) / sum(r["llama_cpp"] for r in rows),
        "runs": len(rows),
    }


def format_comparison(result: dict) -> list[str]:
    c = result["curves"]
    base = c["llama_cpp"][1]
    verdict = result.get("ik_native_verdict")
    if result["ik_native"]:
        built = "this CPU's native build" + (f", measured faster: {verdict}" if verdict else "")
    elif verdict:
        built = f"the wheel's build; this CPU's native build measured slower: {verdict}"
    else:
        built = "the wheel's build; `make native` builds one for this CPU"
    lines = [
        f"ik_llama library: {result['ik_library']} ({built})",
        "cost of a forward of n tokens, ms (and x mainline's 1-token forward), interleaved:",
        f"{'n':>3} {'llama_cpp':>16} {'ik_llama':>16}",
    ]
    for n in sorted(c["llama_cpp"]):
        m, k = c["llama_cpp"][n], c["ik_llama"][n]
        lines.append(f"{n:>3} {m:9.1f} ({m / base:4.2f}) {k:9.1f} ({k / base:4.2f})")
    lines += [
        f"--backend auto picks {result['reason']}",
        "",
        "plain greedy decoding, tokens/s (medians; ik / mainline):",
        f"{'category':20} {'llama_cpp':>10} {'ik_llama':>10} {'ratio':>7} same tokens",
    ]
    for cat, r in result["plain"].items():
        lines.append(
            f"{cat:20} {r['llama_cpp_tokens_per_s']:10.2f} {r['ik_llama_tokens_per_s']:10.2f} "
            f"{r['ratio']:7.3f} {'yes' if r['same_tokens'] else 'no'}"
        )
    lines.append(
        f"{'all':20} {'':>10} {'':>10} {result['plain_ratio_median']:7.3f} "
        f"(median of {result['runs']} runs; tokens/s summed: {result['plain_ratio_total']:.3f})"
    )
    return lines
