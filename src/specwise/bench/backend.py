"""`specwise bench backend`: the backend's own numbers, measured side by side in one process.

0. For a GGUF target, where ik_llama.cpp is installed: both GGUF backends' cost curves, plain
   decoding on each, and the choice `--backend auto` makes (`specwise.bench.gguf`).
1. Plain decoding: specwise's round loop vs llama-cpp-python's own high-level generation
   (`Llama.create_completion`) on the same GGUF, threads and prompt tokens, greedy, interleaved,
   medians after a warm-up. Where their greedy tokens part, the target's top-2 logit gap there
   is reported (they batch the prompt differently, so near-ties can round either way).
2. Where a round's time goes: the forward (llama_decode), the logits copy, warping, the
   acceptance rule, and the rest (rollback, stop checks, bookkeeping), for plain and
   speculative rounds, greedy and sampled.
3. The cost curves: target and draft forward time for 1..16 tokens in one call.

`specwise bench batch` (`run_batch_bench`): what one target call over several sequences costs
by its shape — every sequence with 1 + m tokens, or one with 1 + m and the rest with 1 (a
request speculating in a batch of plain ones), or the sequences in scattered slots — next to
what the controller's cost model predicts from the passes the backend reports (`LM.passes`).

Timers wrap library functions only for the duration of the measurement; nothing here changes
how specwise decodes.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from specwise import engine as engine_mod
from specwise import sampling as sampling_mod
from specwise.backends import GGUF_BACKENDS
from specwise.backends.base import LM
from specwise.backends.curves import measure_curve
from specwise.bench.runner import NEAR_TIE_FACTOR, greedy_divergence, numeric_noise
from specwise.bench.session import default_out
from specwise.costs import CostModel
from specwise.detok import Detokenizer
from specwise.drafters import ModelDrafter, NgramDrafter
from specwise.engine import Engine
from specwise.sampling import SamplingParams

__all__ = ["batch_costs", "run_backend_bench", "run_batch_bench"]

PROMPTS = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a JavaScript function that debounces another function.",
    "Explain what a Python generator is, with a short example.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Refactor this function to use a dictionary instead of the if/elif chain:\n\n"
    "def color(code):\n    if code == 1:\n        return 'red'\n    elif code == 2:\n"
    "        return 'green'\n    elif code == 3:\n        return 'blue'\n    return 'unknown'\n",
]


@contextlib.contextmanager
def _timers(names: dict[str, tuple[object, str]]):
    """Accumulate the wall time of each wrapped attribute into a dict (ms)."""
    acc = dict.fromkeys(names, 0.0)
    saved = []
    for key, (owner, attr) in names.items():
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))

        def wrapped(*a, _fn=fn, _key=key, **kw):
            t = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                acc[_key] += (time.perf_counter() - t) * 1000.0

        setattr(owner, attr, wrapped)
    try:
        yield acc
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def _llama_cpp_python(target: LM):
    """llama-cpp-python's high-level Llama on the same file and threads."""
    from llama_cpp import Llama

    return Llama(
        model_path=target.info.model,
        n_ctx=4096,
        n_threads=target.info.threads,
        n_threads_batch=target.info.threads,
        n_batch=512,
        verbose=False,
    )


def plain_vs_llama_cpp_python(target: LM, max_tokens: int, repeats: int) -> dict:
    llm = _llama_cpp_python(target)
    eng = Engine(target)
    params = SamplingParams(max_tokens=max_tokens)
    prompts = [target.tokenizer.render_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    def ours(ids: list[int]) -> tuple[int, list[int], float]:
        t = time.perf_counter()
        res = eng.generate(ids, params)
        return len(res.tokens), res.tokens, time.perf_counter() - t

    def theirs(ids: list[int]) -> tuple[int, list[int], float]:
        llm.reset()
        t = time.perf_counter()
        out = llm.create_completion(
            ids,
            max_tokens=max_tokens,
            temperature=0.0,
            top_k=1,
            top_p=1.0,
            min_p=0.0,
            repeat_penalty=1.0,
        )
        dt = time.perf_counter() - t
        toks = target.tokenizer.encode(out["choices"][0]["text"], add_special=False)
        return out["usage"]["completion_tokens"], toks, dt

    ours(prompts[0][:64])  # warm-up both
    theirs(prompts[0][:64])
    noise = numeric_noise(target, prompts[0])
    near_tie = NEAR_TIE_FACTOR * noise["top2_gap"]
    speed: dict[str, list[float]] = {"ours": [], "theirs": []}
    checks = []
    for rep in range(repeats):
        for i, ids in enumerate(prompts):
            runs = [("ours", ours), ("theirs", theirs)]
            if (rep + i) % 2:
                runs.reverse()  # alternate who goes first
            toks = {}
            for who, fn in runs:
                n, out, dt = fn(ids)
                speed[who].append(n / dt)
                toks[who] = out
            if rep == 0:  # the same greedy tokens, or a divergence at a near-tie?
                n = min(len(toks["ours"]), len(toks["theirs"]))
                checks.append(
                    greedy_divergence(target, ids, toks["ours"][:n], toks["theirs"][:n], near_tie)
                )
    return {
        "specwise_tokens_per_s": float(np.median(speed["ours"])),
        "llama_cpp_python_tokens_per_s": float(np.median(speed["theirs"])),
        "ratio": float(np.median(speed["ours"]) / np.median(speed["theirs"])),
        "same_tokens": f"{sum(c['match'] for c in checks)}/{len(checks)}",
        "divergence_top2_gaps": [round(c["top2_gap"], 3) for c in checks if not c["match"]],
        "all_divergences_near_ties": all(c["near_tie"] for c in checks if not c["match"]),
        "numeric_noise": noise,
        "samples": len(speed["ours"]),
    }


def round_breakdown(target: LM, draft: LM | None, max_tokens: int) -> dict:
    """Per-round ms: forward, logits copy, warping, acceptance rule, the rest."""
    ids = target.tokenizer.render_chat([{"role": "user", "content": PROMPTS[4]}])
    setups = {
        "plain greedy": (None, 0, 0.0),
        "plain T=0.7": (None, 0, 0.7),
        "ngram k=4 greedy": (NgramDrafter(), 4, 0.0),
        "ngram k=4 T=0.7": (NgramDrafter(), 4, 0.7),
    }
    if draft is not None:
        setups["model k=4 T=0.7"] = (ModelDrafter(draft), 4, 0.7)
    out = {}
    for name, (drafter, k, temp) in setups.items():
        eng = Engine(target, drafter, k=k)
        params = SamplingParams(temperature=temp, seed=1, max_tokens=max_tokens)
        eng.generate(ids[:32], SamplingParams(max_tokens=4))  # warm-up
        copy0 = getattr(target, "copy_ms", 0.0)
        with _timers(
            {
                "warp": (sampling_mod.LazyRows, "__getitem__"),
                "rule": (engine_mod.Engine, "_verify"),
                "detok": (Detokenizer, "push"),
            }
        ) as t:
            res = eng.generate(ids, params)
        n = len(res.rounds)
        s = res.summary
        copy = (getattr(target, "copy_ms", 0.0) - copy0) / n
        round_ms = (s.draft_ms + s.verify_ms + s.overhead_ms) / n
        rule = (t["rule"] - t["warp"]) / n
        rest = s.overhead_ms / n - t["rule"] / n - t["detok"] / n
        out[name] = {
            "round_ms": round_ms,
            "draft_ms": s.draft_ms / n,
            "forward_ms": s.verify_ms / n - copy,
            "logits_copy_ms": copy,
            "warp_ms": t["warp"] / n,
            "rule_ms": rule,
            "detok_ms": t["detok"] / n,
            "bookkeeping_ms": rest,
            "overhead_ms": s.overhead_ms / n + copy,
            "overhead_share": (s.overhead_ms / n + copy) / round_ms,
            "rounds": n,
        }
    return out


def run_backend_bench(target: LM, draft: LM | None, a) -> int:
    out_dir = Path(a.out) if a.out else default_out("-backend")
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf = None
    if target.info.backend in GGUF_BACKENDS:
        from specwise.backends.ik_llama import available
        from specwise.bench.gguf import compare_backends, format_comparison

        if available():
            print("0/3 the GGUF backends side by side ...", file=sys.stderr)
            gguf = compare_backends(
                Path(target.info.model),
                target.info.threads,
                a.max_tokens,
                a.repeats,
                getattr(target, "flash_attn", True),
            )
    print(
        f"1/3 plain decoding: specwise ({target.info.backend}) vs llama-cpp-python ...",
        file=sys.stderr,
    )
    plain = plain_vs_llama_cpp_python(target, a.max_tokens, a.repeats)
    print("2/3 where a round's time goes ...", file=sys.stderr)
    breakdown = round_breakdown(target, draft, a.max_tokens)
    print("3/3 cost curves ...", file=sys.stderr)
    curves = {"target": measure_curve(target, range(1, 17), repeats=5).ms}
    if draft is not None:
        curves["draft"] = measure_curve(draft, range(1, 17), repeats=5).ms
    result = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "target": target.info.model,
        "draft": None if draft is None else draft.info.model,
        "threads": target.info.threads,
        "max_tokens": a.max_tokens,
        "plain": plain,
        "round_breakdown": breakdown,
        "cost_curves": curves,
        "gguf_backends": gguf,
    }
    lines = [
        *([*format_comparison(gguf), ""] if gguf else []),
        f"plain decoding, greedy, {a.max_tokens} tokens, {plain['samples']} runs each "
        f"(medians): specwise on {target.info.backend} "
        f"{plain['specwise_tokens_per_s']:.2f} tokens/s, "
        f"llama-cpp-python {plain['llama_cpp_python_tokens_per_s']:.2f} tokens/s "
        f"-> {plain['ratio']:.3f}x; same tokens {plain['same_tokens']} (top-2 logit gaps where "
        f"they part: {plain['divergence_top2_gaps']}; batched-vs-single noise in a top-2 gap: "
        f"{plain['numeric_noise']['top2_gap']:.3f})",
        "",
        f"{'round':18} {'round ms':>8} {'draft':>7} {'forward':>8} {'copy':>6} {'warp':>6} "
        f"{'rule':>6} {'detok':>6} {'rest':>6} {'overhead %':>10}",
    ]
    for name, b in breakdown.items():
        lines.append(
            f"{name:18} {b['round_ms']:8.2f} {b['draft_ms']:7.2f} {b['forward_ms']:8.2f} "
            f"{b['logits_copy_ms']:6.2f} {b['warp_ms']:6.2f} {b['rule_ms']:6.2f} "
            f"{b['detok_ms']:6.2f} {b['bookkeeping_ms']:6.2f} {100 * b['overhead_share']:10.1f}"
        )
    lines.append("")
    for who, c in curves.items():
        base = c[1]
        lines.append(
            f"{who} forward ms on {target.info.backend} (x of 1 token): "
            + " ".join(f"{n}:{v:.0f}({v / base:.2f})" for n, v in sorted(c.items()))
        )
    text = "\n".join(lines)
    (out_dir / "backend.json").write_text(json.dumps(result, indent=1))
    (out_dir / "backend.txt").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out_dir}")
    print(json.dumps(result, separators=(",", ":")))
    return 0


def _call_ms(lm: LM, calls: list[tuple[int, int]], feed: list[int], context: int, repeats: int):
    """Median ms of one forward over (seq, tokens) pairs, each sequence rolled back after."""
    samples = []
    for i in range(repeats + 1):  # the first is a warm-up
        t = time.perf_counter()
        lm.forward([(q, feed[:n]) for q, n in calls])
        if i:
            samples.append((time.perf_counter() - t) * 1000.0)
        for q, _ in calls:
            lm.truncate(q, context)
    return float(np.median(samples))


def batch_costs(lm: LM, sequences: int, repeats: int = 5, context: int = 128) -> dict:
    """Measured and predicted costs of batched calls (see the module docstring). Sequences are
    numbered from 0 and sit in the slots of their numbers; `sequences` of them in all."""
    model = CostModel(measure_curve(lm, range(1, 17), repeats=repeats, context=context))
    rng = np.random.default_rng(0)
    hi = min(lm.vocab_size, 1000)
    seqs = list(range(sequences + 1))  # the last one only makes room for a scattered layout
    for q in seqs:
        lm.forward([(q, [int(t) for t in rng.integers(10, hi, size=context)])], last_only=True)
    feed = [int(t) for t in rng.integers(10, hi, size=16)]
    sizes = [n for n in (1, 2, 4, 8, 16) if n <= sequences]
    extra = (0, 1, 2, 3, 4, 8)
    rows = []
    for n in sizes:
        for m in extra:
            calls = [(q, 1 + m) for q in range(n)]
            ms = _call_ms(lm, calls, feed, context, repeats)
            if n > 1:
                model.batched[(n, 1 + m)] = ms
            rows.append({"sequences": n, "m": m, "shape": "all", "ms": ms})
    for n in sizes[1:]:
        shapes = {f"one +{m}": [(0, 1 + m)] + [(q, 1) for q in range(1, n)] for m in extra[1:]}
        shapes["gap, +0"] = [(0, 1)] + [(q, 1) for q in range(2, n + 1)]  # slot 1 left out
        for shape, calls in shapes.items():
            passes = lm.passes(calls)
            rows.append(
                {
                    "sequences": n,
                    "shape": shape,
                    "ms": _call_ms(lm, calls, feed, context, repeats),
                    "passes": passes,
                    "predicted_ms": model.call_ms(passes),
                    "one_pass_ms": model.target(sum(c for _, c in calls)),
                }
            )
    for q in seqs:
        lm.release(q)
    return {"curve": model.target.ms, "rows": rows}


def run_batch_bench(target: LM, a) -> int:
    out_dir = Path(a.out) if a.out else default_out("-batch")
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"batched calls over up to {a.sequences} sequences ...", file=sys.stderr)
    got = batch_costs(target, a.sequences, a.repeats)
    uniform = {(r["sequences"], r["m"]): r["ms"] for r in got["rows"] if r["shape"] == "all"}
    sizes = sorted({n for n, _ in uniform})
    extra = sorted({m for _, m in uniform})
    lines = [
        "every sequence with 1 + m tokens: ms of the call (x of the plain call)",
        f"{'sequences':>9} " + " ".join(f"{'m=' + str(m):>13}" for m in extra),
    ]
    for n in sizes:
        base = uniform[(n, 0)]
        cells = [f"{uniform[(n, m)]:7.1f} ({uniform[(n, m)] / base:.2f})" for m in extra]
        lines.append(f"{n:9d} " + " ".join(f"{c:>13}" for c in cells))
    lines += [
        "",
        "other shapes: measured, predicted from their passes, and as one pass of all tokens",
        f"{'sequences':>9} {'shape':>8} {'ms':>7} {'x plain':>7} {'passes':>24} "
        f"{'predicted':>9} {'one pass':>8}",
    ]
    for r in got["rows"]:
        if r["shape"] == "all":
            continue
        passes = " ".join(f"{s}x{c}" for s, c in r["passes"])
        lines.append(
            f"{r['sequences']:9d} {r['shape']:>8} {r['ms']:7.1f} "
            f"{r['ms'] / uniform[(r['sequences'], 0)]:7.2f} {passes:>24} "
            f"{r['predicted_ms']:9.1f} {r['one_pass_ms']:8.1f}"
        )
    text = "\n".join(lines)
    result = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "target": target.info.model,
        "threads": target.info.threads,
        **got,
    }
    (out_dir / "batch.json").write_text(json.dumps(result, indent=1))
    (out_dir / "batch.txt").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out_dir}")
    return 0
