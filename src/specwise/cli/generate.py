"""`specwise generate`: its flags, one prompt generated, and what it prints: the text as it
comes, then the rounds' summary (`describe`), or one JSON object.

It decodes nothing (the engine does) and computes no figure (`trace` does): it displays them.
"""

from __future__ import annotations

import argparse
import json
import sys

from specwise.cli.common import UsageError, _build_engine, _save_memory
from specwise.cli.options import _k, _model_args
from specwise.sampling import SamplingParams

__all__ = ["add_parser", "cmd_generate", "describe"]


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _params(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        min_p=a.min_p,
        seed=a.seed,
        max_tokens=a.max_tokens,
        stop=tuple(a.stop),
    )


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def describe(result, engine) -> list[str]:
    """The human summary of one generation; every acceptance figure says what it is."""
    from collections import Counter

    from specwise.trace import choice_shares

    s = result.summary
    active = engine.drafters if engine.k != 0 else []
    dname = ",".join(d.name for d in active) or "none (plain)"
    k_label = "chosen per round: auto" if engine.k == "auto" else f"k={engine.k}"
    spent = s.draft_ms + s.verify_ms + s.overhead_ms
    share = (lambda v: f"{100 * v / spent:.0f}%") if spent else (lambda v: "n/a")
    lines = [
        f"target {engine.target.info.model} ({engine.target.info.backend}) · drafter {dname} · "
        f"k={engine.k} · finish: {result.finish_reason}",
        f"emitted {s.emitted} tokens in {s.rounds} rounds · proposed {s.proposed} · "
        f"accepted {s.accepted}",
        f"acceptance rate (Σ accepted / Σ proposed, {k_label}): {_fmt(s.acceptance_rate)}",
        f"mean accepted length τ (Σ emitted / rounds, plain = 1): {_fmt(s.mean_accepted_length)}",
        "α per position (conditional): "
        + (" ".join(_fmt(a, ".2f") for a in s.alpha_per_position) or "n/a"),
        "acceptance per position (unconditional): "
        + (" ".join(_fmt(a, ".2f") for a in s.acceptance_per_position) or "n/a"),
        f"TTFT {_fmt(s.ttft_ms, '.0f')} ms · continuation {_fmt(s.continuation_tokens_per_s, '.1f')}"
        f" tokens/s · total {s.total_ms:.0f} ms · goodput {_fmt(s.goodput_tokens_per_ms, '.4f')}"
        f" tokens/ms",
        f"time in rounds: draft {share(s.draft_ms)} · verify {share(s.verify_ms)} · overhead "
        f"{share(s.overhead_ms)} · prefill {s.prefill_ms:.0f} ms · peak RSS {s.peak_rss_mb:.0f} MB",
    ]
    if s.acceptance != "exact":
        lines.insert(
            0,
            f"LOSSY acceptance rule {s.acceptance!r}: this output is NOT a sample of the "
            f"target's distribution (specwise.lossy says which one it is)",
        )
    if engine.k == "auto" and result.rounds:
        shares = choice_shares(result.rounds)
        parts = [
            f"{name} in {100 * v['share']:.0f}% of rounds"
            + (f" (mean k {v['mean_k']:.1f})" if name != "plain" else "")
            for name, v in sorted(shares.items(), key=lambda kv: -kv[1]["share"])
        ]
        why = Counter(r.decision for r in result.rounds if r.decision).most_common(1)
        lines.append("auto: " + ", ".join(parts) + (f"; most often: {why[0][0]}" if why else ""))
    for d in active:
        note = getattr(d, "note", None)
        if note:
            lines.append(f"note: {note}")
    return lines


def cmd_generate(a: argparse.Namespace) -> int:
    from specwise.trace import JsonlSink

    params = _params(a)
    prompt_text = sys.stdin.read() if a.prompt == "-" else a.prompt
    if not prompt_text:
        raise UsageError("the prompt is empty; give the prompt text (or - to read stdin)")
    sink = JsonlSink(a.trace) if a.trace else None
    try:
        engine = _build_engine(a, trace=sink)
        tok = engine.target.tokenizer
        if tok is None:
            raise UsageError(f"the target {a.target!r} has no tokenizer; text prompts need one")
        if a.chat:
            ids = tok.render_chat([{"role": "user", "content": prompt_text}])
        else:
            ids = tok.encode(prompt_text)
        req = engine.start(  # a trace shows its text
            ids, params, inspect=sink is not None, acceptance=a.acceptance
        )
        try:
            while True:
                if not a.json and req.detok is not None:
                    print(req.detok.take(), end="", flush=True)
                if req.done:
                    break
                engine.step([req])
        finally:
            result = engine.finish(req)
        _save_memory(a, engine)
    finally:
        if sink is not None:
            sink.close()
    if a.json:
        out = {
            "text": result.text,
            "tokens": result.tokens,
            "finish_reason": result.finish_reason,
            "summary": result.summary.to_dict(),
        }
        print(json.dumps(out))
    else:
        print(req.detok.take(final=True) if req.detok is not None else "")
        print("---")
        print("\n".join(describe(result, engine)))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`generate` and its flags."""
    g = sub.add_parser("generate", help="generate text for one prompt and summarise the rounds")
    _model_args(g)
    g.add_argument(
        "--k",
        type=_k,
        default="auto",
        help="draft tokens per round: auto (default: the controller decides each round), "
        "or a fixed integer (0: plain decoding)",
    )
    _sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--acceptance",
        default="exact",
        help="acceptance rule: exact (default: the target's distribution), or, for sampled "
        "output only, a LOSSY one: typical (Medusa's) or top-N (a draft token among the "
        "target's N most likely); the output then is not the target's distribution (flagged)",
    )
    g.add_argument(
        "--trace",
        help="append every round, with its detail (draft, p and q, top of p), as JSON lines to "
        "this file (`specwise inspect FILE` shows it)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object instead")
    g.add_argument("prompt", help="prompt text, or - to read stdin")
    g.set_defaults(func=cmd_generate)
