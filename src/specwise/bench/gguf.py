"""The GGUF backends side by side (`specwise bench backend`, first part): mainline llama.cpp and
ik_llama.cpp load the same target file and are measured interleaved in one process:

1. their cost curves (a forward of n tokens, medians of repeats that alternate between the
   candidates of `choice.CANDIDATES`: ik_llama.cpp with and without flash attention,
   mainline), as ms and as multiples of *mainline's* one-token forward, and the candidate that
   `--backend auto` picks from them (`specwise.backends.choice.decide`);
2. plain greedy decoding on each, one prompt per shipped category, the candidates taking turns
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
                row: dict = {"category": p.category, "repeat": rep}
                tokens = {}
                for b in order:
                    t = time.perf_counter()
                    res = engines[b].generate(ids, params)
                    row[b] = len(res.tokens) / (time.perf_counter() - t)
                    tokens[b] = res.tokens
                row["same_tokens"] = all(t == tokens["llama_cpp"] for t in tokens.values())
                rows.append(row)
                print(f"  plain {p.category} {rep + 1}/{repeats}", file=sys.stderr)
    finally:
        for lm in lms.values():
            lm.close()
    choice, reason = decide(curves)
    library = str(ik_api.library_path())
    ik = [b for b in lms if b != "llama_cpp"]
    by_cat = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        rs = [r for r in rows if r["category"] == cat]
        by_cat[cat] = {
            "tokens_per_s": {b: median(r[b] for r in rs) for b in lms},
            "ratio": {b: median(r[b] / r["llama_cpp"] for r in rs) for b in ik},
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
        "plain_ratio_median": {b: median(r[b] / r["llama_cpp"] for r in rows) for b in ik},
        "plain_ratio_total": {
            b: sum(r[b] for r in rows) / sum(r["llama_cpp"] for r in rows) for b in ik
        },
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
    names = list(c)  # the candidates measured (`choice.CANDIDATES`)
    ik = [b for b in names if b != "llama_cpp"]
    lines = [
        f"ik_llama library: {result['ik_library']} ({built})",
        "cost of a forward of n tokens, ms (and x mainline's 1-token forward), interleaved:",
        f"{'n':>3} " + " ".join(f"{b:>16}" for b in names),
    ]
    for n in sorted(c["llama_cpp"]):
        lines.append(
            f"{n:>3} " + " ".join(f"{c[b][n]:9.1f} ({c[b][n] / base:4.2f})" for b in names)
        )
    lines += [
        f"--backend auto picks {result['reason']}",
        "",
        "plain greedy decoding, tokens/s (medians; x: ik_llama over mainline):",
        f"{'category':20} "
        + " ".join(f"{b:>12}" for b in names)
        + " "
        + " ".join(f"{'x ' + b:>14}" for b in ik)
        + " same tokens",
    ]
    for cat, r in result["plain"].items():
        lines.append(
            f"{cat:20} "
            + " ".join(f"{r['tokens_per_s'][b]:12.2f}" for b in names)
            + " "
            + " ".join(f"{r['ratio'][b]:14.3f}" for b in ik)
            + f" {'yes' if r['same_tokens'] else 'no'}"
        )
    med, tot = result["plain_ratio_median"], result["plain_ratio_total"]
    lines.append(
        f"{'all':20} "
        + " ".join(f"{'':>12}" for _ in names)
        + " "
        + " ".join(f"{med[b]:14.3f}" for b in ik)
        + f" (medians of {result['runs']} runs; tokens/s summed: "
        + ", ".join(f"{b} {tot[b]:.3f}" for b in ik)
        + ")"
    )
    return lines
