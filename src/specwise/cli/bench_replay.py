"""`specwise bench replay`: its flags, the drafter sets replayed over recorded greedy answers
(`bench.replay`) with a progress bar a stage, and the table printed.

Drafters that copy text only; it times nothing (rounds are priced at this machine's costs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwise.cli.common import UsageError, _drafter_options, _load_models
from specwise.cli.options import _bench_prompts, _csv, _drafter_sets, _model_args
from specwise.drafters import DRAFT_MODEL, READS_STATES

__all__ = ["add_parser"]


def _bench_replay(a: argparse.Namespace) -> int:
    """`bench replay`: record plain greedy answers, replay drafter sets over them (priced)."""
    from tqdm import tqdm

    from specwise.bench import replay
    from specwise.bench.session import default_out
    from specwise.bench.workloads import interleaved, render
    from specwise.costs import calibrated
    from specwise.drafters import make_drafter

    sets = _drafter_sets(a.sets)
    if not sets:
        raise UsageError(f"--sets {a.sets!r} names no drafters; e.g. 'ngram;ngram+suffix'")
    names = list(dict.fromkeys(n for s in sets for n in s))

    def refuse(n: str) -> UsageError:
        return UsageError(
            f"--sets names {n}, which drafts with a model; replay runs the drafters that "
            f"copy text (ngram, suffix, suffix-chain): measure {n} with `specwise bench`"
        )

    for n in names:
        if n in DRAFT_MODEL or n in READS_STATES:  # before their options: they need models
            raise refuse(n)
    options = _drafter_options(a, names)
    drafters = [make_drafter(n, **options[n]) for n in names]
    for d in drafters:
        if not d.cheap:
            raise refuse(d.name)
    if a.max_tokens < 2:
        raise UsageError(f"--max-tokens {a.max_tokens} is invalid; use an integer >= 2")
    prompts = interleaved(_bench_prompts(a))  # the categories mixed, as a server sees them
    target, _ = _load_models(a, need_draft=False)
    costs = calibrated(target, drafters)
    ids = [(p.category, p.id, render(target.tokenizer, p.turns[:1])) for p in prompts]
    out = Path(a.out) if a.out else default_out("-replay")
    bars: list = []

    def progress(desc: str, total: int):
        for bar in bars:  # one bar at a time: the last one's work is done
            bar.close()
        bars.append(tqdm(total=total, desc=desc, unit="req", file=sys.stderr))
        return bars[-1].update

    try:
        lines = replay.run(target, ids, sets, options, costs, a.max_tokens, out, progress)
    finally:
        for bar in bars:
            bar.close()
    print(f"speedup over plain decoding, priced at this machine's costs ({target.info.backend}):")
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """`bench replay` and its flags."""
    bv = bsub.add_parser(
        "replay",
        help="drafter sets and the controller replayed over recorded greedy answers, priced at "
        "this machine's costs, beside what hindsight gets from the same drafts (no timing noise)",
    )
    _model_args(bv)
    bv.add_argument(
        "--sets",
        default="ngram;ngram+suffix",
        help="drafter sets to replay, each as auto over it: sets separated by ';', names in a "
        "set by '+' (drafters that copy text: ngram, suffix, suffix-chain; default "
        "'ngram;ngram+suffix')",
    )
    bv.add_argument("--categories", type=_csv(str, "names"), help="categories to run")
    bv.add_argument("--prompts", help="a JSONL file of prompts instead of the shipped ones")
    bv.add_argument("--limit", type=int, help="prompts per category")
    bv.add_argument("--max-tokens", type=int, default=256, help="tokens per answer (256)")
    bv.add_argument("--out", help="output folder (default bench-results/<timestamp>-replay)")
    bv.set_defaults(func=_bench_replay)
