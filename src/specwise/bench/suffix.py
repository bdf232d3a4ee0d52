"""`specwise bench suffix`: what the suffix drafter's memory costs as it grows.

For each size, a memory of that many tokens (documents of DOC_TOKENS tokens drawn from a Zipf
law over a 151,936-token vocabulary, a Qwen-sized one) is built, then timed: adding one more
document (what the end of a request costs), and a proposal of up to 8 tokens (`find` + `chain`,
what a round costs) for contexts that end in text the memory holds and for contexts it has
never seen. Medians and 90th percentiles over QUERIES lookups. Then `soak` adds documents far
past a budget and reads the index's size and the process's resident memory as it goes. No
model is involved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specwise.drafters.suffix_index import SuffixIndex, chain
from specwise.trace import rss_mb

__all__ = ["DEFAULT_SIZES", "measure", "run", "soak", "table"]

DEFAULT_SIZES = (100_000, 1_000_000, 5_000_000, 25_000_000)  # 25M tokens ~ 100 MB of text
DOC_TOKENS = 1000
QUERIES = 200
VOCAB = 151_936


def _text(rng: np.random.Generator, n: int) -> np.ndarray:
    """n tokens drawn from a Zipf law over VOCAB."""
    return (rng.zipf(1.1, size=n) % VOCAB).astype(np.int32)


def measure(tokens: int, seed: int = 0) -> dict:
    """Build a memory of `tokens` tokens and time its operations."""
    rng = np.random.default_rng(seed)
    text = _text(rng, tokens)
    lengths = np.full(max(1, tokens // DOC_TOKENS), DOC_TOKENS, np.int64)
    lengths[-1] += tokens - int(lengths.sum())
    mem = SuffixIndex(budget_bytes=1 << 40)
    t = time.perf_counter()
    mem.add_documents(text, lengths)
    build_s = time.perf_counter() - t

    def timed(context: list[int]) -> float:
        t = time.perf_counter()
        chain(mem.find(context), 8)
        return (time.perf_counter() - t) * 1e6

    hits, misses = [], []
    for _ in range(QUERIES):
        p = int(rng.integers(64, tokens))
        hits.append(timed(text[p - 64 : p].tolist()))
        misses.append(timed(rng.integers(0, VOCAB, 64).tolist()))
    adds = []
    for _ in range(5):
        doc = _text(rng, DOC_TOKENS)
        t = time.perf_counter()
        mem.add(doc)
        adds.append((time.perf_counter() - t) * 1e3)
    return {
        "tokens": tokens,
        "index_mib": mem.nbytes / (1 << 20),
        "build_s": build_s,
        "add_ms_median": float(np.median(adds)),
        "add_ms_max": float(np.max(adds)),
        "hit_us_median": float(np.median(hits)),
        "hit_us_p90": float(np.percentile(hits, 90)),
        "miss_us_median": float(np.median(misses)),
        "miss_us_p90": float(np.percentile(misses, 90)),
    }


def soak(budget_mib: float, total_tokens: int, seed: int = 1) -> list[dict]:
    """Add documents of DOC_TOKENS tokens until `total_tokens`, one at a time as requests end,
    into a memory of `budget_mib`; every tenth of the way: the index's bytes and the RSS."""
    rng = np.random.default_rng(seed)
    mem = SuffixIndex(budget_bytes=int(budget_mib * (1 << 20)))
    start = rss_mb()
    rows, added, step = [], 0, total_tokens // 10
    t = time.perf_counter()
    while added < total_tokens:
        doc = _text(rng, DOC_TOKENS)
        mem.add(doc)
        added += DOC_TOKENS
        if added % step < DOC_TOKENS:
            rows.append(
                {
                    "tokens_added": added,
                    "index_mib": mem.nbytes / (1 << 20),
                    "documents": mem.documents,
                    "rss_growth_mib": rss_mb() - start,
                    "seconds": time.perf_counter() - t,
                }
            )
    return rows


def soak_table(budget_mib: float, rows: Sequence[dict]) -> list[str]:
    out = [
        f"| tokens added | index MiB (budget {budget_mib:g}) | documents kept "
        "| RSS growth MiB | seconds |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['tokens_added']:,} | {r['index_mib']:.1f} | {r['documents']:,} "
            f"| {r['rss_growth_mib']:.0f} | {r['seconds']:.0f} |"
        )
    return out


def table(rows: Sequence[dict]) -> list[str]:
    out = [
        "| tokens | index MiB | build s | add a document ms (median / max) "
        "| propose, seen text µs (median / p90) | propose, unseen text µs (median / p90) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['tokens']:,} | {r['index_mib']:.1f} | {r['build_s']:.2f} "
            f"| {r['add_ms_median']:.2f} / {r['add_ms_max']:.2f} "
            f"| {r['hit_us_median']:.0f} / {r['hit_us_p90']:.0f} "
            f"| {r['miss_us_median']:.0f} / {r['miss_us_p90']:.0f} |"
        )
    return out


def run(
    sizes: Sequence[int],
    out: Path,
    budget_mib: float = 64.0,
    soak_tokens: int = 40_000_000,
    progress: Callable[[str], None] = print,
) -> list[str]:
    """Measure every size, then the soak; write suffix.json and suffix.md under `out`; return
    the markdown lines."""
    rows = []
    for n in sizes:
        progress(f"building and timing a memory of {n:,} tokens ...")
        rows.append(measure(n))
    progress(f"adding {soak_tokens:,} tokens to a memory of {budget_mib:g} MiB ...")
    soaked = soak(budget_mib, soak_tokens)
    lines = [*table(rows), "", *soak_table(budget_mib, soaked)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "suffix.json").write_text(json.dumps({"sizes": rows, "soak": soaked}, indent=1))
    (out / "suffix.md").write_text("\n".join(lines) + "\n")
    return lines
